"""outcome.py: repeats that end differently (exit status, then stdout) diverge; stopped ones do not count."""

from __future__ import annotations

from pathlib import Path

from detaudit.compare.outcome import outcome_beyond_noise, outcome_divergence
from detaudit.results import RepeatResult


def result(index: int, exit_code: int | None = 0, timed_out: bool = False, stopped_at_step: int | None = None,
           stdout: str = "") -> RepeatResult:
    return RepeatResult(index, "cpu", exit_code, 0.5, timed_out, f"repeat-{index}.trace", stdout, "", "",
                        stopped_at_step=stopped_at_step)


def test_another_exit_status_is_an_outcome_divergence_naming_every_repeat() -> None:
    found = outcome_divergence([result(0), result(1, exit_code=1), result(2)])
    assert found is not None
    assert found.category == "outcome"
    assert found.repeats == [1]
    assert found.reference == 0
    assert found.detail == "exit status differs: repeat 0 exited 0, repeat 1 exited 1, repeat 2 exited 0"


def test_timed_out_stopped_or_unknown_repeats_are_not_compared() -> None:
    assert outcome_divergence([result(0), result(1, exit_code=-9, timed_out=True),
                               result(2, exit_code=None), result(3, exit_code=1, stopped_at_step=4)]) is None


def test_stdout_is_compared_in_the_mode_asked_for(tmp_path: Path) -> None:
    (tmp_path / "0.out").write_text("epoch took 1.2s loss 0.25\n")
    (tmp_path / "1.out").write_text("epoch took 3.4s loss 0.25\n")
    repeats = [result(0, stdout="0.out"), result(1, stdout="1.out")]
    assert outcome_divergence(repeats, "masked", tmp_path) is None  # only a timing differs
    strict = outcome_divergence(repeats, "strict", tmp_path)
    assert strict is not None
    assert strict.stdout is not None
    assert strict.stdout.line == 1
    assert outcome_divergence(repeats, "ignore", tmp_path) is None


def printed(tmp_path: Path, index: int, text: str) -> RepeatResult:
    """A repeat that printed `text`, its stdout path absolute (the repeats of drift's sides lie apart)."""
    (tmp_path / f"{index}.out").write_text(text)
    return result(index, stdout=str(tmp_path / f"{index}.out"))


def test_another_printed_result_where_the_reference_repeats_agree_is_beyond_noise(tmp_path: Path) -> None:
    """A post-processing threshold changed: `positives 14` -> `positives 46` (issue 43: drift passed it)."""
    reference = [printed(tmp_path, i, "loss 0.25\npositives 14\n") for i in range(3)]
    found, _ = outcome_beyond_noise(reference, printed(tmp_path, 9, "loss 0.25\npositives 46\n"))
    assert (found.stdout.line if found is not None and found.stdout is not None else None) == 2


def test_a_line_the_reference_repeats_print_otherwise_already_is_not_judged(tmp_path: Path) -> None:
    """A's perturbed repeat prints its loss in other last digits: B's loss there is noise, not a change."""
    reference = [printed(tmp_path, 0, "loss 0.250001\n"), printed(tmp_path, 1, "loss 0.250002\n")]
    assert outcome_beyond_noise(reference, printed(tmp_path, 9, "loss 0.250003\n")) == (None, [1])


def test_a_steady_line_after_a_noisy_one_is_still_judged(tmp_path: Path) -> None:
    """The loss moves in its last digits in A's own repeats; the post-processed count after it does not."""
    reference = [printed(tmp_path, 0, "loss 0.250001\npositives 14\n"),
                 printed(tmp_path, 1, "loss 0.250002\npositives 14\n")]
    found, noisy = outcome_beyond_noise(reference, printed(tmp_path, 9, "loss 0.250003\npositives 46\n"))
    assert (found.stdout.line if found is not None and found.stdout is not None else None, noisy) == (2, [1])
