"""compare/set_origins.py: the run-ordered sets the op-level traces recorded at a reordering op's line."""

from __future__ import annotations

from pathlib import Path

from synthetic import training_records, write_trace

from detaudit.compare.set_origins import RunOrderedSet, sets_at

FEATURES = {"name": "features", "of": "str", "size": 5, "built": ["a.py:7"], "iterated": ["a.py:9"], "used": []}


def test_the_sets_at_the_ops_line_are_read_and_other_lines_ignored(tmp_path: Path) -> None:
    events = [(0, {"type": "set-order", "loc": "a.py:12", "sets": [FEATURES]}),
              (0, {"type": "set-order", "loc": "a.py:30", "sets": [{**FEATURES, "name": "other"}]})]
    trace = write_trace(tmp_path / "ops-0.trace", training_records(), {"exit_code": 0}, events)
    assert sets_at([trace], "a.py:12") == [RunOrderedSet("features", "str", 5, ["a.py:7"], ["a.py:9"], [])]
    assert sets_at([trace], "a.py:13") == []


def test_the_fix_goes_where_the_set_is_iterated_else_read_else_built() -> None:
    assert RunOrderedSet("s", "str", 2, ["a.py:1"], ["a.py:3"], ["a.py:2"]).fix_at == "a.py:3"
    assert RunOrderedSet("s", "str", 2, ["a.py:1"], [], ["a.py:2"]).fix_at == "a.py:2"
    assert RunOrderedSet("s", "str", 2, ["a.py:1"], [], []).fix_at == "a.py:1"


def test_objects_hashed_by_identity_order_by_address() -> None:
    assert RunOrderedSet("s", "objects hashed by identity", 2, [], [], []).by_address
    assert not RunOrderedSet("s", "tuple holding str", 2, [], [], []).by_address
