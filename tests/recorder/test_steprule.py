"""The step boundary `detaudit watch` uses (detaudit/recorder/steprule.py)."""

from __future__ import annotations

from detaudit.recorder.steprule import StepRule


def test_with_no_optimizer_each_backward_ends_a_step() -> None:
    rule = StepRule()
    assert [rule.backward_returned() for _ in range(3)] == [True, True, True]


def test_the_boundary_is_unknown_until_the_first_backward_returns() -> None:
    rule = StepRule()
    rule.optimizer_built()
    assert rule.boundary is None


def test_with_an_optimizer_made_first_no_backward_ends_a_step() -> None:
    # gradient accumulation: several backward() calls before the optimizer's first step
    rule = StepRule()
    rule.optimizer_built()
    assert [rule.backward_returned() for _ in range(3)] == [False, False, False]


def test_an_optimizer_made_after_the_first_backward_does_not_change_the_boundary() -> None:
    rule = StepRule()
    rule.backward_returned()
    rule.optimizer_built()
    assert rule.backward_returned()


def test_an_optimizer_that_steps_takes_over_from_backward() -> None:
    rule = StepRule()
    rule.backward_returned()
    rule.optimizer_stepped()
    assert (rule.backward_returned(), rule.boundary) == (False, "optimizer.step")
