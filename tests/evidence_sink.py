"""An in-process evidence recorder for the evidence topic tests: events land in a list, and every
wrapper installed is restored after the test (recorder/patch.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from detaudit.recorder import patch
from detaudit.recorder.compiled import compiling
from detaudit.recorder.evidence.base import Evidence


class Sink:
    """Stands in for the Recorder: keeps the events it is given."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def event(self, event: dict[str, Any]) -> None:
        self.events.append(dict(event))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


@pytest.fixture
def evidence() -> Iterator[tuple[Evidence, Sink]]:
    kept = len(patch.patched())
    ev = Evidence({"pins": []})
    sink = Sink()
    ev.attach_recorder(sink)
    ev.torch = torch
    ev.compiling = compiling
    try:
        yield ev, sink
    finally:
        patch.restore_all(kept)
