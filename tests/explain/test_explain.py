"""The experiment runner: pin planning, bisection, what an experiment's repeats may conclude, and
running experiments end to end (with the repeats faked). How results re-rank causes: test_experiments.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from synthetic import training_records, write_run, write_trace

from detaudit.audit.analysis import Analysis
from detaudit.audit.pipeline import AuditOptions, load_run, loaded
from detaudit.causes import confirm as experiments
from detaudit.errors import TraceError, UsageError
from detaudit.explain import runner as explain
from detaudit.pin import SEP, Pin
from detaudit.report.model import Report
from detaudit.results import Cause, Confidence, RepeatResult
from detaudit.run.launcher import plan_repeats
from detaudit.run.rundir import read_experiments


def cause(cause_id: str, pins: list[str], confidence: Confidence = "likely", separating: Pin | None = None) -> Cause:
    return Cause(cause_id, confidence, "summary", ["seen"], "fix", pins, separating_pin=separating)


def test_plan_follows_the_ranking_without_duplicates() -> None:
    causes = [cause("nondeterministic-op", ["deterministic", "one-thread"]), cause("thread-count", ["one-thread"]),
              cause("concurrency", [])]
    assert explain.plan(causes) == ["deterministic", "one-thread"]


def test_plan_runs_the_separating_experiment_first() -> None:
    a = cause("object-order", ["address-layout"], "possible", Pin.HASH_SEED)
    b = cause("python-hash-seed", ["hash-seed"], "possible", Pin.HASH_SEED)
    assert explain.plan([a, b]) == ["hash-seed", "address-layout"]
    assert explain.cheap_pin([a, b]) == "hash-seed"


def test_cheap_confirmation_only_for_one_cheap_decisive_pin() -> None:
    assert explain.cheap_pin([cause("unseeded-numpy-rng", ["numpy-rng"])]) == "numpy-rng"
    assert explain.cheap_pin([cause("nondeterministic-op", ["deterministic", "one-thread"])]) is None
    assert explain.cheap_pin([cause("varying-seed", ["torch-rng", "numpy-rng"])]) is None
    assert explain.cheap_pin([cause("unseeded-numpy-rng", ["numpy-rng"], "confirmed")]) is None
    assert explain.cheap_pin([]) is None


@pytest.mark.parametrize("sources, expected", [
    ({"hash-seed"}, ["hash-seed"]),
    ({"zero-empty"}, ["zero-empty"]),
    ({"torch-rng", "one-thread"}, ["torch-rng", "one-thread"]),
])
def test_bisection_isolates_the_source(sources: set[str], expected: list[str]) -> None:
    tried: list[str] = []

    def agrees(name: str) -> bool:
        tried.append(name)
        return sources <= set(name.split(SEP))

    assert explain.bisect(explain.bisection_pins(["cpu"]), agrees) == expected
    assert len(tried) <= 12
    assert not any(p in explain.CUDA_PINS for name in tried for p in name.split(SEP))


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
    verdict, _, note = explain.experiment_verdict(load_run(run_dir), _baseline(tmp_path))
    assert verdict == "failed", note


def test_clean_agreeing_repeats_confirm(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    assert explain.experiment_verdict(load_run(write_run(tmp_path / "pinned", [recs, recs])), _baseline(tmp_path))[0] \
        == "deterministic"


def test_exit_statuses_that_still_differ_are_divergent_when_the_baseline_ended_differently(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    baseline = load_run(write_run(tmp_path / "base", [recs, recs[:3]], exit_codes=[0, 1]))
    pinned = load_run(write_run(tmp_path / "pinned", [recs[:3], recs], exit_codes=[1, 0]))
    assert explain.experiment_verdict(pinned, baseline)[0] == "divergent"


def test_experiments_run_at_the_baselines_granularity_from_any_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, "granularity": "step"}))
    seen: list[tuple[str, Path]] = []

    def fake_execute(options: AuditOptions, out: Path, on_done: object = None, prefix: str = "repeat",
                     cwd: Path | None = None, on_progress: object = None, first: int = 0) -> list[RepeatResult]:
        seen.append((options.recording.granularity, out))
        results = []
        for plan in plan_repeats(out, options.schedule.repeats, options.schedule.devices,
                                 options.recording.granularity, prefix=prefix, first=first):
            differ = not pinned(options) and plan.index > 0  # the control still diverges
            write_trace(plan.trace, [recs[0].but(digest=99), *recs[1:]] if differ else recs, {"exit_code": 0})
            plan.stdout.write_text("")
            plan.stderr.write_text("")
            results.append(RepeatResult(plan.index, plan.device, 0, 0.1, False, plan.trace.name, plan.stdout.name,
                                        plan.stderr.name, "same"))
        return results

    monkeypatch.setattr(explain, "execute", fake_execute)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = explain.run_experiments(Path("../run"), budget=4)
    assert seen
    assert all(granularity == "step" for granularity, _ in seen)
    assert all(out.is_absolute() and out == run_dir.resolve() for _, out in seen)
    verdicts = {e.pin: e.verdict for e in report.experiments}
    assert verdicts["all"] == "deterministic"
    # the bisection that follows stops at the budget and says so
    assert report.experiments[-1].verdict == "skipped"
    assert "budget of 4" in report.experiments[-1].note


def test_a_run_with_a_timed_out_repeat_is_not_explained(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    other = [recs[0].but(digest=77), *recs[1:4]]
    run_dir = write_run(tmp_path / "run", [recs, other], exit_codes=[0, -15], timed_out=[False, True])
    with pytest.raises(UsageError, match="timed out"):
        explain.run_experiments(run_dir)


def pinned(options: AuditOptions) -> bool:
    """An experiment pins something; the control pins nothing (synthetic runs have no environment of their own)."""
    return bool(options.recording.child_config.get("pins") or options.target.env)


def _fake_runs(monkeypatch: pytest.MonkeyPatch, agree: Callable[[AuditOptions], bool], lucky: int = 1) -> list[str]:
    """Experiments whose repeats agree when `agree(options)` says so, and otherwise from their `lucky`-th repeat
    on (the first ones agree by chance); returns the pins each ran with."""
    recs = training_records(steps=2)
    ran: list[str] = []

    def fake_execute(options: AuditOptions, out: Path, on_done: object = None, prefix: str = "repeat",
                     cwd: Path | None = None, on_progress: object = None, first: int = 0) -> list[RepeatResult]:
        ran.append(prefix)
        results = []
        for plan in plan_repeats(out, options.schedule.repeats, options.schedule.devices,
                                 options.recording.granularity, prefix=prefix, first=first):
            differ = not agree(options) and plan.index >= max(1, lucky)
            write_trace(plan.trace, [recs[0].but(digest=99), *recs[1:]] if differ else recs, {"exit_code": 0})
            plan.stdout.write_text("")
            plan.stderr.write_text("")
            results.append(RepeatResult(plan.index, plan.device, 0, 0.1, False, plan.trace.name, plan.stdout.name,
                                        plan.stderr.name, "same"))
        return results

    monkeypatch.setattr(explain, "execute", fake_execute)
    return ran


def test_every_pin_agreeing_is_bisected_down_to_the_source_no_cause_named(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The hash seed was the source; the evidence named nothing pinnable: the bisection finds it."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    ran = _fake_runs(monkeypatch, lambda options: options.target.env.get("PYTHONHASHSEED") == "0")
    report = explain.run_experiments(run_dir, budget=40, repeats=2)
    verdicts = {e.pin: e.verdict for e in report.experiments}
    assert verdicts["all"] == "deterministic"
    assert verdicts["hash-seed"] == "deterministic"
    top = report.causes[0]
    assert top.id == "python-hash-seed"
    assert top.confidence == "confirmed"
    assert top.pins == ["hash-seed"]
    assert "no recorded evidence pointed here" in top.evidence[-1]
    assert len(ran) <= 8  # all, then halves: far fewer than one experiment per pin pair


def test_default_confirmation_runs_only_the_cheap_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    ran = _fake_runs(monkeypatch, pinned)
    monkeypatch.setattr(explain, "cheap_pin", lambda causes: "torch-rng")
    report = explain.run_experiments(run_dir, cheap=True)
    assert ran == ["explain-torch-rng"]  # the pin agreed; the audit's own repeats, which diverged, are the control
    assert [(e.pin, e.verdict) for e in report.experiments] == [("torch-rng", "deterministic"),
                                                                ("control", "divergent")]
    assert "the audit's own repeats" in report.experiments[-1].note
    assert read_experiments(run_dir)[-1].results is None  # no repeat was paid for it


def test_a_cause_that_fires_by_chance_gets_a_control_of_its_own(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A race may not fire again: the audit's own repeats diverging once do not show it reproduces now."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    ran = _fake_runs(monkeypatch, pinned)
    _with_causes(monkeypatch, [cause("unseeded-torch-rng", ["torch-rng"]), cause("concurrency", [])])
    report = explain.run_experiments(run_dir, cheap=True)
    assert ran == ["explain-torch-rng", "explain-control"]
    assert [(e.pin, e.verdict) for e in report.experiments] == [("torch-rng", "deterministic"),
                                                                ("control", "divergent")]


@pytest.mark.parametrize("cause_id", explain.CHANCE_CAUSES)
def test_the_audits_repeats_are_no_control_beside_a_cause_that_fires_by_chance(cause_id: str,
                                                                             tmp_path: Path) -> None:
    report = synthetic_divergent(tmp_path)
    assert explain.repeats_as_control(replace(report, causes=[cause("unseeded-torch-rng", ["torch-rng"]),
                                                              cause(cause_id, [])])) is None


def test_the_audits_repeats_are_the_control_of_an_rng_cause(tmp_path: Path) -> None:
    report = synthetic_divergent(tmp_path)
    own = explain.repeats_as_control(replace(report, causes=[cause("unseeded-torch-rng", ["torch-rng"])]))
    assert own is not None
    assert (own.pin, own.verdict) == ("control", "divergent")


def test_the_cheap_pin_separates_the_leading_two_when_the_top_has_no_pin() -> None:
    """Object order competing with concurrency: the address-layout pin; a string order with the clock: the hash
    seed. Neither the race nor the clock can be pinned, so the experiment rules the runner-up in or out."""
    assert explain.cheap_pin([cause("concurrency", []), cause("object-order", ["address-layout"])]) \
        == "address-layout"
    assert explain.cheap_pin([cause("outside-value", []), cause("python-hash-seed", ["hash-seed"])]) == "hash-seed"
    assert explain.cheap_pin([cause("concurrency", [])]) is None


def test_the_cheap_pin_tests_no_guess_behind_a_cause_with_evidence() -> None:
    """A learning rate from the clock (outside-value, read by time.time): no pin holds the clock, and the hash seed
    and object order have no evidence of their mechanism in the run: nothing is spent on them."""
    clock = cause("outside-value", [], "possible")
    guesses = [replace(cause(c, [p], "possible"), basis="no-evidence")
               for c, p in (("python-hash-seed", "hash-seed"), ("object-order", "address-layout"))]
    assert explain.cheap_pin([clock, *guesses]) is None


def test_with_no_evidence_anywhere_no_cheap_experiment_tests_a_guess() -> None:
    """No cause has evidence (`unknown` leads, the candidates go first): the one cheap experiment is not spent on a
    guess (it once pinned PYTHONHASHSEED for a parameter order the evidence laid at object order's door)."""
    guesses = [replace(cause(c, [p], "possible", Pin.HASH_SEED), basis="no-evidence")
               for c, p in (("python-hash-seed", "hash-seed"), ("object-order", "address-layout"))]
    assert explain.cheap_pin([*guesses, cause("unknown", [], "possible")]) is None


def synthetic_divergent(tmp_path: Path) -> Report:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    return load_run(run_dir)


def _with_causes(monkeypatch: pytest.MonkeyPatch, ranked: list[Cause]) -> None:
    """The run's report ranks these causes (synthetic traces carry no evidence)."""
    def loaded_with(path: Path) -> Analysis:
        analysis = loaded(path)
        return replace(analysis, inferred=tuple(ranked), report=replace(analysis.report_made(), causes=ranked))

    monkeypatch.setattr(explain, "loaded", loaded_with)


def test_a_control_that_agrees_too_confirms_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first repeat left a file the later ones found: every later run agrees, pinned or not."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    ran = _fake_runs(monkeypatch, lambda options: True)
    ranked = [cause("python-hash-seed", ["hash-seed"], "likely"), cause("object-order", ["address-layout"], "possible")]
    def loaded_with(path: Path) -> Analysis:
        analysis = loaded(path)
        return replace(analysis, inferred=tuple(ranked), report=replace(analysis.report_made(), causes=ranked))

    monkeypatch.setattr(explain, "loaded", loaded_with)
    report = explain.run_experiments(run_dir, budget=40, repeats=3)
    # the control agreed, then agreed over twice as many more (CONTROL_GROWTH), and nothing ran after it
    assert ran == ["explain-hash-seed", "explain-control", "explain-control"]
    assert [len(e.results or ()) for e in read_experiments(run_dir)] == [3, 3 + 3 * explain.CONTROL_GROWTH]
    top, *rest = experiments.apply(ranked, report.experiments, 0)
    assert top.id == "not-reproduced"
    assert all(c.confidence != "confirmed" for c in rest)
    assert [c.id for c in rest] == ["python-hash-seed", "object-order"]
    assert report.experiments[-1].pin == "control"
    assert report.experiments[-1].verdict == "deterministic"


def test_a_control_that_agreed_by_chance_is_outgrown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set of objects hashed by identity can keep its order across repeats, and a race may not fire: a control
    whose first repeats agreed by chance must not void a confirmation. More repeats of it run,
    numbered after the first under the same prefix, and the control is judged over them all."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    ran = _fake_runs(monkeypatch, pinned, lucky=2)
    monkeypatch.setattr(explain, "cheap_pin", lambda causes: "torch-rng")
    _with_causes(monkeypatch, [cause("unseeded-torch-rng", ["torch-rng"]), cause("concurrency", [])])
    report = explain.run_experiments(run_dir, cheap=True)
    assert ran == ["explain-torch-rng", "explain-control", "explain-control"]
    assert [(e.pin, e.verdict) for e in report.experiments] == [("torch-rng", "deterministic"),
                                                                ("control", "divergent")]
    assert "the first 2 repeats agreed, and 4 more were run" in report.experiments[-1].note
    control = read_experiments(run_dir)[-1]
    assert [r.index for r in control.results or ()] == list(range(2 + 2 * explain.CONTROL_GROWTH))
    assert all((run_dir / r.trace).is_file() for r in control.results or ())


def test_a_stored_control_that_agreed_unextended_is_extended_when_explain_runs_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An explain.json of an earlier version (or of an explain stopped before the extension) holds an agreeing
    control of 2 repeats: a later explain extends it rather than trusting it as it is."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    ran = _fake_runs(monkeypatch, pinned, lucky=2)
    monkeypatch.setattr(explain, "cheap_pin", lambda causes: "torch-rng")
    _with_causes(monkeypatch, [cause("unseeded-torch-rng", ["torch-rng"]), cause("concurrency", [])])
    monkeypatch.setattr(explain, "CONTROL_GROWTH", 0)  # as before controls were extended
    first = explain.run_experiments(run_dir, cheap=True)
    assert [(e.pin, e.verdict) for e in first.experiments] == [("torch-rng", "deterministic"),
                                                               ("control", "deterministic")]
    monkeypatch.setattr(explain, "CONTROL_GROWTH", 2)
    again = explain.run_experiments(run_dir, cheap=True)
    assert ran == ["explain-torch-rng", "explain-control", "explain-control"]  # the pin reused, the control grown
    assert [(e.pin, e.verdict) for e in again.experiments] == [("torch-rng", "deterministic"),
                                                               ("control", "divergent")]


def test_a_separating_experiment_needs_three_agreeing_repeats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Objects keep their set order across two repeats 1 time in 8 by chance: two agreeing prove too little."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    seen: list[int] = []
    _fake_runs(monkeypatch, lambda options: seen.append(options.schedule.repeats) is None and pinned(options))
    tied = [cause("python-hash-seed", ["hash-seed"], "possible", Pin.HASH_SEED),
            cause("object-order", ["address-layout"], "possible", Pin.HASH_SEED)]
    _with_causes(monkeypatch, tied)
    report = explain.run_experiments(run_dir, cheap=True)
    assert seen
    assert set(seen) == {explain.SEPARATING_REPEATS}
    assert [e.pin for e in report.experiments] == ["hash-seed", "control"]


def test_one_explain_at_a_time_per_run_directory(tmp_path: Path) -> None:
    """A second explain would reuse the first one's file names and overwrite explain.json under it."""
    from detaudit.explain.runner import _exclusive  # noqa: PLC2701 - the lock itself is under test

    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=1), *recs[1:]]])
    with _exclusive(run_dir), pytest.raises(UsageError, match="another `detaudit explain` is running"):
        explain.run_experiments(run_dir)
    plain = tmp_path / "not_a_run"
    plain.mkdir()
    with pytest.raises(TraceError):
        explain.run_experiments(plain)
    assert list(plain.iterdir()) == []  # nothing left in a directory that is not a run


