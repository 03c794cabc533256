"""Find the user's `file:line` behind a hook call, skipping torch's and detaudit's own frames."""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterator
from types import CodeType, FrameType

_skip_prefixes: tuple[str, ...] = ()
_relative: dict[str, str] = {}
_SITE_DIRS = ("site-packages", "dist-packages")


def installed_dirs() -> tuple[str, ...]:
    """This interpreter's standard library and site directories, and every site directory on sys.path: a
    virtual environment that sees another's packages (a .pth naming its site-packages, or
    `--system-site-packages` on a venv) has them outside its own sysconfig paths."""
    paths = {p for k in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_paths().get(k))}
    paths |= {p for p in sys.path if p and os.path.basename(p.rstrip(os.sep)) in _SITE_DIRS}
    return tuple(sorted({p.rstrip(os.sep) + os.sep for p in paths}, key=len, reverse=True))


# installed packages and the standard library: a frame there is library code the user did not write
_INSTALLED = installed_dirs()


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


def installed_path(filename: str) -> str | None:
    """`timm/layers/classifier.py` for a file of an installed package or the standard library; None for
    the user's own files."""
    for prefix in _INSTALLED:
        if filename.startswith(prefix):
            return filename[len(prefix):]
    return None


def user_caller(frame: FrameType) -> FrameType | None:
    """For a frame of an installed library (timm building its classifier), the nearest frame above it that
    is the user's own code (the line that built the model); None when there is none or `frame` is the user's."""
    if not _library_code(frame.f_code):
        return None
    caller = frame.f_back
    while caller is not None:
        if not _library_code(caller.f_code):
            return caller
        caller = caller.f_back
    return None


_library: dict[CodeType, bool] = {}  # per code object: run on every record made under a library's frames


def _library_code(code: CodeType) -> bool:
    """torch's, detaudit's, an installed package's or the standard library's code (not the user's)."""
    known = _library.get(code)
    if known is None:
        name = code.co_filename
        known = _library[code] = bool(name.startswith(_skip_prefixes) or name.startswith("<frozen")
                                      or installed_path(name) is not None)
    return known


def user_frames(frame: FrameType | None) -> Iterator[FrameType]:
    """The user's own frames from `frame` outward (library frames between them skipped)."""
    while frame is not None:
        if not _library_code(frame.f_code):
            yield frame
        frame = frame.f_back


def describe_frames(frame: FrameType, user: FrameType | None) -> str:
    """`train.py:12 via timm/layers/classifier.py:55`: the user's line first, then the library's own."""
    here = f"{installed_path(frame.f_code.co_filename) or display_path(frame.f_code.co_filename)}:{frame.f_lineno}"
    if user is None:
        return here
    return f"{display_path(user.f_code.co_filename)}:{user.f_lineno} via {here}"
