"""End to end: `explain` and `compare` on scripts with a known cause (each scenario script's own
top cause, confirmation and line are checked once, in test_cause_matrix.py, which also checks that
the deterministic controls get no cause under --explain and that concurrency survives every pin).

CUDA-only causes run on CPU through the test-only fault injector (detaudit/recorder/faults.py,
DETAUDIT_TEST_FAULT): the op is perturbed while the real flag condition holds, and evidence reports
it on cuda. Thread-count and TF32 differ between machines or devices, not between repeats of one
run, so they are checked by comparing two recordings (`detaudit compare`), which has no re-run
to confirm with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import CliResult, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.process]  # every test here runs the real CLI on real scripts

FAST = ["-n", "2", "-j", "2", "--granularity", "module", "-q"]


def fault(op: str, when: str) -> dict[str, str]:
    return {"DETAUDIT_TEST_FAULT": json.dumps({"op": op, "when": when})}


def audit(tmp_path: Path, script: Path, *extra: str, env: dict[str, str] | None = None,
          fast: list[str] = FAST) -> CliResult:
    return run_cli(["run", str(script), *fast, "--out", str(tmp_path / "run"), "--json", "report.json", *extra],
                   cwd=tmp_path, env=env)


def assert_confirmed(report: dict[str, Any], cause_id: str, pin: str, line: str) -> None:
    top = report["causes"][0]
    assert top["id"] == cause_id, [(c["id"], c["evidence"]) for c in report["causes"]]
    assert top["confidence"] == "confirmed"
    assert line in top["fix"] or any(line in e for e in top["evidence"])
    confirming = [e for e in report["experiments"] if e["pin"] == pin]
    assert confirming
    assert confirming[0]["verdict"] == "deterministic"


def test_explain_command_on_a_finished_run_and_report_afterwards(tmp_path: Path, scripts: Path) -> None:
    first = audit(tmp_path, scripts / "train_tabular.py", "--no-explain")
    assert first.returncode == 1
    assert first.report is not None
    assert first.report["causes"][0]["id"] == "unseeded-python-rng"
    assert first.report["causes"][0]["confidence"] == "likely"
    assert not first.report["experiments"]

    explained = run_cli(["explain", "run", "--budget", "2", "--json", "explained.json"], cwd=tmp_path)
    assert explained.returncode == 1, explained.output
    assert explained.report is not None
    assert_confirmed(explained.report, "unseeded-python-rng", "python-rng", "train_tabular.py:18")
    assert (tmp_path / "run" / "explain-python-rng-0.trace").is_file()

    again = run_cli(["report", "run", "--json", "again.json"], cwd=tmp_path)
    assert again.report is not None
    assert again.report["causes"] == explained.report["causes"]
    assert again.report["experiments"] == explained.report["experiments"]
    assert "Experiments (--explain)" in run_cli(["report", "run"], cwd=tmp_path).stdout


def compare_recordings(tmp_path: Path, script: Path, envs: list[dict[str, str]], *tolerance: str) -> CliResult:
    for i, env in enumerate(envs):
        made = run_cli(["run", str(script), *FAST, "--out", str(tmp_path / f"rec{i}")], cwd=tmp_path, env=env)
        assert made.returncode == 0, made.output  # each recording is deterministic on its own
    return run_cli(["compare", "rec0", "rec1", *tolerance, "--json", "compare.json"], cwd=tmp_path)


def test_thread_count_between_recordings(tmp_path: Path, scripts: Path) -> None:
    result = compare_recordings(tmp_path, scripts / "train_wide.py", [{"OMP_NUM_THREADS": "1"},
                                                                      {"OMP_NUM_THREADS": "2"}])
    assert result.returncode == 1
    assert result.report is not None
    top = result.report["causes"][0]
    assert top["id"] == "thread-count"
    assert "1 in repeat 0, 2 in repeat 1" in top["evidence"][0]


def test_tf32_between_cpu_and_a_tf32_device(tmp_path: Path, scripts: Path) -> None:
    # both on the CPU, one simulating a TF32 device (on a GPU machine the script would pick CUDA)
    cpu = {"CUDA_VISIBLE_DEVICES": ""}
    result = compare_recordings(tmp_path, scripts / "train_fast_mlp.py",
                                [cpu, {**cpu, **fault("torch.nn.functional.linear", "tf32")}], "--atol", "1e-5")
    assert result.returncode == 1
    assert result.report is not None
    assert [c["id"] for c in result.report["causes"]][:2] == ["tf32", "environment"]
