"""recorder/evidence/file_access.py: files read and directories listed that an earlier repeat of the audit changed."""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from evidence_sink import Sink

from detaudit.events import CarriedEvent, FileReadEvent
from detaudit.recorder import patch
from detaudit.recorder.evidence import file_access
from detaudit.recorder.evidence.base import Evidence, digest_bytes

NOW = time.time()
BEFORE_AUDIT = NOW - 200  # a file the user had before the audit started
EARLIER_REPEAT = NOW - 50  # written between the audit's start and this repeat's: by an earlier repeat


def _file(path: Path, when: float, text: str = "1") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (when, when))
    return path


@pytest.fixture
def carried(evidence: tuple[Evidence, Sink], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sink]:
    """The topic installed as in a repeat of an audit that started 100 s ago, in tmp_path."""
    ev, sink = evidence
    monkeypatch.chdir(tmp_path)
    _file(tmp_path / "data.csv", BEFORE_AUDIT)
    _file(tmp_path / "counter.txt", EARLIER_REPEAT)
    _file(tmp_path / "logs" / "version_0" / "metrics.csv", EARLIER_REPEAT)
    os.utime(tmp_path / "logs" / "version_0", (EARLIER_REPEAT, EARLIER_REPEAT))
    os.utime(tmp_path / "logs", (EARLIER_REPEAT, EARLIER_REPEAT))
    _file(tmp_path / "old" / "a.txt", BEFORE_AUDIT)
    os.utime(tmp_path / "old", (BEFORE_AUDIT, BEFORE_AUDIT))
    ev.config["audit_started"] = NOW - 100
    file_access.install(ev)
    yield sink
    patch.restore_all()


def test_a_read_of_what_an_earlier_repeat_wrote_is_recorded_with_path_and_line(carried: Sink) -> None:
    with open("data.csv") as fh:  # there before the audit: not carried
        fh.read()
    Path("counter.txt").read_text()  # pathlib, through io.open
    with open("counter.txt", mode="rb"):
        pass  # the same path again: recorded once
    [event] = carried.of("carried")
    assert set(event) == set(get_type_hints(CarriedEvent)) - {"at", "worker"}
    assert (event["what"], event["path"], event["entries"]) == ("read", "counter.txt", [])
    assert "test_evidence_file_access.py:" in event["loc"]
    assert "pathlib.py:" in event["by"]


def test_what_this_repeat_writes_and_reads_back_is_not_carried(carried: Sink) -> None:
    with open("ckpt.pt", "w") as fh:  # written by this repeat (after its start): its own state
        fh.write("x")
    with open("ckpt.pt") as fh:
        fh.read()
    with open("counter.txt", "w") as fh:  # a write is no read, whatever the file's age
        fh.write("2")
    assert carried.of("carried") == []


@pytest.mark.parametrize("listing", [
    lambda: os.listdir("logs"), lambda: list(os.scandir("logs")), lambda: list(os.walk("logs")),
    lambda: list(Path("logs").iterdir()), lambda: glob.glob("logs/*"),
])
def test_a_listing_of_a_directory_an_earlier_repeat_changed_names_the_entries(carried: Sink,
                                                                               listing: Any) -> None:
    listing()
    os.listdir("old")  # unchanged since before the audit
    events = [e for e in carried.of("carried") if e["path"] == "logs"]
    assert [(e["what"], e["entries"]) for e in events] == [("list", ["version_0"])]
    assert all(e["path"] != "old" for e in carried.of("carried"))


def test_missing_files_descriptors_and_special_files_pass_through(carried: Sink) -> None:
    with pytest.raises(FileNotFoundError), open("nowhere.txt"):
        pass
    fd = os.open("data.csv", os.O_RDONLY)
    with open(fd) as fh:
        fh.read()
    with open("/proc/self/status") as fh:
        fh.read()
    assert carried.of("carried") == []


def test_nothing_is_installed_outside_an_audit(evidence: tuple[Evidence, Sink]) -> None:
    ev, _ = evidence
    before = len(patch.patched())
    file_access.install(ev)  # no audit_started: the evidence of a lone run has no window
    assert len(patch.patched()) == before


def test_a_read_records_the_bytes_the_file_held_once_per_path_and_line(carried: Sink) -> None:
    for _ in range(2):
        Path("data.csv").read_text()  # one line of the script: once
    [event] = carried.of("file-read")
    assert set(event) == set(get_type_hints(FileReadEvent)) - {"at", "worker"}
    assert (event["path"], event["size"], event["lines"], event["digest"]) == \
        ("data.csv", 1, 0, digest_bytes(b"1"))


def test_a_file_appended_to_and_read_back_records_what_it_held_at_each_read(carried: Sink) -> None:
    Path("log.txt").write_text("a\n")
    Path("log.txt").read_text()
    with open("log.txt", "a+") as fh:  # appending and reading: what was there is read
        fh.write("b\n")
    Path("log.txt").read_text()
    assert [(e["lines"], e["size"]) for e in carried.of("file-read")] == [(1, 2), (1, 2), (2, 4)]


def test_writes_and_installed_packages_files_record_no_read(carried: Sink) -> None:
    with open("data.csv", "w+") as fh:  # truncated: nothing that was there is read
        fh.read()
    with open(pytest.__file__) as fh:
        fh.read()
    assert carried.of("file-read") == []


def test_a_large_file_is_digested_by_its_size_and_ends(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\n" * (file_access.MAX_WHOLE + 1))
    size, lines, _ = file_access.file_digest(str(big))
    assert (size, lines) == (file_access.MAX_WHOLE + 1, -1)
