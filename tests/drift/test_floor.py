"""drift/floor.py: sampled differences, the ULP bound, the floor from A's other repeats."""

from __future__ import annotations

import math

from detaudit.drift.alignment import Identity, Value
from detaudit.drift.floor import difference, floor_of, ulp_bound


def value(*samples: float, dtype: str = "float32", shape: str = "4", digest: int = 1) -> Value:
    return Value(Identity(0, "output", "fc"), "fc", "train.py:3", dtype, shape, digest, samples, True)


def test_the_difference_is_the_largest_sampled_one() -> None:
    assert difference(value(1.0, 2.0, 3.0, 4.0), value(1.0, 2.5, 3.0, 3.0)) == 1.0


def test_a_nan_on_one_side_only_is_beyond_any_difference() -> None:
    assert difference(value(1.0, math.nan, 0.0, 0.0), value(1.0, 2.0, 0.0, 0.0)) == math.inf


def test_a_nan_on_both_sides_is_no_difference() -> None:
    assert difference(value(math.nan, 1.0, 0.0, 0.0), value(math.nan, 1.0, 0.0, 0.0)) == 0.0


def test_another_shape_is_not_comparable() -> None:
    assert difference(value(1.0, 1.0, 1.0, 1.0), value(1.0, 1.0, 1.0, 1.0, shape="8")) == math.inf


def test_the_ulp_bound_is_two_units_in_the_last_place_at_the_largest_magnitude() -> None:
    assert ulp_bound(value(0.5, -1.5, 0.0, 0.0)) == 2 * 2.0 ** -23  # 1.5: exponent 0, float32's 23 bits


def test_integers_are_exact() -> None:
    assert ulp_bound(value(3.0, 4.0, 0.0, 0.0, dtype="int64")) == 0.0


def test_the_floor_is_the_widest_spread_of_a_s_other_repeats() -> None:
    plain = value(1.0, 2.0, 3.0, 4.0)
    assert floor_of(plain, [value(1.0, 2.0, 3.0, 4.001), value(1.01, 2.0, 3.0, 4.0)]) == abs(1.01 - 1.0)


def test_an_incomparable_repeat_leaves_the_floor_at_the_ulp_bound() -> None:
    plain = value(1.0, 2.0, 3.0, 4.0)
    assert floor_of(plain, [value(1.0, 2.0, 3.0, 4.0, shape="8")]) == ulp_bound(plain)
