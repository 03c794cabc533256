"""detaudit/events.py: the event types, their kinds, and the schema that checks them when read back."""

from __future__ import annotations

from typing import get_args, get_type_hints

from detaudit import events, schema


def test_every_event_type_has_its_own_kind_and_the_kind_literal_lists_them_all() -> None:
    kinds = [events.kind_of(cls) for cls in get_args(events.Event)]
    assert len(kinds) == len(set(kinds))
    assert set(kinds) == set(get_args(events.Kind))


def test_every_declared_field_is_type_checked_at_the_read_boundary() -> None:
    declared = {name for cls in get_args(events.Event) for name in get_type_hints(cls)}
    # both ways: an unchecked field reaches the detectors unchecked; a spec for a field nothing writes is stale
    assert declared == set(schema.EVENT.fields)


def test_select_types_the_events_of_one_kind() -> None:
    stream: list[events.Event] = [
        {"type": "hash", "PYTHONHASHSEED": None, "randomization": 1, "probe": 7, "aslr_disabled": False},
        {"type": "clock", "fn": "time.time", "loc": "a.py:1"},
        {"type": "clock", "fn": "time.perf_counter", "loc": "a.py:2"},
    ]
    assert [e["fn"] for e in events.select(stream, events.ClockEvent)] == ["time.time", "time.perf_counter"]
    assert events.select(stream, events.SeedEvent) == []
