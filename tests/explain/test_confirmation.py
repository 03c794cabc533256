"""explain/confirmation.py: the experiments as the audit's Experimenter (runner.experiment_on replaced by a fake
that records what it was asked), and why a divergent run gets no cheap confirmation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from synthetic import training_records, write_run

from detaudit.audit.analysis import Analysis
from detaudit.audit.follow_up import FollowUp
from detaudit.audit.pipeline import loaded
from detaudit.explain import confirmation
from detaudit.explain.confirmation import PinnedExperiments, cheap_skipped
from detaudit.results import Cause, Confidence, Experiment


def cause(cause_id: str, pins: list[str], confidence: Confidence = "likely") -> Cause:
    return Cause(cause_id, confidence, "summary", ["seen"], "fix", pins)


def divergent(tmp_path: Path, causes: list[Cause], not_ruled_out: list[Cause] | None = None,
              experiments: list[Experiment] | None = None) -> Analysis:
    """A synthetic divergent run's Analysis whose report ranks these causes."""
    recs = training_records(steps=2)
    analysis = loaded(write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]]))
    report = replace(analysis.report_made(), causes=causes, not_ruled_out=not_ruled_out or [],
                     experiments=experiments or [])
    return replace(analysis, report=report)


class Heard:
    """What the experimenter asked runner.experiment_on for, and what it told the front end."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ran: list[FollowUp] = []
        self.rounds: list[tuple[bool, int]] = []
        self.skipped: list[str] = []
        monkeypatch.setattr(confirmation, "experiment_on", self._experiment_on)
        self.experimenter = PinnedExperiments(on_round=lambda cheap, most: self.rounds.append((cheap, most)),
                                              on_skipped=self.skipped.append)

    def _experiment_on(self, analysis: Analysis, follow_up: FollowUp, *args: Any) -> Analysis:
        self.ran.append(follow_up)
        return analysis


@pytest.fixture
def heard(monkeypatch: pytest.MonkeyPatch) -> Heard:
    return Heard(monkeypatch)


def test_a_top_cause_with_a_cheap_pin_gets_its_cheap_experiment(tmp_path: Path, heard: Heard) -> None:
    heard.experimenter.confirm(divergent(tmp_path, [cause("unseeded-torch-rng", ["torch-rng"])]), FollowUp(cheap=True))
    assert [f.cheap for f in heard.ran] == [True]


def test_the_cheap_round_is_announced_with_its_two_repeats(tmp_path: Path, heard: Heard) -> None:
    heard.experimenter.confirm(divergent(tmp_path, [cause("unseeded-torch-rng", ["torch-rng"])]), FollowUp(cheap=True))
    assert heard.rounds == [(True, 2)]


def test_a_top_cause_without_a_cheap_pin_gets_no_experiment(tmp_path: Path, heard: Heard) -> None:
    heard.experimenter.confirm(divergent(tmp_path, [cause("outside-value", [])]), FollowUp(cheap=True))
    assert heard.ran == []


def test_a_skipped_confirmation_is_told_why(tmp_path: Path, heard: Heard) -> None:
    heard.experimenter.confirm(divergent(tmp_path, [cause("outside-value", [])]), FollowUp(cheap=True))
    assert heard.skipped == ["no experiment pins outside-value's source, so none can confirm it"]


def test_a_run_with_experiments_is_not_confirmed_again(tmp_path: Path, heard: Heard) -> None:
    done = Experiment("torch-rng", "torch RNG seeded", "deterministic", None, "")
    heard.experimenter.confirm(divergent(tmp_path, [cause("unseeded-torch-rng", ["torch-rng"])], experiments=[done]),
                               FollowUp(cheap=True))
    assert (heard.ran, heard.skipped) == ([], [])


def test_explain_runs_the_experiments_within_the_default_budget(tmp_path: Path, heard: Heard) -> None:
    heard.experimenter.explain(divergent(tmp_path, [cause("outside-value", [])]), FollowUp(cheap=True, explain=True))
    assert ([f.cheap for f in heard.ran], heard.rounds) == ([False], [(False, 12)])


def test_with_no_evidence_anywhere_the_skip_names_the_candidates(tmp_path: Path) -> None:
    guesses = [replace(cause(c, [p], "possible"), basis="no-evidence")
               for c, p in (("python-hash-seed", "hash-seed"), ("object-order", "address-layout"))]
    report = divergent(tmp_path, [cause("unknown", [], "possible")], guesses).report_made()
    assert cheap_skipped(report) == (
        "no evidence points at any cause's mechanism, so no experiment tests a guess; `detaudit explain` tests the "
        "candidates not ruled out (python-hash-seed, object-order)")


def test_a_skipped_cheap_confirmation_says_why_in_one_line(tmp_path: Path) -> None:
    guess = replace(cause("python-hash-seed", ["hash-seed"], "possible"), basis="no-evidence")
    report = divergent(tmp_path, [cause("outside-value", [], "possible")], [guess]).report_made()
    assert cheap_skipped(report) == ("no experiment pins outside-value's source, so none can confirm it; "
                                     "the candidates with no evidence of their mechanism (python-hash-seed) "
                                     "are not tested in its place")


def test_a_cheap_confirmation_that_runs_needs_no_reason(tmp_path: Path) -> None:
    report = divergent(tmp_path, [cause("unseeded-numpy-rng", ["numpy-rng"])]).report_made()
    assert cheap_skipped(report) == ""