def test_an_experiment_that_also_pins_other_sources_is_followed_by_those_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch RNG was the source (a seeding undone by fork_rng), the evidence pointed at object order: the
    address-layout experiment agrees because it seeds the RNGs too, so the rest of what it pins runs without the
    layout, agrees as well, and is bisected down to the torch RNG; object order is never confirmed."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    ran = _fake_runs(monkeypatch, lambda options: "torch-rng" in options.recording.child_config.get("pins", []))
    ranked = [cause("object-order", ["address-layout"], "likely")]
    def loaded_with(path: Path) -> Analysis:
        analysis = loaded(path)
        return replace(analysis, inferred=tuple(ranked), report=replace(analysis.report_made(), causes=ranked))

    monkeypatch.setattr(explain, "loaded", loaded_with)
    report = explain.run_experiments(run_dir, budget=40, repeats=2)
    assert ran[:3] == ["explain-address-layout", "explain-control", "explain-torch-rng+numpy-rng+python-rng+hash-seed"]
    final = experiments.apply(ranked, report.experiments, 0)
    assert [(c.id, c.confidence) for c in final] == [("unseeded-torch-rng", "confirmed"),
                                                     ("object-order", "not-needed")]


def test_the_kernels_pin_leaves_the_uninitialized_memory_fill_off() -> None:
    """use_deterministic_algorithms also fills uninitialized memory: that is zero-empty's source, not the kernels'."""
    import torch

    from detaudit.recorder.pinning import Pins

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    try:
        Pins(["deterministic"]).apply_torch_flags(torch)
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.utils.deterministic.fill_uninitialized_memory
        Pins(["deterministic", "zero-empty"]).apply_torch_flags(torch)  # every pin at once: both sources fixed
        assert torch.utils.deterministic.fill_uninitialized_memory
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]


