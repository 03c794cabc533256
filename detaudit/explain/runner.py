"""`--explain`: confirm causes by experiment, one pinned source at a time.

The baseline repeats already showed the divergence and ranked the causes; they are not run
again. Each experiment re-runs the script (a few repeats per device) with one source pinned
(PINS: seeded RNGs, a fixed PYTHONHASHSEED, deterministic algorithms, one thread, ...), in the
order of the ranking, and compares those repeats with each other. A cause whose pin alone
removes the divergence is `confirmed`; a pin that only moves the first divergence later is
reported with where it moved to. When no single pin confirms anything, one last experiment pins
everything at once: if that still diverges, the source is one no pin reaches (concurrency,
object order, or unknown). Experiments stop at the first confirmation unless asked for all,
and never exceed the budget of extra repeats. The first pin that makes the repeats agree is checked
against a control with nothing pinned (outside the budget): if the control agrees too, and still
agrees over more repeats (its first agreement can be chance), the divergence no longer reproduces and
nothing is confirmed. The cheap confirmation after a divergent `run` takes the audit's own repeats as that
control (repeats_as_control), unless a candidate cause fires only some of the time or comes from what an
earlier repeat left: then its control runs as explain's does. An experiment that also pins other sources
(address-layout seeds the RNGs and fixes the hash seed) is followed by those sources pinned without
its own, and, when they agree, by a bisection of them: it confirms its own only when they diverge.

Repeats go into the run directory as `explain-<pin>-<i>.*`; the experiments are stored in
`explain.json` there, so `detaudit report RUN_DIR` shows them and a later explain reuses them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from detaudit.audit.analysis import Analysis, stored_experiments
from detaudit.audit.follow_up import FollowUp
from detaudit.audit.pipeline import (
    AuditOptions,
    Checks,
    Recording,
    Schedule,
    Target,
    analyse,
    execute,
    extended,
    gated,
    loaded,
)
from detaudit.cause_table import CAUSES
from detaudit.causes import NO_EVIDENCE, leads
from detaudit.compare.stdout import recorded_mode
from detaudit.errors import UsageError, output_error
from detaudit.pin import ALL, CONTROL, PINS, SEP, Pin, also_pins, pin_of, separating_pin
from detaudit.records import RunRecord, StoredExperiment
from detaudit.report.model import Report, write_json
from detaudit.results import Cause, Experiment, ExperimentVerdict, RepeatProgress, RepeatResult
from detaudit.run.distributed import NODES_FOLLOW_UP, multi_node
from detaudit.run.rundir import (
    EXPLAIN_LOCK,
    REPORT_FILE,
    RUN_FILE,
    free_prefix,
    read_experiments,
    write_experiments,
)

DEFAULT_BUDGET = 12
CHEAP_REPEATS = 2  # the default confirmation: one experiment of 2 repeats (a source that varies every run)
# experiments that are cheap and decisive in 2 repeats: the source differs in every run when unpinned
CHEAP_PINS = (Pin.TORCH_RNG, Pin.NUMPY_RNG, Pin.PYTHON_RNG, Pin.HASH_SEED, Pin.ADDRESS_LAYOUT)
CUDA_PINS = (Pin.CUDNN, Pin.CUBLAS, Pin.TF32_OFF, Pin.NCCL)
# address randomization moves memory in page steps, so a set of objects keeps its order across two
# repeats about 1 time in 8: an experiment that separates a toss-up must agree over 3 (1 in 64)
SEPARATING_REPEATS = 3
MIN_REPEATS = 2
# a control that agrees voids every confirmation, and can agree by chance (a set of objects hashed by identity in
# the same order, a race that did not fire): before it counts, this many times its repeats more must agree too.
# Less likely by chance, not impossible: fresh interpreters often agree on the order of a set of a few objects
CONTROL_GROWTH = 2
CHANCE_CAUSES = tuple(s.id.value for s in CAUSES.values() if s.by_chance)  # no control: see repeats_as_control


def plan(causes: Sequence[Cause]) -> list[Pin]:
    """Pins to try: the experiment that separates a toss-up first, then in the order of the ranking."""
    names = [c.separating_pin for c in causes[:1] if c.separating_pin is not None]
    for cause in causes:
        names.extend(Pin(p) for p in cause.pins if p in PINS and p not in names)
    return names


def experiment_verdict(report: Report, baseline: Report) -> tuple[ExperimentVerdict, int | None, str]:
    """(verdict, first divergence index, note) of one experiment's repeats.

    Only repeats that all ran to the end, with complete traces and the exit status the baseline
    had, can confirm a pin: a crash or a missing trace proves nothing (`failed`), and exit
    statuses that still differ are a divergence.
    """
    baseline_index = baseline.first_divergence.index if baseline.first_divergence is not None else -1
    if report.verdict == "failed":
        return "failed", None, "the script failed in every pinned repeat"
    if report.timed_out:
        return "failed", None, "a pinned repeat timed out"
    ok_codes = {r.exit_code for r in baseline.runs}
    ended = report.outcome_divergence
    if ended is not None and ended.record is None and len(ok_codes) > 1:  # exit statuses differ, as before
        first = report.comparison.first_divergence
        return ("divergent", first.index if first is not None else None,
                f"the repeats still end differently ({ended.detail})")
    # a repeat stopped at a step boundary (it diverged again, or a bound) has no exit status of its own
    broken = [f"repeat {r.index} exited {r.exit_code}" for r in report.runs
              if r.exit_code not in ok_codes and r.stopped_at_step is None]
    broken += [f"repeat {r.index} left an incomplete or no trace" for r, complete
               in zip(report.runs, report.comparison.complete) if not complete]
    if broken:
        return "failed", None, f"inconclusive: {'; '.join(broken)}"
    first = report.comparison.first_divergence
    if first is None:
        if report.outcome_divergence is not None and baseline_index < 0:
            return "divergent", None, report.outcome_divergence.detail
        note = f"the output still differs ({report.outcome_divergence.detail})" if report.outcome_divergence else ""
        return "deterministic", None, note
    rec = first.record
    where = f"{rec.kind} {rec.name} step {rec.step}" if rec is not None else first.detail
    if baseline_index >= 0 and first.index > baseline_index:
        return "divergent", first.index, f"moved later, to #{first.index}: {where}"
    return "divergent", first.index, f"still at #{first.index}: {where}"


def leading_pair_pin(causes: Sequence[Cause]) -> Pin | None:
    """The experiment that tells the leading two causes apart: the toss-up's, or, when the top cause has no pin
    of its own (concurrency, the clock), the one that pins the runner-up's source and not the top's (the
    address-layout pin where object order competes with concurrency; the hash seed where a string order
    competes with the clock). Not a runner-up with no evidence of its mechanism behind a top cause with some
    (docs/causes.md#ranking): that experiment would test a guess the evidence does not point at."""
    if not causes:
        return None
    top = causes[0]
    if top.separating_pin is not None or top.pins or len(causes) < 2 or unsupported(causes[1], top):
        return top.separating_pin
    return separating_pin(top.pins, causes[1].pins)


def unsupported(candidate: Cause, top: Cause) -> bool:
    """A candidate with no evidence of its mechanism, ranked behind a cause with evidence of its own."""
    return candidate.basis == NO_EVIDENCE and top.basis != NO_EVIDENCE


def cheap_pin(causes: Sequence[Cause]) -> Pin | None:
    """The one inexpensive, decisive experiment for the top cause, or the one that separates the leading two
    (leading_pair_pin), if there is one. None for a top cause with no evidence of its mechanism (candidates lead
    only when no cause has any): the experiment follows the evidence, and a guess is `detaudit explain`'s to test."""
    if not causes or causes[0].confidence == "confirmed" or causes[0].basis == NO_EVIDENCE:
        return None
    separating = leading_pair_pin(causes)
    candidates = [separating] if separating is not None else list(dict.fromkeys(causes[0].pins))
    return Pin(candidates[0]) if len(candidates) == 1 and candidates[0] in CHEAP_PINS else None


def cheap_pin_of(report: Report) -> Pin | None:
    """`cheap_pin` for an audit's report: its causes first, then the candidates not ruled out."""
    return cheap_pin(leads(report.causes, report.not_ruled_out))


def repeats_as_control(report: Report) -> Experiment | None:
    """The audit's own repeats as the cheap confirmation's control, where that is sound: they ran with nothing
    pinned and diverged, which is all a control would show. Not sound (None: a control runs) when a candidate
    cause fires only some of the time (a race, an atomic add, a read of uninitialised memory: the divergence may
    not come back) or comes from what an earlier repeat left (carried state: the later repeats may all agree)."""
    candidates = leads(report.causes, report.not_ruled_out)
    if report.first_divergence is None or any(c.id in CHANCE_CAUSES for c in candidates):
        return None
    return Experiment(CONTROL, pin_of(CONTROL).description, "divergent", report.first_divergence.index,
                      "the audit's own repeats, run with nothing pinned, diverged (they serve as the control)")


def bisection_pins(devices: Sequence[str]) -> list[Pin]:
    """The pins a bisection splits: CUDA-only pins only when a repeat ran on a GPU."""
    return [p for p in PINS if p not in CUDA_PINS or "cuda" in devices]


def run_experiments(run_dir: Path, budget: int = DEFAULT_BUDGET, explain_all: bool = False,
                    repeats: int | None = None, jobs: int = 1,
                    on_done: Callable[[RepeatResult], None] | None = None,
                    on_experiment: Callable[[Experiment], None] | None = None,
                    script_args: Sequence[str] | None = None, cheap: bool = False,
                    on_progress: Callable[[RepeatProgress], None] | None = None) -> Report:
    """`detaudit explain RUN_DIR`: `experiment_on` the run's Analysis, read from its directory once; `repeats` per
    device and experiment defaults to the baseline's."""
    args = None if script_args is None else tuple(script_args)
    follow_up = FollowUp(cheap, not cheap, explain_all, budget, jobs, args)
    analysis = loaded(Path(run_dir).resolve())  # the repeats run in the script's directory, not ours
    return experiment_on(analysis, follow_up, on_done, on_progress, on_experiment, repeats).report_made()


def experiment_on(analysis: Analysis, follow_up: FollowUp, on_done: Callable[[RepeatResult], None] | None = None,
                  on_progress: Callable[[RepeatProgress], None] | None = None,
                  on_experiment: Callable[[Experiment], None] | None = None, repeats: int | None = None) -> Analysis:
    """The experiments for a finished, divergent run: its Analysis extended with them, its traces not compared
    again. `follow_up.cheap`: only the top cause's one inexpensive, decisive experiment (`cheap_pin`), with
    CHEAP_REPEATS repeats, the default confirmation; else --explain's, within `follow_up.budget` extra repeats.
    `on_done`, `on_progress`: each repeat that ended, where each running one stands (audit.execute). One explain
    at a time per run directory: a second would pick the same file names and overwrite explain.json under it."""
    with _exclusive(analysis.run_dir):
        return _run_experiments(analysis, follow_up, Bench(analysis.run_dir, analysis.record, analysis.report_made(),
                                                           Path(analysis.record.cwd or ".").resolve(), on_done,
                                                           on_progress), on_experiment, repeats)


@contextlib.contextmanager
def _exclusive(run_dir: Path) -> Iterator[None]:
    """Hold `RUN_DIR/.explain.lock` (flock, released however the process ends) or refuse at once."""
    if not (run_dir / RUN_FILE).is_file():  # not a run directory: leave no file in it (the caller says why)
        yield
        return
    try:
        # never through a link planted at its name (run/files.py): that would create a file outside the run
        fd = os.open(run_dir / EXPLAIN_LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise output_error(run_dir / EXPLAIN_LOCK, exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"{run_dir}: another `detaudit explain` is running on this run directory; wait for "
                             "it to finish") from None
        yield
    finally:
        os.close(fd)


class Outcome(Enum):
    """What trying one experiment came to."""

    AGREES = "agrees"  # the repeats agreed with the pin in place, and the control still diverges
    DIVERGES = "diverges"  # they did not agree (or the experiment failed)
    OVER_BUDGET = "over-budget"  # not run: the budget cannot pay for it (stored as skipped)
    NOT_REPRODUCED = "not-reproduced"  # the control agreed too: no experiment can confirm anything now

    @property
    def agreed(self) -> bool | None:
        """For the bisection: whether the pins made the repeats agree; None: stop here."""
        return {Outcome.AGREES: True, Outcome.DIVERGES: False}.get(self)


@dataclass
class Ledger:
    """The extra repeats an explain or a fix may pay for, and what it paid: each payment is made at the call that
    runs the repeats (`pay`), never hidden in a condition."""

    budget: int
    spent: int = 0

    def affords(self, cost: int) -> bool:
        return self.spent + cost <= self.budget

    def pay(self, cost: int) -> int:
        self.spent += cost
        return cost


@dataclass(frozen=True)
class Bench:
    """Where an experiment's repeats run and what they are judged against: the audit's run directory, its record
    and report (the baseline). Shared by explain's pins and fix's sets of knobs."""

    run_dir: Path
    record: RunRecord
    baseline: Report
    cwd: Path
    on_done: Callable[[RepeatResult], None] | None = None
    on_progress: Callable[[RepeatProgress], None] | None = None

    def judge(self, options: AuditOptions, prefix: str, earlier: tuple[RepeatResult, ...] = (),
              explained: bool = True) -> tuple[tuple[RepeatResult, ...], ExperimentVerdict, int | None, str]:
        """Run OPTIONS' repeats under PREFIX, numbered after EARLIER's (judged together with those): the results,
        the verdict, the first divergence's index and the note (experiment_verdict)."""
        results = (*earlier, *execute(options, self.run_dir, self.on_done, prefix=prefix, cwd=self.cwd,
                                      on_progress=self.on_progress, first=len(earlier)))
        sub = analyse(self.run_dir, replace(self.record, narrowing=None, results=results), results,
                      explained=explained)
        return (results, *experiment_verdict(sub, self.baseline))


class Experiments:
    """One explain's experiments: the stored ones (explain.json, rewritten after each), the ledger, and the
    control's state. Each `try_pin` says what it came to (Outcome); none raises to stop the others."""

    def __init__(self, bench: Bench, base: AuditOptions, ledger: Ledger, stored: list[StoredExperiment],
                 separating: Pin | None, own_control: Experiment | None,
                 on_experiment: Callable[[Experiment], None] | None) -> None:
        self.bench, self.base, self.ledger, self.stored = bench, base, ledger, stored
        self.separating, self.own_control, self.on_experiment = separating, own_control, on_experiment
        self.devices = len(base.schedule.devices)

    def repeats_for(self, name: str) -> int:
        """A toss-up's separating experiment can agree by chance (objects land in the same order 1 time in 8):
        it gets SEPARATING_REPEATS repeats at least."""
        repeats = self.base.schedule.repeats
        return max(repeats, SEPARATING_REPEATS) if name == self.separating else repeats

    def try_pin(self, name: str) -> Outcome:
        """The pin's experiment (one already run, and not skipped, is reused); one that agreed is checked against
        the control."""
        experiment = self._reused(name)
        if experiment is None:
            count = self.repeats_for(name)
            if not self.ledger.affords(count * self.devices):
                self._store(StoredExperiment(Experiment(name, pin_of(name).description, "skipped", None,
                                                        f"over the budget of {self.ledger.budget} extra repeats")))
                return Outcome.OVER_BUDGET
            self.ledger.pay(count * self.devices)
            experiment = self._store(self._run(name, count, free_prefix(self.bench.run_dir, f"explain-{name}")))
        if experiment.verdict != "deterministic":
            return Outcome.DIVERGES
        if self.control(self.repeats_for(name)).verdict == "deterministic":
            return Outcome.NOT_REPRODUCED
        return Outcome.AGREES

    def settle(self, name: str, narrow: bool) -> Outcome:
        """The pin's experiment; one that also pins other sources confirms its own only if those, pinned without
        it, still diverge (confirm.apply); if they agree, `narrow` bisects them to the source."""
        outcome = self.try_pin(name)
        others = also_pins(name)
        if outcome is not Outcome.AGREES or not others:
            return outcome
        rest = self.try_pin(SEP.join(others))
        if rest is Outcome.AGREES and narrow:
            return self.narrow(others)
        return Outcome.NOT_REPRODUCED if rest is Outcome.NOT_REPRODUCED else Outcome.AGREES

    def narrow(self, pins: Sequence[str]) -> Outcome:
        """Bisect a set of pins that agreed together down to its source; it stops where the budget runs out (the
        skipped experiment says so in the report) or where the control agreed."""
        bisect(pins, lambda name: self.try_pin(name).agreed)
        return Outcome.NOT_REPRODUCED if self.not_reproduced else Outcome.AGREES

    @property
    def not_reproduced(self) -> bool:
        """The control agreed (after its extension): no experiment can confirm anything any more."""
        control = self._reused(CONTROL)
        return control is not None and control.verdict == "deterministic"

    def control(self, count: int) -> Experiment:
        """Once, when a pin first makes the repeats agree: as many repeats with nothing pinned. If those agree
        too, CONTROL_GROWTH times as many more run, and if all agree the divergence no longer reproduces (a
        file an earlier repeat left, a rare race): agreement under a pin proves nothing (confirm.apply then
        confirms no cause). Outside the budget. A stored control that agreed is extended the same way when it
        was not (an explain interrupted in between, or one of an earlier version). The cheap confirmation's
        control, where sound, is the audit's own repeats (repeats_as_control): no repeat is paid for it."""
        stored = self._reused(CONTROL)
        if stored is None and self.own_control is not None:
            return self._store(StoredExperiment(self.own_control))
        if stored is None:
            stored = self._store(self._run(CONTROL, count, free_prefix(self.bench.run_dir, f"explain-{CONTROL}")))
        entry = next(e for e in self.stored if e.experiment.pin == CONTROL)
        earlier = entry.results or ()
        if stored.verdict != "deterministic" or len(earlier) >= count * (1 + CONTROL_GROWTH) * self.devices:
            return stored
        assert entry.prefix is not None  # it ran: only a skipped experiment has none, and a control is never skipped
        return self._store(self._run(CONTROL, count * CONTROL_GROWTH, entry.prefix, earlier))

    def _reused(self, name: str) -> Experiment | None:
        return next((e.experiment for e in self.stored if e.experiment.pin == name
                     and e.experiment.verdict != "skipped"), None)

    def _run(self, name: str, count: int, prefix: str, earlier: tuple[RepeatResult, ...] = ()) -> StoredExperiment:
        """COUNT repeats (per device) of the pin's experiment under PREFIX, numbered after EARLIER's repeats of
        it, judged together with those."""
        pin = pin_of(name)
        options = replace(self.base.recorded(child_config={"pins": list(pin.child)}),
                          target=replace(self.base.target, env={**self.bench.record.env, **pin.env}),
                          schedule=replace(self.base.schedule, repeats=count))
        results, verdict, index, note = self.bench.judge(options, prefix, earlier)
        if earlier:
            more = (f"the first {len(earlier)} repeats agreed, and {len(results) - len(earlier)} more were run "
                    "(agreement can be chance)")
            note = f"{note}; {more}" if note else more
        return StoredExperiment(Experiment(name, pin.description, verdict, index, note), prefix, results)

    def _store(self, entry: StoredExperiment) -> Experiment:
        """Keep the experiment (replacing one of its pin: skipped earlier, or a control extended), write
        explain.json, and tell the caller (a skipped one is only stored)."""
        at = next((i for i, e in enumerate(self.stored) if e.experiment.pin == entry.experiment.pin), None)
        if at is None:
            self.stored.append(entry)
        else:
            self.stored[at] = entry
        write_experiments(self.bench.run_dir, self.stored)
        if self.on_experiment is not None and entry.experiment.verdict != "skipped":
            self.on_experiment(entry.experiment)
        return entry.experiment


def _run_experiments(analysis: Analysis, follow_up: FollowUp, bench: Bench,
                     on_experiment: Callable[[Experiment], None] | None, repeats: int | None) -> Analysis:
    run_dir, record, report, cheap = analysis.run_dir, analysis.record, analysis.report_made(), follow_up.cheap
    _check_explainable(run_dir, report, record, follow_up.script_args)
    # as many repeats per device as the baseline had: fewer would let chance agreement "confirm" a pin
    repeats = CHEAP_REPEATS if cheap else repeats or max(MIN_REPEATS, record.repeats or MIN_REPEATS)
    base = _base_options(record, bench.cwd, repeats, follow_up.jobs, follow_up.script_args)
    leading = leads(report.causes, report.not_ruled_out)  # candidates first when no cause has evidence
    first = cheap_pin(leading) if cheap else None
    experiments = Experiments(bench, base, Ledger(follow_up.budget or DEFAULT_BUDGET), read_experiments(run_dir),
                              leading_pair_pin(leading), repeats_as_control(report) if cheap else None, on_experiment)
    if first is not None:
        # the default confirmation: one experiment (and, for one that also pins other sources, those without it),
        # whatever --budget says
        experiments.ledger = Ledger(sum(experiments.repeats_for(name) * len(base.schedule.devices)
                                        for name in [first, SEP.join(also_pins(first))] if name))
        experiments.settle(first, narrow=False)
    elif not cheap:
        _explain(experiments, leading, follow_up.explain_all, base.schedule.devices)
    analysis = extended(analysis, record, stored_experiments)  # the experiments stored re-rank its causes
    analysis = replace(analysis, report=gated(analysis.report_made(), record))
    write_json(analysis.report_made(), run_dir / REPORT_FILE, mode=0o600)
    return analysis


def _explain(experiments: Experiments, causes: Sequence[Cause], explain_all: bool, devices: Sequence[str]) -> None:
    """The plan's pins in order, up to the first that confirms a cause (every one with `explain_all`); when
    none did, every pin at once, bisected down to the source when that agrees. Stops once the control agreed."""
    confirmed = any(e.experiment.verdict == "deterministic" and e.experiment.pin not in (ALL, CONTROL)
                    for e in experiments.stored)
    for name in plan(causes):
        if confirmed and not explain_all:
            return
        outcome = experiments.settle(name, narrow=True)
        if outcome is Outcome.NOT_REPRODUCED:
            return
        confirmed = confirmed or outcome is Outcome.AGREES
    if confirmed and not explain_all:
        return
    # with --all, every pin at once runs after a confirmation too (the report shows it), but is bisected only
    # when nothing was confirmed
    if experiments.try_pin(ALL) is Outcome.AGREES and not confirmed:
        experiments.narrow(bisection_pins(devices))


def _check_explainable(run_dir: Path, report: Report, record: RunRecord, script_args: Sequence[str] | None) -> None:
    """A UsageError unless the run can be explained: divergent, every repeat finished, on one node, not a
    --perturb run, its arguments at hand."""
    if report.verdict != "divergent" or report.first_divergence is None:
        raise UsageError(f"{run_dir}: the run is {report.verdict}; --explain needs a divergent run")
    if report.timed_out:
        raise UsageError(f"{run_dir}: a repeat timed out; --explain needs a run whose repeats all finished")
    if multi_node(list(record.torchrun_args)):
        raise UsageError(f"{run_dir}: " + NODES_FOLLOW_UP.format("--explain"))
    if record.perturb:
        raise UsageError(f"{run_dir}: a `run --perturb` run, whose repeats differ on purpose: its report already "
                         "says which setting changed the bits; audit without --perturb to explain a divergence")
    if record.args_redacted and script_args is None and record.script_args:
        raise UsageError(f"{run_dir}: the run was recorded with --redact-args, so its script arguments were not "
                         "stored and cannot be re-run; use `detaudit run ... --redact-args --explain`")


def _base_options(record: RunRecord, cwd: Path, repeats: int, jobs: int,
                  script_args: Sequence[str] | None) -> AuditOptions:
    """The audit's own options for the experiments' repeats, nothing pinned yet."""
    script = Path(record.script)
    args = list(record.script_args if script_args is None else script_args)
    return AuditOptions(
        Target(script if script.is_absolute() else cwd / script, args, module=record.module,
               redact_args=record.args_redacted),
        Schedule(repeats=repeats, devices=list(record.devices or ["cpu"]), own_device=record.own_device,
                 timeout=record.timeout, jobs=jobs, nproc_per_node=record.nproc_per_node,
                 torchrun_args=list(record.torchrun_args)),
        # the baseline's own kind of trace, so record indices compare (auto's base run is module)
        Recording(granularity="module" if record.granularity in (None, "auto") else str(record.granularity),
                  max_steps=record.max_steps, max_time=record.max_time, run_to_end=record.run_to_end,
                  # files the earlier repeats changed are told apart by time (recorder/evidence/file_access.py)
                  child_config={"audit_started": record.started} if record.started else {}),
        Checks(tolerance=record.tolerance, stdout=recorded_mode(record)),
    )


def bisect(pins: Sequence[str], agrees: Callable[[str], bool | None]) -> list[str]:
    """Every pin at once makes the repeats agree and no single candidate did: narrow the set down.

    Halve while one half alone still makes the repeats agree; when neither half does (sources in
    both), drop one pin at a time while the rest still agree. Returns the smallest set found (one
    source, or a named pair or more); its experiment is recorded under the set's name. `agrees`
    answers None where no further experiment can run (the budget, a control that agreed): it stops there.
    """
    candidates = list(pins)
    while len(candidates) > 1:
        half = len(candidates) // 2
        part = None
        for p in (candidates[:half], candidates[half:]):
            agreed = agrees(SEP.join(p))
            if agreed is None:
                return candidates
            if agreed:
                part = p
                break
        if part is None:
            break
        candidates = part
    for name in list(candidates):
        if len(candidates) > 1:
            rest = [c for c in candidates if c != name]
            agreed = agrees(SEP.join(rest))
            if agreed is None:
                return candidates
            if agreed:
                candidates = rest
    return candidates
