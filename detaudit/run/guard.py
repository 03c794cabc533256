"""The job dies with its guard: nothing detaudit starts outlives detaudit, however detaudit ends (SIGKILL too).

A repeat's process (`run`, `watch`, `fix`'s experiments, each torchrun rank) and torchrun's own launcher ask
Linux, first thing, to be sent SIGKILL when their parent dies (prctl PR_SET_PDEATHSIG). The request is made in
the started process, right after exec (never in a pre-exec hook of the parent: detaudit runs threads); the
parent may already have died by then, so the process compares its parent with the pid the parent put in its
environment (`PARENT_ENV`) and ends itself when they differ. It then puts its own pid there, for the processes
it starts in turn (torchrun's ranks). Linux sends the signal when the *thread* that started the process ends:
detaudit's launcher thread waits for its repeat, and torchrun starts its ranks from its main thread.

`fix` runs its experiments on a copy of the script beside it; `removed_if_we_die` leaves a tiny `sh` waiting on
a pipe that only detaudit holds, which removes the copy when the pipe closes: when detaudit dies, whatever kills it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PARENT_ENV = "DETAUDIT_GUARD_PID"  # the pid of the process that started this one (detaudit, or torchrun)
_PR_SET_PDEATHSIG = 1
_REAPER = 'cat > /dev/null; rm -f -- "$1"'  # waits for the pipe to close, then removes the file
_REAPER_WAIT_S = 5.0


def guarded_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of a process this one starts: it will die with this process (`die_with_parent`)."""
    return {**env, PARENT_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """In a started process, first thing: be killed when the parent that started it dies, or now if it already
    has. Only where the parent asked (`guarded_env`) and on Linux; elsewhere nothing changes."""
    expected = os.environ.get(PARENT_ENV)
    if expected is None or not sys.platform.startswith("linux"):
        return
    try:
        # a prototype of detaudit's own, never the attributes of a ctypes object the script may share
        prctl = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                                 ctypes.c_ulong, use_errno=True)(("prctl", ctypes.CDLL(None)))
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl in this libc: the job is only stopped the ordinary ways
        return
    if str(os.getppid()) != expected and not _alive(expected):  # it died before the request: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)
    os.environ[PARENT_ENV] = str(os.getpid())


def _alive(pid: str) -> bool:
    """Whether the process that asked is still alive. A process between it and this one (a wrapper the user's
    interpreter runs through, a launcher's fork server) makes the parents differ while the guard lives: that is
    no reason to end; the death signal then comes from the process in between."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return True


@contextlib.contextmanager
def removed_if_we_die(path: Path) -> Iterator[None]:
    """While inside, `path` (a file this process made) is removed should this process die, even by SIGKILL; the
    caller removes it itself on leaving, as before."""
    try:
        reaper = subprocess.Popen(["/bin/sh", "-c", _REAPER, "detaudit-reaper", str(path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:  # no /bin/sh: the file is removed on leaving only
        yield
        return
    try:
        yield
    finally:
        assert reaper.stdin is not None
        reaper.stdin.close()  # the reaper removes the file (already gone, usually) and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(_REAPER_WAIT_S)
