"""RepeatResult.ending and the predicates derived from it: each equals the hand-built test it replaced."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from detaudit.results import Ending, RepeatResult

results = st.builds(
    lambda exit_code, timed_out, interrupted, step, why, by: RepeatResult(
        0, "cpu", exit_code, 1.0, timed_out, "t", "o", "e", "d", interrupted=interrupted, stopped_at_step=step,
        recording_stopped=why, stopped_by=by if step is not None else None),
    st.sampled_from([0, 1, -9, None]), st.booleans(), st.booleans(), st.sampled_from([None, 0, 3]),
    st.sampled_from([None, "a hook failed"]), st.sampled_from(["max-steps", "max-time", "divergence"]))


@given(results)
def test_recorded_whole_is_the_old_truncation_test_negated(r: RepeatResult) -> None:
    old = r.timed_out or r.interrupted or r.exit_code is None or r.stopped_at_step is not None \
        or r.recording_stopped is not None
    assert r.recorded_whole is not old


@given(results)
def test_has_own_exit_status_is_the_old_exit_status_test(r: RepeatResult) -> None:
    old = not (r.timed_out or r.interrupted or r.exit_code is None or r.stopped_at_step is not None)
    assert r.has_own_exit_status is old


@given(results)
def test_timed_out_or_interrupted_is_the_ending(r: RepeatResult) -> None:
    assert (r.ending in (Ending.TIMED_OUT, Ending.INTERRUPTED)) is (r.timed_out or r.interrupted)


def test_a_repeat_stopped_after_diverging_says_so() -> None:
    r = RepeatResult(0, "cpu", 0, 1.0, False, "t", "o", "e", "d", stopped_at_step=2, stopped_by="divergence")
    assert r.ending is Ending.STOPPED_AFTER_DIVERGING


def test_a_repeat_stopped_by_max_steps_stopped_at_a_bound() -> None:
    r = RepeatResult(0, "cpu", 0, 1.0, False, "t", "o", "e", "d", stopped_at_step=2, stopped_by="max-steps")
    assert r.ending is Ending.STOPPED_AT_BOUND


def test_a_non_zero_status_is_a_failure() -> None:
    assert RepeatResult(0, "cpu", 1, 1.0, False, "t", "o", "e", "d").ending is Ending.FAILED


def test_a_zero_status_is_a_completion() -> None:
    assert RepeatResult(0, "cpu", 0, 1.0, False, "t", "o", "e", "d").ending is Ending.COMPLETED


def test_a_failed_hook_is_recording_stopped() -> None:
    r = RepeatResult(0, "cpu", 0, 1.0, False, "t", "o", "e", "d", recording_stopped="hook")
    assert r.ending is Ending.RECORDING_STOPPED


def test_a_bound_is_no_error() -> None:
    r = RepeatResult(0, "cpu", 1, 1.0, False, "t", "o", "e", "d", stopped_at_step=2, stopped_by="max-time")
    assert not r.ended_with_error
