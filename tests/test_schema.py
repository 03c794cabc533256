"""Field-type checks at the boundary: a wrong type names the file and the field (exit 4), never crashes later."""

from __future__ import annotations

import pytest

from detaudit import schema
from detaudit.errors import TraceError


def test_a_wrong_type_names_the_file_and_the_nested_field() -> None:
    results = [{"index": 0, "device": "cpu", "exit_code": "zero", "duration_s": 1.0, "timed_out": False,
                "trace": "a", "stdout": "b", "stderr": "c", "stdout_digest": ""}]
    with pytest.raises(TraceError, match=r"run\.json: field `results\[0\]\.exit_code` must be an integer or null"):
        schema.check(results, schema.ListOf(schema.REPEAT_RESULT), "run.json", "results")


@pytest.mark.parametrize(("value", "ok"), [(1, True), (True, False), (1.0, False), (None, False)])
def test_booleans_are_not_integers(value: object, ok: bool) -> None:
    if ok:
        schema.check(value, schema.Int(), "f")
    else:
        with pytest.raises(TraceError):
            schema.check(value, schema.Int(), "f")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1", True])
def test_numbers_are_finite_and_not_strings(value: object) -> None:
    with pytest.raises(TraceError, match="finite number"):
        schema.check(value, schema.Number(), "f")


def test_missing_required_field_and_unknown_keys() -> None:
    with pytest.raises(TraceError, match="field `type` is missing"):
        schema.check({"at": 0}, schema.EVENT, "t")
    schema.check({"at": 0, "type": "new-kind", "anything": [1, {"x": None}]}, schema.EVENT, "t")  # newer writers


def test_event_fields_are_typed_whatever_the_event_type() -> None:
    with pytest.raises(TraceError, match=r"field `rng\.torch\.digest` must be a string or null"):
        schema.check({"at": 0, "type": "state", "rng": {"torch": {"digest": []}}}, schema.EVENT, "t")
    with pytest.raises(TraceError, match="field `at` must be an integer >= 0"):
        schema.check({"at": -1, "type": "draw"}, schema.EVENT, "t")


@pytest.mark.parametrize("value, ok", [(1, True), (True, False), (1.0, False), ("1", False), (2, False), (None, False)])
def test_a_version_is_exactly_the_int(value: object, ok: bool) -> None:
    assert schema.is_version(value, 1) is ok
