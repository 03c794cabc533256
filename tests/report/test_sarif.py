"""report/sarif.py: each kind of report as SARIF 2.1.0, every finding at the file:line it points at (typed reports
made by hand or from synthetic run directories; `run --sarif` itself: tests/cli/test_cli.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sarif_checks import sarif_errors
from synthetic import training_records, write_run

from detaudit.audit.pipeline import load_run
from detaudit.causes.repetition import RepeatedRandomness
from detaudit.drift.change_kinds import CandidateCause, ChangeEvidence
from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_report import DriftReport, FirstDrift, FloorSummary, OpWindow
from detaudit.report.model import Report
from detaudit.report.sarif import (
    audit_findings,
    drift_findings,
    repository_root,
    sarif_log,
    sites,
    watch_findings,
    write_sarif,
)
from detaudit.report.watch_model import WatchReport, WatchSettings
from detaudit.results import Cause, RepeatResult
from detaudit.run.watchlog import Mismatch, WatchLog

HASH_SEED = Cause("hash-seed", "likely", "set iteration order depends on PYTHONHASHSEED",
                  ["hash() of a str at train.py:21 gave 5 in repeat 0, 7 in repeat 1", "iterated at data/load.py:8"],
                  "set PYTHONHASHSEED=0")


def diverged(tmp: Path) -> Report:
    """Two repeats of a synthetic run whose first record, made at train.py:14, differs."""
    first, *rest = training_records(steps=2)
    first = first.but(loc="train.py:14")
    return load_run(write_run(tmp / "run", [[first, *rest], [first.but(digest=99), *rest]]))


def results(doc: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """Each result's rule, level, and locations as `uri:line`."""
    return [(r["ruleId"], r["level"], [f"{loc['physicalLocation']['artifactLocation']['uri']}:"
                                       f"{loc['physicalLocation']['region']['startLine']}" for loc in r["locations"]])
            for r in doc["runs"][0]["results"]]


def log(findings: Any, tmp: Path, cwd: Path | None = None) -> dict[str, Any]:
    return sarif_log(findings, "train.py", tmp, cwd or tmp)


def test_the_first_divergence_is_an_error_at_its_record_s_line(tmp_path: Path) -> None:
    assert results(log(audit_findings(diverged(tmp_path)), tmp_path))[0] == ("first-divergence", "error",
                                                                            ["train.py:14"])


def test_a_cause_is_a_warning_at_every_line_its_evidence_names(tmp_path: Path) -> None:
    report = replace(diverged(tmp_path), causes=[HASH_SEED])
    assert results(log(audit_findings(report), tmp_path))[1] == ("hash-seed", "warning",
                                                                 ["train.py:21", "data/load.py:8"])


def test_a_cause_whose_evidence_names_no_line_is_shown_at_the_divergence(tmp_path: Path) -> None:
    report = replace(diverged(tmp_path), causes=[replace(HASH_SEED, evidence=["no line here"])])
    assert results(log(audit_findings(report), tmp_path))[1][2] == ["train.py:14"]


def test_a_ruled_out_cause_is_left_out(tmp_path: Path) -> None:
    report = replace(diverged(tmp_path), causes=[replace(HASH_SEED, confidence="ruled-out")])
    assert [r[0] for r in results(log(audit_findings(report), tmp_path))] == ["first-divergence"]


