"""Why a repeat failed, as the report shows it: the script's exception, from its trace's footer.

The child (child.py) captures the exception that ended the script as structured frames and writes
them into the trace footer (`exception`, docs/trace-format.md); the excerpt shown to the user is
built from them: the user's innermost frame `file:line` and its source line, where a library raised
it, and the exception line. Text parsed out of stderr is the fallback, for repeats whose trace has
no frames: killed, written by an older detaudit, failed before the recorder existed, or ended by
`os._exit`. Torch-free: the child imports it before the script runs.
"""

from __future__ import annotations

import errno
import functools
import linecache
import os
import re
import sysconfig
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from detaudit.results import MAX_FRAMES, MAX_MESSAGE, MAX_TEXT, Frame, ScriptError, cut_text
from detaudit.run.excerpt import error_excerpt
from detaudit.safetext import printable

STDERR_TAIL_BYTES = 64 << 10  # how much of a repeat's stderr is read for the report (its end)
EXCERPT_LINES = 15  # lines of stderr shown when there are no frames


# -- capture (in the child) -----------------------------------------------------------------------------
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep  # detaudit/
_DEMO_DIR = _PACKAGE_DIR + "demo" + os.sep  # detaudit's demo scripts are user code
# the recorder's wrappers around the user's calls (an op, torch.save, a hook): an exception passing through
# them is the user's call's, so their frames are no part of its story
_RECORDER_DIR = _PACKAGE_DIR + "recorder" + os.sep
_LIBRARY_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """The standard library's and installed packages' directories, and detaudit's (found on first use:
    the child imports this module before every script, and most scripts never fail)."""
    paths = sysconfig.get_paths()
    found = {os.path.realpath(p) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
             if (p := paths.get(key))}
    return tuple(sorted(found | {_PACKAGE_DIR}))


def is_library(filename: str) -> bool:
    """Whether a frame's file is library code: the standard library, an installed package, detaudit."""
    if filename.startswith("<"):
        return filename.startswith("<frozen")  # `<string>` (the script's own exec) is the user's
    path = os.path.realpath(filename)
    if path.startswith(_DEMO_DIR):
        return False
    return path.startswith(_library_dirs()) or any(m in filename for m in _LIBRARY_MARKERS)


def capture(exc: BaseException, skip_file: str, show_path: Callable[[str], str] = os.path.relpath,
            library: Callable[[str], bool] = is_library) -> ScriptError:
    """The structured traceback of `exc`, without the leading frames of `skip_file` (the child's own) and
    without the recorder's wrapper frames (an op raising in C names the user's call, not the wrapper).

    Keeps every user frame and the innermost frame (where a library raised it), then the last
    MAX_FRAMES of those; source lines are read for the kept frames only.
    """
    raw: list[tuple[str, int | None, str]] = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == skip_file:
        tb = tb.tb_next
    while tb is not None:
        code = tb.tb_frame.f_code
        if not os.path.realpath(code.co_filename).startswith(_RECORDER_DIR):
            raw.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    marked = [(f, library(f[0])) for f in raw]
    kept = [(f, lib) for i, (f, lib) in enumerate(marked) if not lib or i == len(marked) - 1][-MAX_FRAMES:]
    frames = tuple(Frame(cut_text(_shown(name, show_path), MAX_TEXT), line, cut_text(function, MAX_TEXT),
                         _source(name, line), not lib) for (name, line, function), lib in kept)
    return ScriptError(_type_name(exc), cut_text(_message(exc), MAX_MESSAGE), frames, len(raw) - len(frames))


def _shown(filename: str, show_path: Callable[[str], str]) -> str:
    try:
        return show_path(filename)
    except ValueError:
        return filename


def _source(filename: str, line: int | None) -> str | None:
    text = linecache.getline(filename, line).strip() if line else ""
    return cut_text(text, MAX_TEXT) if text else None


def _type_name(exc: BaseException) -> str:
    kind = type(exc)
    module = getattr(kind, "__module__", "builtins")
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<exception str() failed>"  # as python prints it


def from_footer(footer: Mapping[str, Any] | None) -> ScriptError | None:
    """The footer's `exception`; None in a footer without one (no exception, or an older detaudit)."""
    data = (footer or {}).get("exception")
    return ScriptError.from_json(data) if isinstance(data, Mapping) else None


def read_error(trace: Path) -> ScriptError | None:
    """The exception recorded in a trace's footer; None when there is none or no readable footer."""
    from detaudit.trace import read_footer  # here: the child imports this module, and numpy must wait for the script

    return from_footer(read_footer(trace))


def stderr_tail(path: Path) -> str:
    """The end of a repeat's stderr capture (the last STDERR_TAIL_BYTES; a traceback or torchrun's failure
    summary is there): a regular file of the run directory, never read through a link; "" when unreadable."""
    return capture_tail(path, "stderr capture", STDERR_TAIL_BYTES)


def capture_tail(path: Path, what: str, limit: int) -> str:
    """The last `limit` bytes of a captured output file, as text: a regular file, never read through a link;
    "" when unreadable."""
    from detaudit.errors import TraceError
    from detaudit.trace import read_regular

    try:
        return read_regular(path, what, limit, tail=True).decode(errors="replace")
    except (OSError, TraceError):
        return ""


def first_error(traces: Iterable[Path]) -> ScriptError | None:
    """The first exception found among `traces` (a torchrun repeat's ranks, in rank order)."""
    return next((e for e in map(read_error, traces) if e is not None), None)


def excerpt(error: ScriptError | None, stderr: str, lines: int = EXCERPT_LINES) -> str:
    """What the report shows of a failed repeat, safe to print.

    From the frames when there are any: the user's innermost `file:line` and source line, where a
    library raised it, and the exception line. `sys.exit(N)` says nothing itself: the end of what the
    script printed on stderr (argparse's usage error, say) comes first. Without frames: the end of
    stderr (`stderr_excerpt`).
    """
    if error is None:
        text = error_excerpt(stderr, lines)
    else:
        parts = []
        if error.type == "SystemExit" and error.message.lstrip("-").isdigit():
            said = error_excerpt(stderr, lines - 4)
            parts += [said] if said else []
        user, last = error.innermost_user, error.frames[-1] if error.frames else None
        if user is not None:
            parts.append(f"{user.file}:{user.line}, in {user.function}")
            if user.text:
                parts.append(f"    {user.text}")
        if last is not None and not last.user:
            parts.append(f"  (raised in {_short(last.file)}:{last.line}, in {last.function})")
        parts.append(f"{error.type}: {error.message}" if error.message else error.type)
        text = "\n".join(parts)
    return printable(_ANSI.sub("", text))


# the disk (or the quota) filled up: the repeat could not write, which says nothing about the script
_DISK_FULL = tuple(f"[Errno {code}] {os.strerror(code)}" for code in (errno.ENOSPC, errno.EDQUOT)) + \
    tuple(os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT))


def disk_full(shown: str) -> str | None:
    """The line of a failed repeat's excerpt (`excerpt`'s text) that says its disk or quota filled up (ENOSPC,
    EDQUOT: the repeat could not write, which says nothing about the script), or None."""
    return next((line.strip() for line in shown.splitlines() if any(m in line for m in _DISK_FULL)), None)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour and cursor sequences of a script's coloured output
_INSTALLED = re.compile(r".*(?:site-packages|dist-packages|lib[\\/]python\d+\.\d+)[\\/]")


def _short(file: str) -> str:
    """A library file as its import path shows it (`torch/nn/modules/linear.py`)."""
    return _INSTALLED.sub("", file)
