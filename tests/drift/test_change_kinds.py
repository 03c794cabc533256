"""drift/change_kinds.py: the evidence that separates reorder noise from a real change, and the ranking."""

from __future__ import annotations

import math

from detaudit.compare.identity import Identity, Value
from detaudit.drift.change_kinds import (
    ChangeEvidence,
    constant_factor,
    growth,
    layout_change,
    nan_side,
    rank_causes,
    sign_flip,
)
from detaudit.drift.configurations import Difference


def value(*samples: float, dtype: str = "float32", shape: str = "4") -> Value:
    return Value(Identity(0, "grad", "fc.weight"), "", "train.py:9", dtype, shape, 7, samples, True)


def test_gradients_exactly_doubled_are_a_constant_factor_of_two() -> None:
    assert constant_factor(value(0.5, -0.25, 0.0, 3.0), value(1.0, -0.5, 0.0, 6.0)) == 2.0


def test_ratios_that_differ_are_no_constant_factor() -> None:
    assert constant_factor(value(0.5, 1.0, 2.0, 3.0), value(1.0, 2.0, 4.0, 6.5)) is None


def test_equal_samples_are_no_factor() -> None:
    assert constant_factor(value(0.5, 1.0, 2.0, 3.0), value(0.5, 1.0, 2.0, 3.0)) is None


def test_a_zero_on_one_side_only_is_no_factor() -> None:
    assert constant_factor(value(0.5, 1.0, 0.0, 3.0), value(1.0, 2.0, 1.0, 6.0)) is None


def test_every_sign_flipped_is_a_sign_flip() -> None:
    assert sign_flip(value(0.5, -1.0, 2.0, 3.0), value(-0.5, 1.0, -2.0, -3.0))


def test_a_nan_on_b_only_names_b() -> None:
    assert nan_side(value(0.5, 1.0, 2.0, 3.0), value(0.5, math.nan, 2.0, 3.0)) == "b"


def test_a_changed_dtype_is_named_with_both_dtypes() -> None:
    assert layout_change(value(1.0, 1.0, 1.0, 1.0), value(1.0, 1.0, 1.0, 1.0, dtype="bfloat16")) == \
        "dtype float32 -> bfloat16"


def test_a_first_ratio_far_beyond_the_floor_starts_large() -> None:
    assert growth([3000.0, 2500.0]) == "starts-large"


def test_ratios_multiplying_each_step_grow() -> None:
    assert growth([12.0, 40.0, 200.0]) == "grows"


def test_ratios_that_stay_put_are_flat() -> None:
    assert growth([12.0, 11.0, 15.0]) == "flat"


def test_a_drift_ranks_the_script_s_settings_before_the_thread_count() -> None:
    found = [Difference("threads", "1", "2", "reorder"), Difference("args", None, "--lr 0.2", "script")]
    ranked = rank_causes(found, True, ChangeEvidence(growth="starts-large"))
    assert [c.setting for c in ranked] == ["args", "threads"]


def test_noise_ranks_the_thread_count_first() -> None:
    found = [Difference("args", None, "--lr 0.2", "script"), Difference("threads", "1", "2", "reorder")]
    assert [c.setting for c in rank_causes(found, False, None)] == ["threads", "args"]


def test_a_constant_factor_is_named_in_the_reason() -> None:
    [cause] = rank_causes([Difference("env LOSS_WEIGHT", None, "2", "script")], True, ChangeEvidence(factor=2.0))
    assert "a constant factor 2" in cause.why


def test_a_world_size_with_a_constant_factor_asks_whether_gradients_were_summed() -> None:
    [cause] = rank_causes([Difference("nproc", None, "2", "layout")], True, ChangeEvidence(factor=2.0))
    assert "gradients summed, not averaged?" in cause.why


def test_a_drift_ranks_the_world_size_after_the_script_s_settings_and_before_the_thread_count() -> None:
    found = [Difference("threads", "1", "2", "reorder"), Difference("nproc", None, "2", "layout"),
             Difference("args", None, "--lr 0.2", "script")]
    assert [c.setting for c in rank_causes(found, True, None)] == ["args", "nproc", "threads"]
