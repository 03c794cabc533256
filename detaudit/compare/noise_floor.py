"""B's difference from A judged record by record against A's noise floor (`detaudit drift`, docs/drift.md):
EQUIVALENT (bitwise), WITHIN NOISE (never beyond K times the floor), DRIFT (the first record beyond it).

A record's floor is how far configuration A moves from itself when only its reduction order changes (its plain
repeats and its perturbed ones), never less than a few units in the last place of the record's dtype at the
record's magnitude. Differences are read from the records' sampled elements (trace/format.py: N_SAMPLES values at
fixed positions, the same positions in every recording of a tensor of that shape), the largest absolute difference
among them, after the digests: two records are equal only where their digests are, and a difference whose size
the samples do not show (another digest, the same sampled elements; a saved value that is no tensor) is never
within noise, whatever the floor: it is a drift whose size is unknown.

Why K = 10: the floor is the largest of two or three measured spreads of one record, a sample of the reorder
noise, not its bound; another reordering (B's) lands within a few times the measured spread, and reorder noise
of one computation varies within an order of magnitude. A real change (another learning rate, another
layer, a factor of two) starts orders of magnitude beyond it: K = 10 keeps noise from ever reading as drift
while a change of 10 ULP-sized floors is still caught.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from detaudit.compare.identity import Alignment, Identity, Value, structural
from detaudit.compare.saved_values import is_non_tensor
from detaudit.compare.traces import ELSEWHERE, compare_traces, gaps
from detaudit.results import Divergence

# mantissa bits of each floating dtype: one unit in the last place at magnitude x is 2**(exponent(x) - bits)
MANTISSA_BITS = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7, "float8_e4m3fn": 3,
                 "float8_e5m2": 2, "float8_e4m3fnuz": 3, "float8_e5m2fnuz": 2}
ULPS = 2  # the least floor, in units in the last place: one rounding either way


def difference(a: Value, b: Value) -> float:
    """The largest absolute difference between the two records' sampled elements (inf where one side is NaN
    and the other is not, or where they cannot be compared: another shape or dtype, unreadable contents)."""
    if a.shape != b.shape or a.dtype != b.dtype or not (a.readable and b.readable):
        return math.inf
    if not a.samples:
        return 0.0
    return float(gaps(np.asarray(a.samples), np.asarray(b.samples)).max())  # compare's reading of two samples


def magnitude(value: Value) -> float:
    """The largest finite sampled magnitude of a record (0 when every sample is zero or not finite)."""
    return max((abs(x) for x in value.samples if math.isfinite(x)), default=0.0)


def ulp_bound(value: Value, scale: float = 0.0) -> float:
    """ULPS units in the last place of the record's dtype at its magnitude, or at `scale` where that is larger
    (0 for integers, booleans and records with neither: those are exact)."""
    return ulp_at(value.dtype, max(magnitude(value), scale))


def ulp_at(dtype: str, at: float) -> float:
    """ULPS units in the last place of `dtype` at magnitude `at` (0 for an exact dtype or a magnitude of 0)."""
    bits = MANTISSA_BITS.get(dtype)
    if bits is None or at == 0.0:
        return 0.0
    return ULPS * 2.0 ** (math.frexp(at)[1] - 1 - bits)


def floor_of(plain: Value, others: Sequence[Value], scale: float = 0.0) -> float:
    """The record's floor: the largest difference between A's first plain repeat and A's other repeats
    (plain and perturbed), at least the ULP bound at the record's scale; a repeat that could not be compared
    is left out. `scale`: the magnitude this record shows at any step of A. Rounding noise is relative to the
    values a result is made of, not to the result: four samples that happen to be zero at one step (a ReLU's
    zeros, a sum that cancelled) would otherwise give a floor of 0, and any reordering there would read as
    drift."""
    spreads = [d for d in (difference(plain, other) for other in others) if math.isfinite(d)]
    return max([ulp_bound(plain, scale), *spreads])


K = 10.0
Status = Literal["equivalent", "within-noise", "drift"]
# inconclusive: nothing is beyond the floor, but some record differs where no sampled element shows by how much
Overall = Literal["equivalent", "within-noise", "drift", "inconclusive"]


@dataclass(frozen=True)
class Judged:
    """One aligned record judged: B's difference from A's first plain repeat, A's floor there, their ratio
    (None: no floor, an exact record, or no difference to compare); `detail`: why a drift has no size."""

    identity: Identity
    status: Status
    difference: float
    floor: float
    ratio: float | None
    detail: str | None = None  # why a drift has no size, or how its size was found (SIZED)
    unrecorded: bool = False  # a tensor whose digest differs where no sample sits: its size is unknown
    sized: bool = False  # ... whose size was then found from every element, re-recorded (judge_sized)


def unsized(value: Value) -> str:
    """Why a record whose digest differs has no difference to measure."""
    if is_non_tensor(value.dtype):
        return f"a saved {value.dtype} value (no tensor) differs: it has no size to judge against a floor"
    return f"differs at an unrecorded position: size unknown ({ELSEWHERE})"


def _same(a: Value, b: Value) -> bool:
    """Bit for bit the same record (the digests, as `run` compares)."""
    return a.digest == b.digest and a.shape == b.shape and a.dtype == b.dtype


def judge_record(plain: Value, others: Sequence[Value], b: Value, scale: float = 0.0) -> Judged:
    """One record: bitwise equal (the digests, as `run` compares), within K times its floor, or beyond
    (`scale`: floor_of). B bit for bit equal to another of A's repeats is within noise whatever its size: it is
    one of A's own noise samples. Otherwise, another digest whose sampled elements agree is a drift of unknown
    size, never noise."""
    floor = floor_of(plain, others, scale)
    if _same(plain, b):
        return Judged(plain.identity, "equivalent", 0.0, floor, 0.0)
    moved = difference(plain, b)
    if any(_same(other, b) for other in others):  # bit for bit one of A's own repeats: A's noise itself
        return Judged(plain.identity, "within-noise", moved, floor, moved / floor if floor > 0 else 0.0)
    if moved == 0.0:
        return Judged(plain.identity, "drift", math.inf, floor, None, unsized(plain), not is_non_tensor(plain.dtype))
    ratio = moved / floor if floor > 0 and math.isfinite(moved) else None
    beyond = ratio is None or ratio > K
    return Judged(plain.identity, "drift" if beyond else "within-noise", moved, floor, ratio)


SIZED = "sized by re-recording"


def judge_sized(unsized: Judged, dtype: str, a: np.ndarray, b: np.ndarray) -> Judged:
    """A record of unknown size (`unsized`: its digests differ where no sample sits) judged from every element of
    A's and B's re-recordings of it (`a`, `b`: the same dtype and shape as the first ones, whose digests they
    reproduced): the difference is the exact largest |B-A| over all elements; the floor A's spread as measured, at
    least the ULP bound at the record's largest magnitude, now known exactly. Within K times it or beyond, as any
    record."""
    moved = math.inf if a.shape != b.shape else float(gaps(a, b).max()) if a.size else 0.0
    finite = np.abs(a[np.isfinite(a)])
    floor = max(unsized.floor, ulp_at(dtype, float(finite.max()) if finite.size else 0.0))
    ratio = None if not math.isfinite(moved) else moved / floor if floor > 0 else 0.0 if moved == 0 else None
    beyond = ratio is None or ratio > K
    return Judged(unsized.identity, "drift" if beyond else "within-noise", moved, floor, ratio,
                  f"{SIZED}: the largest |B-A| over all {a.size} elements", sized=True)


def judge(alignment: Alignment, plain: Mapping[Identity, Value], others: Sequence[Mapping[Identity, Value]],
          b: Mapping[Identity, Value]) -> list[Judged]:
    """Every record A and B both hold, in A's order; the floor from the other A repeats that hold it, at the
    scale the record shows at any of A's steps."""
    scales = record_scales(plain.values())
    return [judge_record(plain[i], [o[i] for o in others if i in o], b[i], scales[_across_steps(i)])
            for i in alignment.both]


