"""The analysis steps (detaudit/audit/analysis.py): each step alone, their order, and `extend` comparing once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from synthetic import training_records, write_run, write_trace

from detaudit.audit import analysis
from detaudit.audit.analysis import STEPS, Analysis, extend, run_steps, start
from detaudit.audit.pipeline import analyse
from detaudit.errors import TraceError
from detaudit.records import Narrowing
from detaudit.run.rundir import read_run


def divergent_run(tmp_path: Path, stdout: tuple[str, str] = ("", "")) -> Path:
    """Two repeats whose record #4 differs."""
    recs = training_records()
    other = [r.but(digest=r.digest + 1) if i == 4 else r for i, r in enumerate(recs)]
    return write_run(tmp_path / "run", [recs, other], stdout=list(stdout))


def deterministic_run(tmp_path: Path, stdout: tuple[str, str] = ("", "")) -> Path:
    recs = training_records()
    return write_run(tmp_path / "run", [recs, recs], stdout=list(stdout))


def begun(run_dir: Path) -> Analysis:
    record, results = read_run(run_dir)
    return start(run_dir, record, results)


def through(a: Analysis, last: analysis.Step) -> Analysis:
    """`a` after the steps up to and including `last`."""
    return run_steps(a, STEPS[:STEPS.index(last) + 1])


def test_every_step_has_a_one_line_docstring() -> None:
    assert all(step.__doc__ and "\n" not in step.__doc__.strip() for step in STEPS)


def test_the_steps_end_with_the_report() -> None:
    assert STEPS[-1] is analysis.build_report


def test_locate_traces_names_each_repeats_trace_and_device(tmp_path: Path) -> None:
    a = analysis.locate_traces(begun(divergent_run(tmp_path)))
    assert [t.name for t in a.traces] == ["repeat-0.trace", "repeat-1.trace"]
    assert a.devices == ("cpu", "cpu")


def test_locate_traces_refuses_a_run_that_wrote_no_trace(tmp_path: Path) -> None:
    run_dir = divergent_run(tmp_path)
    for trace in run_dir.glob("*.trace"):
        trace.unlink()
    with pytest.raises(TraceError, match="no trace was written"):
        analysis.locate_traces(begun(run_dir))


def test_note_failures_keeps_the_excerpt_of_a_failed_repeat(tmp_path: Path) -> None:
    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, recs], exit_codes=[0, 1])
    a = through(begun(run_dir), analysis.note_failures)
    assert list(a.repeat_errors) == [1]


def test_note_failures_marks_a_timed_out_repeat_truncated(tmp_path: Path) -> None:
    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, recs], timed_out=[False, True])
    assert through(begun(run_dir), analysis.note_failures).truncated == (False, True)


def test_compare_finds_the_first_differing_record(tmp_path: Path) -> None:
    a = through(begun(divergent_run(tmp_path)), analysis.compare)
    assert a.first is not None
    assert a.first.index == 4


def test_outcome_finds_stdout_that_differs(tmp_path: Path) -> None:
    a = through(begun(deterministic_run(tmp_path, ("loss 1\n", "loss 2\n"))), analysis.outcome)
    assert a.ended is not None


def test_outcome_is_none_when_the_repeats_ended_alike(tmp_path: Path) -> None:
    assert through(begun(deterministic_run(tmp_path)), analysis.outcome).ended is None


def test_carried_state_leaves_a_record_divergence_alone(tmp_path: Path) -> None:
    a = through(begun(divergent_run(tmp_path)), analysis.carried_state)
    assert a.carried is None


def test_structure_note_leaves_a_content_divergence_alone(tmp_path: Path) -> None:
    before = through(begun(divergent_run(tmp_path)), analysis.carried_state)
    assert analysis.structure_note(before) == before


def test_structure_note_tells_a_repeat_that_ended_early_as_an_outcome(tmp_path: Path) -> None:
    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, recs[:5]], exit_codes=[0, 1])
    a = through(begun(run_dir), analysis.structure_note)
    assert a.first is not None
    assert a.first.category == "outcome"


def test_op_finding_is_none_without_op_records(tmp_path: Path) -> None:
    assert through(begun(divergent_run(tmp_path)), analysis.op_finding).op_finding is None


def test_perturbation_is_skipped_when_nothing_was_perturbed(tmp_path: Path) -> None:
    assert through(begun(divergent_run(tmp_path)), analysis.perturbation).perturbed is None


def test_perturbation_compares_the_groups_of_a_perturbed_run(tmp_path: Path) -> None:
    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, recs, recs, recs],
                        perturbations=[{"threads": "1"}, {"threads": "2"}, {"threads": "1"}, {"threads": "2"}])
    assert through(begun(run_dir), analysis.perturbation).perturbed is not None


def test_baseline_check_is_skipped_without_a_baseline(tmp_path: Path) -> None:
    assert through(begun(divergent_run(tmp_path)), analysis.baseline_check).baseline_check is None


