"""Reading a trace, validated at the boundary: regular files only, the format and version checked,
every metadata frame's fields typed (schema.py), tables bounded; a frame cut short (a killed repeat)
ends the trace quietly, and a trace with no footer reads as incomplete."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detaudit import schema
from detaudit.errors import TraceError
from detaudit.trace.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    FRAME_HEAD,
    FRAME_TAGS,
    MAGIC,
    MAX_EVENTS,
    MAX_FRAME,
    MAX_STRINGS,
    RECORD_DTYPE,
)


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
        if not _magic(fh, path):
            return  # cut before the header was whole: an empty trace
        yield from _whole_frames(fh, path)


def _magic(fh: Any, path: Path) -> bool:
    """Read the magic bytes: False when the file ends before they are whole (nothing written yet)."""
    magic = fh.read(len(MAGIC))
    if len(magic) < len(MAGIC) and MAGIC.startswith(magic):
        return False
    if magic != MAGIC:
        raise _fail(path, "not a detaudit trace (wrong magic bytes); was it written by detaudit run?")
    return True


def _whole_frames(fh: Any, path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Yield the frames from `fh`'s position on while they are whole; at one cut short (a killed repeat, or
    one still being written) stop with `fh` back at its start, so a later call reads it once it is whole."""
    while True:
        start = fh.tell()
        head = fh.read(FRAME_HEAD.size)
        if len(head) < FRAME_HEAD.size:
            fh.seek(start)
            return
        tag, length = FRAME_HEAD.unpack(head)
        if tag not in FRAME_TAGS or length > MAX_FRAME:
            raise _fail(path, f"corrupt trace: bad frame header at byte {start}")
        if fh.tell() + length > os.fstat(fh.fileno()).st_size:
            fh.seek(start)
            return  # cut short; checked first: a bogus length must not allocate
        payload = fh.read(length)
        if len(payload) < length:
            fh.seek(start)
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
                head = fh.read(FRAME_HEAD.size)
                if len(head) < FRAME_HEAD.size:
                    return None
                tag, length = FRAME_HEAD.unpack(head)
                if tag == b"F":
                    if fh.tell() + length > os.fstat(fh.fileno()).st_size:  # cut short (a bogus length never allocates)
                        return None
                    payload = fh.read(length)
                    return _object(Path(path), _json(Path(path), payload), "footer", schema.TRACE_FOOTER)
                fh.seek(length, os.SEEK_CUR)
    except (OSError, ValueError, TraceError):
        return None


def read_events(path: Path, kind: str) -> list[dict[str, Any]]:
    """A trace's evidence events of one kind, types checked, without reading its records (frames are
    skipped by length); none when the trace is missing or unreadable (the comparison says why)."""
    found: list[dict[str, Any]] = []
    try:
        with open_regular(Path(path), "trace") as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                return []
            size = os.fstat(fh.fileno()).st_size
            while len(head := fh.read(FRAME_HEAD.size)) == FRAME_HEAD.size:
                tag, length = FRAME_HEAD.unpack(head)
                if fh.tell() + length > size or len(found) >= MAX_EVENTS:
                    break  # cut short (a killed repeat): a bogus length never allocates
                if tag != b"E":
                    fh.seek(length, os.SEEK_CUR)
                    continue
                event = _json(Path(path), fh.read(length), "an evidence event")
                if isinstance(event, dict) and event.get("type") == kind:
                    found.append(_object(Path(path), event, "evidence event", schema.EVENT))
    except (OSError, TraceError):
        return []
    return found


def open_regular(path: Path, what: str) -> Any:
    """Open a file detaudit reads (trace, run record, capture, baseline file) in binary mode: a regular
    file, never reached through a symbolic link.

    The one rule for every file of a run directory or a baseline: a symlink planted there (by the
    script, or committed into a baseline) must not bring a file from outside it into a report, so
    the last component is opened with O_NOFOLLOW and refused when it is a link. A FIFO, a device
    (`/dev/zero`) or a directory named where a trace belongs would hang or never end; it is refused
    before any byte is read (O_NONBLOCK: opening a FIFO never waits). A path the user names on the
    command line is theirs to follow: the CLI resolves it first.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _fail(path, f"the {what} is a symbolic link; detaudit reads only the files it wrote, never "
                              "through a link") from None
        raise _fail(path, f"cannot open {what} ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _fail(path, f"not a regular file; a {what} is a file detaudit wrote")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: Path, what: str, limit: int, tail: bool = False) -> bytes:
    """At most `limit` bytes of a file opened by `open_regular`: its start, or its end (`tail`)."""
    with open_regular(path, what) as fh:
        if tail:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
        return bytes(fh.read(limit))


def sha256_regular(path: Path, what: str) -> str:
    """The SHA-256 (hex) of a file opened by `open_regular`, read in blocks."""
    h = hashlib.sha256()
    with open_regular(path, what) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
        self._frames = self._open()
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
        if not schema.is_version(version, FORMAT_VERSION):
            raise _fail(
                self.path,
                f"trace format version {version!r} is not supported by this detaudit "
                f"(it reads version {FORMAT_VERSION}); use the detaudit release that wrote it",
            )
        schema.check(self.header, schema.TRACE_HEADER, f"{self.path}: corrupt trace: header")

    def _open(self) -> Iterator[tuple[bytes, bytes]]:
        return _frames(self.path)

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

    def chunks(self, size: int = 1 << 16, limit: float = float("inf")) -> Iterator[np.ndarray]:
        """The records in chunks of up to `size`, the first `limit` of them (all by default)."""
        left = limit
        while left > 0:
            chunk = self.take(int(min(size, left)))
            if not len(chunk):
                return
            left -= len(chunk)
            yield chunk

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


class GrowingTrace(RecordStream):
    """A trace its repeat is still writing: `poll` returns the records written whole since the last call.

    Only whole frames are read; a frame the writer has not finished is left where it starts and read by
    a later poll once it is whole. Raises EmptyTrace while the header is not yet written (try again).
    """

    def __init__(self, path: Path) -> None:
        self._fh = open_regular(Path(path), "trace")
        try:
            if not _magic(self._fh, Path(path)):
                raise EmptyTrace(f"{path}: nothing written yet")
            super().__init__(path)
        except BaseException:
            self._fh.close()
            raise

    def _open(self) -> Iterator[tuple[bytes, bytes]]:
        return _whole_frames(self._fh, self.path)

    def poll(self, limit: int = 1 << 62) -> np.ndarray:
        """Up to `limit` records written whole and not yet returned (their strings are checked)."""
        if self.footer is None and not self._fh.closed:
            self._frames, self._done = self._open(), False
        records = self.take(limit)
        self.check_strings(records)
        return records

    def close(self) -> None:
        self._fh.close()


def read_trace(path: Path | str) -> Trace:
    """Read a whole trace (for `show`, causes and tests; compare streams instead)."""
    stream = RecordStream(Path(path))
    chunks = list(stream.chunks())
    stream.drain()
    records = np.concatenate(chunks) if chunks else np.empty(0, dtype=RECORD_DTYPE)
    stream.check_strings(records)
    return Trace(stream.path, stream.header, stream.strings, records, stream.events, stream.footer)
