"""The trace format: round trip, killed-repeat prefixes, refusal of foreign/corrupt/unknown-version
files, inert writers in forked children, and no pickle on the read path."""

from __future__ import annotations

import ast
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from synthetic import Rec, training_records, write_trace

import detaudit
from detaudit import trace as trace_mod
from detaudit.errors import TraceError
from detaudit.trace import (
    FORMAT_VERSION,
    MAGIC,
    RECORD_DTYPE,
    Flag,
    Kind,
    Record,
    RecordStream,
    TraceWriter,
    read_events,
    read_footer,
    read_trace,
    sha256_regular,
)


def _names(tr: trace_mod.Trace) -> list[str]:
    return [tr.strings[i] for i in tr.records["name"]]


def test_round_trip_records_strings_events_footer(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    events = [(0, {"type": "rng", "source": "torch"}), (7, {"type": "nondet_op", "op": "index_add"})]
    path = write_trace(tmp_path / "t.trace", recs, {"exit_code": 0, "error": None}, events=events,
                       header={"repeat": 2, "script": "train.py"}, flush_every=5)
    tr = read_trace(path)
    assert tr.header["format"] == "detaudit-trace"
    assert tr.header["version"] == FORMAT_VERSION
    assert tr.header["repeat"] == 2
    assert tr.header["script"] == "train.py"
    assert tr.complete
    assert tr.footer == {"records": len(recs), "exit_code": 0, "error": None}
    assert len(tr.records) == len(recs)
    assert _names(tr) == [r.name for r in recs]
    assert [tr.strings[i] for i in tr.records["module"]] == [r.module for r in recs]
    assert [tr.strings[i] for i in tr.records["loc"]] == [r.loc for r in recs]
    assert list(tr.records["digest"]) == [r.digest for r in recs]
    assert list(tr.records["step"]) == [r.step for r in recs]
    assert [Kind(k) for k in tr.records["kind"]] == [r.kind for r in recs]
    assert np.array_equal(tr.records["samples"], np.array([r.samples for r in recs]))
    assert [(e["at"], e["type"]) for e in tr.events] == [(0, "rng"), (7, "nondet_op")]
    assert tr.strings[0] == ""
    assert len(tr.strings) == len(set(tr.strings))


def test_full_u64_digests_and_nan_samples_survive(tmp_path: Path) -> None:
    nan = float("nan")
    recs = [Rec("a", digest=2**64 - 1, samples=(nan, -0.0, float("inf"), 1e-310))]
    tr = read_trace(write_trace(tmp_path / "t.trace", recs, {"exit_code": 0}))
    assert int(tr.records["digest"][0]) == 2**64 - 1
    s = tr.records["samples"][0]
    assert np.isnan(s[0])
    assert np.signbit(s[1])
    assert np.isinf(s[2])
    assert s[3] == 1e-310


@pytest.mark.parametrize("size, limit", [(1, float("inf")), (4, 10), (7, 9), (1 << 16, 0), (3, 1000)])
def test_chunks_cover_the_first_records_in_order(tmp_path: Path, size: int, limit: float) -> None:
    recs = training_records(steps=3)
    path = write_trace(tmp_path / "r.trace", recs, {"exit_code": 0})
    chunks = list(trace_mod.RecordStream(path).chunks(size, limit))
    assert all(0 < len(c) <= size for c in chunks)
    joined = np.concatenate(chunks) if chunks else np.empty(0, dtype=RECORD_DTYPE)
    assert joined.tobytes() == read_trace(path).records[: int(min(limit, len(recs)))].tobytes()


def test_empty_trace_round_trips(tmp_path: Path) -> None:
    tr = read_trace(write_trace(tmp_path / "t.trace", [], {"exit_code": 3}))
    assert len(tr.records) == 0
    assert tr.footer == {"records": 0, "exit_code": 3}


def test_record_layout_is_the_documented_84_bytes() -> None:
    assert RECORD_DTYPE.itemsize == 84


def test_a_record_is_written_by_name_or_by_position_byte_for_byte_alike(tmp_path: Path) -> None:
    """trace.Record names the fields of RECORD_DTYPE; the recorder's plain tuples write the same bytes."""
    assert Record._fields == RECORD_DTYPE.names
    fields = (int(Kind.OP), 7, int(Flag.RANDOM), 0, 1, 0, 2, 3, 0, 0, 2**64 - 1, 5, 6, (1.5, -0.0, float("inf"), 2.0))
    files = []
    for row in (fields, Record(*fields)):
        path = tmp_path / f"{type(row).__name__}.trace"
        writer = TraceWriter(path, {"pid": 1})
        writer.intern("aten.rand.default")
        writer.intern("train.py:3")
        writer.add(row)
        writer.close({"exit_code": 0})
        files.append(path.read_bytes())
    assert files[0] == files[1]
    [got] = read_trace(tmp_path / "Record.trace").records
    assert [got[name].item() for name in Record._fields[:-1]] == list(fields[:-1])  # read back by name
    assert got["samples"].tolist() == list(fields[-1])


def test_a_block_of_rows_is_written_as_its_rows_one_by_one(tmp_path: Path) -> None:
    """`add_block` (the optimizer step's records, one array) writes what `add` writes row by row, in queue order
    with the rows around it, and counts its rows in `position` and across flushes."""
    rows = [(int(Kind.PARAM), 1, 0, 0, i, 0, 0, 2, 0, 0, 2**64 - 1 - i, 0, 0, (float(i), -0.0, float("nan"), 1.0))
            for i in range(1, 7)]
    files = []
    for blocked in (False, True):
        path = tmp_path / f"{blocked}.trace"
        writer = TraceWriter(path, {"pid": 1})
        for i in range(1, 7):
            writer.intern(f"p{i}")
        writer.add(rows[0])
        if blocked:
            block = np.zeros(4, RECORD_DTYPE)
            for i, row in enumerate(rows[1:5]):
                block[i] = (*row[:-1], row[-1])
            writer.add_block(block)
            assert writer.position == 5
            writer.flush()
            writer.add_block(block[:0])
        else:
            for row in rows[1:5]:
                writer.add(row)
            writer.flush()
        writer.add(rows[5])
        assert writer.position == 6
        writer.close({"exit_code": 0})
        files.append(read_trace(path).records.tobytes())
    assert files[0] == files[1]


def test_identical_content_gives_identical_record_bodies(tmp_path: Path) -> None:
    recs = training_records()
    a = read_trace(write_trace(tmp_path / "a.trace", recs, {"exit_code": 0}, header={"pid": 1}))
    b = read_trace(write_trace(tmp_path / "b.trace", recs, {"exit_code": 0}, header={"pid": 2}))
    assert a.records.tobytes() == b.records.tobytes()
    assert a.strings == b.strings


def _frame_ends(data: bytes) -> list[int]:
    """Byte offsets where each frame ends (parsed independently of the reader under test)."""
    ends, pos = [], len(MAGIC)
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos + 1)
        pos += 5 + length
        ends.append(pos)
    return ends


