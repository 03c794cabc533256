"""The op-level window of a drift: A (plain) and B re-run once each recording ops over the drifting step only
(granularity `op`, `op_window` [step, step]: each repeat ends after it), their ops lined up by module, op and
occurrence, and the first op in A's order that B lacks, or whose output moves beyond K times its ULP bound,
named with its `file:line`.

Its floor is the ULP bound alone (A's ops are not re-run perturbed): noise accumulated over earlier steps can
exceed it, so the op's ratio is reported with it and the record-level verdict stays the judge.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from detaudit.audit.pipeline import AuditOptions
from detaudit.compare.identity import Identity, Value, value_of
from detaudit.compare.noise_floor import K, difference, ulp_bound
from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_report import OpWindow
from detaudit.drift.rank_views import rank_traces
from detaudit.drift.recordings import record
from detaudit.errors import TraceError
from detaudit.results import RepeatResult
from detaudit.trace import Flag, Kind, read_trace

OpKey = tuple[str, str, bool, int]  # module, op, backward, occurrence


def op_values(path: Path, step: int) -> dict[OpKey, Value]:
    """The op records of `step` in a trace, by module, op, phase and occurrence, in the trace's order."""
    trace = read_trace(path)
    seen: dict[tuple[str, str, bool], int] = {}
    found: dict[OpKey, Value] = {}
    for row in trace.records:
        if int(row["kind"]) != Kind.OP or int(row["step"]) != step:
            continue
        module, op = trace.text(row["module"]), trace.text(row["name"])
        backward = bool(int(row["flags"]) & Flag.BACKWARD)
        n = seen.get((module, op, backward), 0)
        seen[(module, op, backward)] = n + 1
        found[(module, op, backward, n)] = value_of(trace, row, Identity(step, "op", op, n))
    return found


def first_departure(a: dict[OpKey, Value], b: dict[OpKey, Value], step: int) -> OpWindow | None:
    """The first op of `a` that `b` lacks, or whose output is beyond K times its ULP bound."""
    for key, va in a.items():
        module, op, backward, _ = key
        vb = b.get(key)
        if vb is None:
            instead = [f"{o}" for (m, o, bw, _), _v in b.items() if m == module and bw == backward
                       and (m, o, bw, 0) not in a]
            return OpWindow(step, op, module, va.location, backward, None, instead)
        if va.digest == vb.digest:
            continue
        bound = ulp_bound(va)
        moved = difference(va, vb)
        if bound == 0 or moved > K * bound:
            return OpWindow(step, op, module, va.location, backward, moved / bound if bound else None)
    return None


def op_window(options: AuditOptions, a: Configuration, b: Configuration, run_dir: Path, step: int,
              on_done: Callable[[RepeatResult], None] | None) -> OpWindow | None:
    """Re-run A and B once each recording ops over `step`, and find the first op where B departs from A (None:
    no op departs, or a re-run left no trace)."""
    traces = []
    for config in (a, b):
        [result] = record(options, config, run_dir, 1, None, on_done, prefix=f"ops-{config.label.lower()}",
                          granularity="op", child_config={"op_window": [step, step]})
        traces.append(rank_traces(run_dir, result, config.nproc)[0])  # rank 0's ops
    try:
        return first_departure(op_values(traces[0], step), op_values(traces[1], step), step)
    except (TraceError, OSError):
        return None