def test_repeated_draws_are_a_warning_at_the_drawing_line_and_where_the_state_was_made(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    report = replace(load_run(write_run(tmp_path / "run", [recs, recs])), repeated_randomness=[
        RepeatedRandomness("train.py:31", "workers", "train.py:9", ["same draw in workers 0 and 1"], "seed workers")])
    assert results(log(audit_findings(report), tmp_path)) == [("repeated-randomness", "warning",
                                                               ["train.py:31", "train.py:9"])]


def test_repeated_draws_are_an_error_when_the_run_fails_on_them(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    report = replace(load_run(write_run(tmp_path / "run", [recs, recs])), fail_on_repeats=True, repeated_randomness=[
        RepeatedRandomness("train.py:31", "steps", None, ["the same at steps 0 and 1"], "seed once")])
    assert [r[1] for r in results(log(audit_findings(report), tmp_path))] == ["error"]


def test_repeats_that_agree_have_no_result_and_a_valid_document(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    doc = log(audit_findings(load_run(write_run(tmp_path / "run", [recs, recs]))), tmp_path)
    assert (doc["runs"][0]["results"], sarif_errors(doc)) == ([], [])


def test_an_audit_s_document_is_valid_sarif(tmp_path: Path) -> None:
    assert sarif_errors(log(audit_findings(replace(diverged(tmp_path), causes=[HASH_SEED])), tmp_path)) == []


def test_the_rules_are_those_the_results_name_each_once(tmp_path: Path) -> None:
    report = replace(diverged(tmp_path), causes=[HASH_SEED, replace(HASH_SEED, id="rng-unseeded")])
    rules = log(audit_findings(report), tmp_path)["runs"][0]["tool"]["driver"]["rules"]
    assert [rule["id"] for rule in rules] == ["first-divergence", "hash-seed", "rng-unseeded"]


def test_a_library_line_reached_from_the_user_s_is_left_out() -> None:
    assert sites(["train.py:12 via timm/layers/classifier.py:55", "again train.py:12"]) == ("train.py:12",)


def test_paths_are_relative_to_the_repository_root_above_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "examples").mkdir()
    assert repository_root(tmp_path / "examples") == tmp_path


def test_a_path_is_written_from_the_root_with_its_base_id(tmp_path: Path) -> None:
    doc = log(audit_findings(diverged(tmp_path)), tmp_path, tmp_path / "examples")
    artifact = doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact == {"uri": "examples/train.py", "uriBaseId": "%SRCROOT%"}


def test_a_path_outside_the_root_is_a_file_uri(tmp_path: Path) -> None:
    doc = log(audit_findings(diverged(tmp_path)), tmp_path / "repo", tmp_path)
    artifact = doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact == {"uri": (tmp_path / "train.py").as_uri()}


def watched(*mismatches: Mismatch) -> WatchReport:
    ended = RepeatResult(0, "cpu", 0, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    return WatchReport("train.py", "run", WatchSettings(), ended,
                       WatchLog(steps=2, checked_steps=(0, 1), replayed_ops=5, mismatches=mismatches))


def test_a_watch_mismatch_is_an_error_at_the_op_s_line(tmp_path: Path) -> None:
    mismatch = Mismatch(1, "aten.index_put_.default", "net", "train.py:13", None, 1e-3, 126, "neither")
    doc = log(watch_findings(watched(mismatch)), tmp_path)
    assert (results(doc), sarif_errors(doc)) == ([("watch-mismatch", "error", ["train.py:13"])], [])


def test_a_replica_mismatch_without_a_line_is_shown_at_the_script_s_first(tmp_path: Path) -> None:
    replica = Mismatch(2, "fc.weight", None, None, None, 1e-3, 3, None, check="replica", rank=1)
    assert results(log(watch_findings(watched(replica)), tmp_path)) == [("watch-mismatch", "error", ["train.py:1"])]


def drifted(window: OpWindow | None = None) -> DriftReport:
    first = FirstDrift(0, "grad", "fc.weight", "fc", "train.py:9", None, 2.0, "float32", "4x4",
                       ChangeEvidence(factor=2.0))
    cause = CandidateCause("env LOSS_WEIGHT", None, "2", "script", "changes what the script computes")
    return DriftReport("train.py", [], "run", "drift", Configuration("A"), Configuration("B"), [], [],
                       FloorSummary(10.0, 2, [], 0.0, None), first_drift=first, causes=[cause], op_window=window)


def test_a_drift_is_an_error_at_its_first_record_and_its_candidates_warnings_there(tmp_path: Path) -> None:
    doc = log(drift_findings(drifted()), tmp_path)
    assert (results(doc), sarif_errors(doc)) == ([("drift", "error", ["train.py:9"]),
                                                  ("drift-candidate", "warning", ["train.py:9"])], [])


def test_a_drift_s_op_window_line_comes_first(tmp_path: Path) -> None:
    window = OpWindow(0, "aten.mul.Tensor", "fc", "train.py:7", False, 40.0)
    assert results(log(drift_findings(drifted(window)), tmp_path))[0][2] == ["train.py:7", "train.py:9"]


def test_within_noise_has_no_result(tmp_path: Path) -> None:
    assert drift_findings(replace(drifted(), verdict="within-noise", first_drift=None, causes=[])) == []


def test_a_cause_s_rule_is_described_by_its_summary(tmp_path: Path) -> None:
    driver = log(audit_findings(replace(diverged(tmp_path), causes=[HASH_SEED])), tmp_path)["runs"][0]["tool"]["driver"]
    assert driver["rules"][1]["shortDescription"]["text"] == HASH_SEED.summary


def test_the_checks_refuse_a_result_without_a_line(tmp_path: Path) -> None:
    """tests/sarif_checks.py can fail: a location without its startLine is refused."""
    doc = log(audit_findings(diverged(tmp_path)), tmp_path)
    del doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert sarif_errors(doc) == ["results[0]: region.startLine must be a positive integer: None"]


def test_write_sarif_writes_the_document_from_the_working_directory(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_sarif(diverged(tmp_path), tmp_path / "out.sarif")
    assert json.loads((tmp_path / "out.sarif").read_text())["version"] == "2.1.0"
