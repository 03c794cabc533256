"""Writing a report, run-directory or baseline file: atomically via a temporary and a rename, or to
stdout for `-`, and a check, before any repeat runs, that the file can be written at all.

A failed write is an OutputError (exit 7) naming the path and the reason, and leaves no half file.
Nothing is ever written through a symbolic link found in a run directory or a baseline (the script
runs with write access to its run directory and can plant one): a file detaudit creates there is
created exclusively (`create_private`) or renamed into place (`write_text_atomically`), which
replaces a link instead of following it. Only a report path the user names is written in place
when it is a device or a FIFO (`--json /dev/stdout`). The reading side of the same rule is
`detaudit.trace.open_regular`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from detaudit.errors import OutputError, output_error


@contextlib.contextmanager
def naming(what: str) -> Iterator[None]:
    """Writes to a stream (stdout redirected to a full disk): an OSError that names no file becomes an
    OutputError naming `what`. A closed pipe is not an error of the run: it passes through unchanged."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise output_error(what, exc) from None


def write_output(path: Path, text: str, mode: int | None = None) -> None:
    """A report file, or stdout for `-`.

    `mode` None: a path the user named, written in place when it is a device or a FIFO
    (`/dev/stdout`). A `mode` (0o600) marks a run directory's own file (report.json): always
    replaced, never written through whatever sits at its name.
    """
    if str(path) == "-":
        try:
            with naming("standard output"):
                sys.stdout.write(text)
                sys.stdout.flush()
        except BrokenPipeError:  # the reader stopped early (`| head`): not an error of the run
            silence_stdout()
        return
    path = Path(path)
    if mode is None and path.exists() and not path.is_file() and not path.is_dir():
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise output_error(path, exc) from None
        return
    write_text_atomically(path, text, mode)


def silence_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone, so nothing more fails writing to it."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def check_writable(path: Path) -> None:
    """Fail early (OutputError, exit 7), before any repeat runs, when a report file cannot be written."""
    if str(path) == "-":
        return
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory")
    if path.exists() and not path.is_file():  # a device or FIFO is written in place, not replaced
        if not os.access(path, os.W_OK):
            raise OutputError(f"cannot write {path}: permission denied")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: {parent} is not a directory")
    try:  # a real file: access() cannot tell a read-only mount or a full disk
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise output_error(path, exc) from None


def write_text_atomically(path: Path, text: str, mode: int | None = None) -> None:
    """Write via a uniquely named temporary file, then rename: a failure (disk full, read-only) never
    leaves half a file or a temporary behind, two writers never share a temporary, and a symlink
    planted at `path` is replaced, not written through.

    `mode`: the file's permissions (run-directory files: 0o600); default: what the umask allows.
    An OSError becomes an OutputError (exit 7) naming the path and the reason.
    """
    data = text.encode("utf-8")
    _replace(path, lambda fh: fh.write(data), mode)


def copy_atomically(source: Path, what: str, path: Path) -> None:
    """Copy a run directory's file (read by `open_regular`: never through a link) to `path`, as
    `write_text_atomically` writes; the source's read errors are TraceErrors (exit 4)."""
    from detaudit.trace import open_regular  # here: the child imports this package before the script

    with open_regular(source, what) as src:
        _replace(path, lambda fh: shutil.copyfileobj(src, fh, 1 << 20), None)


def _replace(path: Path, write: Callable[[BinaryIO], object], mode: int | None) -> None:
    if mode is None:
        umask = os.umask(0o022)
        os.umask(umask)
        mode = 0o666 & ~umask
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise output_error(path, exc) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def create_private(path: Path, readable: bool = False) -> int:
    """Create a run directory's file that detaudit writes (a repeat's stdout, stderr, config, pid file):
    exclusively, mode 0o600, never through a symbolic link; the descriptor (`readable`: opened for
    reading back too, so what is read is the file detaudit created, whatever later sits at its name).

    Something already at that name was not made by detaudit for this repeat (the script can plant a
    link to a file of the user's there): refused with an OutputError (exit 7), never overwritten.
    """
    flags = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_RDWR if readable else os.O_WRONLY)
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        raise name_taken(path) from None
    except OSError as exc:
        raise output_error(path, exc) from None


def name_taken(path: Path) -> OutputError:
    """A file detaudit must create in a run directory already exists there (exit 7)."""
    return OutputError(f"cannot create {path}: something already exists at that name in the run directory, not "
                       "made by detaudit (did the script put it there?); detaudit never writes through or over it")