def _across_steps(identity: Identity) -> Identity:
    return replace(identity, step=0)


def record_scales(values: Iterable[Value]) -> dict[Identity, float]:
    """The largest sampled magnitude of each record (kind, name, occurrence, rank) over every step."""
    scales: dict[Identity, float] = {}
    for v in values:
        key = _across_steps(v.identity)
        scales[key] = max(scales.get(key, 0.0), magnitude(v))
    return scales


def first_drift(judged: Sequence[Judged]) -> Judged | None:
    """The first record beyond the floor, in A's order (the order the script made them)."""
    return next((j for j in judged if j.status == "drift"), None)


def ratios_over_steps(judged: Sequence[Judged], first: Judged) -> list[float]:
    """The ratio to the floor of `first`'s record (same kind, name, occurrence) at its step and each later one
    (inf: beyond any floor)."""
    same = [j for j in judged if (j.identity.kind, j.identity.name, j.identity.occurrence)
            == (first.identity.kind, first.identity.name, first.identity.occurrence)
            and j.identity.step >= first.identity.step]
    return [math.inf if j.ratio is None else j.ratio for j in same]


def overall(judged: Sequence[Judged], alignment: Alignment) -> Overall:
    """drift when a record is beyond its floor (or a saved value that is no tensor changed), or a record one side
    lacks is a structure difference (identity.structural); inconclusive when the only records not within noise
    differ where no sample sits (their size is unknown: neither within noise nor shown beyond it); equivalent when
    every record agrees bit for bit and both hold the same records; within-noise otherwise (a module call a
    compiler fused away is listed, not a drift by itself)."""
    if any(j.status == "drift" and not j.unrecorded for j in judged) or structural(alignment):
        return "drift"
    if any(j.unrecorded for j in judged):
        return "inconclusive"
    if all(j.status == "equivalent" for j in judged) and not alignment.only_a and not alignment.only_b:
        return "equivalent"
    return "within-noise"


def own_disagreement(plain: Sequence[Sequence[Path]]) -> Divergence | None:
    """A's plain repeats (the same settings; each repeat's traces, one per rank) compared as `run` compares repeats,
    bit for bit: their first divergence, or None. Where they differ the script is nondeterministic under A alone,
    and A's floor measures that, not reorder noise: nothing is within noise of it."""
    for ranks in zip(*plain):
        found = compare_traces(list(ranks)).first_divergence if len(ranks) > 1 else None
        if found is not None:
            return found
    return None
