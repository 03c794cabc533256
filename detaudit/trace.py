"""The trace file: a versioned, streaming, pickle-free record of one repeat.

Layout (docs/trace-format.md): an 8-byte magic, then frames of `tag (1 byte) | length (u32 LE) |
payload`. Tags: H header (JSON), S new strings (JSON list, appended to the string table),
R records (packed `RECORD_DTYPE` rows), E evidence event (JSON), F footer (JSON). Frames are
appended whole on an unbuffered descriptor, so a repeat killed at any moment leaves a readable
prefix (a frame cut short is ignored); a missing footer marks the trace incomplete.
"""

from __future__ import annotations

import enum
import json
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detaudit.errors import TraceError

MAGIC = b"\x89DTRACE\n"
FORMAT_NAME = "detaudit-trace"
FORMAT_VERSION = 1
N_SAMPLES = 4

RECORD_DTYPE = np.dtype(
    [
        ("kind", "u1"), ("dtype", "u1"), ("flags", "u1"), ("reserved", "u1"),
        ("name", "<u4"), ("module", "<u4"), ("loc", "<u4"), ("step", "<u4"),
        ("shape", "<u4"), ("aux", "<u4"),
        ("digest", "<u8"), ("in_ordered", "<u8"), ("in_unordered", "<u8"),
        ("samples", "<f8", (N_SAMPLES,)),
    ]
)

_FRAME_HEAD = struct.Struct("<cI")
# One RECORD_DTYPE row, packed as the writer queues it: 4x faster than numpy on lists of tuples.
_ROW = struct.Struct("<4B6I3Q4d")
assert _ROW.size == RECORD_DTYPE.itemsize
_MAX_FRAME = 1 << 30
FLUSH_EVERY = 4096
THREAD_BLOCK_LIMIT = 1 << 17  # records from other threads held for one canonical block, at most


class Kind(enum.IntEnum):
    """What a record fingerprints. Values are stored in traces: never renumber."""

    OUTPUT = 1      # a module's forward output
    GRAD = 2        # a parameter's gradient, just before optimizer.step
    PARAM = 3       # a parameter, just after optimizer.step
    OPTSTATE = 4    # an optimizer state tensor, just after optimizer.step
    SAVE = 5        # a tensor passed to torch.save
    CHECKPOINT = 6  # a tensor passed to detaudit.checkpoint
    OP = 7          # an aten op's output (op granularity)
    INPUT = 8       # an input to a root module's forward (the data the model was given)


class Flag(enum.IntFlag):
    BACKWARD = 1    # OP record produced during the backward pass
    DEVICE = 2      # digest computed on an accelerator (not comparable bitwise with CPU digests)
    RANDOM = 4      # OP record of an op that draws from an RNG
    NO_DATA = 8     # no contents could be read (meta tensor, unsupported layout)
    UNINIT = 16     # OP record of an op that read memory nothing had written (torch.empty and kin)
    THREAD = 32     # recorded on a thread other than the main one: written in canonical order (TraceWriter.sync)


_THREAD = int(Flag.THREAD)  # a plain int: IntFlag arithmetic costs a Python call per record


