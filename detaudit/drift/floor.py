"""The noise floor of one record: how far configuration A moves from itself when only its reduction order
changes (its plain repeats and its perturbed ones), never less than a few units in the last place of the
record's dtype at the record's magnitude.

Differences are read from the records' sampled elements (trace/format.py: N_SAMPLES values at fixed positions,
the same positions in every recording of a tensor of that shape), the largest absolute difference among them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from detaudit.compare.traces import gaps
from detaudit.drift.alignment import Value

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
    bits = MANTISSA_BITS.get(value.dtype)
    at = max(magnitude(value), scale)
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
