"""Baselines (detaudit/report/baseline.py): save, compare, name what changed; strict reading of the format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SCRIPTS, run_cli
from rich.console import Console
from synthetic import training_records, write_run

from detaudit.audit.pipeline import compare_recorded, load_run
from detaudit.cli.render import divergence_panel, runs_table
from detaudit.compare import baseline_diff
from detaudit.compare.baseline_diff import EnvironmentChange
from detaudit.errors import TraceError
from detaudit.report import baseline
from detaudit.report.model import report_json
from detaudit.trace import Kind, read_trace


def _saved(tmp_path: Path) -> Path:
    """A baseline saved from a synthetic deterministic run."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, recs])
    return baseline.save(run_dir, load_run(run_dir), tmp_path / "base")


def test_save_and_load(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    assert sorted(p.name for p in saved.iterdir()) == [baseline.MANIFEST, baseline.STDOUT, baseline.TRACE]
    loaded = baseline.load(saved)
    assert loaded.granularity == "module"
    assert loaded.result.exit_code == 0
    assert loaded.script == "train.py"
    assert baseline.load(saved / baseline.MANIFEST).trace == loaded.trace


def test_a_divergent_run_is_never_saved(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [r.but(digest=r.digest + 1) for r in recs]])
    with pytest.raises(Exception, match="baseline not saved: the run is divergent"):
        baseline.save(run_dir, load_run(run_dir), tmp_path / "base")
    assert not (tmp_path / "base").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / baseline.MANIFEST).unlink(), "not a detaudit baseline"),
    (lambda d: (d / baseline.MANIFEST).write_text("{"), "unreadable baseline manifest"),
    (lambda d: _edit(d, format="something-else"), "not a detaudit baseline manifest"),
    (lambda d: _edit(d, version=99), "baseline manifest version 99 is not supported"),
    (lambda d: _edit(d, reference=None), "field `reference` must be an object"),
    (lambda d: (d / baseline.TRACE).unlink(), "is missing"),
    (lambda d: (d / baseline.TRACE).write_bytes((d / baseline.TRACE).read_bytes()[:-3] + b"xyz"),
     "does not match the checksum"),
])
def test_damaged_baselines_are_refused(tmp_path: Path, damage: object, message: str) -> None:
    saved = _saved(tmp_path)
    damage(saved)  # type: ignore[operator]
    with pytest.raises(TraceError, match=message):
        baseline.load(saved)


def _edit(directory: Path, **fields: object) -> None:
    manifest = directory / baseline.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), **fields}))


def test_environment_changes_name_every_field() -> None:
    changes = baseline_diff.environment_changes({"torch": "2.12.0", "num_threads": 4, "python": "3.11.7"},
                                           {"torch": "2.13.0", "num_threads": 2, "python": "3.11.7", "gpu": "H100"})
    assert changes == [EnvironmentChange("gpu", None, "H100"), EnvironmentChange("num_threads", 4, 2),
                       EnvironmentChange("torch", "2.12.0", "2.13.0")]


