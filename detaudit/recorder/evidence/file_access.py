"""State carried between repeats: what the script read or listed that an earlier repeat of this audit left.

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

from detaudit.events import CarriedEvent
from detaudit.recorder import location
from detaudit.recorder.evidence.base import Evidence
from detaudit.recorder.patch import wrap

MAX_CARRIED = 64  # paths recorded per process
MAX_ENTRIES_CHECKED = 256  # entries of a carried directory whose own times are read
MAX_ENTRIES_NAMED = 8
STATS = ("getsize", "getmtime", "exists", "isfile")  # a size, a time, or whether it exists, decides as a read does
_SKIP = ("/proc/", "/sys/", "/dev/")
# the import system scans sys.path (the working directory included) for distributions: not the script's state
_IMPORTS = (os.path.dirname(importlib.__file__) + os.sep, os.path.dirname(os.__file__) + os.sep + "pkgutil.py")


class CarriedFiles:
    """The window [audit start, this repeat's start) and the paths already recorded."""

    def __init__(self, ev: Evidence, audit_started: float) -> None:
        self.ev = ev
        self.since = int(audit_started * 1e9)
        self.until = time.time_ns()
        trace = ev.config.get("trace")
        self.own_dir = os.path.dirname(os.path.abspath(str(trace))) + os.sep if trace else None
        self.count = 0
        self.skipped = (*location.own_code(), *_IMPORTS)  # detaudit's reads are not the script's

    def changed(self, st: os.stat_result) -> bool:
        return self.since <= st.st_mtime_ns < self.until

    def check(self, path: Any, what: Literal["read", "list", "stat"], frame: Any) -> None:
        """Record `path` when an earlier repeat changed it (never raises: the script's call goes on)."""
        ev = self.ev
        if self.count >= MAX_CARRIED or ev.compiling() or isinstance(path, int) \
                or frame.f_code.co_filename.startswith(self.skipped):
            return
        try:
            full = os.path.abspath(os.fsdecode(path))
            if full.startswith(_SKIP) or (self.own_dir and full.startswith(self.own_dir)):
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


def shown_path(full: str) -> str:
    """A path as evidence shows it: relative to the working directory inside it (the same in every repeat)."""
    cwd = os.getcwd()
    return os.path.relpath(full, cwd) if full == cwd or full.startswith(cwd + os.sep) else full


def install(ev: Evidence) -> None:
    """Wrap the read opens and listings (before the script runs), when the run record gave a start time."""
    started = ev.config.get("audit_started")
    if not isinstance(started, (int, float)):
        return
    files = CarriedFiles(ev, float(started))
    for owner in (builtins, io):
        wrap(owner, "open", lambda original: _open(files, original))
    for name in ("listdir", "scandir"):
        wrap(os, name, lambda original: _listing(files, original))
    for name in STATS:  # not os.stat itself: libraries call it everywhere, and these are what a script asks
        wrap(os.path, name, lambda original: _stat(files, original))


def _open(files: CarriedFiles, original: Callable[..., Any]) -> Callable[..., Any]:
    def open_(*args: Any, **kwargs: Any) -> Any:
        mode = kwargs.get("mode", args[1] if len(args) > 1 else "r")
        if isinstance(mode, str) and "r" in mode:
            files.check(args[0] if args else kwargs.get("file"), "read", sys._getframe(1))
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
