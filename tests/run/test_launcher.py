"""The launcher: fresh interpreters per repeat, timeouts that kill the whole process group and leave
a readable incomplete trace, and Ctrl-C that stops every repeat with no orphan left behind."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest
from processes import alive, processes_mentioning, wait_until

from detaudit.errors import ExitCode, OutputError, UsageError
from detaudit.results import RepeatResult
from detaudit.run import launcher
from detaudit.run.launcher import Launcher, plan_repeats
from detaudit.trace import read_trace

# Records one module output, starts a grandchild in its process group, then hangs.
HANG = """
    import os, subprocess, sys, time
    import torch
    {prelude}
    out = torch.nn.Linear(3, 2)(torch.ones(1, 3))
    torch.save(out, os.devnull)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["PID_FILE"] + "." + str(os.getpid()), "w") as fh:
        fh.write(f"{{os.getpid()}} {{child.pid}}")
    print("ready", flush=True)
    time.sleep(600)
"""


def pids_from(pid_file: Path) -> list[int]:
    pids = []
    for path in pid_file.parent.glob(pid_file.name + ".*"):
        pids += [int(p) for p in path.read_text().split()]
    return pids


def test_plan_repeats_numbers_repeats_and_hides_gpus_for_cpu(tmp_path: Path) -> None:
    plans = plan_repeats(tmp_path, 2, ["cpu", "cuda"])
    assert [(p.index, p.device) for p in plans] == [(0, "cpu"), (1, "cpu"), (2, "cuda"), (3, "cuda")]
    assert [p.trace.name for p in plans] == [f"repeat-{i}.trace" for i in range(4)]
    assert all(p.env.get("CUDA_VISIBLE_DEVICES") == "" for p in plans[:2])
    assert all("CUDA_VISIBLE_DEVICES" not in p.env for p in plans[2:])
    assert "PYTHONHASHSEED" not in {k for p in plans for k in p.env}  # detaudit sets no seed


def test_missing_script_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="script not found"):
        Launcher(tmp_path / "nope.py", [], None)


def _special(tmp_path: Path, kind: str) -> Path:
    if kind == "fifo":
        os.mkfifo(tmp_path / "s.py")  # no writer: reading it would block forever
        return tmp_path / "s.py"
    if kind == "directory":
        (tmp_path / "pkg").mkdir()
        return tmp_path / "pkg"
    return Path(kind)


@pytest.mark.parametrize(("kind", "said"), [
    ("/dev/zero", "is a device, not a regular file"), ("/dev/null", "is a device"),
    ("fifo", "is a FIFO \\(named pipe\\), not a regular file"), ("directory", "is a directory"),
    ("/dev/stdin", "is a stream of this process"), ("/proc/self/fd/0", "is a stream of this process"),
])
def test_a_script_that_is_no_regular_file_is_refused_before_any_repeat(tmp_path: Path, kind: str,
                                                                      said: str) -> None:
    """Refused at once, never read: nothing blocks where --timeout does not reach, nothing fills memory."""
    with pytest.raises(UsageError, match=said):
        launcher.check_script(_special(tmp_path, kind))


def test_a_directory_python_would_run_names_its_main_file(tmp_path: Path) -> None:
    (tmp_path / "__main__.py").write_text("print(1)\n")
    with pytest.raises(UsageError, match=f"give {tmp_path / '__main__.py'}"):
        launcher.check_script(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_script_is_a_usage_error(tmp_path: Path) -> None:
    script = tmp_path / "secret.py"
    script.write_text("print(1)\n")
    script.chmod(0)
    with pytest.raises(UsageError, match="permission denied"):
        launcher.check_script(script)


@pytest.mark.process
def test_a_run_directory_deleted_while_a_repeat_runs_is_an_output_error(tmp_path: Path) -> None:
    """`rm -rf .detaudit` mid-run gave exit 70, "a bug in detaudit", half the time: now always exit 7."""
    from detaudit.errors import ExitCode, OutputError

    script = tmp_path / "rm.py"
    script.write_text("import shutil, sys\nshutil.rmtree(sys.argv[1])\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    [plan] = plan_repeats(run_dir, 1, ["cpu"])
    with pytest.raises(OutputError, match=f"cannot write {run_dir}: No such file or directory") as raised:
        Launcher(script, [str(run_dir)], timeout=60).run_one(plan)
    assert raised.value.exit_code == ExitCode.OUTPUT


def test_the_child_gets_the_script_as_typed_and_no_working_directory_on_its_path(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-y.py").write_text("print(1)\n")
    command = Launcher("./-y.py", ["a"], None)._command(tmp_path / "c.json")
    assert command[-3:] == [str(tmp_path / "c.json"), "./-y.py", "a"]
    assert command[:2] == [sys.executable, "-c"]
    assert "del sys.path[0]" in command[2]


@pytest.mark.process
def test_repeats_are_fresh_interpreters_and_results_come_in_plan_order(tmp_path: Path) -> None:
    script = tmp_path / "who.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        time.sleep(0.3 if sys.argv[1] == "slow" else 0)
        print(os.getpid(), hash("detaudit"), os.environ.get("CUDA_VISIBLE_DEVICES"))
    """))
    plans = plan_repeats(tmp_path, 3, ["cpu"])
    results = Launcher(script, ["slow"], timeout=60, jobs=3, cwd=tmp_path).run(plans)
    assert [r.index for r in results] == [0, 1, 2]
    assert all(r.exit_code == 0 for r in results)
    lines = [(tmp_path / r.stdout).read_text().split() for r in results]
    assert len({line[0] for line in lines}) == 3  # three processes
    assert len({line[1] for line in lines}) > 1  # each with its own hash seed: nothing inherited
    assert all(line[2] == "" if len(line) == 3 else line[2:] == [] for line in lines)
    assert len({r.stdout_digest for r in results}) == 3


