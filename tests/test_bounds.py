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


def test_max_steps_stops_once_after_the_nth_optimizer_step(tmp_path: Path) -> None:
    bounds, stops = _bounds(tmp_path, max_steps=3)
    bounds.optimizer_built = True
    for step in range(1, 6):
        bounds._on_step(step)
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
    bounds.optimizer_built = True
    bounds._on_forward(torch.nn.Linear(1, 1), (), None)
    assert stops == []


def test_max_time_stops_at_the_first_boundary_after_the_budget(tmp_path: Path) -> None:
    bounds, stops = _bounds(tmp_path, max_time=60.0)
    bounds.optimizer_built = True
    bounds._on_step(1)
    assert stops == []
    late, late_stops = _bounds(tmp_path / "late", max_time=0.5, started=time.time() - 1)
    late.optimizer_built = True
    late._on_step(4)
    assert late_stops == [Stop(4, "max-time", "optimizer steps")]


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
