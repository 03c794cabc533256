"""drift/configurations.py: each side's environment, what A and B differ in, and A's perturbed settings."""

from __future__ import annotations

from detaudit.drift.configurations import Configuration, Difference, differences, floor_perturbation, plain_threads
from detaudit.pin import Perturb


def test_threads_become_the_thread_variables_over_the_side_s_environment() -> None:
    config = Configuration("A", {"OMP_NUM_THREADS": "8", "X": "1"}, threads=2)
    assert config.environment() == {"OMP_NUM_THREADS": "2", "X": "1", "MKL_NUM_THREADS": "2"}


def test_differences_name_each_setting_with_its_family() -> None:
    a = Configuration("A", {"LOSS_WEIGHT": "1"}, threads=1)
    b = Configuration("B", {"LOSS_WEIGHT": "2", "CUBLAS_WORKSPACE_CONFIG": ":16:8"}, ["--lr", "0.2"], threads=2)
    assert differences(a, b) == [Difference("threads", "1", "2", "reorder"),
                                 Difference("env CUBLAS_WORKSPACE_CONFIG", None, ":16:8", "reorder"),
                                 Difference("env LOSS_WEIGHT", "1", "2", "script"),
                                 Difference("args", None, "--lr 0.2", "script")]


def test_the_same_configuration_twice_differs_in_nothing() -> None:
    assert differences(Configuration("A", {"X": "1"}), Configuration("B", {"X": "1"})) == []


def test_a_side_without_threads_runs_with_the_cores() -> None:
    assert plain_threads(Configuration("A", {"OMP_NUM_THREADS": "3"}), 16) == 3


def test_one_thread_is_perturbed_to_two() -> None:
    perturbation = floor_perturbation(Configuration("A", threads=1), ["cpu"], 8)
    assert [g.values for g in perturbation.groups] == [{"threads": "1"}, {"threads": "2"}]


def test_on_cuda_the_workspace_and_the_algorithm_choice_are_perturbed_too() -> None:
    perturbation = floor_perturbation(Configuration("A", threads=4), ["cuda"], 8)
    assert [g.changed for g in perturbation.groups] == [None, Perturb.THREADS, Perturb.CUBLAS_WORKSPACE,
                                                          Perturb.CUDNN_BENCHMARK]


def test_another_world_size_is_a_layout_difference() -> None:
    assert differences(Configuration("A"), Configuration("B", nproc=2)) == [Difference("nproc", None, "2", "layout")]
