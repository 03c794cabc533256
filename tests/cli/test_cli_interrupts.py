"""Signals sent to a real `detaudit run` process: Ctrl-C, SIGTERM (CI cancellation, `timeout`) and SIGHUP
stop every repeat and everything it started; further interrupts escalate at once; nothing of the run
survives, nothing hangs, no traceback; the partial run directory can still be reported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import run_cli
from processes import processes_mentioning, wait_until

pytestmark = pytest.mark.process  # every test here starts `detaudit run` and signals it


# Records one module output, starts a sleeper in its process group, says so, then waits.
LONG = """
    import signal, subprocess, sys, time
    import torch
    if sys.argv[1:] == ["stubborn"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.manual_seed(0)
    torch.nn.Linear(3, 2)(torch.ones(1, 3))
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", sys.argv[0]])
    print("ready", flush=True)
    time.sleep(300)
"""


def start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "long_job.py"
    script.write_text(textwrap.dedent(LONG))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "detaudit", "run", str(script), "-n", "2", "--jobs", "2",
                             "--out", str(run_dir), *extra], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    # both repeats are up (each printed "ready") before the signal is sent: no single-shot timing luck
    assert wait_until(lambda: all((run_dir / f"repeat-{i}.stdout").is_file()
                                  and "ready" in (run_dir / f"repeat-{i}.stdout").read_text() for i in (0, 1)),
                      120), "the repeats never started"
    return proc, run_dir


def survivors(tmp_path: Path) -> list[int]:
    return processes_mentioning(str(tmp_path / "long_job.py"))


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_stop_signal_stops_every_repeat_and_names_the_partial_run(tmp_path: Path, signum: int, code: int) -> None:
    proc, run_dir = start(tmp_path)
    assert len(survivors(tmp_path)) == 5  # detaudit, two repeats, two sleepers
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert "every process it started (repeat, watched job, experiment) was stopped" in err
    assert str(run_dir) in err
    assert "detaudit report" in err
    assert "detaudit compare" in err
    assert wait_until(lambda: not survivors(tmp_path), 5), f"survivors: {survivors(tmp_path)}"
    # the partial run is reportable: the repeats agree as far as they got, which proves nothing
    report = run_cli(["report", str(run_dir), "--json", "r.json"], cwd=tmp_path)
    assert report.returncode == 6, report.output
    assert report.report is not None
    assert report.report["verdict"] == "inconclusive"
    assert all(r["interrupted"] for r in report.report["runs"])


@pytest.mark.slow
def test_repeated_interrupts_escalate_instead_of_hanging(tmp_path: Path) -> None:
    """Repeats that ignore SIGTERM: a second Ctrl-C kills them at once; more, even while detaudit exits,
    change nothing (no hang, no traceback, no death by the signal)."""
    proc, _ = start(tmp_path, "--", "stubborn")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)  # inside the grace period, where the second Ctrl-C used to hang
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:  # keep pressing Ctrl-C until it exits
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "Traceback" not in err
    assert wait_until(lambda: not survivors(tmp_path), 5), f"survivors: {survivors(tmp_path)}"


@pytest.mark.slow
def test_descendants_never_outlive_a_repeat_that_ended_normally(tmp_path: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", sys.argv[0], "sleeper"])
        print("started a sleeper")
    """))
    result = run_cli(["run", str(script), "-n", "2", "--out", "run"], cwd=tmp_path)
    assert result.returncode == 6, result.output  # no tensor recorded: nothing to compare
    assert "nothing to compare" in result.stdout
    assert not processes_mentioning(str(script)), "a repeat's sleeper outlived it"

