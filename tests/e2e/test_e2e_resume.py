"""`detaudit resume` end to end: the real CLI on scripts that checkpoint and resume (tests/scripts/MANIFEST.md,
"Resumed from a checkpoint"): one that saves and restores everything is resume-equivalent; each of the others
forgets one thing and gets that cause first; a run that saved nothing by --stop-at is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from detaudit.errors import ExitCode

SCRIPTS = Path(__file__).parents[1] / "scripts"
pytestmark = [pytest.mark.slow, pytest.mark.process]


@pytest.mark.parametrize(("script", "verdict", "cause", "where"), [
    ("train_ckpt_full.py", "resume-equivalent", None, None),
    ("train_ckpt_sampled.py", "resume-divergent", "resume-rng-state", "input"),
    ("train_ckpt_weights.py", "resume-divergent", "resume-optimizer-state", "param"),
    ("train_ckpt_decay.py", "resume-divergent", "resume-scheduler", "optstate"),
    ("train_ckpt_stream.py", "resume-divergent", "resume-data-position", "input"),
])
def test_resume_names_what_the_checkpoint_forgot(tmp_path: Path, script: str, verdict: str, cause: str | None,
                                                 where: str | None) -> None:
    result = run_cli(["resume", "--json", "report.json", str(SCRIPTS / script), "--steps", "5",
                      "--stop-at", "3", "--resume-args", "--resume"], cwd=tmp_path, timeout=600)
    report = result.report
    assert report is not None, result.stderr
    assert report["verdict"] == verdict, result.stdout
    assert result.returncode == (ExitCode.DETERMINISTIC if cause is None else ExitCode.DIVERGENT)
    assert report["stop_at"] == 3
    assert report["aligned_step"] == 2
    assert report["checkpoint"]["saved"][-1]["step"] == 2
    assert report["checkpoint"]["loaded"]
    if cause is None:
        assert report["first_divergence"] is None
        assert report["causes"] == []
        assert {p["role"] for p in report["checkpoint"]["saved"][0]["parts"]} == {
            "module", "optimizer", "scheduler", "rng-torch", "rng-numpy", "rng-python"}
        return
    assert report["causes"][0]["id"] == cause, [c["id"] for c in report["causes"]]
    first = report["first_divergence"]
    assert first["kind"] == where
    assert first["step"] >= 2
    assert f"{script}:" in report["causes"][0]["fix"]  # the fix is at the script's own line
    assert cause in result.stdout


def test_a_run_that_saved_no_checkpoint_by_stop_at_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli(["resume", str(SCRIPTS / "train_ckpt_full.py"), "--steps", "5", "--every", "4",
                      "--stop-at", "3", "--resume-args", "--resume"], cwd=tmp_path, timeout=600)
    assert result.returncode == ExitCode.NO_CHECKPOINT, result.stderr
    assert "the interrupted run saved no checkpoint by step 3" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_reference_that_does_not_reproduce_itself_is_reported_first(tmp_path: Path) -> None:
    """train_cnn.py initialises its model from the unseeded global RNG: that is `run`'s finding, not a resume
    bug, and nothing is interrupted or resumed."""
    result = run_cli(["resume", "--json", "report.json", str(SCRIPTS / "train_cnn.py"), "--stop-at", "1",
                      "--resume-args", "--resume"], cwd=tmp_path, timeout=600)
    assert result.returncode == ExitCode.DIVERGENT, result.stderr
    report = result.report
    assert report is not None
    assert report["verdict"] == "reference-divergent"
    assert report["causes"][0]["id"] == "unseeded-torch-rng"
    assert report["runs"] == []
    assert report["reference"]["verdict"] == "divergent"
    assert "does not reproduce itself" in result.stdout
