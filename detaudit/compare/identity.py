"""Records of two recordings lined up by what they are, not where they are: a record's logical identity is its
step, its kind, its name (module qualified name, parameter name, torch.save key) and its occurrence among the
records of that step with that kind and name (a module called twice in a step). A record only one side has is
never paired with another: it is a structure difference, as `run` calls a record one repeat lacks (`structural`),
except a module call's records where a compiler fused the module away (listed)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detaudit.errors import Inconclusive, TraceError
from detaudit.trace import Flag, Kind, Trace, read_trace
from detaudit.trace.dtypes import DTYPE_NAMES


@dataclass(frozen=True, order=True)
class Identity:
    """A record's logical identity: the same in any recording of the same computation."""

    step: int
    kind: str  # output, grad, param, optstate, save, checkpoint, input, buffer
    name: str
    occurrence: int = 0  # among this step's records of this kind and name
    rank: int = 0  # a torchrun run's rank whose record this is (drift/rank_views.py)


@dataclass(frozen=True)
class Value:
    """What a recording holds of one record: where it was made, its digest and its sampled elements."""

    identity: Identity
    module: str
    location: str  # the user's file:line behind it
    dtype: str
    shape: str
    digest: int
    samples: tuple[float, ...]
    readable: bool  # False: no contents could be read (meta tensor, unsupported layout)


Recording = Mapping[Identity, Value]  # in the recording's own order
_KINDS = {int(k) for k in Kind if k != Kind.OP}  # op records are named by position within a module: left out


def read_recording(path: Path) -> dict[Identity, Value]:
    """A whole trace's records by identity (`whole`: a recording cut short is no evidence of its end)."""
    trace = read_trace(path)
    whole(trace)
    return keyed(trace)


def whole(trace: Trace) -> None:
    """Refuse a recording a verdict cannot rest on, as `run` refuses agreement over one (report/model.py
    `inconclusive_reason`): cut short (no footer: killed, its writes failed, or cut after the fact) is
    Inconclusive; a footer that declares more records than the trace holds is a corrupt trace (TraceError)."""
    if trace.footer is None:
        raise Inconclusive(f"the recording {trace.path} is incomplete (no footer: stopped, killed, cut short or its "
                           f"writes failed): its {len(trace.records)} records say nothing about the rest, so no "
                           "verdict rests on it; record it again")
    declared = trace.footer.get("records")
    if isinstance(declared, int) and declared != len(trace.records):
        raise TraceError(f"{trace.path}: corrupt trace: its footer declares {declared} records, it holds "
                         f"{len(trace.records)}")


def keyed(trace: Trace) -> dict[Identity, Value]:
    """`trace`'s records by identity, in the trace's order."""
    return {identity: value_of(trace, row, identity) for _, identity, row in _identified(trace)}


def record_index(path: Path, identity: Identity) -> int | None:
    """Where the record `identity` lies in the trace at `path`: its record index, as token events count records
    (None: the trace does not hold it)."""
    return next((index for index, found, _ in _identified(read_trace(path)) if found == identity), None)


def _identified(trace: Trace) -> Iterator[tuple[int, Identity, Any]]:
    """`trace`'s records (ops left out) with their index in the trace and their identity, in the trace's order."""
    seen: dict[tuple[int, str, str], int] = {}
    for index, row in enumerate(trace.records):
        code = int(row["kind"])
        if code not in _KINDS:
            continue
        kind, name, step = Kind(code).name.lower(), trace.text(row["name"]), int(row["step"])
        occurrence = seen.get((step, kind, name), 0)
        seen[(step, kind, name)] = occurrence + 1
        yield index, Identity(step, kind, name, occurrence), row


def value_of(trace: Trace, row: Any, identity: Identity) -> Value:
    """What `trace` holds of one record row, under the identity its caller gave it."""
    return Value(identity, trace.text(row["module"]), trace.text(row["loc"]), DTYPE_NAMES.get(int(row["dtype"]), "?"),
                 trace.text(row["shape"]), int(row["digest"]), tuple(float(x) for x in row["samples"]),
                 not int(row["flags"]) & Flag.NO_DATA)


@dataclass(frozen=True)
class Alignment:
    """The identities both recordings hold (in A's order), and those only one of them holds."""

    both: tuple[Identity, ...]
    only_a: tuple[Identity, ...]
    only_b: tuple[Identity, ...]


def align(a: Recording, b: Recording) -> Alignment:
    """Line up `a` and `b` by identity."""
    return Alignment(tuple(i for i in a if i in b), tuple(i for i in a if i not in b),
                     tuple(i for i in b if i not in a))


# a module call's records: a module torch.compile fuses into a generated kernel runs no hook, so they may be missing
MODULE_CALL_KINDS = frozenset({"output", "input"})


def structural(alignment: Alignment) -> tuple[Identity, ...]:
    """The records one side lacks that are a structure difference, as `run` calls any record one repeat lacks
    (compare/traces.py): a step one side never reached, a gradient, a parameter, optimizer state, a buffer, a saved
    value. Only a module call's output or input in a step both sides recorded is exempt: a compiler fuses modules
    away (their hooks never fire), which changes no result; those are listed, not judged. In A's order, then B's."""
    steps_a = {i.step for i in (*alignment.both, *alignment.only_a)}
    steps_b = {i.step for i in (*alignment.both, *alignment.only_b)}
    common = steps_a & steps_b
    return tuple(i for i in (*alignment.only_a, *alignment.only_b)
                 if i.kind not in MODULE_CALL_KINDS or i.step not in common)
