"""Issue 27, class B: nothing read or written outside a run directory or a baseline through a symlink
planted in it (detaudit/trace/reader.py `open_regular` reads, detaudit/run/files.py writes).

Every file a run directory or a baseline holds is replaced by a link to a file outside it (whose
content would pass as the real one), to a directory and to /proc/self/environ; each command that
reads it must end with a clear error or leave the file out, and never show the target's content.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_in_process
from synthetic import training_records, write_run

from detaudit.audit.pipeline import load_run
from detaudit.events import WORKERS_SUFFIX
from detaudit.report import baseline
from detaudit.run.rundir import write_experiments

SECRET = "aws_secret_access_key=hunter2"
RUN_FILES = ["run.json", "explain.json", "repeat-0.trace", "repeat-1.trace", "repeat-0.stdout", "repeat-1.stdout",
             "repeat-0.stderr", "repeat-1.stderr", "repeat-1.trace" + WORKERS_SUFFIX]
BASELINE_FILES = [baseline.MANIFEST, baseline.TRACE, baseline.STDOUT]
TARGETS = ["file", "directory", "proc"]


def _environ_marker() -> str:
    """A string only /proc/self/environ of this process holds (its first variable, whole)."""
    return Path("/proc/self/environ").read_bytes().split(b"\0")[0].decode(errors="replace")


def _plant(directory: Path, name: str, target: str, outside: Path) -> None:
    """Replace `directory/name` with a symlink: to a copy of itself plus a secret outside the directory
    (followed, it would read as the real file), to a directory, or to /proc/self/environ."""
    original = directory / name
    if target == "file":
        copy = outside / f"copy-of-{name}"
        shutil.copyfile(original, copy)
        if name.endswith((".stdout", ".stderr")):
            with open(copy, "a") as fh:
                fh.write(SECRET + "\n")
        destination = str(copy)
    else:
        destination = str(outside) if target == "directory" else "/proc/self/environ"
    original.unlink()
    original.symlink_to(destination)


def _assert_never_read_through(result: object, stdout_text: str, stderr_text: str, code: int) -> None:
    assert code in (0, 1, 4), stderr_text
    assert "Traceback" not in stdout_text + stderr_text
    assert "internal error" not in stderr_text
    assert SECRET not in stdout_text + stderr_text
    if os.path.exists("/proc/self/environ"):
        assert _environ_marker() not in stdout_text + stderr_text


def _run_dir(tmp_path: Path) -> Path:
    recs = training_records(steps=2)
    # repeat 1 failed: its stderr is shown; the repeats print, so stdout is compared
    run_dir = write_run(tmp_path / "run", [recs, recs], exit_codes=[0, 1], stdout=["loss 0.5\n", "loss 0.5\n"])
    write_experiments(run_dir, [])
    worker = {"at": 0, "worker": 0, "type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 1,
              "loc": "train.py:3", "library": False, "drawn_before": False, "state": None, "pinned": None}
    (run_dir / ("repeat-1.trace" + WORKERS_SUFFIX)).write_text(json.dumps(worker) + "\n")
    return run_dir


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", RUN_FILES)
def test_a_link_planted_in_a_run_directory_is_never_read_through(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 name: str, target: str) -> None:
    run_dir = _run_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    _plant(run_dir, name, target, outside)
    recs = training_records(steps=2)
    intact = write_run(tmp_path / "intact", [recs, recs], stdout=["loss 0.5\n", "loss 0.5\n"])
    for args in (["report", str(run_dir), "--json", "-"], ["compare", str(run_dir), str(intact), "--json", "-"]):
        result = run_in_process(args, capsys)
        _assert_never_read_through(result, result.stdout, result.stderr, result.returncode)
        read = {"report": ("run.json", "explain.json", "repeat-0.trace", "repeat-1.trace",  # no stdout: exits differ
                           "repeat-1.trace" + WORKERS_SUFFIX),
                "compare": ("run.json", "repeat-0.trace", "repeat-0.stdout")}  # a run's first repeat
        if name in read[args[0]]:
            # what the verdict rests on: refused, naming the link (a copy of the file would have passed)
            assert result.returncode == 4, result.stderr
            assert "symbolic link" in result.stderr or "not a regular file" in result.stderr


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", BASELINE_FILES)
def test_a_link_planted_in_a_baseline_is_never_read_through(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            name: str, target: str) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, recs], stdout=["loss 0.5\n", "loss 0.5\n"])
    saved = baseline.save(run_dir, load_run(run_dir), tmp_path / "base")
    outside = tmp_path / "outside"
    outside.mkdir()
    _plant(saved, name, target, outside)
    result = run_in_process(["compare", str(saved), str(run_dir), "--json", "-"], capsys)
    _assert_never_read_through(result, result.stdout, result.stderr, result.returncode)
    assert result.returncode == 4, result.stderr  # a baseline is read whole: a link anywhere in it is refused
    assert "symbolic link" in result.stderr or "not a regular file" in result.stderr or "missing" in result.stderr


def test_saving_a_baseline_never_writes_through_a_link_planted_in_it(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, recs], stdout=["loss 0.5\n", "loss 0.5\n"])
    report = load_run(run_dir)
    dest = baseline.save(run_dir, report, tmp_path / "base")  # an older baseline, to be replaced
    victim = tmp_path / "users-file"
    victim.write_text("precious\n")
    for name in BASELINE_FILES:
        (dest / name).unlink()
        (dest / name).symlink_to(victim)
    baseline.save(run_dir, report, dest)
    assert victim.read_text() == "precious\n"
    assert all(not (dest / name).is_symlink() for name in BASELINE_FILES)
    assert baseline.load(dest).result.stdout_digest == json.loads((run_dir / "run.json").read_text())[
        "results"][0]["stdout_digest"]


def test_saving_a_baseline_never_copies_a_link_planted_in_the_run(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, recs], stdout=["loss 0.5\n", "loss 0.5\n"])
    report = load_run(run_dir)
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    (run_dir / "repeat-0.stdout").unlink()
    (run_dir / "repeat-0.stdout").symlink_to(secret)
    with pytest.raises(Exception, match="symbolic link"):
        baseline.save(run_dir, report, tmp_path / "base")
    assert not (tmp_path / "base" / baseline.STDOUT).exists()
