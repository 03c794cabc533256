"""recorder/evidence/writes.py: the files a repeat opens for writing (what `-j` repeats would share)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import pytest
import torch
from evidence_sink import Sink

from detaudit.events import FileWriteEvent
from detaudit.recorder.evidence import writes as files
from detaudit.recorder.evidence.base import Evidence


@pytest.fixture
def writes(evidence: tuple[Evidence, Sink], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The files topic installed on an in-process Evidence whose run directory is tmp_path/run; the
    process-wide audit hook passes nothing on once the test ends."""
    ev, sink = evidence
    ev.config["trace"] = str(tmp_path / "run" / "repeat-0.trace")
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(files._RELAY, "listener", None)
    found = files.install(ev)
    files.install_torch(found, torch)
    return found, sink


def test_every_way_of_writing_a_file_is_seen_once_per_path(writes: Any, tmp_path: Path) -> None:
    _, sink = writes
    with open(tmp_path / "log.txt", "w") as fh:
        fh.write("a")
    with open(tmp_path / "log.txt", "a") as fh:  # the same path again: no second event
        fh.write("b")
    os.close(os.open(tmp_path / "raw.bin", os.O_WRONLY | os.O_CREAT, 0o600))
    np.save(tmp_path / "array.npy", np.zeros(2))
    torch.save(torch.ones(2), str(tmp_path / "ckpt.pt"))  # written by torch's C++ writer: seen through torch.save
    fd, temporary = tempfile.mkstemp(dir=tmp_path)  # exclusive: it cannot write into another's file
    os.close(fd)
    os.replace(temporary, tmp_path / "final.pt")  # ... but renamed into place, it replaces a shared name
    [event, *_] = events = sink.of("file-write")
    assert [e["path"] for e in events] == [str(tmp_path / n)
                                           for n in ("log.txt", "raw.bin", "array.npy", "ckpt.pt", "final.pt")]
    assert set(event) == set(get_type_hints(FileWriteEvent)) - {"at", "worker"}
    assert "test_evidence_writes.py:" in event["loc"]


def test_reads_detaudits_own_files_and_special_files_are_not_writes(writes: Any, tmp_path: Path) -> None:
    _, sink = writes
    (tmp_path / "data.txt").write_text("x")
    sink.events.clear()
    with open(tmp_path / "data.txt") as fh:
        fh.read()
    torch.load(_saved(tmp_path / "run" / "t.pt"))  # inside the run directory: detaudit's own
    with open(os.devnull, "w") as fh:
        fh.write("x")
    with open(tmp_path / "run" / "repeat-0.stdout", "w") as fh:
        fh.write("x")
    assert sink.of("file-write") == []


def test_paths_are_capped_at_the_source(writes: Any, tmp_path: Path) -> None:
    _, sink = writes
    for i in range(files.MAX_PATHS + 5):
        with open(tmp_path / f"f{i}", "w"):
            pass
    assert len(sink.of("file-write")) == files.MAX_PATHS


def _saved(path: Path) -> Path:
    torch.save(torch.ones(1), str(path))
    return path


def test_a_failure_in_the_hook_never_fails_the_scripts_open(writes: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    found, sink = writes

    def broken(path: Any, frame: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(found, "opened", broken)
    with open(tmp_path / "out.txt", "w") as fh:  # the script's open still succeeds
        fh.write("x")
    assert (tmp_path / "out.txt").read_text() == "x"
    assert files._RELAY.listener is None
    assert "stopped recording the files" in capsys.readouterr().err


def test_an_open_for_appending_says_so(writes: Any, tmp_path: Path) -> None:
    _, sink = writes
    with open(tmp_path / "sessions.jsonl", "a") as fh:
        fh.write("{}\n")
    with open(tmp_path / "model.txt", "w") as fh:
        fh.write("x")
    assert [e.get("append") for e in sink.of("file-write")] == [True, False]
