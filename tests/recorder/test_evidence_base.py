"""recorder/evidence/base.py: the evidence sinks (the trace, or a DataLoader worker's side file)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from detaudit.events import SeedEvent
from detaudit.recorder.evidence import base
from detaudit.recorder.evidence.base import Evidence


def test_a_worker_whose_side_file_cannot_be_written_loses_its_evidence_and_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk under a DataLoader worker: the write fails with ENOSPC, and that must not become the
    script's error (the repeat would exit 1 for detaudit's own failure); later events are dropped."""
    ev = Evidence({"trace": str(tmp_path / "repeat-0.trace")})
    ev.after_fork()
    calls: list[int] = []

    def full(fd: int, data: bytes) -> int:
        calls.append(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(base.os, "write", full)
    for line in (3, 4):
        ev.emit(SeedEvent(type="seed", lib="torch", fn="manual_seed", value=0, loc=f"train.py:{line}", library=False,
                          drawn_before=False, state=None, pinned=None))
    assert len(calls) == 1
    assert ev.side_path is None
