"""compare/noise_floor.py: sampled differences, the ULP bound, the floor from A's other repeats; each record
equivalent, within noise or drift; the overall verdict; the first drift."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
from synthetic import Rec, write_trace

from detaudit.compare.identity import Alignment, Identity, Value
from detaudit.compare.noise_floor import (
    Judged,
    K,
    difference,
    first_drift,
    floor_of,
    judge,
    judge_record,
    judge_sized,
    overall,
    own_disagreement,
    ratios_over_steps,
    ulp_bound,
)


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


FC = Identity(0, "output", "fc")


def record(*samples: float, digest: int = 1, identity: Identity = FC) -> Value:
    return Value(identity, "fc", "train.py:3", "float32", "4", digest, samples, True)


def test_the_same_digest_is_equivalent() -> None:
    assert judge_record(record(1.0, 2.0, 3.0, 4.0), [], record(1.0, 2.0, 3.0, 4.0)).status == "equivalent"


def test_a_difference_the_size_of_a_s_spread_is_within_noise() -> None:
    plain = record(1.0, 2.0, 3.0, 4.0)
    judged = judge_record(plain, [record(1.0, 2.0, 3.0, 4.001, digest=2)], record(1.0, 2.0, 3.0, 3.999, digest=3))
    assert (judged.status, round(judged.ratio or 0, 3)) == ("within-noise", 1.0)


def test_a_difference_beyond_k_times_the_spread_is_drift() -> None:
    plain = record(1.0, 2.0, 3.0, 4.0)
    beyond = record(1.0, 2.0, 3.0, 4.0 + 0.002 * K, digest=3)
    judged = judge_record(plain, [record(1.0, 2.0, 3.0, 4.001, digest=2)], beyond)
    assert judged.status == "drift"


def test_without_a_measured_spread_the_ulp_bound_is_the_floor() -> None:
    plain = record(1.0, 2.0, 3.0, 4.0)
    assert judge_record(plain, [plain], record(1.0, 2.0, 3.0, 4.0 + 1e-3, digest=2)).status == "drift"


def test_the_first_drift_is_the_first_in_a_s_order() -> None:
    steps = [Identity(s, "param", "w") for s in range(3)]
    plain = {i: record(1.0, 1.0, 1.0, 1.0, identity=i) for i in steps}
    b = {steps[0]: plain[steps[0]], **{i: record(2.0, 2.0, 2.0, 2.0, digest=9, identity=i) for i in steps[1:]}}
    judged = judge(Alignment(tuple(steps), (), ()), plain, [], b)
    first = first_drift(judged)
    assert first is not None
    assert first.identity == steps[1]
    assert len(ratios_over_steps(judged, first)) == 2


def test_records_only_one_side_holds_keep_the_verdict_from_equivalent() -> None:
    judged = [judge_record(record(1.0, 1.0, 1.0, 1.0), [], record(1.0, 1.0, 1.0, 1.0))]
    assert overall(judged, Alignment((FC,), (), (Identity(0, "output", "extra"),))) == "within-noise"


def test_a_record_whose_samples_are_zero_at_one_step_keeps_the_floor_of_its_scale() -> None:
    """Four zero samples at step 1 (a ReLU's zeros) against a reordering's 1e-8: within noise at the scale the
    record shows at step 0 (about 1.0), not a drift from a floor of 0."""
    steps = [Identity(s, "output", "relu") for s in range(2)]
    plain = {steps[0]: record(1.0, 0.5, 0.25, 0.75, identity=steps[0]),
             steps[1]: record(0.0, 0.0, 0.0, 0.0, digest=2, identity=steps[1])}
    b = {steps[0]: plain[steps[0]], steps[1]: record(1e-8, 0.0, 0.0, 0.0, digest=3, identity=steps[1])}
    judged = judge(Alignment(tuple(steps), (), ()), plain, [], b)
    assert judged[1].status == "within-noise"


def test_a_record_that_is_zero_at_every_step_has_no_floor() -> None:
    """A gradient A never moved from zero (a dead unit) that B moves: drift, however small."""
    steps = [Identity(s, "grad", "dead") for s in range(2)]
    plain = {i: record(0.0, 0.0, 0.0, 0.0, identity=i) for i in steps}
    b = {steps[0]: plain[steps[0]], steps[1]: record(1e-8, 0.0, 0.0, 0.0, digest=3, identity=steps[1])}
    judged = judge(Alignment(tuple(steps), (), ()), plain, [], b)
    assert judged[1].status == "drift"


def test_another_digest_whose_sampled_elements_agree_is_a_drift_of_unknown_size() -> None:
    """+1000 at an element no sample sits on: the digests differ, the samples agree (issue 43)."""
    judged = judge_record(record(1.0, 2.0, 3.0, 4.0), [], record(1.0, 2.0, 3.0, 4.0, digest=2))
    assert (judged.status, judged.ratio) == ("drift", None)


def test_a_drift_of_unknown_size_says_its_size_was_not_recorded() -> None:
    judged = judge_record(record(1.0, 2.0, 3.0, 4.0), [], record(1.0, 2.0, 3.0, 4.0, digest=2))
    assert str(judged.detail).startswith("differs at an unrecorded position: size unknown")


def test_a_saved_string_that_differs_is_a_drift_not_a_difference_of_zero() -> None:
    a = Value(Identity(0, "save", "note"), "", "train.py:9", "str", "", 1, (0.0, 0.0, 0.0, 0.0), True)
    judged = judge_record(a, [], replace(a, digest=2))
    assert (judged.status, judged.detail) == (
        "drift", "a saved str value (no tensor) differs: it has no size to judge against a floor")


def test_a_saved_value_only_a_holds_makes_the_verdict_a_drift() -> None:
    """B trained 3 steps, A 5: their final saves sit at other steps (issue 43: was WITHIN NOISE)."""
    judged = [judge_record(record(1.0, 1.0, 1.0, 1.0), [], record(1.0, 1.0, 1.0, 1.0))]
    assert overall(judged, Alignment((FC,), (Identity(5, "save", "model"),), (Identity(3, "save", "model"),))) == \
        "drift"


def test_plain_repeats_that_differ_bit_for_bit_are_named_at_their_first_divergence(tmp_path: Path) -> None:
    """A's two plain repeats (the same settings) compared as `run` compares repeats."""
    first = write_trace(tmp_path / "a-0.trace", [Rec("fc", 1), Rec("fc", 2, step=1)], footer={})
    other = write_trace(tmp_path / "a-2.trace", [Rec("fc", 1), Rec("fc", 3, step=1)], footer={})
    found = own_disagreement([[first], [other]])
    assert (found.record.step if found is not None and found.record is not None else None) == 1


def test_plain_repeats_that_agree_have_no_divergence(tmp_path: Path) -> None:
    traces = [[write_trace(tmp_path / f"a-{i}.trace", [Rec("fc", 1)], footer={})] for i in (0, 2)]
    assert own_disagreement(traces) is None


def test_b_bit_for_bit_one_of_a_s_perturbed_repeats_is_within_noise_though_its_size_is_unrecorded() -> None:
    """B at two threads is A's perturbed repeat (two threads) over again: A's own noise, whatever its size."""
    perturbed = record(1.0, 2.0, 3.0, 4.0, digest=2)
    assert judge_record(record(1.0, 2.0, 3.0, 4.0), [perturbed], perturbed).status == "within-noise"


def test_records_that_differ_only_where_no_sample_sits_make_the_verdict_inconclusive() -> None:
    judged = [judge_record(record(1.0, 2.0, 3.0, 4.0), [], record(1.0, 2.0, 3.0, 4.0, digest=2))]
    assert overall(judged, Alignment((FC,), (), ())) == "inconclusive"


def test_a_saved_string_that_differs_makes_the_verdict_a_drift() -> None:
    """A string cannot move by reordering: another one is a change, whatever its size."""
    a = Value(Identity(0, "save", "note"), "", "train.py:9", "str", "", 1, (0.0, 0.0, 0.0, 0.0), True)
    assert overall([judge_record(a, [], replace(a, digest=2))], Alignment((a.identity,), (), ())) == "drift"


def unsized(floor: float) -> Judged:
    """A record whose digests differ where no sample sits (judge_record's unknown size), A's floor there."""
    return Judged(Identity(0, "param", "0.bias"), "drift", math.inf, floor, None, "size unknown", True)


def test_a_record_sized_from_every_element_is_within_noise_where_its_largest_difference_is() -> None:
    a = np.array([0.5, 0.25, -1.0, 2.0])
    judged = judge_sized(unsized(1e-7), "float32", a, a + np.array([0.0, 2.0 ** -22, 0.0, 0.0]))
    assert (judged.status, judged.difference, judged.sized) == ("within-noise", 2.0 ** -22, True)


def test_a_record_sized_from_every_element_drifts_beyond_k_times_its_floor() -> None:
    a = np.array([0.5, 0.25, -1.0, 2.0])
    judged = judge_sized(unsized(1e-7), "float32", a, a + np.array([0.0, 1000.0, 0.0, 0.0]))
    assert (judged.status, judged.difference) == ("drift", 1000.0)


def test_a_sized_record_s_floor_is_at_least_the_ulp_bound_at_its_largest_element() -> None:
    """The samples showed 2.0 at most; an unsampled element of 1000 makes 2 ULP there 1.2e-4."""
    a = np.array([0.5, 1000.0, -1.0, 2.0])
    assert judge_sized(unsized(1e-7), "float32", a, a).floor == 2 * 2.0 ** (9 - 23)
