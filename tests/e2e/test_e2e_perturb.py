"""Issue 22's `--perturb` on the real CLI (docs/perturb.md): a script that agrees with itself on this machine
and not on one with another core count is caught, and a script that depends on none of the settings survives
them and keeps that in its baseline. In-process tests of the parts: tests/report/test_perturb.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SCRIPTS, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.process]  # the real CLI on real scripts

FAST = ["--repeats", "2", "--jobs", "2", "--granularity", "module"]


def test_a_thread_count_sensitive_script_agrees_with_itself_and_not_across_thread_counts(tmp_path: Path) -> None:
    script = str(SCRIPTS / "sum_readings.py")
    plain = run_cli(["run", script, *FAST, "--no-explain", "--out", "plain", "--json", "plain.json"], cwd=tmp_path)
    assert plain.returncode == 0, plain.output
    assert plain.report is not None, plain.output
    assert plain.report["verdict"] == "deterministic"
    assert plain.report["perturbation"] is None

    result = run_cli(["run", script, *FAST, "--perturb", "threads", "--out", "run", "--json", "report.json"],
                     cwd=tmp_path)
    report = result.report
    assert result.returncode == 1, result.output
    assert report is not None, result.output
    many = report["runs"][1]["perturbation"]["threads"]  # this machine's core count, at least 2
    assert [r["perturbation"]["threads"] for r in report["runs"]] == ["1", many] * 2
    assert many != "1"
    [threads] = report["perturbation"]["settings"]
    assert threads["changed_bits"] is True
    assert report["perturbation"]["control_agrees"] is True
    assert threads["repeats"] == [[0, 2], [1, 3]]
    assert threads["first_divergence"]["name"] == "Total"
    assert threads["first_divergence"]["kind"] == "output"
    assert [c["id"] for c in report["causes"]] == ["thread-count"]
    assert report["causes"][0]["confidence"] == "confirmed"
    # each repeat's own trace shows the thread count it ran with
    assert any("torch.get_num_threads() 1 in repeat 0" in line for line in report["causes"][0]["evidence"])
    assert "thread-count" in result.stdout
    assert "Perturbed settings" in result.stdout
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run_json["perturb"] == ["threads"]
    assert run_json["results"][1]["perturbation"] == {
        "threads": report["runs"][1]["perturbation"]["threads"]}


def test_a_script_that_depends_on_no_setting_survives_them_all_and_its_baseline_says_so(tmp_path: Path) -> None:
    result = run_cli(["run", str(SCRIPTS / "scale_features.py"), *FAST, "--device", "cpu", "--perturb", "all",
                      "--out", "run", "--json", "report.json", "--save-baseline", "base"], cwd=tmp_path)
    report = result.report
    assert result.returncode == 0, result.output
    assert report is not None, result.output
    assert report["verdict"] == "deterministic"
    assert len(report["runs"]) == 6
    assert report["perturbation"]["survived"] == ["threads", "hash-seed"]
    assert set(report["perturbation"]["not_tested"]) == {"cudnn-benchmark", "cublas-workspace", "allocator"}
    assert json.loads((tmp_path / "base" / "baseline.json").read_text())["survived"] == {
        "threads": ["1", report["runs"][1]["perturbation"]["threads"]], "hash-seed": ["1", "2"]}
    assert "unchanged by --perturb threads,hash-seed" in result.stdout
