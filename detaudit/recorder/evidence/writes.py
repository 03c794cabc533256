"""Files the script opens for writing, once per path (`file-write` events).

With `-j N` the repeats run at the same time in one working directory (the script's own, as
`python script.py` would), so a script that saves a checkpoint to a fixed name and reloads it
can read another repeat's file: detaudit's parallelism, not the script's nondeterminism. The
launching side reads these events and re-runs such repeats one after another (audit/pipeline.py).

Seen through audit hooks: `open` for writing (builtins.open, io.open, os.open: every Python-level
open, numpy.save and pickle included) and the destination of `os.rename`/`os.replace` (a save to a
temporary then renamed into place); and through `torch.save` given a path (its C++ writer opens the
file itself). Left out: exclusive creates (O_EXCL: `tempfile`, mode "x", lock files), which fail
rather than write into a file another process made; the run directory (detaudit's own files);
`/dev`, `/proc`, `/sys`; and `__pycache__` (written atomically under unique names by importlib).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from detaudit.events import FileWriteEvent
from detaudit.recorder.audithook import AuditRelay
from detaudit.recorder.evidence.base import Evidence, never_fatal
from detaudit.recorder.patch import wrap

MAX_PATHS = 256  # distinct paths recorded per repeat (events are capped at the source)
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_SKIPPED = ("/dev/", "/proc/", "/sys/")


class Writes:
    """The paths one process has reported (a forked DataLoader worker starts with its parent's)."""

    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        trace = ev.config.get("trace")
        self.skipped = (*_SKIPPED, *((os.path.dirname(os.path.abspath(str(trace))) + os.sep,) if trace else ()))
        self.seen: set[str] = set()
        self._busy = threading.local()

    def opened(self, path: Any, frame: Any, append: bool = False) -> None:
        """`path` (as given to open) was opened for writing from `frame` (`append`: keeping what it held)."""
        if len(self.seen) >= MAX_PATHS or getattr(self._busy, "on", False):
            return
        try:
            full = os.path.abspath(os.fsdecode(os.fspath(path)))
        except (TypeError, ValueError):  # a descriptor, or a name that is no path
            return
        if full in self.seen or full.startswith(self.skipped) or f"{os.sep}__pycache__{os.sep}" in full:
            return
        self.seen.add(full)
        self._busy.on = True  # emitting may open the workers' side file: not the script's write
        try:
            self.ev.emit(FileWriteEvent(type="file-write", path=full, loc=self.ev.where(frame), append=append))
        finally:
            self._busy.on = False

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        """The audit events `open` (path, mode, flags: whether it writes, and not exclusively) and
        `os.rename` (src, dst, ...: the destination is written)."""
        if event == "os.rename" and len(args) >= 2:
            self.opened(args[1], sys._getframe(1))
        elif event == "open" and len(args) >= 3 and not isinstance(args[0], int):
            flags = args[2]
            if isinstance(flags, int) and flags & _WRITING and not flags & os.O_EXCL:
                self.opened(args[0], sys._getframe(1), bool(flags & os.O_APPEND))


_RELAY: AuditRelay[Writes] = AuditRelay(frozenset({"open", "os.rename"}),
                                         "detaudit: stopped recording the files the script writes")


def install(ev: Evidence) -> Writes:
    """At child start, before the script: passed the script's `open` and `os.rename` events
    (recorder/audithook.py: one hook per process, the Writes installed last)."""
    return _RELAY.install(Writes(ev))


def install_torch(writes: Writes, torch: ModuleType) -> None:
    """`torch.save(obj, path)`: the C++ writer opens the path itself, unseen by the audit hook."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(f, str | bytes | os.PathLike) and not writes.ev.compiling():
                with never_fatal():
                    writes.opened(f, sys._getframe(1))
            return original(obj, f, *args, **kwargs)

        return save

    wrap(torch, "save", make)
