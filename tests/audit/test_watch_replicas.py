"""`detaudit watch`'s live replica check under torchrun (detaudit/audit/watch_replicas.py)."""

from __future__ import annotations

from pathlib import Path

from synthetic import Rec, write_trace

from detaudit.audit.watch_replicas import ReplicaWatch
from detaudit.trace import Kind

DDP = {"type": "ddp", "loc": "train.py:5", "params": ["module.fc.weight"], "ignored": [], "backend": "gloo",
       "bucket_cap_mb": None, "gradient_as_bucket_view": False, "static_graph": False,
       "find_unused_parameters": False, "buffers": []}


def params(*values: int) -> list[Rec]:
    return [Rec("module.fc.weight", v, step, Kind.PARAM, samples=(v, 0, 0, 0)) for step, v in enumerate(values)]


def traces(tmp_path: Path, zero: list[Rec], one: list[Rec], ended: bool = True,
           events: tuple[dict[str, object], ...] = (DDP,)) -> dict[int, Path]:
    return {rank: write_trace(tmp_path / f"w.rank-{rank}.trace", recs, {"exit_code": 0} if ended else None,
                              events=[(0, e) for e in events])
            for rank, recs in ((0, zero), (1, one))}


def test_a_rank_whose_replica_differs_is_found_at_its_first_step(tmp_path: Path) -> None:
    found = ReplicaWatch(traces(tmp_path, params(1, 2, 3), params(1, 5, 6))).poll()
    assert found is not None
    assert (found.step, found.name, found.ranks, found.reference, found.max_abs_diff) == \
        (1, "module.fc.weight", [1], 0, 3.0)


def test_a_step_a_rank_is_still_recording_is_not_compared_yet(tmp_path: Path) -> None:
    watch = ReplicaWatch(traces(tmp_path, params(1, 2), params(1, 5), ended=False))
    assert watch.poll() is None
    assert watch.poll(final=True) is not None


def test_parameters_no_ddp_event_names_are_not_replicas(tmp_path: Path) -> None:
    assert ReplicaWatch(traces(tmp_path, params(1, 2), params(1, 5), events=())).poll() is None


def test_ranks_not_started_yet_are_waited_for(tmp_path: Path) -> None:
    assert ReplicaWatch({0: tmp_path / "none.rank-0.trace", 1: tmp_path / "none.rank-1.trace"}).poll() is None


def test_the_steps_compared_equal_are_where_the_replicas_agree_to(tmp_path: Path) -> None:
    watch = ReplicaWatch(traces(tmp_path, params(1, 2, 3), params(1, 2, 3), ended=False))
    watch.poll()
    assert watch.agrees_to == 1  # step 2 may still be recorded
