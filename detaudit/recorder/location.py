"""Find the user's `file:line` behind a hook call, skipping torch's and detaudit's own frames."""

from __future__ import annotations

import os
import sys
from types import FrameType

_skip_prefixes: tuple[str, ...] = ()
_relative: dict[str, str] = {}


def skip_paths(*paths: str) -> None:
    """Treat frames from these files or directories as library code, never as the user's line."""
    global _skip_prefixes
    _skip_prefixes = tuple(sorted(set(_skip_prefixes) | {p for p in paths if p}))


def own_code() -> tuple[str, ...]:
    """detaudit's own files and packages: library code however detaudit is installed (an editable
    install is not under site-packages). Its bundled demo (detaudit/demo/) is the user's script."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tuple(os.path.join(root, name) for name in sorted(os.listdir(root)) if name != "demo")


def package_dir(module: object) -> str:
    return os.path.dirname(str(getattr(module, "__file__", "") or "")) + os.sep


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
