"""drift/drift_check.py over recordings written by hand: B judged against A's floor, read from the traces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from synthetic import Rec, write_trace

from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_check import _failure, judged_report, load_baseline
from detaudit.drift.drift_report import DriftReport, FloorSummary, write_json
from detaudit.errors import ExitCode, TraceError, UsageError
from detaudit.results import RepeatResult
from detaudit.trace import Kind

GRADS = [Rec("fc.weight", 10, kind=Kind.GRAD, samples=(0.5, -0.25, 0.125, 1.0)),
         Rec("fc.bias", 11, kind=Kind.GRAD, samples=(0.5, 0.75, 0.125, 1.0))]


def empty(a: Configuration, b: Configuration) -> DriftReport:
    return DriftReport("train.py", [], "run", "inconclusive", a, b, [], [], FloorSummary(10.0, 2, [], 0.0, None))


def traces(tmp_path: Path, b: list[Rec]) -> tuple[list[Path], Path]:
    a = [write_trace(tmp_path / f"a-{i}.trace", [Rec("fc", 1), *GRADS], footer={}) for i in range(3)]
    return a, write_trace(tmp_path / "b-0.trace", [Rec("fc", 1), *b], footer={})


def test_gradients_doubled_drift_at_the_first_gradient_with_factor_two(tmp_path: Path) -> None:
    doubled = [r.but(digest=r.digest + 100, samples=tuple(2 * x for x in r.samples)) for r in GRADS]
    a, b = traces(tmp_path, doubled)
    report = judged_report(empty(Configuration("A"), Configuration("B", {"LOSS_WEIGHT": "2"})), [[p] for p in a], [b],
                           (tmp_path, tmp_path))
    assert report.first_drift is not None
    assert (report.verdict, report.first_drift.name, report.first_drift.factor) == ("drift", "fc.weight", 2.0)
    assert report.causes[0].setting == "env LOSS_WEIGHT"


def test_the_same_records_are_equivalent(tmp_path: Path) -> None:
    a, b = traces(tmp_path, GRADS)
    report = judged_report(empty(Configuration("A"), Configuration("B")), [[p] for p in a], [b], (tmp_path, tmp_path))
    assert (report.verdict, report.counts.aligned, report.counts.equivalent) == ("equivalent", 3, 3)


def test_recordings_with_nothing_in_common_are_inconclusive(tmp_path: Path) -> None:
    a = [write_trace(tmp_path / f"a-{i}.trace", [Rec("fc", 1)], footer={}) for i in range(3)]
    b = write_trace(tmp_path / "b-0.trace", [Rec("other", 1)], footer={})
    report = judged_report(empty(Configuration("A"), Configuration("B")), [[p] for p in a], [b], (tmp_path, tmp_path))
    assert (report.verdict, len(report.only_b)) == ("inconclusive", 1)


def test_a_failed_repeat_of_b_is_named() -> None:
    failed = RepeatResult(0, "cpu", 1, 1.0, False, "b-0.trace", "b-0.stdout", "b-0.stderr", "")
    assert _failure([], [failed]) == ("script-failed",
                                      "configuration B's repeat 0 exited with status 1 (see b-0.stderr)")


def test_a_baseline_without_a_drift_report_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no drift.json there"):
        load_baseline(tmp_path, Path("train.py"))


def test_a_baseline_of_another_script_is_refused(tmp_path: Path) -> None:
    write_json(empty(Configuration("A"), Configuration("B")), tmp_path / "drift.json")
    with pytest.raises(UsageError, match="a floor is one script's"):
        load_baseline(tmp_path, Path("other.py"))


def keep_run_with_args(run_dir: Path, script_args: list[str]) -> None:
    """A kept drift run directory (whole A) recorded with these common script arguments."""
    write_json(replace(kept_report(), script_args=script_args), run_dir / "drift.json")


def kept_report() -> DriftReport:
    """A drift report as a whole check writes it: one repeat of A (plain), one of B."""
    a_0 = RepeatResult(0, "cpu", 0, 1.0, False, "a-0.trace", "a-0.stdout", "a-0.stderr", "")
    b_0 = replace(a_0, trace="b-0.trace", stdout="b-0.stdout", stderr="b-0.stderr")
    report = replace(empty(Configuration("A"), Configuration("B")), verdict="within-noise", results_a=[a_0],
                     results_b=[b_0])
    return replace(report, floor=replace(report.floor, perturbed=[{}]))


def test_a_baseline_recorded_with_other_common_script_arguments_is_refused(tmp_path: Path) -> None:
    keep_run_with_args(tmp_path, ["--epochs", "1"])
    refused = "recorded with the script arguments '--epochs 1', this check gives '\\(none\\)'"
    with pytest.raises(UsageError, match=refused):
        load_baseline(tmp_path, Path("train.py"), script_args=[])


def test_two_kept_recordings_of_other_common_script_arguments_are_refused(tmp_path: Path) -> None:
    keep_run_with_args(tmp_path, ["--epochs", "1"])
    with pytest.raises(UsageError, match="--baseline's with '--epochs 2'"):
        load_baseline(tmp_path, Path("train.py"), "--b-from", stored=["--epochs", "2"])


def test_a_b_from_directory_without_a_drift_report_is_named_by_its_option(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="^--b-from "):
        load_baseline(tmp_path, Path("train.py"), "--b-from")


def test_a_repeat_whose_end_is_unknown_is_inconclusive_not_a_failure_of_the_script() -> None:
    """Issue 43: `exit_code != 0` counted an unknown ending (no footer: exit_code None) as the script failing."""
    unknown = RepeatResult(0, "cpu", None, 1.0, False, "a-0.trace", "a-0.stdout", "a-0.stderr", "")
    assert _failure([unknown], [])[0] == "inconclusive"  # type: ignore[index]


def test_an_output_that_differs_where_no_sample_sits_is_inconclusive_with_its_size_unknown(tmp_path: Path) -> None:
    """B adds 1000 to an element no sample sits on: another digest, the same samples (issue 43: was WITHIN NOISE,
    |B-A| 0, exit 0). Its size is unknown: neither within noise nor shown beyond it, the gate fails (exit 6)."""
    a, b = traces(tmp_path, [GRADS[0].but(digest=GRADS[0].digest + 1), GRADS[1]])
    report = judged_report(empty(Configuration("A"), Configuration("B")), [[p] for p in a], [b], (tmp_path, tmp_path))
    assert (report.exit_code, report.first_drift and report.first_drift.name) == (ExitCode.INCONCLUSIVE, "fc.weight")


def test_b_stopping_steps_early_drifts_at_the_first_record_it_lacks(tmp_path: Path) -> None:
    """A trains two steps, B one: step 1's gradients only A holds are a structure difference, as `run` calls them
    (issue 43: was WITHIN NOISE, every aligned record equivalent)."""
    later = [r.but(step=1) for r in GRADS]
    a = [write_trace(tmp_path / f"a-{i}.trace", [*GRADS, *later], footer={}) for i in range(3)]
    b = write_trace(tmp_path / "b-0.trace", GRADS, footer={})
    report = judged_report(empty(Configuration("A"), Configuration("B")), [[p] for p in a], [b], (tmp_path, tmp_path))
    first = report.first_drift
    assert (report.verdict, first and (first.step, first.name, first.structure), report.counts.structure) == (
        "drift", (1, "fc.weight", True), 2)


def test_a_kept_report_listing_fewer_repeats_than_its_floor_declares_is_corrupt(tmp_path: Path) -> None:
    kept = kept_report()
    write_json(replace(kept, floor=replace(kept.floor, perturbed=[{}, {"threads": "2"}, {}])), tmp_path / "drift.json")
    with pytest.raises(TraceError, match="corrupt drift report"):
        load_baseline(tmp_path, Path("train.py"))


def test_a_kept_b_without_its_repeat_is_corrupt(tmp_path: Path) -> None:
    """--b-from on a drift.json that lists no repeat of B: was an IndexError."""
    write_json(replace(kept_report(), results_b=[]), tmp_path / "drift.json")
    with pytest.raises(TraceError, match="corrupt drift report"):
        load_baseline(tmp_path, Path("train.py"), "--b-from")


def test_a_recording_cut_short_is_inconclusive_never_a_verdict(tmp_path: Path) -> None:
    """A's trace cut to 70%, no footer (issue 43: was WITHIN NOISE, exit 0)."""
    a, b = traces(tmp_path, GRADS)
    a[0].unlink()
    write_trace(a[0], [Rec("fc", 1), *GRADS], footer=None)
    report = judged_report(empty(Configuration("A"), Configuration("B")), [[p] for p in a], [b], (tmp_path, tmp_path))
    assert (report.verdict, report.exit_code) == ("inconclusive", ExitCode.INCONCLUSIVE)


