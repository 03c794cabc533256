"""State carried between repeats: what the script read or listed that an earlier repeat of this audit left,
and the bytes of every file it read (`file-read` events: compared across repeats by causes/carried.py).

The repeats of an audit run one after another in one working directory, so what one repeat writes
(a counter, a cache, a checkpoint an auto-resume picks up, Lightning's `lightning_logs/version_N`) is
there for the next. Every read open (`open`/`io.open`, so pathlib's `open`/`read_*`, `torch.load`,
`np.load`) and every listing (`os.listdir`, `os.scandir`, and through them `os.walk`, `glob`,
`Path.iterdir`, fsspec's local `ls`) costs one `os.stat`: a file or directory modified after the audit
started (`audit_started` in the child config, from the run record) and before this repeat started was
changed by an earlier repeat. Only those are recorded (`carried` events, once per path, at most
MAX_CARRIED), so repeats that start from the same state record the same evidence: none. detaudit's own
reads are not the script's. Repeats run in parallel (`-j`) see each other's writes after their own
start: those are not classified (causes/carried.py says so).

The modification time misses a file the script appends to and then reads back (its own append moves the
time past the repeat's start), so each read open of a file outside the installed packages also records
the file's size, newline count and digest, once per path and user line (at most MAX_READS): a file up to
MAX_WHOLE whole, a larger one by its size, first and last MiB.
"""

from __future__ import annotations

import builtins
import importlib
import io
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

from detaudit.events import CarriedEvent, FileReadEvent
from detaudit.recorder import location
from detaudit.recorder.evidence.base import Evidence, digest_bytes
from detaudit.recorder.patch import wrap

MAX_CARRIED = 64  # paths recorded per process
MAX_READS = 64  # (path, line) pairs whose bytes are digested per process
MAX_WHOLE = 8 << 20  # a file up to this size is digested whole
PART = 1 << 20
MAX_ENTRIES_CHECKED = 256  # entries of a carried directory whose own times are read
MAX_ENTRIES_NAMED = 8
STATS = ("getsize", "getmtime", "exists", "isfile")  # a size, a time, or whether it exists, decides as a read does
_SKIP = ("/proc/", "/sys/", "/dev/")
# the import system scans sys.path (the working directory included) for distributions: not the script's state
_IMPORTS = (os.path.dirname(importlib.__file__) + os.sep, os.path.dirname(os.__file__) + os.sep + "pkgutil.py")


class _ScriptFiles:
    """Which opened paths are the script's: not detaudit's reads, the import system's, the run directory's or
    the kernel's pseudo-files."""

    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        trace = ev.config.get("trace")
        self.own_dir = os.path.dirname(os.path.abspath(str(trace))) + os.sep if trace else None
        self.skipped = (*location.own_code(), *_IMPORTS)  # detaudit's reads are not the script's

    def script_path(self, path: Any, frame: Any) -> str | None:
        """The absolute path `path` names when the script's call opened it, else None (may raise on a bad path)."""
        if self.ev.compiling() or isinstance(path, int) or frame.f_code.co_filename.startswith(self.skipped):
            return None
        full = os.path.abspath(os.fsdecode(path))
        if full.startswith(_SKIP) or (self.own_dir and full.startswith(self.own_dir)):
            return None
        return full


class CarriedFiles(_ScriptFiles):
    """The window [audit start, this repeat's start) and the paths already recorded."""

    def __init__(self, ev: Evidence, audit_started: float) -> None:
        super().__init__(ev)
        self.since = int(audit_started * 1e9)
        self.until = time.time_ns()
        self.count = 0

    def changed(self, st: os.stat_result) -> bool:
        return self.since <= st.st_mtime_ns < self.until

    def check(self, path: Any, what: Literal["read", "list", "stat"], frame: Any) -> None:
        """Record `path` when an earlier repeat changed it (never raises: the script's call goes on)."""
        ev = self.ev
        if self.count >= MAX_CARRIED:
            return
        try:
            full = self.script_path(path, frame)
            if full is None:
                return
            st = os.stat(full)
            if not self.changed(st) or not ev.first_time("carried", what, full):
                return
            entries = self.entries(full) if what == "list" else []
            self.count += 1
            ev.emit(CarriedEvent(type="carried", what=what, path=shown_path(full), loc=ev.where(frame),
                                 by=ev.site(frame), entries=entries))
        except (OSError, ValueError, TypeError):
            return

    def entries(self, directory: str) -> list[str]:
        """The entries of a carried directory an earlier repeat created or modified (by name, sorted)."""
        names = []
        with os.scandir(directory) as it:
            for k, entry in enumerate(it):
                if k >= MAX_ENTRIES_CHECKED:
                    break
                try:
                    if self.changed(entry.stat(follow_symlinks=False)):
                        names.append(entry.name)
                except OSError:
                    continue
        return sorted(names)[:MAX_ENTRIES_NAMED]


