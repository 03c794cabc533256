"""Pin planning, what an experiment's repeats may conclude, and how results confirm, qualify or
demote causes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import training_records, write_run, write_trace

from detaudit import audit, explain
from detaudit.audit import AuditOptions, load_run
from detaudit.errors import TraceError, UsageError
from detaudit.launcher import RepeatResult, plan_repeats
from detaudit.report import Cause, Experiment, Report


def cause(cause_id: str, pins: list[str], confidence: str = "likely") -> Cause:
    return Cause(cause_id, confidence, "summary", ["seen"], "fix", pins)


def test_plan_follows_the_ranking_without_duplicates() -> None:
    causes = [cause("nondeterministic-op", ["deterministic", "one-thread"]), cause("thread-count", ["one-thread"]),
              cause("concurrency", [])]
    assert explain.plan(causes) == ["deterministic", "one-thread"]


def test_all_pins_everything() -> None:
    everything = explain.pin_of(explain.ALL)
    assert set(everything.child) >= {"torch-rng", "deterministic", "zero-empty", "address-layout"}
    assert everything.env["PYTHONHASHSEED"] == "0" and everything.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_pin_that_removes_the_divergence_confirms_and_ranks_first() -> None:
    causes = [cause("python-hash-seed", ["hash-seed"]), cause("object-order", ["address-layout"], "possible")]
    experiments = [Experiment("hash-seed", "the hash seed", "divergent", 5, "still at #5"),
                   Experiment("address-layout", "the layout", "deterministic", None)]
    ranked = explain.apply(causes, experiments, 5)
    assert [c.id for c in ranked] == ["object-order", "python-hash-seed"]
    assert ranked[0].confidence == "confirmed"
    assert ranked[1].confidence == "possible"
    assert "still diverge" in ranked[1].evidence[-1]


def test_a_pin_that_moves_the_divergence_later_says_where() -> None:
    causes = [cause("unseeded-torch-rng", ["torch-rng"])]
    ranked = explain.apply(causes, [Experiment("torch-rng", "the torch RNG", "divergent", 40, "moved later")], 3)
    assert ranked[0].confidence == "likely"
    assert "from #3 to #40" in ranked[0].evidence[-1]


def test_everything_pinned_still_diverging_is_evidence_for_order_causes() -> None:
    causes = [cause("concurrency", [])]
    ranked = explain.apply(causes, [Experiment("all", "every source", "divergent", 0, "")], 0)
    assert "every pin at once" in ranked[0].evidence[-1]
    ranked = explain.apply([cause("unseeded-torch-rng", ["torch-rng"])],
                           [Experiment("all", "every source", "divergent", 0, "")], 0)
    assert ranked[-1].id == "unknown"


def test_skipped_experiments_change_nothing() -> None:
    causes = [cause("cudnn-benchmark", ["cudnn"])]
    ranked = explain.apply(causes, [Experiment("cudnn", "cuDNN", "skipped", None, "over the budget")], 2)
    assert ranked[0].confidence == "likely" and ranked[0].evidence == ["seen"]


def _baseline(tmp_path: Path) -> Report:
    recs = training_records(steps=2)
    return load_run(write_run(tmp_path / "base", [recs, [recs[0].but(digest=77), *recs[1:]]]))


@pytest.mark.parametrize("exit_codes, incomplete", [([0, 1], None), ([0, 0], 1), ([2, 2], None)])
def test_a_crashed_repeat_or_a_broken_trace_never_confirms(tmp_path: Path, exit_codes: list[int],
                                                          incomplete: int | None) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "pinned", [recs, recs], exit_codes=exit_codes)
    if incomplete is not None:
        (run_dir / f"repeat-{incomplete}.trace").unlink()
        write_trace(run_dir / f"repeat-{incomplete}.trace", recs, None)
    verdict, _, note = explain._verdict(load_run(run_dir), _baseline(tmp_path))
    assert verdict == "failed", note


def test_clean_agreeing_repeats_confirm(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    assert explain._verdict(load_run(write_run(tmp_path / "pinned", [recs, recs])), _baseline(tmp_path))[0] \
        == "deterministic"


def test_exit_statuses_that_still_differ_are_divergent_when_the_baseline_ended_differently(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    baseline = load_run(write_run(tmp_path / "base", [recs, recs[:3]], exit_codes=[0, 1]))
    pinned = load_run(write_run(tmp_path / "pinned", [recs[:3], recs], exit_codes=[1, 0]))
    assert explain._verdict(pinned, baseline)[0] == "divergent"


def test_experiments_run_at_the_baselines_granularity_from_any_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, "granularity": "step"}))
    seen: list[tuple[str, Path]] = []

    def fake_execute(options: AuditOptions, out: Path, on_done: object = None, prefix: str = "repeat",
                     cwd: Path | None = None) -> list[RepeatResult]:
        seen.append((options.granularity, out))
        results = []
        for plan in plan_repeats(out, options.repeats, options.devices, options.granularity, prefix=prefix):
            write_trace(plan.trace, recs, {"exit_code": 0})
            plan.stdout.write_text("")
            plan.stderr.write_text("")
            results.append(RepeatResult(plan.index, plan.device, 0, 0.1, False, plan.trace.name, plan.stdout.name,
                                        plan.stderr.name, "same"))
        return results

    monkeypatch.setattr(audit, "execute", fake_execute)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = explain.run_experiments(Path("../run"), budget=4)
    assert seen and all(granularity == "step" for granularity, _ in seen)
    assert all(out.is_absolute() and out == run_dir.resolve() for _, out in seen)
    assert report.experiments and report.experiments[-1].verdict == "deterministic"


def test_a_run_with_a_timed_out_repeat_is_not_explained(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    other = [recs[0].but(digest=77), *recs[1:4]]
    run_dir = write_run(tmp_path / "run", [recs, other], exit_codes=[0, -15], timed_out=[False, True])
    with pytest.raises(UsageError, match="timed out"):
        explain.run_experiments(run_dir)


def test_one_explain_at_a_time_per_run_directory(tmp_path: Path) -> None:
    """A second explain would reuse the first one's file names and overwrite explain.json under it."""
    from detaudit.explain import _exclusive  # noqa: PLC2701 - the lock itself is under test

    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=1), *recs[1:]]])
    with _exclusive(run_dir), pytest.raises(UsageError, match="another `detaudit explain` is running"):
        explain.run_experiments(run_dir)
    plain = tmp_path / "not_a_run"
    plain.mkdir()
    with pytest.raises(TraceError):
        explain.run_experiments(plain)
    assert list(plain.iterdir()) == []  # nothing left in a directory that is not a run
