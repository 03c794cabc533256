"""The typed JSON codec (detaudit/codec.py): what it accepts, and the errors that name the field."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pytest

from detaudit.codec import AT_LEAST_0, FINITE, Codable, FileFormat, decode, encode
from detaudit.errors import TraceError


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner:
    size: int
    ratio: float | None = None


@dataclass(frozen=True)
class Outer(Codable):
    name: str
    inner: Inner
    colour: Colour = Colour.RED
    mode: Literal["strict", "loose"] = "strict"
    pair: tuple[int, str] = (0, "")
    items: tuple[Inner, ...] = ()
    by_index: dict[int, str] = field(default_factory=dict)
    anything: Any = None
    number: float | int = 0


def test_a_value_reads_back_through_json_types() -> None:
    value = Outer("x", Inner(3, 0.5), Colour.BLUE, "loose", (1, "a"), (Inner(1),), {2: "two"}, {"k": [1]}, 7)
    assert Outer.from_dict(value.to_dict()) == value


def test_enums_tuples_and_int_keys_are_written_as_json_values() -> None:
    data = encode(Outer("x", Inner(1), Colour.BLUE, pair=(1, "a"), by_index={2: "two"}))
    assert (data["colour"], data["pair"], data["by_index"]) == ("blue", [1, "a"], {"2": "two"})


def test_an_int_in_a_float_field_is_read_as_a_float_and_an_int_of_a_union_stays_an_int() -> None:
    value = decode(Outer, {"name": "x", "inner": {"size": 1, "ratio": 2}, "number": 3})
    assert (type(value.inner.ratio), type(value.number)) == (float, int)


def test_a_missing_field_with_a_default_takes_the_default() -> None:
    assert decode(Outer, {"name": "x", "inner": {"size": 1}}) == Outer("x", Inner(1))


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "x"}, "field `inner` is missing"),
    ({"name": "x", "inner": {"size": True}}, "field `inner.size` must be an integer, not True"),
    ({"name": "x", "inner": {"size": 1, "ratio": "a"}}, "field `inner.ratio` must be a number or null, not 'a'"),
    ({"name": "x", "inner": {"size": 1}, "colour": "green"}, "field `colour` must be one of 'red', 'blue'"),
    ({"name": "x", "inner": {"size": 1}, "mode": "lax"}, "field `mode` must be 'strict' or 'loose', not 'lax'"),
    ({"name": "x", "inner": {"size": 1}, "pair": [1]}, "field `pair` must be a list of 2, not list"),
    ({"name": "x", "inner": {"size": 1}, "items": [{"size": "s"}]}, "field `items[0].size` must be an integer"),
    ({"name": "x", "inner": {"size": 1}, "by_index": {"a": "b"}}, "field `by_index.a` must be an integer key"),
    ([], "field `(top level)` must be an object (Outer), not list"),
])
def test_a_value_of_the_wrong_type_is_an_error_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(TraceError, match="^where: .*") as raised:
        decode(Outer, data, "where")
    assert message in str(raised.value)


@dataclass(frozen=True)
class Counted:
    count: Annotated[int, AT_LEAST_0]
    mean: Annotated[float, FINITE] | None = None


NOTES = FileFormat("detaudit-notes", 3, "notes file")


def test_a_file_format_reads_its_stamped_json_into_the_declared_type() -> None:
    assert NOTES.read(Counted, {**NOTES.stamp(), "count": 2, "mean": 0.5}, "notes.json") == Counted(2, 0.5)


@pytest.mark.parametrize("data, message", [
    ({"format": "other", "version": 3, "count": 1}, r"notes\.json: not a detaudit notes file"),
    ({"format": "detaudit-notes", "version": 4, "count": 1}, r"notes\.json: notes file version 4 is not supported"),
    ({"format": "detaudit-notes", "version": True, "count": 1}, r"notes file version True is not supported"),
    ([], r"notes\.json: field `\(top level\)` must be an object"),
])
def test_a_file_format_refuses_a_foreign_or_newer_file_by_name(data: Any, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        NOTES.read(Counted, data, "notes.json")


@pytest.mark.parametrize("data, message", [
    ({"count": -1}, r"x\.json: field `count` must be an integer >= 0, not -1"),
    ({"count": 1, "mean": float("inf")}, r"x\.json: field `mean` must be a finite number or null, not inf"),
])
def test_a_declared_rule_refuses_what_the_type_alone_would_take(data: Any, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        decode(Counted, data, "x.json")
