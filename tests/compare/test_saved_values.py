"""Saved values that are not tensors: whether they are all that differs between the repeats."""

from __future__ import annotations

from pathlib import Path

from synthetic import Rec, training_records, write_trace

from detaudit.compare.saved_values import non_tensor, only_non_tensor_values_differ
from detaudit.compare.traces import compare_traces
from detaudit.trace import Flag, Kind, RecordStream

PATH = Rec("torch.save[0].callbacks.best_model_path", digest=7, step=3, kind=Kind.SAVE, dtype="str", shape="")
WEIGHT = Rec("torch.save[0].state_dict.weight", digest=11, step=3, kind=Kind.SAVE)
STEP = Rec("torch.save[0].step", digest=5, step=3, kind=Kind.SAVE, dtype="int64", shape="scalar",
           flags=int(Flag.PYTHON_VALUE))  # a Python int saved beside the weights


def _traces(tmp: Path, repeats: list[list[Rec]]) -> list[Path]:
    return [write_trace(tmp / f"repeat-{i}.trace", recs, {"exit_code": 0}) for i, recs in enumerate(repeats)]


def _differ_alone(tmp: Path, repeats: list[list[Rec]]) -> bool:
    traces = _traces(tmp, repeats)
    first = compare_traces(traces).first_divergence
    return only_non_tensor_values_differ(first, traces, ["cpu"] * len(traces), None, [False] * len(traces))


def test_a_saved_path_that_alone_differs_is_all_that_differs(tmp_path: Path) -> None:
    base = training_records()
    assert _differ_alone(tmp_path, [[*base, PATH, WEIGHT], [*base, PATH.but(digest=8), WEIGHT]])


def test_a_tensor_differing_after_the_path_is_not_excused(tmp_path: Path) -> None:
    base = training_records()
    assert not _differ_alone(tmp_path, [[*base, PATH, WEIGHT], [*base, PATH.but(digest=8), WEIGHT.but(digest=12)]])


def test_a_first_divergence_at_a_tensor_is_not_a_saved_value(tmp_path: Path) -> None:
    base = training_records()
    changed = [r.but(digest=r.digest + 1) if i == 2 else r for i, r in enumerate(base)]
    assert not _differ_alone(tmp_path, [[*base, PATH], [*changed, PATH.but(digest=8)]])


def test_a_saved_value_that_agrees_is_no_divergence_to_excuse(tmp_path: Path) -> None:
    assert not _differ_alone(tmp_path, [[PATH], [PATH]])


def test_only_non_tensor_saves_are_picked(tmp_path: Path) -> None:
    trace = _traces(tmp_path, [[PATH, WEIGHT, PATH.but(kind=Kind.OUTPUT)]])[0]
    assert non_tensor(RecordStream(trace).take(3)).tolist() == [True, False, False]


def test_a_saved_python_number_that_alone_differs_is_all_that_differs(tmp_path: Path) -> None:
    base = training_records()
    assert _differ_alone(tmp_path, [[*base, STEP, WEIGHT], [*base, STEP.but(digest=6), WEIGHT]])


def test_a_saved_0_dim_tensor_is_no_python_number(tmp_path: Path) -> None:
    base = training_records()
    loss = STEP.but(name="torch.save[0].loss", flags=0)
    assert not _differ_alone(tmp_path, [[*base, loss, WEIGHT], [*base, loss.but(digest=6), WEIGHT]])


def test_python_numbers_are_picked_as_non_tensor(tmp_path: Path) -> None:
    trace = _traces(tmp_path, [[STEP, STEP.but(flags=0), STEP.but(kind=Kind.OUTPUT)]])[0]
    assert non_tensor(RecordStream(trace).take(3)).tolist() == [True, False, False]
