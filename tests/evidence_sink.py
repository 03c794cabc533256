"""An in-process evidence recorder for the evidence topic tests: events land in a list, and every
wrapper installed is restored after the test (recorder/patch.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

import detaudit
from detaudit.recorder import location, patch
from detaudit.recorder.compiled import compiling
from detaudit.recorder.evidence.base import Evidence


class Sink:
    """Stands in for the Recorder: keeps the events it is given."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.internal = 0  # >0 while detaudit does its own tensor work (Recorder.internal)

    def event(self, event: dict[str, Any]) -> None:
        self.events.append(dict(event))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


@contextlib.contextmanager
def recording() -> Iterator[tuple[Evidence, Sink]]:
    """An Evidence whose events go to a Sink; what its topics patch is restored on exit
    (the `evidence` fixture of tests/conftest.py)."""
    kept = len(patch.patched())
    skipped = location._skip_prefixes
    location.skip_paths(location.package_dir(detaudit), detaudit.__file__ or "")  # as in a repeat
    ev = Evidence({"pins": []})
    sink = Sink()
    ev.attach_recorder(sink)
    ev.torch = torch
    ev.compiling = compiling
    try:
        yield ev, sink
    finally:
        patch.restore_all(kept)
        location._skip_prefixes = skipped
