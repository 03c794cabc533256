"""Field-type checks for the JSON that detaudit reads back from disk (trace frames; run.json, explain.json and
baseline.json field by field through detaudit/records.py).

Files on disk may come from another machine, another release, or a hand edit: every value the
code later uses is checked here, at the boundary, so a wrong type is a TraceError (exit 4) that
names the file and the field, never an exception deep inside the comparison or a cause detector.
Unknown keys are allowed (newer writers may add them); a key that is present must have its type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from detaudit.errors import TraceError

NONE = type(None)


@dataclass(frozen=True)
class Int:
    """An int (never a bool), optionally bounded below."""

    minimum: int | None = None


@dataclass(frozen=True)
class Number:
    """A finite int or float (never a bool)."""


@dataclass(frozen=True)
class ListOf:
    item: Spec
    max_len: int | None = None


@dataclass(frozen=True)
class MapOf:
    """A JSON object with string keys and values of one spec."""

    value: Spec


@dataclass(frozen=True)
class Obj:
    fields: Mapping[str, Spec]
    required: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class OneOf:
    options: tuple[Spec, ...]


Spec = Union[type, Int, Number, ListOf, MapOf, Obj, OneOf, None]  # None: anything
STR_OR_NONE = OneOf((str, NONE))
INT_OR_NONE = OneOf((Int(), NONE))
NUMBER_OR_NONE = OneOf((Number(), NONE))


def _name(spec: Spec) -> str:
    if spec is None:
        return "anything"
    if spec is NONE:
        return "null"
    if isinstance(spec, type):
        return {str: "a string", bool: "true/false", dict: "an object", list: "a list"}.get(spec, spec.__name__)
    if isinstance(spec, Int):
        return "an integer" + (f" >= {spec.minimum}" if spec.minimum is not None else "")
    if isinstance(spec, Number):
        return "a finite number"
    if isinstance(spec, ListOf):
        return f"a list of {_name(spec.item)}" + (f" (at most {spec.max_len})" if spec.max_len else "")
    if isinstance(spec, (MapOf, Obj)):
        return "an object"
    return " or ".join(_name(o) for o in spec.options)


def is_version(value: Any, version: int) -> bool:
    """Whether a file's `version` field is exactly `version`: an int, never a bool (`true == 1` in python) or a
    float (`1.0`), which no detaudit writes; every versioned reader checks its format's version so."""
    return _ok(value, Int()) and value == version


def _ok(value: Any, spec: Spec) -> bool:
    """Whether `value` has the top-level shape of `spec` (members are checked by `check`)."""
    if spec is None:
        return True
    if isinstance(spec, type):
        if spec is dict:
            return isinstance(value, dict)
        return isinstance(value, spec) and not (spec is int and isinstance(value, bool))
    if isinstance(spec, Int):
        return isinstance(value, int) and not isinstance(value, bool) and (
            spec.minimum is None or value >= spec.minimum)
    if isinstance(spec, Number):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if isinstance(spec, ListOf):
        return isinstance(value, list) and (spec.max_len is None or len(value) <= spec.max_len)
    if isinstance(spec, (MapOf, Obj)):
        return isinstance(value, dict)
    return any(_ok(value, option) for option in spec.options)


def check(value: Any, spec: Spec, where: str, path: str = "") -> Any:
    """Raise a TraceError naming `where` and the field when `value` does not fit `spec`; return it."""
    if not _ok(value, spec):
        shown = type(value).__name__ if not isinstance(value, (bool, int, float)) or isinstance(value, bool) \
            else repr(value)
        raise TraceError(f"{where}: field `{path or '(top level)'}` must be {_name(spec)}, not {shown}")
    if isinstance(spec, OneOf):
        spec = next(o for o in spec.options if _ok(value, o))
    if isinstance(spec, ListOf):
        for i, item in enumerate(value):
            check(item, spec.item, where, f"{path}[{i}]")
    elif isinstance(spec, MapOf):
        for key, item in value.items():
            check(item, spec.value, where, f"{path}.{key}" if path else key)
    elif isinstance(spec, Obj):
        missing = sorted(spec.required - value.keys())
        if missing:
            raise TraceError(f"{where}: field `{_join(path, missing[0])}` is missing")
        for key, sub in spec.fields.items():
            if key in value:
                check(value[key], sub, where, _join(path, key))
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# -- what the readers expect -------------------------------------------------------------------------
FILE_NAME = str  # further checked by audit.inside_run_dir