def side(label: str, tmp_path: Path, prints: list[str],
         perturbed: list[dict[str, str]] | None = None) -> list[RepeatResult]:
    """A side's repeats as run.json stores them, each having printed its text into `<label>-N.stdout`."""
    results = []
    for i, text in enumerate(prints):
        (tmp_path / f"{label}-{i}.stdout").write_text(text)
        results.append(RepeatResult(i, "cpu", 0, 1.0, False, f"{label}-{i}.trace", f"{label}-{i}.stdout",
                                    f"{label}-{i}.stderr", "", perturbation=perturbed[i] if perturbed else None))
    return results


def test_another_printed_result_is_a_drift_though_every_record_is_equal(tmp_path: Path) -> None:
    """B's post-processing threshold: `positives 14` -> `positives 46` (issue 43: was EQUIVALENT, exit 0)."""
    a, b = traces(tmp_path, GRADS)
    printed_a, printed_b = side("a", tmp_path, ["positives 14\n"] * 3), side("b", tmp_path, ["positives 46\n"])
    report = replace(empty(Configuration("A"), Configuration("B")), results_a=printed_a, results_b=printed_b)
    judged = judged_report(report, [[p] for p in a], [b], (tmp_path, tmp_path))
    assert (judged.verdict, judged.outcome and judged.outcome.b) == ("drift", "positives 46")


