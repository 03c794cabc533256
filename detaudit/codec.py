"""A dataclass as JSON and back, driven by its fields' type hints: one encoder and one decoder for every
report kind (Report, BatchReport, ResumeReport, FixReport, DriftReport) and the values inside them.

Why not a hand-written `from_dict` per class: the reports gain fields often, and a decoder that reads the
declaration itself reads a new field with no code. Why not pydantic (or msgspec, not installed here): on a
Report of 100,000 steps (10.9 MB of JSON, a 1M-record run), pydantic reads it in 0.25 s plus 0.03 s to build
its adapter, this in 0.33 s; but importing pydantic costs 68 ms, this module 7 ms, and most reports are
small: the import is the cost a user pays, and pydantic would be a new dependency.

The decoder validates at the boundary: a value of the wrong type is a TraceError naming the field's path
(`runs[1].exit_code must be an integer or null, not 'x'`), never an exception deep inside a renderer.
Supported: str, int, float, bool, None, Any, enums, Literal, X | None and other unions, list, tuple (fixed
or variable length), dict or Mapping (keys of str, int or an enum), TypedDicts, nested (also recursive)
dataclasses, and `Annotated[X, Rule(...)]` for a constraint the type cannot say (`AT_LEAST_0`, `FINITE`).

A file detaudit writes and reads back declares its `FileFormat` (name, version, what errors call it): the
format and version lead the JSON and are checked before any field, and `FileFormat.read` decodes the rest.
How to add a format: docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
from collections.abc import Callable, Mapping
from functools import cache
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints, is_typeddict

from detaudit import schema
from detaudit.errors import TraceError

T = TypeVar("T")
C = TypeVar("C", bound="Codable")
_NONE = type(None)


class Codable:
    """A dataclass that reads back what it writes: `Kind.from_dict(kind.to_dict()) == kind`."""

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON values (`encode`)."""
        return encode(self)

    @classmethod
    def from_dict(cls: type[C], data: Any) -> C:
        """What `to_dict` wrote (through json or not), checked against the fields' types (`decode`)."""
        return decode(cls, data, cls.__name__)


@dataclasses.dataclass(frozen=True)
class FileFormat:
    """A versioned JSON file: `{"format": name, "version": version, ...}`. A reader checks both before any other
    field, so a foreign file, or one from a newer detaudit, is refused by name (`what` names it in errors)."""

    name: str
    version: int
    what: str

    def stamp(self) -> dict[str, Any]:
        """The keys a file of this format starts with."""
        return {"format": self.name, "version": self.version}

    def check(self, data: Any, where: str) -> None:
        """A TraceError unless `data` is this format's JSON at this version (`where`: the file, named in it)."""
        schema.check(data, dict, where)
        if data.get("format") != self.name:
            raise TraceError(f"{where}: not a detaudit {self.what} (its `format` is not {self.name!r})")
        if not schema.is_version(data.get("version"), self.version):
            raise TraceError(f"{where}: {self.what} version {data.get('version')!r} is not supported (this "
                             f"detaudit reads version {self.version}); it was written by another detaudit release")

    def read(self, cls: type[T], data: Any, where: str) -> T:
        """`data`, checked to be this format, as a `cls` (its fields decoded by their declared types)."""
        self.check(data, where)
        return decode(cls, data, where)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A constraint on a decoded value that its type cannot say, declared as `Annotated[tp, rule]`."""

    expected: str  # what a value must be, as errors say it: "an integer >= 0"
    holds: Callable[[Any], bool]


AT_LEAST_0 = Rule("an integer >= 0", lambda value: value is None or value >= 0)
FINITE = Rule("a finite number", lambda value: value is None or math.isfinite(value))


def encode(value: Any) -> Any:
    """`value` as JSON values: dataclasses as objects of their fields, enums as their values, tuples as lists,
    dict keys as strings. Non-finite floats stay as they are (json.dumps writes them as NaN/Infinity)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, Mapping):
        return {_key(k): encode(v) for k, v in value.items()}
    return value


def _key(key: Any) -> str:
    return str(key.value) if isinstance(key, enum.Enum) else str(key)


def decode(cls: type[T], data: Any, where: str = "report") -> T:
    """`data` (as `encode` wrote it) as a `cls`; a TraceError naming `where` and the field when it does not fit."""
    try:
        read: Reader = reader(cls)  # type: ignore[arg-type]
        return read(data)
    except _Misfit as e:
        shown = repr(e.data) if isinstance(e.data, (bool, int, float, str)) or e.data is None else type(e.data).__name__
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in reversed(e.path)).lstrip(".")
        if e.expected is None:
            raise TraceError(f"{where}: field `{path}` is missing") from None
        raise TraceError(f"{where}: field `{path or '(top level)'}` must be {e.expected}, not {shown:.80}") from None


@cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of a dataclass or TypedDict (its module must import the names it uses at run
    time, not only under TYPE_CHECKING)."""
    return get_type_hints(cls, include_extras=True)


Reader = Callable[[Any], Any]


class _Misfit(Exception):
    """A value that does not fit; `path` grows (innermost first) as the readers around it re-raise it.
    `expected` None: a required field is missing."""

    def __init__(self, expected: str | None, data: Any, path: list[str | int] | None = None) -> None:
        self.expected, self.data, self.path = expected, data, path or []


def _inside(key: str | int, read: Reader, value: Any) -> Any:
    try:
        return read(value)
    except _Misfit as e:
        e.path.append(key)
        raise


@cache
def reader(tp: Any) -> Reader:
    """The function that reads a JSON value as a `tp` (built once per type: a large report reads fast)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return lambda data: data
    if origin is Annotated:
        return _ruled_reader(reader(args[0]), [rule for rule in tp.__metadata__ if isinstance(rule, Rule)])
    if origin in (Union, types.UnionType):
        return _union_reader(args)
    if origin is Literal:
        return _literal_reader(args)
    if origin in (list, tuple):
        return _sequence_reader(origin, args)
    if origin in (dict, Mapping) or tp is dict:
        return _mapping_reader(*(args or (str, Any)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_reader(tp)
    if isinstance(tp, type) and is_typeddict(tp):
        return _typeddict_reader(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_reader(tp)
    return _scalar_reader(tp)


def _ruled_reader(read_value: Reader, rules: list[Rule]) -> Reader:
    def read(data: Any) -> Any:
        value = read_value(data)
        for rule in rules:
            if not rule.holds(value):
                raise _Misfit(rule.expected, data)
        return value
    return read


def _union_reader(options: tuple[Any, ...]) -> Reader:
    nullable = _NONE in options
    choices = [(o, reader(o)) for o in options if o is not _NONE]
    expected = " or ".join(_name(o) for o in options)

    def read(data: Any) -> Any:
        if data is None and nullable:
            return None
        misfits = []
        # the option of the value's own type first: 1 in `float | int` stays an int
        for _, read_option in sorted(choices, key=lambda c: c[0] is not type(data)):
            try:
                return read_option(data)
            except _Misfit as e:
                misfits.append(e)
        if len(misfits) == 1 and misfits[0].path:
            raise misfits[0]
        raise _Misfit(expected, data)
    return read


def _literal_reader(allowed: tuple[Any, ...]) -> Reader:
    expected = " or ".join(repr(a) for a in allowed)
    exact = {(type(a), a) for a in allowed}

    def read(data: Any) -> Any:
        if (type(data), data) not in exact:
            raise _Misfit(expected, data)
        return data
    return read


def _sequence_reader(origin: Any, args: tuple[Any, ...]) -> Reader:
    fixed = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
    items = [reader(a) for a in args] if fixed else []
    read_item = reader(args[0] if args else Any)

    def read(data: Any) -> Any:
        if not isinstance(data, list):
            raise _Misfit("a list", data)
        if fixed:
            if len(data) != len(items):
                raise _Misfit(f"a list of {len(items)}", data)
            return tuple(_inside(i, r, v) for i, (r, v) in enumerate(zip(items, data)))
        try:
            out = [read_item(v) for v in data]
        except _Misfit:  # again one by one, to say which item
            out = [_inside(i, read_item, v) for i, v in enumerate(data)]
        return out if origin is list else tuple(out)
    return read


def _mapping_reader(key_type: Any, value_type: Any) -> Reader:
    read_value = reader(value_type)
    read_key = (lambda k: k) if key_type is str else _int_key if key_type is int else reader(key_type)

    def read(data: Any) -> Any:
        if not isinstance(data, dict):
            raise _Misfit("an object", data)
        return {_inside(k, read_key, k): _inside(k, read_value, v) for k, v in data.items()}
    return read


def _int_key(key: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise _Misfit("an integer key", key) from None


def _enum_reader(tp: type[enum.Enum]) -> Reader:
    expected = "one of " + ", ".join(repr(m.value) for m in tp)

    def read(data: Any) -> Any:
        try:
            return tp(data)
        except ValueError:
            raise _Misfit(expected, data) from None
    return read


def _typeddict_reader(tp: type) -> Reader:
    required: frozenset[str] = getattr(tp, "__required_keys__", frozenset())

    def read(data: Any) -> Any:
        if not isinstance(data, dict):
            raise _Misfit(f"an object ({tp.__name__})", data)
        for missing in sorted(required - data.keys())[:1]:
            raise _Misfit(None, data, [missing])
        declared = hints(tp)
        return {k: _inside(k, reader(declared.get(k, Any)), v) for k, v in data.items()}
    return read


def _dataclass_reader(cls: type) -> Reader:
    fields: list[tuple[str, Reader, bool]] = []  # built at the first read: a report holds reports (torchrun ranks)

    def read(data: Any) -> Any:
        if not isinstance(data, dict):
            raise _Misfit(f"an object ({cls.__name__})", data)
        if not fields:
            declared = hints(cls)
            fields.extend((f.name, reader(declared[f.name]), f.default is dataclasses.MISSING
                           and f.default_factory is dataclasses.MISSING) for f in dataclasses.fields(cls) if f.init)
        values = {}
        for name, read_field, required in fields:
            if name in data:
                values[name] = _inside(name, read_field, data[name])
            elif required:
                raise _Misfit(None, data, [name])
        return cls(**values)
    return read


def _scalar_reader(tp: Any) -> Reader:
    expected = _name(tp)
    if tp is float:
        def read_float(data: Any) -> Any:
            if type(data) is float or (isinstance(data, int) and not isinstance(data, bool)):
                return float(data)
            raise _Misfit(expected, data)
        return read_float

    def read(data: Any) -> Any:
        if type(data) is tp or (tp is str and isinstance(data, str)):
            return data
        raise _Misfit(expected, data)
    return read


def _name(tp: Any) -> str:
    if get_origin(tp) is Annotated:
        return next((rule.expected for rule in tp.__metadata__ if isinstance(rule, Rule)), _name(get_args(tp)[0]))
    names = {str: "a string", int: "an integer", float: "a number", bool: "true/false", _NONE: "null"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))
