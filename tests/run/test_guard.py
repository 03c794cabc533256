"""The job dies with its guard (detaudit/run/guard.py): real processes, killed with SIGKILL (marked `process`), and
the in-process parts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from processes import alive, wait_until

from detaudit.run.guard import PARENT_ENV, _alive, guarded_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

GUARDED = "from detaudit.run.guard import die_with_parent; die_with_parent(); import time; time.sleep(60)"
# a parent that starts a guarded child, says its pid, and waits to be killed
PARENT = f"""import subprocess, sys, time
from detaudit.run.guard import guarded_env
import os
child = subprocess.Popen([sys.executable, "-c", {GUARDED!r}], env=guarded_env(dict(os.environ)))
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.process
def test_a_started_process_dies_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    assert wait_until(lambda: not alive(child), 10)


@pytest.mark.process
def test_a_process_whose_parent_died_before_it_asked_ends_itself() -> None:
    """The death signal is asked for after exec: a parent gone by then is seen by its pid (`getppid`)."""
    env = {**os.environ, PARENT_ENV: str(os.getpid() + 1_000_000)}  # no such parent
    proc = subprocess.run([sys.executable, "-c", GUARDED], env=env, timeout=60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.process
def test_a_process_started_through_another_while_its_guard_lives_runs() -> None:
    """A wrapper between detaudit and the repeat (a shell, a launcher's fork server): the parents differ, the guard
    is alive, so the repeat runs (it was killed at once: explain's repeats under the suite's warm servers)."""
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    quick = GUARDED.replace("time.sleep(60)", "print('ran')")
    proc = subprocess.run(["/bin/sh", "-c", f"{sys.executable} -c {quick!r}; true"], env=env, timeout=60,
                          capture_output=True, text=True)
    assert proc.stdout.strip() == "ran"


def test_a_live_guard_is_alive_and_a_gone_one_is_not() -> None:
    assert (_alive(str(os.getpid())), _alive(str(2**22 + 12345))) == (True, False)


def test_the_environment_names_this_process_as_the_parent() -> None:
    assert guarded_env({"A": "1"}) == {"A": "1", PARENT_ENV: str(os.getpid())}


@pytest.mark.process
def test_a_file_is_removed_when_the_process_that_made_it_is_killed(tmp_path: Path) -> None:
    copy = tmp_path / ".train.detaudit-fix-0000.py"
    maker = f"""import pathlib, time
from detaudit.run.guard import removed_if_we_die
path = pathlib.Path({str(copy)!r})
path.write_text("print(1)")
with removed_if_we_die(path):
    print("in", flush=True)
    time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", maker], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "in\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert wait_until(lambda: not copy.exists(), 10)
