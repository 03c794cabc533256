"""B's difference from A judged record by record against A's floor: EQUIVALENT (bitwise), WITHIN NOISE (never
beyond K times the floor), DRIFT (the first record beyond it).

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
from typing import Literal

from detaudit.drift.alignment import Alignment, Identity, Value
from detaudit.drift.floor import difference, floor_of, magnitude

K = 10.0
Status = Literal["equivalent", "within-noise", "drift"]


@dataclass(frozen=True)
class Judged:
    """One aligned record judged: B's difference from A's first plain repeat, A's floor there, their ratio
    (None: no floor, an exact record, or no difference to compare)."""

    identity: Identity
    status: Status
    difference: float
    floor: float
    ratio: float | None


def judge_record(plain: Value, others: Sequence[Value], b: Value, scale: float = 0.0) -> Judged:
    """One record: bitwise equal, within K times its floor, or beyond (`scale`: floor.floor_of)."""
    if plain.digest == b.digest and plain.shape == b.shape and plain.dtype == b.dtype:
        return Judged(plain.identity, "equivalent", 0.0, floor_of(plain, others, scale), 0.0)
    floor = floor_of(plain, others, scale)
    moved = difference(plain, b)
    ratio = moved / floor if floor > 0 and math.isfinite(moved) else (0.0 if moved == 0 else None)
    beyond = ratio is None or ratio > K
    return Judged(plain.identity, "drift" if beyond else "within-noise", moved, floor, ratio)


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


def overall(judged: Sequence[Judged], alignment: Alignment) -> Status:
    """equivalent when every record agrees bit for bit and both hold the same records; drift when one is beyond
    its floor; within-noise otherwise (records only one side holds are listed, and are not drift by themselves)."""
    if any(j.status == "drift" for j in judged):
        return "drift"
    if all(j.status == "equivalent" for j in judged) and not alignment.only_a and not alignment.only_b:
        return "equivalent"
    return "within-noise"