def test_diagnose_ranks_causes_of_a_divergence(tmp_path: Path) -> None:
    a = through(begun(divergent_run(tmp_path)), analysis.diagnose)
    assert a.ranked == a.inferred


def test_diagnose_finds_nothing_to_explain_in_a_deterministic_run(tmp_path: Path) -> None:
    assert through(begun(deterministic_run(tmp_path)), analysis.diagnose).inferred == ()


def test_stored_experiments_are_not_read_when_not_asked(tmp_path: Path) -> None:
    record, results = read_run(divergent_run(tmp_path))
    a = run_steps(start(tmp_path / "run", record, results, explained=False),
                  STEPS[:STEPS.index(analysis.stored_experiments) + 1])
    assert a.stored == ()


def test_describe_match_says_what_the_verdict_rests_on(tmp_path: Path) -> None:
    assert through(begun(deterministic_run(tmp_path)), analysis.describe_match).match is not None


def test_first_evidence_reads_the_first_repeat(tmp_path: Path) -> None:
    a = through(begun(divergent_run(tmp_path)), analysis.first_evidence)
    assert a.first_evidence is not None
    assert a.first_evidence.index == 0


def test_build_report_is_what_analyse_returns(tmp_path: Path) -> None:
    run_dir = divergent_run(tmp_path)
    record, results = read_run(run_dir)
    assert run_steps(begun(run_dir)).report_made() == analyse(run_dir, record, results)


def counting_comparisons(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of times the analysis compares traces, as it goes."""
    calls: list[int] = []
    real = analysis.compare_traces

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(analysis, "compare_traces", counted)
    return calls


def test_extending_after_the_op_level_re_run_compares_the_traces_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting_comparisons(monkeypatch)
    run_dir = divergent_run(tmp_path)
    a = run_steps(begun(run_dir))
    narrowed = replace(a.record, narrowing=Narrowing((), [0, 1], "ops"))
    extend(a, narrowed, analysis.op_finding)
    assert len(calls) == 1


def test_extending_after_the_self_check_compares_the_traces_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting_comparisons(monkeypatch)
    a = run_steps(begun(deterministic_run(tmp_path)))
    extend(a, a.record, analysis.describe_match)
    assert len(calls) == 1


def test_an_extended_analysis_reports_as_a_fresh_one(tmp_path: Path) -> None:
    run_dir = divergent_run(tmp_path)
    a = run_steps(begun(run_dir))
    assert extend(a, a.record, analysis.op_finding).report_made() == run_steps(begun(run_dir)).report_made()


def test_an_auto_run_whose_first_difference_is_a_parameter_says_why_no_op_re_run_ran(tmp_path: Path) -> None:
    """Record #4 is a parameter after optimizer step 0, its gradients agreeing: the update itself differs."""
    a = begun(divergent_run(tmp_path))
    a = through(replace(a, record=replace(a.record, granularity="auto")), analysis.op_finding)
    assert a.op_level.startswith("no op-level re-run: parameter net.0.weight is the first record to differ")


def test_an_op_level_re_run_that_found_no_op_says_so(tmp_path: Path) -> None:
    a = begun(divergent_run(tmp_path))
    ran = Narrowing(a.results, [0, 0], "ops")  # its traces are the module-level ones: no op records
    a = through(replace(a, record=replace(a.record, granularity="auto", narrowing=ran)), analysis.op_finding)
    assert a.op_level.startswith("op-level re-run (steps 0–0): no op found behind the first divergence")


def test_a_run_recorded_at_one_granularity_has_no_op_level_note(tmp_path: Path) -> None:
    assert through(begun(divergent_run(tmp_path)), analysis.op_finding).op_level == ""


def token_event(n: int, ids: list[int]) -> dict[str, object]:
    return {"type": "token", "fn": "torch.argmax", "loc": "gen.py:9", "site": "gen.py:9", "n": n, "rows": len(ids),
            "ids": ids, "top2": None}


def test_generated_tokens_compares_each_repeats_token_events(tmp_path: Path) -> None:
    run_dir = deterministic_run(tmp_path)
    recs = training_records()
    for i, ids in enumerate(([5, 6], [5, 7])):  # the second repeat's second sequence differs at its first token
        (run_dir / f"repeat-{i}.trace").unlink()
        write_trace(run_dir / f"repeat-{i}.trace", recs, {"exit_code": 0, "error": None}, [(2, token_event(0, ids))],
                    {"repeat": i})
    found = through(begun(run_dir), analysis.generated_tokens).tokens
    assert found is not None
    assert [(d.sequence, d.position, d.token, d.other) for d in found.divergences] == [(1, 0, 6, 7)]


def test_generated_tokens_is_none_for_a_script_that_does_not_decode(tmp_path: Path) -> None:
    assert through(begun(deterministic_run(tmp_path)), analysis.generated_tokens).tokens is None