class TraceWriter:
    """Appends records and events to one trace file. Inert in forked children (DataLoader workers).

    Thread-safe: one lock (reentrant, for a flush from a signal handler) around the queues. Records
    flagged THREAD (made on another thread) arrive in scheduling order, which changes from run to run;
    they are held and written by `sync` as one block sorted by content, so a deterministic threaded
    script writes identical traces and a value that differs still shows as a difference at its name.
    """

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._pid = os.getpid()
        self._rows: list[bytes] = []  # packed records not yet written
        self._strings: dict[str, int] = {"": 0}
        self._texts: list[str] = [""]  # id -> text, to sort THREAD records by name
        self._threaded: list[tuple[Any, ...]] = []  # THREAD records waiting for `sync`
        self._lock = threading.RLock()
        self._pending_strings: list[str] = []
        self.records_written = 0
        self.closed = False
        self.busy = False  # inside flush(): a signal handler must not flush again

        head = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **header}
        _write_all(self._fd, MAGIC + self._frame(b"H", json.dumps(head).encode()))

    @staticmethod
    def _frame(tag: bytes, payload: bytes) -> bytes:
        return _FRAME_HEAD.pack(tag, len(payload)) + payload

    def intern(self, text: str) -> int:
        """The string-table id of `text` (names, locations, shapes are stored once)."""
        sid = self._strings.get(text)
        if sid is None:
            with self._lock:
                sid = self._strings.get(text)
                if sid is None:
                    sid = len(self._strings)
                    self._strings[text] = sid
                    self._texts.append(text)
                    self._pending_strings.append(text)
        return sid

    def text(self, sid: int) -> str:
        """The text of an interned string id."""
        return self._texts[sid]

    def add(self, row: tuple[Any, ...]) -> None:
        """Queue one record; `row` follows RECORD_DTYPE's field order (samples last, as a 4-tuple)."""
        if row[2] & _THREAD:
            with self._lock:
                self._threaded.append(row)
                if len(self._threaded) >= THREAD_BLOCK_LIMIT:
                    self.sync()
            return
        packed = _ROW.pack(*row[:-1], *row[-1])
        with self._lock:
            self._rows.append(packed)
            if len(self._rows) >= FLUSH_EVERY:
                self.flush()

    def sync(self) -> None:
        """Queue the records made on other threads since the last sync, sorted by content.

        Called at each optimizer step and at close: threads that run between two such points leave
        the same block whatever the scheduling (over THREAD_BLOCK_LIMIT records, blocks are cut early).
        """
        with self._lock:
            if not self._threaded:
                return
            texts = self._texts
            # step, kind, the strings' texts (ids depend on which thread interned first), then content
            self._threaded.sort(key=lambda r: (r[7], r[0], texts[r[4]], texts[r[5]], texts[r[8]], texts[r[6]],
                                               texts[r[9]], r[1], r[2], r[10], r[11], r[12]))
            self._rows.extend(_ROW.pack(*r[:-1], *r[-1]) for r in self._threaded)
            self._threaded.clear()

    @property
    def position(self) -> int:
        """Index the next record will get."""
        return self.records_written + len(self._rows)

    def event(self, event: dict[str, Any]) -> None:
        """Write one evidence event, positioned at the current record index."""
        if self.closed or os.getpid() != self._pid:
            return
        with self._lock:
            self.flush()
            payload = json.dumps({"at": self.position, **event}, default=str).encode()
            _write_all(self._fd, self._frame(b"E", payload))

    def flush(self) -> None:
        if self.closed or os.getpid() != self._pid:
            self._rows.clear()
            return
        self._lock.acquire()
        self.busy = True
        try:
            out = b""
            if self._pending_strings:
                out += self._frame(b"S", json.dumps(self._pending_strings).encode())
            if self._rows:
                out += self._frame(b"R", b"".join(self._rows))
            if out:
                _write_all(self._fd, out)
            self.records_written += len(self._rows)
            self._rows.clear()
            self._pending_strings = []
        finally:
            self.busy = False
            self._lock.release()

    def abandon(self) -> None:
        """Close without a footer: the trace reads as incomplete (a repeat that never finished)."""
        if not self.closed and os.getpid() == self._pid:
            self.flush()
            os.close(self._fd)
            self.closed = True

    def close(self, footer: dict[str, Any]) -> None:
        """Flush and write the footer that marks the trace complete."""
        if self.closed or os.getpid() != self._pid:
            return
        self.sync()
        self.flush()
        foot = {"records": self.records_written, **footer}
        _write_all(self._fd, self._frame(b"F", json.dumps(foot, default=str).encode()))
        os.close(self._fd)
        self.closed = True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@dataclass
class Trace:
    """One repeat's trace, read fully (use RecordStream to compare large traces)."""

    path: Path
    header: dict[str, Any]
    strings: list[str]
    records: np.ndarray
    events: list[dict[str, Any]] = field(default_factory=list)
    footer: dict[str, Any] | None = None

    @property
    def complete(self) -> bool:
        return self.footer is not None

    def text(self, sid: int) -> str:
        return self.strings[sid]


def _fail(path: Path, why: str) -> TraceError:
    return TraceError(f"{path}: {why}")


