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
import stat
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from detaudit import schema
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



class Record(NamedTuple):
    """One record, field for field as RECORD_DTYPE stores it (readers get RECORD_DTYPE rows: the same names).

    The writer takes any tuple in this order: the recorder builds plain tuples, because building a NamedTuple
    costs about 0.33 µs more per record (0.40 µs against 0.07 µs), some 13% of recording a small tensor (2.5 µs).
    """

    kind: int  # Kind
    dtype: int  # fingerprint.DTYPE_CODES
    flags: int  # Flag
    reserved: int
    name: int  # string ids, here and below up to aux
    module: int
    loc: int
    step: int  # optimizer steps completed before the record
    shape: int
    aux: int  # op records: the autograd node that ran a backward op
    digest: int
    in_ordered: int  # op records: digest of the inputs in order (0: unknown)
    in_unordered: int  # ... and as a multiset (same inputs, another order)
    samples: tuple[float, ...]  # N_SAMPLES sampled values


assert Record._fields == RECORD_DTYPE.names  # one field order for writer and readers
_FLAGS = Record._fields.index("flags")

_FRAME_HEAD = struct.Struct("<cI")
# One RECORD_DTYPE row, packed as the writer queues it: 4x faster than numpy on lists of tuples.
_ROW = struct.Struct("<4B6I3Q4d")
assert _ROW.size == RECORD_DTYPE.itemsize
_MAX_FRAME = 1 << 30
MAX_STRINGS = 1 << 20  # a string table bigger than this is no trace detaudit wrote (bounds compare's memory)
MAX_EVENTS = 1 << 19  # evidence is capped at the source (once per call site); more is no trace detaudit wrote
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
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        # a high descriptor: out of the way of a script that closes and reopens low ones
        self._fd = _high_fd(fd)
        st = os.fstat(self._fd)
        self._identity = (st.st_dev, st.st_ino)
        self._pid = os.getpid()
        self.lost: str | None = None  # why records could not be written (disk full, descriptor taken)
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
        self._write(MAGIC + self._frame(b"H", json.dumps(head).encode()))

    def _write(self, data: bytes) -> None:
        """Append to the trace, only if the descriptor still refers to it.

        A script may close every descriptor (`os.closerange`) and open its own file, which can
        take the trace's number: writing then would put trace frames into the user's file. The
        descriptor's device and inode are checked before each write; a descriptor that lost its
        file is reopened by path (same inode only). A write that fails (disk full) marks the
        trace `lost` and stops writing: a recording with a hole in it must read as incomplete.
        """
        if self.lost is not None:
            return
        try:
            if not self._owns_fd():
                self._reopen()
            if self.lost is None:
                _write_all(self._fd, data)
        except OSError as exc:
            self.lost = f"writing the trace failed: {exc.strerror or exc}"

    def _owns_fd(self) -> bool:
        try:
            st = os.fstat(self._fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    def _reopen(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            self.lost = "the trace's descriptor was closed by the script and the file could not be reopened"
            return
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._identity:
            os.close(fd)
            self.lost = "the trace's descriptor was closed by the script and its file was replaced"
            return
        self._fd = _high_fd(fd)

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
        """Queue one record; `row` is a `Record` or a plain tuple in its field order."""
        if row[_FLAGS] & _THREAD:
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

            def order(row: tuple[Any, ...]) -> tuple[Any, ...]:
                # step, kind, the strings' texts (ids depend on which thread interned first), then content
                r = Record._make(row)
                return (r.step, r.kind, texts[r.name], texts[r.module], texts[r.shape], texts[r.loc], texts[r.aux],
                        r.dtype, r.flags, r.digest, r.in_ordered, r.in_unordered)

            self._threaded.sort(key=order)
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
            self._write(self._frame(b"E", payload))

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
                self._write(out)
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
            self._close_fd()
            self.closed = True

    def _close_fd(self) -> None:
        if self._owns_fd():  # never close a descriptor that now belongs to the script
            os.close(self._fd)

    def close(self, footer: dict[str, Any]) -> None:
        """Flush and write the footer that marks the trace complete."""
        if self.closed or os.getpid() != self._pid:
            return
        self.sync()
        self.flush()
        if self.lost is None:  # a trace with a hole in it gets no footer: it must read as incomplete
            foot = {"records": self.records_written, **footer}
            self._write(self._frame(b"F", json.dumps(foot, default=str).encode()))
        self._close_fd()
        self.closed = True


_HIGH_FD = 900  # above what scripts open, below the usual 1024 soft limit


def _high_fd(fd: int) -> int:
    """Move `fd` to a high close-on-exec number when the limit allows (else keep it)."""
    import fcntl

    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD)
    except OSError:
        return fd
    os.close(fd)
    return high


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


class EmptyTrace(TraceError):
    """A trace cut before its header was whole: the repeat recorded nothing (read as incomplete)."""


def _fail(path: Path, why: str) -> TraceError:
    return TraceError(f"{path}: {why}")


def _frames(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Yield (tag, payload) frames; stop quietly at a truncated tail (a killed repeat)."""
    fh = open_regular(path, "trace")
    with fh:
        magic = fh.read(len(MAGIC))
        if len(magic) < len(MAGIC) and MAGIC.startswith(magic):
            return  # cut before the header was whole: an empty trace
        if magic != MAGIC:
            raise _fail(path, "not a detaudit trace (wrong magic bytes); was it written by detaudit run?")
        while True:
            head = fh.read(_FRAME_HEAD.size)
            if len(head) < _FRAME_HEAD.size:
                return
            tag, length = _FRAME_HEAD.unpack(head)
            if tag not in b"HSREF" or length > _MAX_FRAME:
                raise _fail(path, f"corrupt trace: bad frame header at byte {fh.tell() - _FRAME_HEAD.size}")
            if fh.tell() + length > os.fstat(fh.fileno()).st_size:
                return  # cut short (a killed repeat); checked first: a bogus length must not allocate
            payload = fh.read(length)
            if len(payload) < length:
                return
            yield tag, payload


def read_footer(path: Path) -> dict[str, Any] | None:
    """A trace's footer without reading its records (frames are skipped by length), field types checked;
    None when the trace is missing, incomplete or not readable as a trace (RecordStream says why)."""
    try:
        with open_regular(Path(path), "trace") as fh:  # a FIFO planted as a trace must not hang the report
            if fh.read(len(MAGIC)) != MAGIC:
                return None
            while True:
                head = fh.read(_FRAME_HEAD.size)
                if len(head) < _FRAME_HEAD.size:
                    return None
                tag, length = _FRAME_HEAD.unpack(head)
                if tag == b"F":
                    if fh.tell() + length > os.fstat(fh.fileno()).st_size:  # cut short (a bogus length never allocates)
                        return None
                    payload = fh.read(length)
                    return _object(Path(path), _json(Path(path), payload), "footer", schema.TRACE_FOOTER)
                fh.seek(length, os.SEEK_CUR)
    except (OSError, ValueError, TraceError):
        return None


def open_regular(path: Path, what: str, follow_symlinks: bool = True) -> Any:
    """Open a file detaudit reads (trace, run record) in binary mode: regular files only.

    A FIFO, a device (`/dev/zero`) or a directory named where a trace belongs would hang or
    never end; it is refused before any byte is read (O_NONBLOCK: opening a FIFO never waits).
    `follow_symlinks=False` for files whose text is shown (a run directory's stderr captures):
    a symlink planted there must not print a file from outside it.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _fail(path, f"cannot open {what} ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _fail(path, f"not a regular file; a {what} is a file detaudit wrote")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def load_json(data: bytes | str, where: str) -> Any:
    """JSON from disk; any parse failure (deep nesting included) is a TraceError naming `where`."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise TraceError(f"{where}: not valid JSON (or nested too deeply)") from None


def _json(path: Path, payload: bytes, what: str = "a metadata frame") -> Any:
    return load_json(payload, f"{path}: corrupt trace: {what}")


def _object(path: Path, value: Any, what: str, spec: schema.Spec) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, f"corrupt trace: the {what} is not a JSON object")
    return schema.check(value, spec, f"{path}: corrupt trace: {what}")


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
        if not tag:
            raise EmptyTrace(f"{self.path}: empty trace: the repeat ended (or its disk filled up) before its "
                             "header was written")
        if tag != b"H":
            raise _fail(self.path, "corrupt trace: missing header")
        self.header = _json(self.path, payload)
        if not isinstance(self.header, dict) or self.header.get("format") != FORMAT_NAME:
            raise _fail(self.path, "not a detaudit trace (foreign header)")
        version = self.header.get("version")
        if version != FORMAT_VERSION:
            raise _fail(
                self.path,
                f"trace format version {version!r} is not supported by this detaudit "
                f"(it reads version {FORMAT_VERSION}); use the detaudit release that wrote it",
            )
        schema.check(self.header, schema.TRACE_HEADER, f"{self.path}: corrupt trace: header")

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
                # counted before parsing: a table of millions of strings is refused without building it
                if len(self.strings) + (payload.count(b'"') - payload.count(b'\\"')) // 2 > MAX_STRINGS:
                    raise self._too_many_strings()
                new = _json(self.path, payload)
                if not isinstance(new, list) or not all(isinstance(s, str) for s in new):
                    raise _fail(self.path, "corrupt trace: bad string table")
                if len(self.strings) + len(new) > MAX_STRINGS:
                    raise self._too_many_strings()
                self.strings.extend(new)
            elif tag == b"E":
                if len(self.events) >= MAX_EVENTS:
                    raise _fail(self.path, f"corrupt trace: more than {MAX_EVENTS} evidence events; detaudit "
                                "refuses to load that many")
                self.events.append(_object(self.path, _json(self.path, payload), "evidence event", schema.EVENT))
            elif tag == b"F":
                self.footer = _object(self.path, _json(self.path, payload), "footer", schema.TRACE_FOOTER)
            else:
                raise _fail(self.path, "corrupt trace: a second header")
        self._done = True
        return False

    def _too_many_strings(self) -> TraceError:
        return _fail(self.path, f"corrupt trace: more than {MAX_STRINGS} distinct strings (names, locations, "
                     "shapes); detaudit refuses to load a string table that large")

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
