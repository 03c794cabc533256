"""What a knob costs (detaudit/fix/cost.py), on synthetic timings: paired runs, CPU per step, the spread, and a
knob that costs nothing within the spread said to cost nothing."""

from __future__ import annotations

import pytest

from detaudit.fix.cost import MIN_CHANGE, Figure, Sample, cost, paired


def test_a_repeats_step_cost_is_the_median_cpu_time_of_its_steps_after_the_first() -> None:
    assert Sample.of([5.0, 0.1, 0.3, 0.2], 10.0) == Sample(0.2, 10.0)
    assert Sample.of([5.0], 1.0) == Sample(None, 1.0)  # one step is setup only: not measured


def test_a_free_knob_on_a_loaded_machine_is_not_priced_at_the_loads_difference() -> None:
    """Issue 45: zero-empty alone, whole runs of 8.22 against 4.89 s taken at different moments of a loaded machine
    read as +68%, while its steps were faster. Paired, the load hits both runs of a pair: the pairs disagree on
    the sign, and the knob costs nothing within the spread."""
    with_knob = [Sample(0.00110, 8.22), Sample(0.00112, 4.70), Sample(0.00109, 6.10)]
    without = [Sample(0.00111, 7.90), Sample(0.00110, 4.89), Sample(0.00111, 6.40)]
    knob = cost(with_knob, without)
    assert not knob.run.measurable
    assert not knob.step.measurable
    assert knob.summary.startswith("costs nothing within the spread")
    assert (knob.run.low or 0) < 0 < (knob.run.high or 0)


def test_a_knob_slower_in_every_pair_by_more_than_the_floor_is_a_cost_with_its_spread() -> None:
    step = paired([0.12, 0.125, 0.13], [0.1, 0.1, 0.1])
    assert step.measurable
    assert (step.change, step.low, step.high) == (pytest.approx(0.25), pytest.approx(0.2), pytest.approx(0.3))
    assert step.text("CPU per step") == "+25% CPU per step (+20% … +30% over 3 pairs)"


def test_a_change_below_the_floor_or_too_few_pairs_costs_nothing() -> None:
    small = paired([1.0 + MIN_CHANGE / 2] * 3, [1.0] * 3)  # every pair slower, but by less than the floor
    assert not small.measurable
    assert small.text("whole run").startswith("whole run: costs nothing within the spread (+5%;")
    assert not paired([2.0, 2.0], [1.0, 1.0]).measurable  # two pairs can agree on a sign by chance


def test_a_faster_knob_is_a_negative_cost_and_unmeasured_sides_are_said() -> None:
    assert paired([0.05, 0.051, 0.05], [0.1, 0.11, 0.1]).text("CPU per step").startswith("-50% CPU per step")
    none = paired([None, None], [0.1, 0.1])
    assert none == Figure(None, None, False)
    assert none.text("CPU per step") == "CPU per step: not measured"