def _frames(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Yield (tag, payload) frames; stop quietly at a truncated tail (a killed repeat)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the `with` below; open errors need their own message
    except OSError as exc:
        raise _fail(path, f"cannot open trace ({exc.strerror})") from None
    with fh:
        magic = fh.read(len(MAGIC))
        if magic != MAGIC:
            raise _fail(path, "not a detaudit trace (wrong magic bytes); was it written by detaudit run?")
        while True:
            head = fh.read(_FRAME_HEAD.size)
            if len(head) < _FRAME_HEAD.size:
                return
            tag, length = _FRAME_HEAD.unpack(head)
            if tag not in b"HSREF" or length > _MAX_FRAME:
                raise _fail(path, f"corrupt trace: bad frame header at byte {fh.tell() - _FRAME_HEAD.size}")
            payload = fh.read(length)
            if len(payload) < length:
                return
            yield tag, payload


def read_footer(path: Path) -> dict[str, Any] | None:
    """A trace's footer without reading its records (frames are skipped by length); None when the
    trace is missing, incomplete or not readable as a trace (RecordStream says why)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                return None
            while True:
                head = fh.read(_FRAME_HEAD.size)
                if len(head) < _FRAME_HEAD.size:
                    return None
                tag, length = _FRAME_HEAD.unpack(head)
                if tag == b"F":
                    footer = json.loads(fh.read(length))
                    return footer if isinstance(footer, dict) else None
                fh.seek(length, os.SEEK_CUR)
    except (OSError, ValueError):
        return None


def _json(path: Path, payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        raise _fail(path, "corrupt trace: a metadata frame is not valid JSON") from None


class RecordStream:
    """Reads a trace's records in chunks of a caller-chosen size, keeping memory bounded."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._frames = _frames(self.path)
        self.header: dict[str, Any] = {}
        self.strings: list[str] = [""]
        self.events: list[dict[str, Any]] = []
        self.footer: dict[str, Any] | None = None
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._done = False
        tag, payload = next(self._frames, (b"", b""))
        if tag != b"H":
            raise _fail(self.path, "corrupt trace: missing header")
        self.header = _json(self.path, payload)
        if not isinstance(self.header, dict) or self.header.get("format") != FORMAT_NAME:
            raise _fail(self.path, "not a detaudit trace (foreign header)")
        version = self.header.get("version")
        if version != FORMAT_VERSION:
            raise _fail(
                self.path,
                f"trace format version {version} is not supported by this detaudit "
                f"(it reads version {FORMAT_VERSION}); use the detaudit release that wrote it",
            )

    def _pull(self) -> bool:
        for tag, payload in self._frames:
            if tag == b"R":
                if len(payload) % RECORD_DTYPE.itemsize:
                    raise _fail(self.path, "corrupt trace: record frame of the wrong size")
                rows = np.frombuffer(payload, dtype=RECORD_DTYPE)
                self._buffer.append(rows)
                self._buffered += len(rows)
                return True
            if tag == b"S":
                new = _json(self.path, payload)
                if not isinstance(new, list):
                    raise _fail(self.path, "corrupt trace: bad string table")
                self.strings.extend(str(s) for s in new)
            elif tag == b"E":
                self.events.append(_json(self.path, payload))
            elif tag == b"F":
                self.footer = _json(self.path, payload)
            else:
                raise _fail(self.path, "corrupt trace: a second header")
        self._done = True
        return False

    def take(self, n: int) -> np.ndarray:
        """Up to `n` next records (fewer only at the end of the trace)."""
        while self._buffered < n and not self._done:
            self._pull()
        if not self._buffer:
            return np.empty(0, dtype=RECORD_DTYPE)
        joined = self._buffer[0] if len(self._buffer) == 1 else np.concatenate(self._buffer)
        out, rest = joined[:n], joined[n:]
        self._buffer = [rest] if len(rest) else []
        self._buffered = len(rest)
        return out

    def drain(self) -> None:
        """Read to the end so events and footer are known."""
        while not self._done:
            self._pull()
            self._buffer.clear()
            self._buffered = 0

    def check_strings(self, records: np.ndarray) -> None:
        top = len(self.strings)
        for column in ("name", "module", "loc", "shape", "aux"):
            if len(records) and int(records[column].max()) >= top:
                raise _fail(self.path, "corrupt trace: a record names a string that was never written")


def read_trace(path: Path | str) -> Trace:
    """Read a whole trace (for `show`, causes and tests; compare streams instead)."""
    stream = RecordStream(Path(path))
    chunks = []
    while True:
        chunk = stream.take(1 << 16)
        if not len(chunk):
            break
        chunks.append(chunk)
    stream.drain()
    records = np.concatenate(chunks) if chunks else np.empty(0, dtype=RECORD_DTYPE)
    stream.check_strings(records)
    return Trace(stream.path, stream.header, stream.strings, records, stream.events, stream.footer)
