"""fix/trials.py: the search's trials judge the audit's causes by the one ranking rule (docs/causes.md#ranking)."""

from __future__ import annotations

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
