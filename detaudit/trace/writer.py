"""Writing a trace: the child appends frames whole on an unbuffered, high-numbered descriptor that it
checks before each write, so a repeat killed at any moment, or a script that closes and reuses
descriptors, leaves a readable prefix and never a frame in someone else's file."""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from detaudit.trace.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    FRAME_HEAD,
    MAGIC,
    MAX_EVENTS,
    MAX_FRAME,
    MAX_STRINGS,
    RECORD_DTYPE,
    Flag,
    Record,
)

_FLAGS = Record._fields.index("flags")

# One RECORD_DTYPE row, packed as the writer queues it: 4x faster than numpy on lists of tuples.
_ROW = struct.Struct("<4B6I3Q4d")
assert _ROW.size == RECORD_DTYPE.itemsize
FLUSH_EVERY = 4096
THREAD_BLOCK_LIMIT = 1 << 17  # records from other threads held for one canonical block, at most
_THREAD = int(Flag.THREAD)  # a plain int: IntFlag arithmetic costs a Python call per record


class TraceWriter:
    """Appends records and events to one trace file. Inert in forked children (DataLoader workers).

    Thread-safe: one lock (reentrant, for a flush from a signal handler) around the queues. Records
    flagged THREAD (made on another thread) arrive in scheduling order, which changes from run to run;
    they are held and written by `sync` as one block sorted by content, so a deterministic threaded
    script writes identical traces and a value that differs still shows as a difference at its name.

    The format's limits (format.MAX_STRINGS, MAX_EVENTS, MAX_FRAME: what the reader accepts) are kept
    here, never discovered by the reader: past the string table's, no further record is written and
    the footer says why (`recording_stopped`: compared as far as it was recorded); past the events',
    further evidence is counted (`events_dropped`), not written.
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
        self.stopped: str | None = None  # a limit of the format was reached: no record after it is written
        self.events_written = 0
        self.events_dropped = 0
        self._rows: list[bytes] = []  # packed records not yet written (one or more per item)
        self._queued = 0  # records in `_rows`
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
        return FRAME_HEAD.pack(tag, len(payload)) + payload

    def _stop(self, why: str) -> None:
        """A limit of the format is reached: nothing recorded from here on is written (said once, on stderr)."""
        if self.stopped is None:
            self.stopped = why
            print(f"detaudit: recording stopped, this repeat is recorded only up to here: {why}", file=sys.stderr)

    def intern(self, text: str) -> int:
        """The string-table id of `text` (names, locations, shapes are stored once); past MAX_STRINGS the
        recording stops (the id returned then belongs to no written record)."""
        sid = self._strings.get(text)
        if sid is None:
            with self._lock:
                sid = self._strings.get(text)
                if sid is None:
                    if len(self._strings) >= MAX_STRINGS:
                        self._stop(f"more than {MAX_STRINGS:,} distinct names, locations and shapes (checkpoint "
                                   "names, say), the most a trace holds")
                        return 0
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
        if self.stopped is not None:
            return
        if row[_FLAGS] & _THREAD:
            with self._lock:
                self._threaded.append(row)
                if len(self._threaded) >= THREAD_BLOCK_LIMIT:
                    self.sync()
            return
        packed = _ROW.pack(*row[:-1], *row[-1])
        with self._lock:
            self._rows.append(packed)
            self._queued += 1
            if self._queued >= FLUSH_EVERY:
                self.flush()

    def add_block(self, rows: np.ndarray) -> None:
        """Queue RECORD_DTYPE rows made on the writer's own thread (no THREAD flag), as `add` would one by one:
        the optimizer step's records, built as one array (recorder/boundary.py)."""
        if self.stopped is not None or not len(rows):
            return
        with self._lock:
            self._rows.append(rows.tobytes())
            self._queued += len(rows)
            if self._queued >= FLUSH_EVERY:
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
            self._queued += len(self._threaded)
            self._threaded.clear()

    @property
    def position(self) -> int:
        """Index the next record will get."""
        return self.records_written + self._queued

    def event(self, event: dict[str, Any]) -> None:
        """Write one evidence event, positioned at the current record index."""
        if self.closed or os.getpid() != self._pid:
            return
        with self._lock:
            if self.events_written >= MAX_EVENTS:
                if not self.events_dropped:
                    print(f"detaudit: more than {MAX_EVENTS:,} evidence events (seeding calls, say); later ones are "
                          "not recorded, causes are inferred from the first ones", file=sys.stderr)
                self.events_dropped += 1
                return
            self.flush()
            payload = json.dumps({"at": self.position, **event}, default=str).encode()
            if len(payload) > MAX_FRAME:
                self.events_dropped += 1
                return
            self._write(self._frame(b"E", payload))
            self.events_written += 1

    def flush(self) -> None:
        if self.closed or os.getpid() != self._pid:
            self._rows.clear()
            self._queued = 0
            return
        self._lock.acquire()
        self.busy = True
        try:
            out = b""
            if self._pending_strings:
                strings = json.dumps(self._pending_strings).encode()
                if len(strings) > MAX_FRAME:  # names of a gigabyte: the reader would call the frame corrupt
                    self._stop("the names recorded since the last flush exceed a trace frame (1 GiB)")
                    self._rows.clear()
                    self._queued = 0
                    self._pending_strings = []
                    return
                out += self._frame(b"S", strings)
            if self._rows:
                out += self._frame(b"R", b"".join(self._rows))
            if out:
                self._write(out)
            self.records_written += self._queued
            self._rows.clear()
            self._queued = 0
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
            if self.stopped is not None and not foot.get("recording_stopped"):
                foot["recording_stopped"] = self.stopped
            if self.events_dropped:
                foot["events_dropped"] = self.events_dropped
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
