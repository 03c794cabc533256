"""What a knob costs (detaudit/fix/cost.py): step and whole-run time, and "no measurable cost" within noise."""

from __future__ import annotations

import pytest

from detaudit.fix.cost import MIN_CHANGE, Figure, Timing, cost, figure


def test_the_first_step_of_each_repeat_is_setup_and_left_out() -> None:
    timing = Timing.of([[5.0, 0.1, 0.2], [4.0, 0.3], []], [10.0, 11.0, 1.0])
    assert timing.step_s == (0.1, 0.2, 0.3)
    assert timing.run_s == (10.0, 11.0, 1.0)


def test_a_slower_knob_whose_steps_all_lie_above_is_a_cost() -> None:
    slow = Timing((0.12, 0.13, 0.125, 0.128), (12.0, 12.5, 12.2))
    fast = Timing((0.10, 0.101, 0.099, 0.1), (10.0, 10.2, 10.1))
    knob = cost(slow, fast)
    assert knob.step.measurable
    assert knob.step.change == pytest.approx(0.1265 / 0.1 - 1)
    assert knob.run.measurable
    assert not figure([12.0, 12.5], [10.0, 10.2]).measurable
    assert knob.summary.startswith("+26% step time")
    assert "whole run" in knob.summary


def test_overlapping_steps_or_a_small_change_are_no_measurable_cost() -> None:
    overlapping = cost(Timing((0.1, 0.2, 0.15), (10.0,)), Timing((0.12, 0.18), (10.1,)))
    assert overlapping.summary == "no measurable cost"
    small = figure([1.0 + MIN_CHANGE / 2] * 3, [1.0] * 3)  # apart, but within the noise of a shared machine
    assert not small.measurable
    assert "no measurable cost" in small.text("step time")


def test_a_faster_set_is_a_negative_cost_and_missing_steps_are_not_measured() -> None:
    faster = figure([0.05, 0.051, 0.05], [0.1, 0.11, 0.1])
    assert faster.measurable
    assert faster.text("step time") == "-50% step time"
    none = figure([], [0.1])
    assert none == Figure(None, None, False)
    assert none.text("step time") == "step time: not measured"
