"""drift/drift_report.py: the verdict's exit code and the JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_report import DRIFT_FORMAT, DriftReport, FloorSummary, write_json


def report(verdict: str) -> DriftReport:
    return DriftReport("train.py", [], "run", verdict, Configuration("A"), Configuration("B"), [], [],  # type: ignore[arg-type]
                       FloorSummary(10.0, 2, [], 0.0, None))


@pytest.mark.parametrize(("verdict", "code"), [("equivalent", 0), ("within-noise", 0), ("drift", 1),
                                               ("script-failed", 3), ("timeout", 5), ("inconclusive", 6)])
def test_within_noise_passes_and_drift_fails(verdict: str, code: int) -> None:
    assert report(verdict).exit_code == code


def test_the_json_document_names_its_format_and_reads_back(tmp_path: Path) -> None:
    write_json(report("drift"), tmp_path / "d.json")
    data = json.loads((tmp_path / "d.json").read_text())
    assert (data["format"], DriftReport.from_dict({k: v for k, v in data.items()
                                                    if k not in ("format", "version", "exit_code")})) == \
        (DRIFT_FORMAT, report("drift"))
