"""fix/trials.py: the search's trials judge the audit's causes by the one ranking rule (docs/causes.md#ranking)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from detaudit.fix.fix_report import Trial
from detaudit.fix.trials import _judged
from detaudit.pin import Pin
from detaudit.results import Cause


def _audit(causes: list[Cause], not_ruled_out: list[Cause]) -> SimpleNamespace:
    return SimpleNamespace(causes=causes, not_ruled_out=not_ruled_out, first_divergence=SimpleNamespace(index=4))


CLOCK = Cause("outside-value", "possible", "the clock", ["time.time at a.py:3"], "log it")
HASH = Cause("python-hash-seed", "possible", "hash order", [], "sorted", [Pin.HASH_SEED], "no-evidence")


def test_a_candidate_the_search_refuted_is_ruled_out_in_fixs_report() -> None:
    judged = _judged(_audit([CLOCK], [HASH]), [Trial((Pin.HASH_SEED,), "divergent", 2)])  # type: ignore[arg-type]
    assert [(c.id, c.confidence) for c in judged] == [("outside-value", "possible"), ("python-hash-seed", "ruled-out")]


def test_a_candidate_the_search_confirmed_leads_fixs_report() -> None:
    unknown = Cause("unknown", "possible", "no recorded evidence explains the divergence", [], "explain")
    judged = _judged(_audit([unknown], [HASH]), [Trial((Pin.HASH_SEED,), "deterministic", 2)])  # type: ignore[arg-type]
    assert [(c.id, c.confidence) for c in judged] == [("python-hash-seed", "confirmed")]


SEED = Cause("varying-seed", "likely", "a seed from outside", ["Generator.seed() at a.py:13"],
             "call `.manual_seed(0)` on the Generator instead of `.seed()` at a.py:13", [Pin.TORCH_RNG], "direct")


def test_a_cause_no_knob_reaches_is_not_ruled_out_by_the_knob_that_failed_to_fix_it() -> None:
    """The torch-rng knob's prelude seed is overwritten by the script's own `.seed()`: its failure is no evidence."""
    judged = _judged(_audit([SEED], []), [Trial((Pin.TORCH_RNG,), "divergent", 2)])  # type: ignore[arg-type]
    assert [(c.id, c.confidence, c.pins) for c in judged] == [("varying-seed", "likely", [Pin.TORCH_RNG])]


def test_a_cause_no_knob_reaches_stays_confirmed_by_runs_experiment() -> None:
    confirmed = replace(SEED, confidence="confirmed", basis="experiment")
    judged = _judged(_audit([confirmed], []), [Trial((Pin.TORCH_RNG,), "divergent", 2)])  # type: ignore[arg-type]
    assert [(c.id, c.confidence) for c in judged] == [("varying-seed", "confirmed")]
    assert not any("still diverge" in line for line in judged[0].evidence)
