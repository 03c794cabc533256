"""conftest.py's lane machinery: `diverges_within`, the retry helper of race tests, and the order tests start in."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import conftest
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

    assert diverges_within(4, audit) is ran[2]
    assert calls == [0, 1, 2]


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


@dataclass
class FakeItem:
    """What the ordering hook reads of a collected test: its id and its markers."""

    nodeid: str
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.markers.add(mark.name)


def test_slow_tests_start_longest_first_new_ones_among_the_long_and_in_process_ones_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"e2e.py::short": 2.0, "e2e.py::long": 40.0, "e2e.py::middle": 9.0}))
    monkeypatch.setattr(conftest, "DURATIONS", durations)
    items = [FakeItem("unit.py::a"), FakeItem("e2e.py::short", {"process"}), FakeItem("unit.py::b"),
             FakeItem("e2e.py::long", {"slow"}), FakeItem("e2e.py::new", {"race"}),
             FakeItem("e2e.py::middle", {"slow"})]
    conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["e2e.py::long", "e2e.py::middle", "e2e.py::new", "e2e.py::short",
                                         "unit.py::a", "unit.py::b"]
    assert all("slow" in i.markers for i in items[:4])  # process and race tests are slow


def test_without_a_durations_file_slow_tests_keep_their_collection_order_before_the_fast_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "none.json")
    items = [FakeItem("unit.py::a"), FakeItem("e2e.py::x", {"process"}), FakeItem("e2e.py::y", {"slow"})]
    conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["e2e.py::x", "e2e.py::y", "unit.py::a"]