def test_a_plain_repeat_of_a_that_disagrees_with_the_first_makes_noise_inconclusive(tmp_path: Path) -> None:
    """A's two plain repeats (threads 1) differ: the script is nondeterministic under A alone (issue 43 item 6)."""
    a, b = traces(tmp_path, GRADS)
    a[2].unlink()
    write_trace(a[2], [Rec("fc", 1), GRADS[0].but(digest=99, samples=(0.5, -0.25, 0.125, 1.01)), GRADS[1]], footer={})
    settings = [{"threads": "1"}, {"threads": "2"}, {"threads": "1"}]
    report = replace(empty(Configuration("A"), Configuration("B")), results_a=side("a", tmp_path, [""] * 3, settings),
                     results_b=side("b", tmp_path, [""]))
    judged = judged_report(report, [[p] for p in a], [b], (tmp_path, tmp_path))
    assert (judged.verdict, str(judged.reason).startswith("A's own plain repeats (the same settings) disagree at "
                                                          "step 0 grad fc.weight")) == ("inconclusive", True)


def test_a_kept_run_whose_verdict_was_inconclusive_still_keeps_its_whole_a(tmp_path: Path) -> None:
    """Its A recorded whole (every repeat ended 0), its B of unknown size: A's floor is still A's floor."""
    write_json(replace(kept_report(), verdict="inconclusive"), tmp_path / "drift.json")
    assert load_baseline(tmp_path, Path("train.py")).verdict == "inconclusive"


def token(n: int, ids: list[int], at: int) -> tuple[int, dict[str, object]]:
    """A greedy decode step of two sequences chosen at record `at` (each row's top-2 scores 2.0 and 1.75)."""
    return at, {"type": "token", "at": at, "fn": "Tensor.argmax", "loc": "gen.py:9", "site": "gen.py:9", "n": n,
                "rows": 2, "ids": ids, "top2": [[2.0, 1.75], [2.0, 1.75]]}


HEADS = [Rec("head", 20 + step, step=step, samples=(0.5, -0.25, 0.125, 1.0)) for step in range(3)]


@pytest.fixture(scope="module")
def decoded(tmp_path_factory: pytest.TempPathFactory) -> DriftReport:
    """A greedy decoder whose step-1 logits B moves: its second sequence's token 1 flips, after record 1."""
    tmp = tmp_path_factory.mktemp("decoded")
    steps = [([5, 7], 1), ([9, 3], 2), ([4, 4], 3)]
    a = [write_trace(tmp / f"a-{i}.trace", HEADS, footer={},
                     events=[token(n, ids, at) for n, (ids, at) in enumerate(steps)]) for i in range(3)]
    moved = [HEADS[0], HEADS[1].but(digest=99, samples=(1.0, -0.5, 0.25, 2.0)), HEADS[2]]
    b = write_trace(tmp / "b-0.trace", moved, footer={},
                    events=[token(n, ids, at) for n, (ids, at) in enumerate([([5, 7], 1), ([9, 8], 2), ([4, 1], 3)])])
    return judged_report(empty(Configuration("A"), Configuration("B", {"TEMPERATURE": "0.5"})), [[p] for p in a],
                         [b], (tmp, tmp))


def test_a_decoder_s_b_answers_with_each_differing_sequence_s_first_divergent_token(decoded: DriftReport) -> None:
    assert decoded.tokens is not None
    assert [(d.sequence, d.position, d.token, d.other, d.margin) for d in decoded.tokens.compared.divergences] == \
        [(1, 1, 3, 8, 0.25)]


def test_a_and_b_s_distinct_outputs_are_counted_beside_a_s_own(decoded: DriftReport) -> None:
    assert decoded.tokens is not None
    assert (decoded.tokens.compared.distinct, decoded.tokens.a_distinct) == (2, 1)


def test_the_first_divergent_token_follows_the_first_drift_s_record(decoded: DriftReport) -> None:
    assert decoded.tokens is not None
    assert (decoded.tokens.first_drift_record, decoded.tokens.compared.earliest.follows(1)) == (1, True)


def test_a_script_that_decodes_nothing_has_no_token_answer(tmp_path: Path) -> None:
    a, b = traces(tmp_path, GRADS)
    report = judged_report(empty(Configuration("A"), Configuration("B")), [[p] for p in a], [b], (tmp_path, tmp_path))
    assert report.tokens is None
