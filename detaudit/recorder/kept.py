"""`detaudit watch`'s stop before a torch.save leaves every file the script had as it was.

A script that saves through a handle (`with open(ck, "wb") as f: torch.save(state, f)`) has emptied the file by
the time torch.save is called: stopping the save alone would leave its last good checkpoint 0 bytes long. So,
while a stop before a save can come (after a replay mismatch; and always while the parent's checks may find one,
under torchrun or `--against`), each file the script opens for writing with truncation has its previous bytes
copied into the run directory first (seen through the `open` audit event, before the open truncates; the first
copy since the last step boundary is kept: what came after it was written by a run already found to differ).
When the save is stopped, the file it was given is put back: its previous bytes written into it again, or, when
its open had created it, the empty file removed. The copies are dropped at each step boundary, after each save
that went ahead, and at exit. A file opened for writing in one step and saved into in a later one is not kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

from detaudit.recorder.audithook import AuditRelay


class KeptFiles:
    """The files opened for writing since the last step boundary, with their previous bytes (`None`: the open
    created the file). `armed()`: whether a stop before a save can come now."""

    def __init__(self, folder: str, armed: Callable[[], bool]) -> None:
        self.folder = os.path.realpath(folder)
        self.armed = armed
        self.kept: dict[str, str | None] = {}
        self.copies = 0
        self._busy = threading.local()  # detaudit's own opens (copying, restoring) are not the script's

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        """The audit event `open` (path, mode, flags): a truncating open of a path is about to happen."""
        if event != "open" or len(args) < 3 or getattr(self._busy, "on", False) or not self.armed():
            return
        path, flags = args[0], args[2]
        if isinstance(path, int) or not isinstance(flags, int) or not flags & os.O_TRUNC or flags & os.O_EXCL:
            return
        real = os.path.realpath(os.fsdecode(path))
        if real in self.kept or real.startswith(self.folder + os.sep):
            return
        self._busy.on = True
        try:
            if os.path.isfile(real):
                copy = os.path.join(self.folder, f"watch-kept-{os.getpid()}-{self.copies}")
                self.copies += 1
                shutil.copyfile(real, copy)
                self.kept[real] = copy
            elif not os.path.lexists(real):
                self.kept[real] = None
        finally:
            self._busy.on = False

    def restore(self, f: Any) -> str | None:
        """torch.save was stopped before writing to `f`: put its file back as it was; what was done, in words
        (None for a path: torch.save never opened it)."""
        name = getattr(f, "name", None) if not isinstance(f, (str, bytes, os.PathLike)) else None
        if not isinstance(name, (str, bytes)):
            return None
        real = os.path.realpath(os.fsdecode(name))
        if real not in self.kept:
            return "its open had already emptied it, before a stop could be foreseen: its earlier bytes are lost"
        copy = self.kept.pop(real)
        self._busy.on = True
        try:
            if copy is None:
                if os.path.isfile(real) and os.path.getsize(real) == 0:
                    os.unlink(real)
                return "the empty file its open had created was removed"
            shutil.copyfile(copy, real)
            os.unlink(copy)
            return f"its previous {os.path.getsize(real)} bytes were put back"
        except OSError as exc:
            return f"its previous bytes could not be put back ({exc.strerror}); they are in {copy}"
        finally:
            self._busy.on = False

    def forget(self) -> None:
        """No stop comes for what was opened so far: drop the copies."""
        for copy in self.kept.values():
            if copy is not None:
                with contextlib.suppress(OSError):
                    os.unlink(copy)
        self.kept.clear()


_RELAY: AuditRelay[KeptFiles] = AuditRelay(frozenset({"open"}),
                                             "detaudit watch: stopped keeping the files the script overwrites")


def install(kept: KeptFiles) -> KeptFiles:
    """Passed the script's `open` events (recorder/audithook.py: one hook per process, the KeptFiles installed
    last)."""
    return _RELAY.install(kept)