@pytest.mark.process
def test_timeout_kills_the_process_group_and_leaves_an_incomplete_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "GRACE_S", 1.0)
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent(HANG.format(prelude="")))
    pid_file = tmp_path / "pids"
    plans = plan_repeats(tmp_path, 2, ["cpu"], env={"PID_FILE": str(pid_file)})
    started = time.monotonic()
    results = Launcher(script, ["x"], timeout=8, jobs=2, cwd=tmp_path).run(plans)
    assert time.monotonic() - started < 30
    assert all(r.timed_out for r in results)
    pids = pids_from(pid_file)
    assert len(pids) == 4  # two repeats and their grandchildren
    assert wait_until(lambda: not any(alive(p) for p in pids), 5), "a repeat or its grandchild survived"
    for r in results:
        tr = read_trace(tmp_path / r.trace)
        assert not tr.complete  # killed: no footer
        names = [tr.strings[i] for i in tr.records["name"]]
        assert "Linear" in names
        assert "torch.save[0]" in names
    assert "ready" in (tmp_path / results[0].stdout).read_text()


@pytest.mark.process
def test_timeout_kills_a_script_that_ignores_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "GRACE_S", 0.5)
    script = tmp_path / "stubborn.py"
    ignore_term = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    script.write_text(textwrap.dedent(HANG.format(prelude=ignore_term)))
    pid_file = tmp_path / "pids"
    plans = plan_repeats(tmp_path, 2, ["cpu"], env={"PID_FILE": str(pid_file)})[:1]
    results = Launcher(script, ["y"], timeout=8, cwd=tmp_path).run(plans)
    assert results[0].timed_out
    assert results[0].exit_code == -signal.SIGKILL
    assert wait_until(lambda: not any(alive(p) for p in pids_from(pid_file)), 5)
    assert not read_trace(tmp_path / results[0].trace).complete


