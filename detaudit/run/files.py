"""Writing a report or run-directory file: atomically via a temporary and a rename, or to stdout for
`-`, and a check, before any repeat runs, that the file can be written at all.

A failed write is an OutputError (exit 7) naming the path and the reason, and leaves no half file.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

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
    """A report file, or stdout for `-`."""
    if str(path) == "-":
        try:
            with naming("standard output"):
                sys.stdout.write(text)
                sys.stdout.flush()
        except BrokenPipeError:  # the reader stopped early (`| head`): not an error of the run
            silence_stdout()
    else:
        write_text_atomically(Path(path), text, mode)


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
    leaves half a file or a temporary behind, and two writers never share a temporary.

    `mode`: the file's permissions (run-directory files: 0o600); default: what the umask allows.
    An OSError becomes an OutputError (exit 7) naming the path and the reason.
    """
    if mode is None:
        umask = os.umask(0o022)
        os.umask(umask)
        mode = 0o666 & ~umask
    tmp: str | None = None
    try:
        if path.exists() and not path.is_file() and not path.is_dir():  # /dev/stdout, a FIFO: written in place
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise output_error(path, exc) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