@pytest.mark.process
@pytest.mark.slow
def test_round_trip(tmp_path: Path) -> None:
    """Record, re-run unchanged, re-run with another learning rate, compare across a faked environment change."""
    script = str(SCRIPTS / "fit_lr.py")
    saved = run_cli(["run", script, "-n", "2", "--save-baseline", "base", "-q"], cwd=tmp_path)
    assert saved.returncode == 0, saved.output
    assert "baseline saved to base" in saved.stderr
    manifest = json.loads((tmp_path / "base" / baseline.MANIFEST).read_text())
    assert manifest["format"] == "detaudit-baseline"
    assert manifest["version"] == 1
    assert manifest["environment"]["torch"]
    assert manifest["environment"]["num_threads"] >= 1

    same = run_cli(["run", script, "-n", "2", "--baseline", "base", "--json", "same.json"], cwd=tmp_path)
    assert same.returncode == 0, same.output
    assert same.report is not None
    assert same.report["baseline"]["matches"] is True
    assert same.report["baseline"]["environment_changes"] == []
    assert "matches the baseline" in same.stdout

    # another learning rate: the first parameter update is the first record to differ
    changed = run_cli(["run", script, "-n", "2", "--baseline", "base", "--json", "lr.json", "--", "--lr", "0.07"],
                      cwd=tmp_path)
    assert changed.returncode == 1, changed.output
    assert changed.report is not None
    assert changed.report["verdict"] == "deterministic"
    first = changed.report["baseline"]["first_divergence"]
    reference = read_trace(tmp_path / "base" / baseline.TRACE)
    first_param = int(np.flatnonzero(reference.records["kind"] == int(Kind.PARAM))[0])
    assert (first["index"], first["kind"], first["name"], first["step"]) == \
        (first_param, "param", reference.text(int(reference.records["name"][first_param])), 0)
    assert changed.report["baseline"]["environment_changes"] == [
        {"field": "script arguments", "baseline": "(none)", "current": "--lr 0.07"}]
    assert "DIFFERS FROM THE BASELINE" in changed.stdout

    # a baseline recorded elsewhere: other torch, other thread count
    env = manifest["environment"]
    _edit(tmp_path / "base", environment={**env, "torch": "2.11.0", "num_threads": env["num_threads"] + 6})
    moved = run_cli(["run", script, "-n", "2", "--baseline", "base", "--json", "env.json", "--html", "env.html",
                     "--", "--lr", "0.07"], cwd=tmp_path)
    assert moved.returncode == 1
    assert moved.report is not None
    changes = {c["field"]: (c["baseline"], c["current"]) for c in moved.report["baseline"]["environment_changes"]}
    assert changes["torch"] == ("2.11.0", env["torch"])
    assert changes["num_threads"] == (env["num_threads"] + 6, env["num_threads"])
    assert f"2.11.0 → {env['torch']}" in moved.stdout  # next to the divergence in the terminal report
    html = (tmp_path / "env.html").read_text()
    assert "2.11.0" in html
    assert "Baseline" in html


@pytest.mark.process
def test_baseline_of_another_granularity_is_refused(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    result = run_cli(["run", str(SCRIPTS / "fit_lr.py"), "--granularity", "op", "--baseline", str(saved)],
                     cwd=tmp_path)
    assert result.returncode == 2
    assert "was recorded at granularity module" in result.stderr


@pytest.mark.process
def test_unreadable_baseline_exits_4_before_running(tmp_path: Path) -> None:
    (tmp_path / "nobase").mkdir()
    result = run_cli(["run", str(SCRIPTS / "fit_lr.py"), "--baseline", "nobase"], cwd=tmp_path)
    assert result.returncode == 4
    assert "not a detaudit baseline" in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / ".detaudit").exists()


def test_compare_reads_a_baseline_as_a_recording(tmp_path: Path) -> None:
    saved = _saved(tmp_path)
    recs = training_records(steps=2)
    other = write_run(tmp_path / "other", [[r.but(digest=r.digest + 1) if r.step == 1 else r for r in recs]] * 2)
    same = compare_recorded([saved, tmp_path / "run"])
    assert same.verdict == "deterministic"
    # each recording by the name it was given, and no time for the baseline, which keeps none
    assert same.recordings == [str(saved), str(tmp_path / "run")]
    assert [r["recording"] for r in report_json(same)["runs"]] == same.recordings
    assert [r.duration_s for r in same.runs] == [None, 0.5]
    console = Console(record=True, width=400)  # wide enough for any temporary path: rows are found by it
    console.print(runs_table(same))
    text = console.export_text()
    rows = [line for line in text.splitlines() if str(saved) in line or str(tmp_path / "run") in line]
    assert "Recordings compared" in text
    assert "repeat" not in text.splitlines()[1]
    assert len(rows) == 2
    assert " - " in rows[0]
    assert "0.50" in rows[1]
    assert "0.00" not in text
    report = compare_recorded([saved, other])
    assert report.verdict == "divergent"
    assert report.first_divergence is not None
    console = Console(record=True, width=300)
    panel = divergence_panel(report)
    assert panel is not None
    console.print(panel)
    assert f"{other} differ from {saved}" in console.export_text()
    assert report.first_divergence.record is not None
    assert report.first_divergence.record.step == 1


def test_saving_over_a_baseline_says_what_it_replaces_and_from_when(tmp_path: Path) -> None:
    assert baseline.replaces(tmp_path / "base") is None
    saved = _saved(tmp_path)
    manifest = json.loads((saved / baseline.MANIFEST).read_text())
    said = baseline.replaces(saved)
    assert said == (f"the baseline of train.py recorded {manifest['created']} "
                    f"(detaudit {manifest['detaudit_version']}, {manifest['reference']['records']} records)")
    (saved / baseline.MANIFEST).write_text("{")
    assert baseline.replaces(saved) == f"a baseline in {saved} whose {baseline.MANIFEST} could not be read"