@pytest.mark.process
def test_ctrl_c_stops_every_repeat_with_no_orphans(tmp_path: Path) -> None:
    marker = f"ctrlc-{os.getpid()}-{time.monotonic_ns()}"
    work = tmp_path / marker
    work.mkdir()
    script = work / "hang.py"
    script.write_text(textwrap.dedent(HANG.format(prelude="")))
    pid_file = work / "pids"
    env = {**os.environ, "PID_FILE": str(pid_file)}
    proc = subprocess.Popen([sys.executable, "-m", "detaudit", "run", str(script), "--repeats", "3", "--jobs", "2",
                             "--out", str(work / "run"), "--", "arg"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # both parallel repeats are running (and have started their grandchildren)
        assert wait_until(lambda: len(list(work.glob("run/repeat-*.stdout"))) >= 2
                          and all("ready" in p.read_text() for p in work.glob("run/repeat-*.stdout")), 60), \
            f"repeats did not start (detaudit exit status: {proc.poll()})"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the foreground group
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err
    assert wait_until(lambda: not processes_mentioning(marker), 5), processes_mentioning(marker)
    pids = pids_from(pid_file)
    assert pids
    assert not any(alive(p) for p in pids)
    assert len(pids) == 4
    assert not (work / "run" / "repeat-2.trace").exists()


def test_plan_names_keep_a_prefix_with_a_dot_and_are_absolute(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    plans = plan_repeats(Path("run"), 2, ["cpu"], prefix="explain-python-rng.2")
    names = [(p.trace.name, p.stdout.name, p.stderr.name) for p in plans]
    assert names == [(f"explain-python-rng.2-{i}.trace", f"explain-python-rng.2-{i}.stdout",
                      f"explain-python-rng.2-{i}.stderr") for i in range(2)]
    # the repeats run in the script's directory: a relative run directory would point elsewhere there
    assert all(path.is_absolute() and path.parent == tmp_path / "run"
               for p in plans for path in (p.trace, p.stdout, p.stderr))


def test_own_device_choice_hides_no_gpu(tmp_path: Path) -> None:
    plans = plan_repeats(tmp_path, 2, ["cpu"], own_device=True)
    assert all("CUDA_VISIBLE_DEVICES" not in p.env for p in plans)
    assert all(p.child_config["device"] == "cpu" for p in plans)


@pytest.mark.slow
def test_a_result_is_frozen_and_carries_the_scripts_error_from_the_footer(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("def load(path):\n    raise FileNotFoundError(path)\n\nload('labels.csv')\n")
    [result] = Launcher(script, [], timeout=60, cwd=tmp_path).run(plan_repeats(tmp_path, 1, ["cpu"]))
    assert result.exit_code == 1
    assert result.error is not None
    assert (result.error.type, result.error.message) == ("FileNotFoundError", "labels.csv")
    assert [(f.line, f.function) for f in result.error.frames] == [(4, "<module>"), (2, "load")]
    with pytest.raises(FrozenInstanceError):
        result.exit_code = 0  # type: ignore[misc]
    stored = result.to_dict()  # run.json keeps no copy: the footer is the error's one source
    assert "error" not in stored
    assert RepeatResult.from_dict({**stored, "new-key": 1}) == replace(result, error=None)


@pytest.mark.process
def test_links_a_script_plants_for_the_next_repeat_are_never_written_through(tmp_path: Path) -> None:
    """Issue 27 B5: a repeat's files are created exclusively; a link already at a name is refused (exit 7)."""
    victim = tmp_path / "users-file"
    victim.write_text("precious\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "plant.py"
    script.write_text(textwrap.dedent(f"""
        import os
        for name in ("repeat-1.stdout", "repeat-1.stderr", "repeat-1.config.json"):
            os.symlink({str(victim)!r}, os.path.join({str(run_dir)!r}, name))
        print("planted")
    """))
    plans = plan_repeats(run_dir, 2, ["cpu"])
    with pytest.raises(OutputError, match="already exists") as caught:
        Launcher(script, [], timeout=60, jobs=1, cwd=tmp_path).run(plans)
    assert caught.value.exit_code == ExitCode.OUTPUT
    assert victim.read_text() == "precious\n"


@pytest.mark.process
def test_a_stdout_digest_is_of_the_file_detaudit_created(tmp_path: Path) -> None:
    """A script that swaps its own capture for another file does not change what detaudit read back."""
    script = tmp_path / "swap.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        print("real output", flush=True)
        capture = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
        os.unlink(capture)
        with open(capture, "w") as fh:
            fh.write("forged output\\n")
    """))
    [planned] = plan_repeats(tmp_path, 1, ["cpu"])
    [result] = Launcher(script, [], timeout=60, cwd=tmp_path).run([planned])
    assert result.exit_code == 0
    assert result.stdout_digest == hashlib.sha256(b"real output\n").hexdigest()[:16]


def test_another_interpreter_runs_the_child_that_imports_this_detaudit(tmp_path: Path) -> None:
    command = launcher.child_command(tmp_path / "c.json", "train.py", ["--lr", "1"], python="/opt/other/bin/python")
    assert (command[0], command[3], command[-3:]) == ("/opt/other/bin/python", launcher._ROOT,
                                                      ["train.py", "--lr", "1"])
