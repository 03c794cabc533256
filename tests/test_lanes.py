"""conftest.py's lane machinery: `diverges_within`, the retry helper of race tests."""

from __future__ import annotations

import pytest
from conftest import CliResult, diverges_within


def results(*codes: int) -> list[CliResult]:
    return [CliResult(code, f"out {i}", "", None) for i, code in enumerate(codes)]


def test_the_first_divergent_audit_is_returned_and_no_more_run() -> None:
    ran = results(0, 0, 1, 1)
    calls: list[int] = []

    def audit(attempt: int) -> CliResult:
        calls.append(attempt)
        return ran[attempt]

    assert diverges_within(4, audit) is ran[2] and calls == [0, 1, 2]


def test_no_divergence_within_the_attempts_fails_listing_them() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"no divergence within 2 audits \(attempt 0: exit 0; attempt 1"):
        diverges_within(2, lambda attempt: results(0, 0)[attempt])


def test_an_audit_that_failed_otherwise_stops_the_retries() -> None:
    calls: list[int] = []

    def audit(attempt: int) -> CliResult:
        calls.append(attempt)
        return results(3, 1)[attempt]

    with pytest.raises(pytest.fail.Exception, match="attempt 0: exit 3"):
        diverges_within(3, audit)
    assert calls == [0]
