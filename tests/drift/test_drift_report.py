"""drift/drift_report.py: the verdict's exit code and the JSON document."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from detaudit.compare.tokens import TokenComparison, TokenDivergence
from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_report import DRIFT_FORMAT, DriftReport, DriftTokens, FloorSummary, write_json


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


def test_a_json_document_with_tokens_reads_back(tmp_path: Path) -> None:
    divergence = TokenDivergence(sequence=1, position=3, fn="Tensor.argmax", loc="gen.py:9", reference=0, repeat=1,
                                 token=3, other=8, margin=0.25, other_margin=None, at=7)
    compared = TokenComparison(repeats=2, distinct=2, sequences=2, tokens=4, groups=((0,), (1,)),
                               divergences=(divergence,))
    decoded = replace(report("drift"), tokens=DriftTokens(compared, a_repeats=3, a_distinct=1, first_drift_record=5))
    write_json(decoded, tmp_path / "d.json")
    data = json.loads((tmp_path / "d.json").read_text())
    assert DriftReport.from_dict({k: v for k, v in data.items() if k not in ("format", "version", "exit_code")}) \
        == decoded
