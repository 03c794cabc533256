"""Recording small computations in-process with the op recorder, for the tests of what it records
(tests/recorder/test_ops.py) and of the rules that read op records (tests/compare/test_oprules.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import detaudit.recorder
from detaudit.recorder import location, patch
from detaudit.recorder.core import Recorder
from detaudit.recorder.ops import install
from detaudit.trace import Trace, TraceWriter, read_trace

location.skip_paths(location.package_dir(torch), location.package_dir(detaudit.recorder))


def here() -> str:
    """`file:line` of the caller, as the recorder writes it."""
    frame = sys._getframe(1)
    return f"{location.display_path(frame.f_code.co_filename)}:{frame.f_lineno}"



def record(path: Path, body: Callable[[Recorder], Any], config: dict[str, Any] | None = None,
           on_end: Callable[[], None] = lambda: None) -> Trace:
    rec = Recorder(TraceWriter(path, {"repeat": 0}))
    since = len(patch.patched())
    ops = install(rec, config or {"granularity": "op"}, on_end)
    try:
        body(rec)
    finally:
        if ops is not None:
            ops.stop()
        patch.restore_all(since)  # the DataLoader wrappers the op recorder installs (recorder/loader_batches.py)
    rec.close({"exit_code": 0})
    return read_trace(path)