def test_truncation_at_every_offset_reads_as_incomplete_prefix(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    full = write_trace(tmp_path / "full.trace", recs, {"exit_code": 0}, events=[(4, {"type": "x"})],
                       flush_every=3)
    data = full.read_bytes()
    ends = _frame_ends(data)
    assert len(ends) >= 8
    header_end = ends[0]
    cut_path = tmp_path / "cut.trace"
    for cut in range(ends[-6], len(data) + 1):  # every byte of the last frames, and the whole file
        cut_path.write_bytes(data[:cut])
        tr = read_trace(cut_path)
        n = len(tr.records)
        assert _names(tr) == [r.name for r in recs[:n]], cut
        assert list(tr.records["digest"]) == [r.digest for r in recs[:n]], cut
        assert tr.complete == (cut == len(data)), cut
    for cut in range(0, header_end):  # inside the magic or header: refused, never a crash
        cut_path.write_bytes(data[:cut])
        with pytest.raises(TraceError):
            read_trace(cut_path)
    cut_path.write_bytes(data[:header_end])
    assert len(read_trace(cut_path).records) == 0


def test_abandoned_writer_leaves_incomplete_trace(tmp_path: Path) -> None:
    tr = read_trace(write_trace(tmp_path / "t.trace", training_records(), footer=None))
    assert not tr.complete
    assert tr.footer is None
    assert len(tr.records) == len(training_records())


def test_wrong_magic_is_not_a_detaudit_trace(tmp_path: Path) -> None:
    path = tmp_path / "foreign.trace"
    path.write_bytes(b"PK\x03\x04 this is a zip file, not a trace" * 10)
    with pytest.raises(TraceError, match="not a detaudit trace"):
        read_trace(path)
    for cut in (b"", MAGIC[:3]):  # cut before the header was whole (killed at start, disk full): empty
        path.write_bytes(cut)
        with pytest.raises(TraceError, match="empty trace"):
            read_trace(path)


def _handmade(path: Path, header: object, rest: bytes = b"") -> Path:
    payload = json.dumps(header).encode()
    path.write_bytes(MAGIC + b"H" + struct.pack("<I", len(payload)) + payload + rest)
    return path


def test_foreign_header_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not a detaudit trace"):
        read_trace(_handmade(tmp_path / "t", {"format": "something-else", "version": 1}))
    with pytest.raises(TraceError, match="not a detaudit trace"):
        read_trace(_handmade(tmp_path / "u", [1, 2, 3]))


def test_a_version_that_only_equals_the_format_version_in_python_is_refused(tmp_path: Path) -> None:
    path = _handmade(tmp_path / "t", {"format": "detaudit-trace", "version": float(FORMAT_VERSION)})
    with pytest.raises(TraceError, match=rf"trace format version {FORMAT_VERSION}\.0 is not supported"):
        read_trace(path)


def test_unknown_version_is_refused_naming_the_version(tmp_path: Path) -> None:
    path = _handmade(tmp_path / "t", {"format": "detaudit-trace", "version": 99})
    with pytest.raises(TraceError, match=r"version 99") as info:
        read_trace(path)
    assert str(FORMAT_VERSION) in str(info.value)


@pytest.mark.parametrize("garbage", [
    b"Z\x05\x00\x00\x00hello",                # unknown tag
    b"R\xff\xff\xff\xff" + b"\x00" * 16,      # oversize frame
    b"\x00\x00\x00\x00\x00",                  # zeros
], ids=["unknown-tag", "oversize", "zeros"])
def test_garbage_frame_header_is_corrupt(tmp_path: Path, garbage: bytes) -> None:
    good = write_trace(tmp_path / "good.trace", training_records(), {"exit_code": 0}).read_bytes()
    ends = _frame_ends(good)
    bad = tmp_path / "bad.trace"
    bad.write_bytes(good[:ends[1]] + garbage + good[ends[1]:])
    with pytest.raises(TraceError, match="corrupt trace"):
        read_trace(bad)


@pytest.mark.parametrize("frame", [
    b"S" + struct.pack("<I", 5) + b"[1, 2",               # invalid JSON string table
    b"S" + struct.pack("<I", 4) + b'{"a"',                # invalid JSON
    b"S" + struct.pack("<I", 2) + b"{}",                  # valid JSON, not a list
    b"R" + struct.pack("<I", 10) + b"\x00" * 10,          # record frame of the wrong size
    b"E" + struct.pack("<I", 3) + b"\xff\xfe\xfd",        # not UTF-8
    b"H" + struct.pack("<I", 2) + b"{}",                  # a second header
], ids=["bad-json-list", "bad-json", "strings-not-list", "record-size", "not-utf8", "second-header"])
def test_malformed_frames_are_corrupt(tmp_path: Path, frame: bytes) -> None:
    path = _handmade(tmp_path / "t", {"format": "detaudit-trace", "version": FORMAT_VERSION}, frame)
    with pytest.raises(TraceError, match="corrupt trace"):
        read_trace(path)


def test_record_naming_unwritten_string_is_corrupt(tmp_path: Path) -> None:
    row = np.zeros(1, dtype=RECORD_DTYPE)
    row["name"] = 7
    rec = row.tobytes()
    path = _handmade(tmp_path / "t", {"format": "detaudit-trace", "version": FORMAT_VERSION},
                     b"R" + struct.pack("<I", len(rec)) + rec)
    with pytest.raises(TraceError, match="never written"):
        read_trace(path)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot open"):
        read_trace(tmp_path / "nope.trace")
    with pytest.raises(TraceError):
        read_trace(tmp_path)  # a directory


def test_forked_child_never_writes_to_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, {"repeat": 0})
    writer.add((1, 1, 0, 0, writer.intern("parent.before"), 0, 0, 0, writer.intern("4"), 0, 1, 0, 0,
                (0.0,) * 4))
    writer.add((1, 1, 0, 0, writer.intern("parent.pending"), 0, 0, 0, writer.intern("4"), 0, 2, 0, 0,
                (0.0,) * 4))
    size_before = path.stat().st_size
    pid = os.fork()
    if pid == 0:  # a DataLoader worker: it inherits the writer, with unflushed rows
        try:
            for i in range(trace_mod.FLUSH_EVERY + 10):
                writer.add((1, 1, 0, 0, writer.intern(f"child.{i}"), 0, 0, 0, 0, 0, 3, 0, 0, (0.0,) * 4))
            writer.event({"type": "child"})
            writer.flush()
            writer.close({"exit_code": 99})
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert path.stat().st_size == size_before
    writer.add((1, 1, 0, 0, writer.intern("parent.after"), 0, 0, 0, writer.intern("4"), 0, 4, 0, 0,
                (0.0,) * 4))
    writer.close({"exit_code": 0})
    tr = read_trace(path)
    assert _names(tr) == ["parent.before", "parent.pending", "parent.after"]
    assert tr.events == []
    assert tr.footer is not None
    assert tr.footer["exit_code"] == 0
    assert not any(s.startswith("child") for s in tr.strings)


_PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


def test_no_pickle_anywhere_in_detaudit() -> None:
    """Source check: no pickle-family import, no torch.load, no np.load(allow_pickle=True)."""
    root = Path(detaudit.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                offenders += [f"{path}: import {a.name}" for a in node.names if a.name.split(".")[0] in _PICKLE_MODULES]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _PICKLE_MODULES:
                offenders.append(f"{path}: from {node.module}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = ast.unparse(node.func.value)
                if (owner, node.func.attr) in {("torch", "load"), ("np", "load"), ("numpy", "load")} or any(
                        k.arg == "allow_pickle" for k in node.keywords):
                    offenders.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_reading_a_trace_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pickle used while reading a trace")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    path = write_trace(tmp_path / "t.trace", training_records(), {"exit_code": 0}, events=[(1, {"type": "x"})])
    assert len(read_trace(path).records) == len(training_records())
    # a pickle disguised as a trace is refused as foreign, not executed
    (tmp_path / "evil.trace").write_bytes(b"\x80\x04\x95" + b"\x00" * 40)
    with pytest.raises(TraceError, match="not a detaudit trace"):
        read_trace(tmp_path / "evil.trace")


def test_records_from_other_threads_are_written_in_one_order_whatever_the_scheduling(tmp_path: Path) -> None:
    from detaudit.trace import Flag

    def row(name: int, digest: int) -> tuple:
        return (1, 1, int(Flag.THREAD), 0, name, 0, 0, 0, 0, 0, digest, 0, 0, (0.0, 0.0, 0.0, 0.0))

    bodies = []
    for order, path in (((0, 1, 2), tmp_path / "a.trace"), ((2, 0, 1), tmp_path / "b.trace")):
        w = TraceWriter(path, {})
        names = [w.intern(s) for s in ("m.b", "m.a")] if order[0] == 0 else [w.intern(s) for s in ("m.a", "m.b")]
        ids = {"m.b": names[0] if order[0] == 0 else names[1], "m.a": names[1] if order[0] == 0 else names[0]}
        rows = [row(ids["m.b"], 5), row(ids["m.a"], 9), row(ids["m.a"], 3)]
        for i in order:  # arrival order and string ids differ between the two "runs"
            w.add(rows[i])
        w.close({"exit_code": 0})
        tr = read_trace(path)
        bodies.append([(tr.strings[r["name"]], int(r["digest"])) for r in tr.records])
    assert bodies[0] == bodies[1] == [("m.a", 3), ("m.a", 9), ("m.b", 5)]


def test_writer_never_writes_into_a_descriptor_the_script_took_over(tmp_path: Path) -> None:
    """A script closes every descriptor and opens its own file, which gets the trace's number."""
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, {"repeat": 0})
    writer.add((int(Kind.OUTPUT), 1, 0, 0, writer.intern("a"), 0, 0, 0, writer.intern("1"), 0, 1, 0, 0,
                (1.0, 1.0, 1.0, 1.0)))
    writer.flush()
    user_file = tmp_path / "user.txt"
    user_fd = os.open(user_file, os.O_WRONLY | os.O_CREAT)
    os.dup2(user_fd, writer._fd)  # the trace's descriptor number now refers to the user's file
    os.close(user_fd)
    taken = writer._fd
    writer.add((int(Kind.OUTPUT), 1, 0, 0, writer.intern("b"), 0, 0, 0, writer.intern("1"), 0, 2, 0, 0,
                (1.0, 1.0, 1.0, 1.0)))
    writer.close({"exit_code": 0})
    assert user_file.read_bytes() == b""  # not one trace byte in the user's file
    os.fstat(taken)  # ... and the user's descriptor was left open
    os.close(taken)
    trace = read_trace(path)  # the trace was reopened by path and finished
    assert trace.complete
    assert [trace.strings[i] for i in trace.records["name"]] == ["a", "b"]


def test_a_failed_write_marks_the_trace_lost_and_incomplete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk full mid-run: the script is not disturbed, and the trace never claims to be whole."""
    import errno

    from detaudit.trace import writer as trace_module

    path = tmp_path / "t.trace"
    writer = TraceWriter(path, {"repeat": 0})

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trace_module, "_write_all", full)
    writer.add((int(Kind.OUTPUT), 1, 0, 0, writer.intern("a"), 0, 0, 0, writer.intern("1"), 0, 1, 0, 0,
                (1.0, 1.0, 1.0, 1.0)))
    writer.flush()  # no exception reaches the recorder (and the user's forward hook)
    writer.close({"exit_code": 0})
    assert writer.lost is not None
    assert "No space left" in writer.lost
    monkeypatch.undo()
    assert not read_trace(path).complete


def test_trace_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    TraceWriter(path, {"repeat": 0}).close({})
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_reader_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = Path("/dev/zero") if kind == "device" else tmp_path / "x.trace"
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    elif kind == "dir":
        path.mkdir()
    with pytest.raises(TraceError, match="not a regular file|Is a directory"):
        read_trace(path)


def test_reader_never_follows_a_symlink_even_to_a_valid_trace(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.trace"
    TraceWriter(real, {"repeat": 0}).close({"exit_code": 0})
    (tmp_path / "repeat-0.trace").symlink_to(real)
    for read in (read_trace, lambda p: RecordStream(p), lambda p: sha256_regular(p, "trace")):
        with pytest.raises(TraceError, match="symbolic link"):
            read(tmp_path / "repeat-0.trace")
    assert read_footer(tmp_path / "repeat-0.trace") is None


def test_events_of_one_kind_are_read_without_the_records(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, {"repeat": 0})
    writer.event({"type": "file-write", "path": "/w/ckpt.pt", "loc": "train.py:3"})
    writer.add((1, 0, 0, 0, writer.intern("m"), 0, 0, 0, 0, 0, 7, 0, 0, (0.0, 0.0, 0.0, 0.0)))
    writer.event({"type": "clock", "fn": "time.time", "loc": "train.py:4"})
    writer.abandon()  # no footer: a killed repeat's events still count
    assert [e["path"] for e in read_events(path, "file-write")] == ["/w/ckpt.pt"]
    assert read_events(tmp_path / "missing.trace", "file-write") == []
    path.write_bytes(path.read_bytes()[:-5])  # cut inside the last frame
    assert len(read_events(path, "file-write")) == 1


def test_a_lying_frame_length_is_a_truncated_tail_not_an_allocation(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    TraceWriter(path, {"repeat": 0}).close({"exit_code": 0})
    path.write_bytes(path.read_bytes() + b"R" + struct.pack("<I", (1 << 30) - 1))
    assert read_trace(path).complete


def _row(writer: TraceWriter, name: str, digest: int) -> Record:
    return Record(int(Kind.CHECKPOINT), 0, 0, 0, writer.intern(name), 0, 0, 0, 0, 0, digest, 0, 0, (0.0,) * 4)


def test_the_writer_stops_at_the_string_tables_limit_and_the_reader_reads_what_it_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """1.1 million distinct checkpoint names made a trace detaudit then called corrupt (exit 4)."""
    from detaudit.trace import reader, writer

    monkeypatch.setattr(writer, "MAX_STRINGS", 8)
    monkeypatch.setattr(reader, "MAX_STRINGS", 8)
    w = TraceWriter(tmp_path / "t.trace", {"repeat": 0})
    for i in range(20):  # id 0 is "": 7 names fit
        w.add(_row(w, f"ck{i}", i))
    w.add(_row(w, "ck0", 0))  # a known name after the stop is not written either: no hole in the recording
    w.close({"exit_code": 0})
    tr = read_trace(tmp_path / "t.trace")
    assert _names(tr) == [f"ck{i}" for i in range(7)]
    assert list(tr.records["digest"]) == list(range(7))
    assert tr.footer is not None
    assert "more than 8 distinct names" in tr.footer["recording_stopped"]
    assert capfd.readouterr().err.count("recording stopped") == 1


def test_the_writer_keeps_the_readers_event_limit_and_counts_what_it_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """600,000 torch.manual_seed calls (one seed event each) made a trace detaudit then called corrupt."""
    from detaudit.trace import reader, writer

    monkeypatch.setattr(writer, "MAX_EVENTS", 5)
    monkeypatch.setattr(reader, "MAX_EVENTS", 5)
    w = TraceWriter(tmp_path / "t.trace", {"repeat": 0})
    for i in range(9):
        w.event({"type": "seed", "value": i})
    w.add(_row(w, "after", 1))  # records go on
    w.close({"exit_code": 0})
    tr = read_trace(tmp_path / "t.trace")
    assert [e["value"] for e in tr.events] == [0, 1, 2, 3, 4]
    assert _names(tr) == ["after"]
    assert tr.footer is not None
    assert tr.footer["events_dropped"] == 4
    assert "recording_stopped" not in tr.footer
