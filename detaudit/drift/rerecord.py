"""Sizing records whose size is unknown by re-recording them (issue 43: "re-record it, bound it, or say so and fail
the gate"). A record whose digest differs from A's while its sampled elements agree differs only where no sample
sits: A (plain) and B are run once more (2 interpreters) with the recorder told to keep every element of exactly
those records (recorder/full_values.py, into `.values` side files: trace/values.py). Where both re-recordings
reproduce the first ones (the same digests, and the kept elements show the record's samples), the exact largest
|B-A| over all elements is the record's difference, judged against its floor as any other record
(compare/noise_floor.judge_sized); otherwise the record stays of unknown size, with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from detaudit.audit.pipeline import AuditOptions
from detaudit.compare.identity import Identity, Value
from detaudit.compare.noise_floor import Judged, judge_sized
from detaudit.compare.traces import gaps
from detaudit.drift.configurations import Configuration, floor_perturbation
from detaudit.drift.drift_report import Rerecorded, RerecordedRecord
from detaudit.drift.rank_views import rank_traces, side_view
from detaudit.drift.recordings import record
from detaudit.errors import Inconclusive, TraceError
from detaudit.results import Ending, RepeatResult
from detaudit.run.devices import resolve_devices
from detaudit.trace.format import sample_positions
from detaudit.trace.values import FullValues, ValuesKey, read_values, values_path

PREFIX = "sized"  # the re-recordings' files: sized-a-0.trace, sized-a-0.values, sized-b-0...
Unsized = tuple[Judged, Value, Value]  # a record of unknown size: its judgement, A's first plain record, B's


@dataclass(frozen=True)
class Side:
    """One configuration's re-recording as read back: its records, its kept elements, or why it is no evidence."""

    label: str
    records: Mapping[Identity, Value]
    kept: Mapping[ValuesKey, FullValues]
    failed: str | None = None


def rerecord(options: AuditOptions, sides: tuple[Configuration, Configuration], run_dir: Path,
             unsized: Sequence[Unsized], on_done: Callable[[RepeatResult], None] | None
             ) -> tuple[dict[Identity, Judged], Rerecorded]:
    """Run A (plain) and B once more keeping the full values of the `unsized` records, and judge each one from
    them: sized (within noise or drift), or left of unknown size with why."""
    keys = [[j.identity.step, j.identity.kind, j.identity.name, j.identity.occurrence, j.identity.rank]
            for j, _, _ in unsized]
    per_rank = sides[0].world_size == sides[1].world_size
    # A as its first plain repeat ran: the floor's perturbation, whose first repeat runs every setting plain
    plain = floor_perturbation(sides[0], resolve_devices((sides[0].device,)), os.cpu_count())
    read = []
    for config, perturbation in zip(sides, (plain, None), strict=True):
        [result] = record(options, config, run_dir, 1, perturbation, on_done,
                          prefix=f"{PREFIX}-{config.label.lower()}", child_config={"full_values": keys})
        read.append(read_side(config, run_dir, result, per_rank))
    return size(unsized, (read[0], read[1]))


def size(unsized: Sequence[Unsized], read: tuple[Side, Side]) -> tuple[dict[Identity, Judged], Rerecorded]:
    """Each record of unknown size judged from A's and B's re-recordings (`read`): sized, or why not."""
    judged: dict[Identity, Judged] = {}
    records = []
    for first, va, vb in unsized:
        reason = not_reproduced(first.identity, va, read[0]) or not_reproduced(first.identity, vb, read[1])
        i = first.identity
        if reason is None:
            a, b = (_elements(side, i) for side in read)
            judged[i] = judge_sized(first, va.dtype, a, b)
        else:
            judged[i] = replace(first, detail=f"{first.detail}; not sized by re-recording: {reason}")
        records.append(RerecordedRecord(i.step, i.kind, i.name, i.occurrence, i.rank, reason is None, reason))
    return judged, Rerecorded(len(read), records)


def read_side(config: Configuration, run_dir: Path, result: RepeatResult, per_rank: bool) -> Side:
    """A re-recording's records (as the first recording's were read: rank_views.side_view) and its kept elements
    (every rank's side file), or why it is no evidence."""
    label = config.label
    if result.ending not in (Ending.COMPLETED, Ending.STOPPED_AT_BOUND):
        return Side(label, {}, {}, f"the re-recording of {label} ended: {result.ending.value}")
    traces = rank_traces(run_dir, result, config.nproc)
    kept: dict[ValuesKey, FullValues] = {}
    try:
        records = side_view(traces, per_rank).recording
        for trace in traces:
            if values_path(trace).is_file():
                kept.update(read_values(values_path(trace)))
    except (Inconclusive, TraceError, OSError) as exc:
        return Side(label, {}, {}, f"the re-recording of {label} is unreadable: {exc}")
    return Side(label, records, kept)


def not_reproduced(identity: Identity, first: Value, side: Side) -> str | None:
    """Why `side`'s re-recording of a record is no evidence of the first one's elements (None: it is): it failed,
    lacks the record, holds it with another digest (the run did not reproduce), kept no elements of it (and why),
    or kept elements that are not the record's (another dtype, shape or samples)."""
    if side.failed is not None:
        return side.failed
    again = side.records.get(identity)
    if again is None or again.digest != first.digest:
        return (f"the re-recording of {side.label} does not reproduce the first (" +
                ("the record is missing" if again is None else "another digest") + "): no evidence of its elements")
    kept = side.kept.get(_key(identity))
    if kept is None:
        return f"the re-recording of {side.label} kept no elements of it (recorded on another thread?)"
    if kept.head.skipped is not None:
        return f"the re-recording of {side.label} kept no elements of it: {kept.head.skipped}"
    values = kept.as_float64()
    shape = "x".join(map(str, kept.head.shape)) or "scalar"
    if values is None or kept.head.dtype != first.dtype or shape != first.shape or not _shows(values, first):
        return f"the elements {side.label}'s re-recording kept are not the record's (another dtype, shape or samples)"
    return None


def _shows(values: np.ndarray, record: Value) -> bool:
    """The elements show the record's sampled ones at their positions (trace/format.sample_positions)."""
    if not values.size:
        return not record.samples or all(np.isnan(record.samples))
    at = np.asarray(sample_positions(values.size))
    return bool((gaps(values[at], np.asarray(record.samples, dtype=np.float64)) == 0).all())


def _key(identity: Identity) -> ValuesKey:
    return ValuesKey(identity.step, identity.kind, identity.name, identity.occurrence, identity.rank)


def _elements(side: Side, identity: Identity) -> np.ndarray:
    values = side.kept[_key(identity)].as_float64()
    assert values is not None  # not_reproduced checked it
    return values