REPEAT_RESULT = Obj({
    "index": Int(0), "device": str, "exit_code": INT_OR_NONE, "duration_s": Number(), "timed_out": bool,
    "trace": FILE_NAME, "stdout": FILE_NAME, "stderr": FILE_NAME, "stdout_digest": str, "interrupted": bool,
    "stopped_at_step": INT_OR_NONE, "recording_stopped": STR_OR_NONE, "rerun_alone": STR_OR_NONE,
    "exit_barrier_waited": bool, "rendezvous_retries": Int(0),
    "stopped_by": STR_OR_NONE, "diverged_at_step": INT_OR_NONE,
    "perturbation": OneOf((NONE, MapOf(str))),
}, frozenset({"index", "device", "exit_code", "duration_s", "timed_out", "trace", "stdout", "stderr",
              "stdout_digest"}))

TRACE_HEADER = Obj({"format": str, "version": Int(), "repeat": Int(), "script": str, "argv": ListOf(str),
                    "pid": Int(), "device_request": STR_OR_NONE, "granularity": STR_OR_NONE,
                    "op_window": OneOf((NONE, ListOf(Int(0), 2))), "pins": ListOf(str), "torch": STR_OR_NONE,
                    "distributed": Obj({"rank": Int(0), "nproc_per_node": Int(1), "env": MapOf(str),
                                        "collective_env": MapOf(str)}, frozenset({"rank"}))})

# the exception that ended the script (detaudit/run/failure.py: ScriptError); absent in older traces
SCRIPT_ERROR = Obj({
    "type": str, "message": str, "omitted": Int(0),
    "frames": ListOf(Obj({"file": str, "line": INT_OR_NONE, "function": str, "text": STR_OR_NONE, "user": bool},
                         frozenset({"file", "function", "user"}))),
}, frozenset({"type", "message", "frames"}))

TRACE_FOOTER = Obj({"records": Int(0), "exit_code": INT_OR_NONE, "error": STR_OR_NONE, "duration_s": Number(),
                    "recording_failed": STR_OR_NONE, "stopped_after_step": Int(), "stopped_at_step": Int(0),
                    "stopped_by": str, "counting": str, "diverged_at_step": Int(0), "recording_stopped": STR_OR_NONE,
                    "events_dropped": Int(0), "exception": SCRIPT_ERROR,
                    "step_times": ListOf(Number()), "step_cpu_times": ListOf(Number())})

_RNG = MapOf(Obj({"digest": STR_OR_NONE, "drawn": bool, "initial_seed": Int()}))
_MODULE = Obj({"module": str, "class": str, "entry": str}, frozenset({"module", "class"}))
_BATCH_FIGURES: dict[str, Spec] = {"max_abs_diff": Number(), "max_ulp": Int(0), "scale": Number(), "dtype": str,
                                   "across_rows": bool, "shape_changed": bool}
_BATCH_SUBSET = Obj({"subset": str, "size": Int(1), "rows_compared": Int(0), "rows_differ": Int(0),
                     "nan_mismatch": bool, "ladder": bool, **_BATCH_FIGURES},
                    frozenset({"subset", "size", "rows_differ"}))
