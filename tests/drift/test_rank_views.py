"""drift/rank_views.py: a torchrun side's records from its ranks' traces, compared across world sizes only where
the sample sets match."""

from __future__ import annotations

from pathlib import Path

from synthetic import Rec, write_trace

from detaudit.compare.identity import Identity
from detaudit.drift.rank_views import disagreements, not_comparable, rank_traces, side_view
from detaudit.results import RepeatResult
from detaudit.trace import Kind

GRAD = Rec("fc.weight", 10, kind=Kind.GRAD, samples=(0.5, -0.25, 0.125, 1.0))


def ranks(tmp_path: Path, rank_1_grad: Rec = GRAD) -> list[Path]:
    return [write_trace(tmp_path / "b-0.rank-0.trace", [Rec("fc", 1), GRAD], footer={}),
            write_trace(tmp_path / "b-0.rank-1.trace", [Rec("fc", 2), rank_1_grad], footer={})]


def test_a_torchrun_repeat_s_traces_are_one_per_rank_rank_0_first(tmp_path: Path) -> None:
    result = RepeatResult(0, "cpu", 0, 0.0, False, "b-0.trace", "b-0.stdout", "b-0.stderr", "")
    assert rank_traces(tmp_path, result, 2) == [tmp_path / "b-0.rank-0.trace", tmp_path / "b-0.rank-1.trace"]


def test_across_world_sizes_the_gradient_is_rank_0_s_and_module_outputs_are_set_aside(tmp_path: Path) -> None:
    view = side_view(ranks(tmp_path), per_rank=False)
    assert list(view.recording) == [Identity(0, "grad", "fc.weight")]
    assert view.set_aside == {"output": 2}


def test_the_same_world_size_compares_module_outputs_rank_by_rank(tmp_path: Path) -> None:
    view = side_view(ranks(tmp_path), per_rank=True)
    assert list(view.recording) == [Identity(0, "output", "fc"), Identity(0, "grad", "fc.weight"),
                                    Identity(0, "output", "fc", rank=1)]


def test_a_rank_whose_averaged_gradient_differs_from_rank_0_s_is_named(tmp_path: Path) -> None:
    other = Rec("fc.weight", 99, kind=Kind.GRAD, samples=(1.0, -0.5, 0.25, 2.0))
    traces = ranks(tmp_path, other)
    [found] = disagreements(side_view(traces[:1], per_rank=False), side_view(traces, per_rank=False))
    assert (found.side, found.rank, found.kind, found.name) == ("b", 1, "grad", "fc.weight")


def test_the_kinds_set_aside_are_counted_per_side_with_the_reason(tmp_path: Path) -> None:
    single = side_view([write_trace(tmp_path / "a-0.trace", [Rec("fc", 1), GRAD], footer={})], per_rank=False)
    [left] = not_comparable(single, side_view(ranks(tmp_path), per_rank=False))
    assert (left.kind, left.records_a, left.records_b, left.reason) == (
        "output", 1, 2, "different sample sets per rank")