class ReadDigests(_ScriptFiles):
    """The bytes of each file the script opens for reading, once per path and user line: repeats that
    start from the same files record the same digests, and a file one run appends to and reads back (a
    session log) records other bytes in each (causes/carried.py compares them across repeats)."""

    def __init__(self, ev: Evidence) -> None:
        super().__init__(ev)
        self.done: set[tuple[str, str]] = set()
        self.installed = location.installed_dirs()  # packages' own files (entry points read at import)

    def read(self, path: Any, frame: Any) -> None:
        """Record the bytes `path` holds as the script opens it for reading (never raises)."""
        if len(self.done) >= MAX_READS:
            return
        try:
            full = self.script_path(path, frame)
            if full is None or full.startswith(self.installed):
                return
            loc = self.ev.where(frame)
            if (full, loc) in self.done or not os.path.isfile(full):
                return
            self.done.add((full, loc))
            size, lines, digest = file_digest(full)
            self.ev.emit(FileReadEvent(type="file-read", path=shown_path(full), loc=loc,
                                       by=self.ev.site(frame), size=size, lines=lines, digest=digest))
        except (OSError, ValueError, TypeError):
            return


def file_digest(path: str) -> tuple[int, int, str]:
    """(size, newlines, digest) of a file's bytes; one over MAX_WHOLE is digested by its size, its first and its
    last MiB (newlines -1: not counted), so a large data file costs two reads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size <= MAX_WHOLE:
            data = os.read(fd, MAX_WHOLE + 1)
            return len(data), data.count(b"\n"), digest_bytes(data)
        head = os.pread(fd, PART, 0)
        tail = os.pread(fd, PART, size - PART)
        return size, -1, digest_bytes(str(size).encode() + head + tail)
    finally:
        os.close(fd)


def shown_path(full: str) -> str:
    """A path as evidence shows it: relative to the working directory inside it (the same in every repeat)."""
    cwd = os.getcwd()
    return os.path.relpath(full, cwd) if full == cwd or full.startswith(cwd + os.sep) else full


def install(ev: Evidence) -> None:
    """Wrap the read opens and listings (before the script runs), when the run record gave a start time."""
    started = ev.config.get("audit_started")
    if not isinstance(started, (int, float)):
        return
    files, reads = CarriedFiles(ev, float(started)), ReadDigests(ev)
    for owner in (builtins, io):
        wrap(owner, "open", lambda original: _open(files, reads, original))
    for name in ("listdir", "scandir"):
        wrap(os, name, lambda original: _listing(files, original))
    for name in STATS:  # not os.stat itself: libraries call it everywhere, and these are what a script asks
        wrap(os.path, name, lambda original: _stat(files, original))


def _open(files: CarriedFiles, reads: ReadDigests, original: Callable[..., Any]) -> Callable[..., Any]:
    def open_(*args: Any, **kwargs: Any) -> Any:
        mode = kwargs.get("mode", args[1] if len(args) > 1 else "r")
        if isinstance(mode, str) and ("r" in mode or "+" in mode) and "w" not in mode:  # reads what was there
            path, frame = args[0] if args else kwargs.get("file"), sys._getframe(1)
            files.check(path, "read", frame)
            reads.read(path, frame)
        return original(*args, **kwargs)

    return open_


def _listing(files: CarriedFiles, original: Callable[..., Any]) -> Callable[..., Any]:
    def listing(*args: Any, **kwargs: Any) -> Any:
        path = args[0] if args else kwargs.get("path", ".")
        files.check("." if path is None else path, "list", sys._getframe(1))
        return original(*args, **kwargs)

    return listing


def _stat(files: CarriedFiles, original: Callable[..., Any]) -> Callable[..., Any]:
    def stat(*args: Any, **kwargs: Any) -> Any:
        path = args[0] if args else kwargs.get("path")
        caller = sys._getframe(1)
        if path is not None and not files.ev.is_library(caller):  # the script's own question (not os.makedirs')
            files.check(path, "stat", caller)
        return original(*args, **kwargs)

    return stat