_BATCH_SPOT = Obj({"name": str, "module": str, "cls": str, "loc": str, **_BATCH_FIGURES}, frozenset({"name"}))
# Evidence events (detaudit/events.py, one TypedDict per kind): fields are typed by name, whatever the event
# type, so a new event type is covered for the fields it shares; `at` and `type` are in every event. Every
# field events.py declares has a spec here (tests/test_events.py); None: any JSON value.
EVENT = Obj({
    "at": Int(0), "type": str, "loc": STR_OR_NONE, "lib": str, "fn": str, "when": str, "rng": _RNG,
    "flags": OneOf((NONE, MapOf(OneOf((bool, Number(), str, NONE))))), "op": str, "device": STR_OR_NONE,
    "entry": str, "phase": str,
    "threads": Int(), "deterministic": bool, "num_workers": Int(0), "worker_id": INT_OR_NONE,
    "shape": ListOf(Int()), "dtype": str, "digest": STR_OR_NONE, "probe": Int(), "seeded": bool,
    "library": bool, "drawn_before": bool, "state": STR_OR_NONE, "root": str, "listed": ListOf(_MODULE),
    "matmul": ListOf(_MODULE), "what": str, "target": STR_OR_NONE, "env": MapOf(str),
    "gpu": ListOf(str), "randomization": Int(), "aslr_disabled": OneOf((bool, NONE)),
    "frames": Int(0), "inductor": MapOf(OneOf((bool, Number(), str, NONE))),
    "sites": ListOf(Obj({"fn": str, "loc": STR_OR_NONE, "reads": Int(0)})),
    "worker": INT_OR_NONE, "value": None, "pinned": OneOf((bool, Int(), NONE)), "generator": OneOf((str, bool)),
    "PYTHONHASHSEED": STR_OR_NONE, "flag": str, "by": STR_OR_NONE, "module": str, "name": str, "meant": STR_OR_NONE,
    "states": ListOf(str), "backend": STR_OR_NONE, "world_size": Int(), "sampler": str, "worker_init_fn": STR_OR_NONE,
    "python": STR_OR_NONE, "torch": STR_OR_NONE, "numpy": STR_OR_NONE, "cuda": STR_OR_NONE, "cudnn": INT_OR_NONE,
    "driver": STR_OR_NONE, "cpu": STR_OR_NONE, "machine": STR_OR_NONE, "os": STR_OR_NONE,
    "device_request": STR_OR_NONE, "git": OneOf((dict, NONE)), "params": ListOf(str), "ignored": ListOf(str),
    "buffers": ListOf(str), "bucket_cap_mb": None, "gradient_as_bucket_view": bool, "static_graph": bool,
    "find_unused_parameters": bool,
    "epoch": Int(), "iterations": Int(), "seed": INT_OR_NONE, "path": str, "entries": ListOf(str),
    "call": Int(0), "rows": Int(0), "batch_dim": Int(), "batch_dim_from": str, "batch_dim_detail": str,
    "not_compared": ListOf(str), "training": bool,
    "reproduced": bool, "subsets": ListOf(_BATCH_SUBSET),
    "why": str, "detail": str, "subset": str, "size": Int(0), "first_module": OneOf((_BATCH_SPOT, NONE)),
    "first_op": OneOf((_BATCH_SPOT, NONE)), "note": STR_OR_NONE,
    "knob": STR_OR_NONE,
    "lines": Int(-1), "append": bool, "thread": str,
    "step": Int(-1), "keys": ListOf(str), "parts": ListOf(Obj({"path": str, "role": str})), "digests": ListOf(str),
    "obj": Int(0), "entropy": bool, "importing": bool, "of": str,
    "site": str, "source": str, "n": Int(0), "grad": bool, "evaluating": bool, "rank": Int(0),
    "sets": ListOf(Obj({"name": str, "of": str, "size": Int(2), "built": ListOf(str), "iterated": ListOf(str),
                        "used": ListOf(str)}, frozenset({"name", "of", "size"}))),
    "ids": ListOf(Int()), "top2": OneOf((NONE, ListOf(OneOf((NONE, ListOf(Number(), 2)))))),
    "choice": Obj({"output": str, "ids": ListOf(Int()), "top2": ListOf(OneOf((NONE, ListOf(Number(), 2)))),
                   "flips": ListOf(Obj({"subset": str, "size": Int(1), "row": Int(0), "other": Int()},
                                       frozenset({"subset", "size", "row", "other"})))},
                  frozenset({"output", "ids", "top2", "flips"})),
}, frozenset({"at", "type"}))
