"""cli_options.py: command-line values into library values, called directly (the commands that use
them are tested against a mocked core in test_cli_core.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest

import detaudit.run.devices
from detaudit.cli.commands import cli
from detaudit.cli.options import (
    DEFAULT_GRANULARITY,
    FiniteFloat,
    audit_option_group,
    audit_options,
    check_outputs,
    compare_tolerance,
    demo_options,
    option_group,
    stdout_mode_of,
)
from detaudit.errors import OutputError, UsageError
from detaudit.results import Tolerance

RUN_DEFAULTS: dict[str, Any] = dict(repeats=3, devices=(), timeout=None, out_dir=None, jobs=1, atol=1e-5, rtol=1.3e-6,
                                    stdout_mode=None, ignore_stdout=False, granularity="auto", baseline_dir=None,
                                    save_baseline=None, redact_args=False, max_steps=None, max_time=None,
                                    self_check=False, nproc_per_node=None, torchrun_args="")


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detaudit.run.devices, "cuda_available", lambda: False)  # the same on every machine


def test_run_options_land_in_their_parts(tmp_path: Path) -> None:
    options = audit_options(tmp_path / "t.py", ("--lr", "1"), **{**RUN_DEFAULTS, "devices": ("cpu",), "jobs": 2,
                                                                 "ignore_stdout": True, "max_steps": 4})
    assert options.target.script == tmp_path / "t.py"
    assert options.target.script_args == ["--lr", "1"]
    assert options.schedule.devices == ["cpu"]
    assert options.schedule.own_device is False
    assert options.schedule.jobs == 2
    assert options.recording.max_steps == 4
    assert options.checks.stdout == "ignore"
    assert options.checks.tolerance == Tolerance(1e-5, 1.3e-6)


@pytest.mark.parametrize(("changes", "message"), [
    ({"torchrun_args": "--nnodes 2"}, "needs --nproc-per-node"),
    ({"nproc_per_node": 2, "baseline_dir": Path("b")}, "do not support --nproc-per-node"),
    ({"nproc_per_node": 2, "max_time": 5.0}, "cannot bound a torchrun run"),
    ({"stdout_mode": "strict", "ignore_stdout": True}, "contradicts --stdout strict"),
    ({"perturb": "threads,cores"}, "unknown setting 'cores'"),
    ({"perturb": "threads", "nproc_per_node": 2}, "--perturb does not support --nproc-per-node"),
])
def test_contradicting_run_options_are_usage_errors(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(click.UsageError, match=message):
        audit_options(tmp_path / "t.py", (), **{**RUN_DEFAULTS, **changes})


def test_perturb_runs_repeats_per_setting_and_refuses_cuda_settings_without_a_gpu(tmp_path: Path) -> None:
    options = audit_options(tmp_path / "t.py", (), **{**RUN_DEFAULTS, "perturb": "threads,hash-seed"})
    perturbation = options.schedule.perturbation
    assert perturbation is not None
    assert len(perturbation.groups) == 3
    assert options.schedule.repeats == 9  # --repeats 3 in each of the 3 groups
    assert audit_options(tmp_path / "t.py", (), **RUN_DEFAULTS).schedule.perturbation is None
    with pytest.raises(UsageError, match="only CUDA work can notice"):
        audit_options(tmp_path / "t.py", (), **{**RUN_DEFAULTS, "perturb": "cublas-workspace"})


def test_an_option_group_hands_the_command_the_value_its_options_describe() -> None:
    seen: dict[str, Any] = {}
    option_group(Tolerance, "tolerance", keep=("rtol",))(lambda **kwargs: seen.update(kwargs))(
        atol=0.5, rtol=0.25, quiet=True)
    assert seen == {"tolerance": Tolerance(0.5, 0.25), "rtol": 0.25, "quiet": True}


def test_a_command_sets_the_audit_options_it_does_not_declare(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}
    audit_option_group(repeats=2, granularity="module")(lambda **kwargs: seen.update(kwargs))(
        script=tmp_path / "t.py", script_args=(), devices=(), out_dir=None, json_path=None)
    assert seen == {"options": audit_options(tmp_path / "t.py", repeats=2, granularity="module"), "json_path": None}


def test_stdout_mode_is_the_commands_default_unless_asked() -> None:
    assert stdout_mode_of(None, False) is None
    assert stdout_mode_of("strict", False) == "strict"
    assert stdout_mode_of(None, True) == stdout_mode_of("ignore", True) == "ignore"


def test_compare_is_bitwise_unless_a_tolerance_is_given() -> None:
    assert compare_tolerance(None, None) is None
    assert compare_tolerance(0.5, None) == Tolerance(0.5, 0.0)
    assert compare_tolerance(None, 0.25) == Tolerance(0.0, 0.25)


def test_finite_float_refuses_nan_inf_and_the_minimum() -> None:
    positive = FiniteFloat(minimum=0)
    assert positive.convert("2.5", None, None) == 2.5
    for bad in ("nan", "inf", "0", "x"):
        with pytest.raises(click.BadParameter):
            positive.convert(bad, None, None)


def test_report_outputs_are_checked_before_the_run(tmp_path: Path) -> None:
    check_outputs(tmp_path / "r.json", Path("-"), None)
    with pytest.raises(click.UsageError, match="cannot both write to stdout"):
        check_outputs(Path("-"), Path("-"))
    with pytest.raises(OutputError, match="is a directory"):
        check_outputs(None, tmp_path)


def test_sarif_and_another_report_cannot_both_go_to_stdout() -> None:
    with pytest.raises(click.UsageError, match="--json - and --sarif - cannot both write to stdout"):
        check_outputs(Path("-"), None, sarif_path=Path("-"))


def test_the_demo_runs_the_shipped_script_at_the_default_granularity(tmp_path: Path) -> None:
    options = demo_options(tmp_path / "demo.py", 4, tmp_path / "out")
    assert options.schedule.repeats == 4
    assert options.schedule.jobs in (1, 2)
    assert options.schedule.timeout == 120.0
    assert options.recording.granularity == DEFAULT_GRANULARITY
    assert options.out_dir == tmp_path / "out"


def test_a_tolerance_is_finite_and_not_negative() -> None:
    from detaudit.cli.options import TOLERANCE

    assert TOLERANCE.convert("0", None, None) == 0.0
    assert TOLERANCE.convert("1e-3", None, None) == 1e-3
    for bad in ("-1e-5", "-0.1", "nan", "-inf", "inf"):
        with pytest.raises(click.BadParameter):
            TOLERANCE.convert(bad, None, None)


SCRIPT_DEFINING = """import argparse
parser = argparse.ArgumentParser()
parser.add_argument("-i", "--input-file")
parser.add_argument("-n", "--num-workers", type=int)
parser.add_argument("--device")
parser.parse_args()
"""


def _run_params(args: list[str]) -> dict[str, Any]:
    """`detaudit run ARGS` through the real parser (RunCommand), nothing run."""
    parent = cli.make_context("detaudit", ["run", *args])
    return cli.commands["run"].make_context("run", list(args), parent=parent).params


@pytest.mark.parametrize("args", [
    ["train.py", "-n", "3", "--", "-i", "names.txt"],  # the script's -n
    ["train.py", "names.txt", "--device", "cpu", "-q"],  # the script's --device
    ["-n", "2", "train.py", "-n", "3", "-i", "x"],  # given twice (and the script's)
    ["--repeats", "2", "train.py", "--repeats", "3", "--", "-i", "x"],  # given twice
])
def test_every_command_an_ambiguity_suggests_is_one_run_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                args: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT_DEFINING)
    with pytest.raises(UsageError) as refused:
        _run_params(args)
    suggested = re.findall(r"`detaudit run ([^`]*)`", str(refused.value))
    assert suggested
    for command in suggested:
        # accepted, and the script is handed no `--` that the original command did not hand it
        assert "--" not in _run_params(shlex.split(command))["script_args"]
