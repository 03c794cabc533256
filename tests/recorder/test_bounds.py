"""recorder/bounds.py: where --max-steps and --max-time stop a repeat, and what counts as a step."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from detaudit.recorder.bounds import Bounds, Stop
from detaudit.recorder.core import Recorder
from detaudit.trace import TraceWriter, read_footer


def _bounds(tmp_path: Path, max_steps: int | None = None, max_time: float | None = None,
            started: float | None = None) -> tuple[Bounds, list[Stop]]:
    stops: list[Stop] = []
    tmp_path.mkdir(exist_ok=True)
    rec = Recorder(TraceWriter(tmp_path / "t.trace", {"repeat": 0}))
    bounds = Bounds(rec, lambda module: True, max_steps, max_time, started or time.time(), stops.append)
    return bounds, stops


def _optimizer(bounds: Bounds) -> torch.optim.Optimizer:
    """An optimizer the bounds know about, as if built under `Bounds.install`'s wrapper."""
    optimizer = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    bounds.optimizer_built = True
    bounds.optimizers.add(optimizer)
    return optimizer


def _step(bounds: Bounds, step: int, *optimizers: torch.optim.Optimizer) -> None:
    """The counting optimizer (the first) ends step `step`; the others step right after it."""
    bounds._on_step(step)
    for optimizer in optimizers:
        bounds._on_optimizer_pre(optimizer, (), {})
        bounds._on_optimizer_post(optimizer, (), {})


def test_max_steps_stops_once_after_the_nth_optimizer_step(tmp_path: Path) -> None:
    bounds, stops = _bounds(tmp_path, max_steps=3)
    optimizer = _optimizer(bounds)
    for step in range(1, 6):
        _step(bounds, step, optimizer)
        assert len(stops) == (step >= 3)
    assert stops == [Stop(3, "max-steps", "optimizer steps")]
    assert stops[0].footer() == {"stopped_at_step": 3, "stopped_by": "max-steps", "counting": "optimizer steps"}


def test_without_an_optimizer_root_forward_calls_count(tmp_path: Path) -> None:
    bounds, stops = _bounds(tmp_path, max_steps=2)
    model = torch.nn.Linear(1, 1)
    for _ in range(3):
        bounds._on_forward(model, (), None)
    assert stops == [Stop(2, "max-steps", "root-module forward calls")]


def test_forward_calls_do_not_count_once_an_optimizer_exists(tmp_path: Path) -> None:
    bounds, stops = _bounds(tmp_path, max_steps=1)
    _optimizer(bounds)
    bounds._on_forward(torch.nn.Linear(1, 1), (), None)
    assert stops == []


def test_max_time_stops_at_the_first_boundary_after_the_budget(tmp_path: Path) -> None:
    bounds, stops = _bounds(tmp_path, max_time=60.0)
    _step(bounds, 1, _optimizer(bounds))
    assert stops == []
    late, late_stops = _bounds(tmp_path / "late", max_time=0.5, started=time.time() - 1)
    _step(late, 4, _optimizer(late))
    assert late_stops == [Stop(4, "max-time", "optimizer steps")]


def test_with_two_optimizers_the_step_ends_after_both_stepped(tmp_path: Path) -> None:
    bounds, stops = _bounds(tmp_path, max_steps=2)
    head, body = _optimizer(bounds), _optimizer(bounds)
    _step(bounds, 1, head, body)
    bounds._on_step(2)
    bounds._on_optimizer_post(head, (), {})
    assert stops == []  # the body's optimizer still steps in step 2: its records are kept
    bounds._on_optimizer_pre(body, (), {})
    bounds._on_optimizer_post(body, (), {})
    assert stops == [Stop(2, "max-steps", "optimizer steps")]


def test_a_step_where_only_one_of_two_optimizers_stepped_ends_at_the_next_forward(tmp_path: Path) -> None:
    bounds, stops = _bounds(tmp_path, max_steps=1)
    head, _frozen = _optimizer(bounds), _optimizer(bounds)
    _step(bounds, 1, head)
    assert stops == []
    bounds._on_forward_pre(torch.nn.Linear(1, 1), ())
    assert stops == [Stop(1, "max-steps", "optimizer steps")]
    again, again_stops = _bounds(tmp_path / "again", max_steps=1)  # or when the counting one steps again
    head, _frozen = _optimizer(again), _optimizer(again)
    _step(again, 1, head)
    again._on_optimizer_pre(head, (), {})
    assert again_stops == [Stop(1, "max-steps", "optimizer steps")]


def test_read_footer_skips_records(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "a.trace", {"repeat": 0})
    for i in range(100):
        writer.add((1, 1, 0, 0, writer.intern(f"r{i}"), 0, 0, 0, 0, 0, i, 0, 0, (0.0, 0.0, 0.0, 0.0)))
    writer.flush()
    writer.close({"exit_code": 0, "stopped_at_step": 7})
    assert read_footer(tmp_path / "a.trace") == {"records": 100, "exit_code": 0, "stopped_at_step": 7}
    (tmp_path / "cut.trace").write_bytes((tmp_path / "a.trace").read_bytes()[:-10])
    assert read_footer(tmp_path / "cut.trace") is None
    assert read_footer(tmp_path / "missing.trace") is None