@pytest.mark.process
@pytest.mark.slow
def test_a_default_divergent_run_starts_six_interpreters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: 3 repeats, the op-level re-run and the cheap confirmation's 2 pinned ones (was 8: the audit's own
    repeats, which diverged with nothing pinned, are now the confirmation's control)."""
    from click.testing import CliRunner
    from conftest import _interpreters_started

    from detaudit.cli.commands import cli

    monkeypatch.chdir(tmp_path)
    demo = Path(explain.__file__).parents[1] / "demo" / "train_demo.py"
    with _interpreters_started() as started:
        result = CliRunner().invoke(cli, ["run", "--repeats", "3", "--out", "run", "--json", "r.json", "-q",
                                          str(demo)], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert len(started) == 6, started
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["causes"][0]["confidence"] == "confirmed"
    assert [(e["pin"], e["verdict"]) for e in report["experiments"]] == [("numpy-rng", "deterministic"),
                                                                         ("control", "divergent")]


@pytest.mark.process
@pytest.mark.slow
def test_a_learning_rate_from_the_clock_starts_only_the_repeats(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A parameter is the first record to differ (its step's gradients agree) and the only evidence is a clock read:
    no op-level re-run (no op makes an optimizer's update) and no hash-seed experiment (no evidence of hashing).
    Was 7 with 2 repeats: the hash seed's 3 pinned repeats and 2 op-level ones that named nothing."""
    from click.testing import CliRunner
    from conftest import SCRIPTS, _interpreters_started

    from detaudit.cli.commands import cli

    monkeypatch.chdir(tmp_path)
    with _interpreters_started() as started:
        result = CliRunner().invoke(cli, ["run", "--repeats", "2", "--out", "run", "--json", "r.json",
                                          str(SCRIPTS / "train_warm_restart.py")], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert len(started) == 2, started
    assert json.loads((tmp_path / "r.json").read_text())["experiments"] == []
    assert "no op-level re-run: parameter 0.weight is the first record to differ" in result.output
