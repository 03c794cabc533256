"""Find the user's `file:line` behind a hook call, skipping torch's and detaudit's own frames."""

from __future__ import annotations

import os
import sys
from types import FrameType

_skip_prefixes: tuple[str, ...] = ()
_relative: dict[str, str] = {}


def skip_packages(*modules: object) -> None:
    """Treat frames from these packages (by their directory) as library code."""
    global _skip_prefixes
    dirs = {os.path.dirname(str(getattr(m, "__file__", "") or "")) + os.sep for m in modules}
    _skip_prefixes = tuple(sorted(set(_skip_prefixes) | {d for d in dirs if d != os.sep}))


def display_path(filename: str) -> str:
    shown = _relative.get(filename)
    if shown is None:
        if filename.startswith("<"):
            shown = filename
        else:
            try:
                shown = os.path.relpath(filename)
            except ValueError:
                shown = filename
            if shown.startswith(".." + os.sep + ".."):
                shown = filename
        _relative[filename] = shown
    return shown


def user_frame(depth: int = 2) -> FrameType | None:
    """The innermost frame that belongs to neither torch, detaudit nor the import machinery."""
    frame: FrameType | None = sys._getframe(depth)
    skip = _skip_prefixes
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(skip) or name.startswith("<frozen")):
            return frame
        frame = frame.f_back
    return None


def user_location(depth: int = 2) -> str:
    frame = user_frame(depth + 1)
    if frame is None:
        return ""
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"
