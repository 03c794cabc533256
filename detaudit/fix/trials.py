"""`detaudit fix SCRIPT`: audit, then search the knobs for the smallest set whose repeats agree.

Each experiment is an audit's repeats (audit.execute, compared by explain's `experiment_verdict`) of the
script as the user would change it: a temporary copy beside it with the knobs' prelude and line edits, run
with the knobs' environment (fix/code.py). So the set the search ends with is verified as written: its own
experiment ran exactly the code the report prints. The repeats go into the audit's run directory as
`fix-<n>-*`, the report into `fix.json` there; `--budget` bounds the experiments' repeats.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from detaudit.audit.analysis import Analysis
from detaudit.audit.follow_up import FollowUp, audit
from detaudit.audit.pipeline import AuditOptions, execute
from detaudit.cause_table import CAUSES
from detaudit.causes import leads, rng, split
from detaudit.causes.confirm import apply
from detaudit.causes.context import build
from detaudit.errors import UsageError
from detaudit.explain.runner import CHEAP_REPEATS, Bench, Ledger, cheap_pin_of, experiment_on, plan
from detaudit.fix import code, search
from detaudit.fix.cost import PAIRS, KnobCost, Sample, cost
from detaudit.fix.fix_report import FixReport, FixVerdict, KnobFix, Trial, report_json
from detaudit.pin import Pin, also_pins
from detaudit.report.model import Report
from detaudit.results import Cause, Experiment, RepeatProgress, RepeatResult
from detaudit.run.distributed import Layout
from detaudit.run.files import write_text_atomically
from detaudit.trace import read_footer

DEFAULT_BUDGET = 24
FIX_FILE = "fix.json"
LIBS = {Pin.TORCH_RNG: "torch", Pin.NUMPY_RNG: "numpy", Pin.PYTHON_RNG: "python"}
# causes whose source no knob's code reaches (cause_table.CauseSpec.fix_knob None): a seed the script sets itself from
# outside the program (the clock, the pid, `Generator.seed()`) is set again by the script's own call after the
# prelude's constant seed (docs/fix.md); a set of objects keeps its address order whatever a knob sets
BEYOND_KNOBS = tuple(s.id.value for s in CAUSES.values() if s.fix_knob is None)


def run_fix(options: AuditOptions, budget: int = DEFAULT_BUDGET,
            on_done: Callable[[RepeatResult], None] | None = None,
            on_progress: Callable[[RepeatProgress], None] | None = None,
            on_trial: Callable[[Trial], None] | None = None,
            on_audit: Callable[[Report], None] | None = None) -> FixReport:
    """Audit the script and, if its repeats diverge, find, verify and cost the minimal fix.

    Every repeat runs to its end (`run_to_end`): the whole-run times of the sets are compared. Under
    `--perturb` the audit and every experiment run with its groups of settings, and a set agrees only when all
    its repeats agree across the groups; the variables the perturbation sets stay its own in each experiment.
    """
    options = options.recorded(run_to_end=True)
    schedule = options.schedule
    knobs = code.catalogue(schedule.devices, bool(schedule.nproc_per_node))
    perturbation = schedule.perturbation
    held = perturbation.variables if perturbation is not None else frozenset()
    perturbed = tuple(s.knob.value for s in perturbation.specs) if perturbation is not None else ()
    _refuse_held_away(knobs, held, perturbed)
    audited = audit(options, on_done, None, on_progress)  # extended, never read back from its run directory
    report = audited.report_made()
    if on_audit is not None:
        on_audit(report)
    run_dir = Path(report.run_dir)
    base = FixReport(script=report.script, run_dir=str(run_dir), verdict="deterministic",
                     audit_exit_code=int(report.exit_code), budget=budget, causes=tuple(report.causes),
                     perturb=perturbed)
    if report.verdict != "divergent" or report.timed_out:
        ended: FixVerdict = report.verdict if report.verdict in ("deterministic", "failed", "inconclusive") \
            else "timeout"
        return _written(replace(base, verdict=ended))
    record, audit_results = audited.record, audited.results
    cwd = Path(record.cwd or ".").resolve()
    script = options.target.script if options.target.script.is_absolute() else cwd / options.target.script
    try:
        source = code.read_source(script)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{script}: cannot read the script to write its fix ({exc})") from None
    code.insertion_line(source)  # a script that does not parse is refused before any experiment
    edits, drawn = seed_edits(report, run_dir, audit_results, script, cwd)
    experiments = KnobTrials(
        Bench(run_dir, record, report, cwd, on_done, on_progress),
        options.recorded(child_config={"audit_started": record.started} if record.started else {}),
        Ledger(budget), Patch(script, Path(record.script).name, source, knobs, edits,
                              {e.pin for e in edits if e.applies} - drawn),
        held, on_trial)
    suspected = [p.value for p in plan(leads(report.causes, report.not_ruled_out)) if p in knobs]
    found = search.search([p.value for p in knobs], suspected, experiments.agrees)
    if found.uncontrolled and experiments.trials[-1].verdict == "divergent" and not perturbed:
        report = _confirmed_beyond_knobs(audited, experiments, on_done, on_progress)
    base = replace(base, trials=tuple(experiments.trials), repeats_used=experiments.ledger.spent,
                   first_divergence=_where(report), insert_after=code.insertion_line(source),
                   causes=_judged(report, experiments.trials))
    if found.uncontrolled or found.minimal is None:
        return _written(_not_found(base, found, experiments.trials, report, knobs))
    by_set: dict[frozenset[str], Trial] = {frozenset(p.value for p in t.knobs): t for t in experiments.trials}
    by_set[frozenset()] = Trial((), "divergent", len(audit_results), "the audit's repeats")
    return _written(_found(base, found, experiments, by_set, perturbed))


@dataclass(frozen=True)
class Patch:
    """What a set of knobs makes of the script: its prelude, its line edits (seeding the RNG objects it makes)."""

    script: Path
    name: str  # as the run recorded it: the patch's file name
    source: str
    knobs: Sequence[Pin]
    edits: Sequence[code.Edit]
    edits_only: set[Pin]  # knobs whose RNG objects need their edits but whose global RNG was never drawn from

    def pins(self, chosen: frozenset[str]) -> list[Pin]:
        return [p for p in self.knobs if p in chosen]

    def text(self, chosen: frozenset[str]) -> str:
        return code.rewrite(self.source, code.prelude(self.pins(chosen), self.edits_only),
                            [e for e in self.edits if e.pin in chosen])


class KnobTrials:
    """The search's oracle, and its state: the trials run, the ledger of repeats paid, the cost pairs run."""

    def __init__(self, bench: Bench, options: AuditOptions, ledger: Ledger, patch: Patch, held: frozenset[str],
                 on_trial: Callable[[Trial], None] | None) -> None:
        self.bench, self.options, self.ledger, self.patch, self.held = bench, options, ledger, patch, held
        self.on_trial = on_trial
        self.trials: list[Trial] = []
        self.cost_runs = 0  # the sets timed in pairs so far (their files: `fix-cost-<n>-*`)

    def agrees(self, chosen: frozenset[str]) -> bool | None:
        """Whether the script with CHOSEN's code agrees over its repeats; None: the budget cannot pay for them."""
        per_trial = self.options.schedule.repeats * len(self.options.schedule.devices)
        if not self.ledger.affords(per_trial):
            return None
        pins = self.patch.pins(chosen)
        prefix = f"fix-{len(self.trials) + 1}"
        with self._as_written(chosen) as options:
            results, verdict, _, note = self.bench.judge(options, prefix, explained=False)
        self.ledger.pay(len(results))  # the repeats that ran (a torchrun repeat counts once)
        trial = Trial(tuple(pins), verdict, len(results), note, prefix)
        self.trials.append(trial)
        if self.on_trial is not None:
            self.on_trial(trial)
        return verdict == "deterministic"

    @contextlib.contextmanager
    def _as_written(self, chosen: frozenset[str]) -> Iterator[AuditOptions]:
        """The options that run the script with CHOSEN's code: what the patch makes of it (the patch itself
        verified, not a copy of the text), as a copy beside it, with the knobs' environment."""
        patched = code.patched(self.patch.name, self.patch.source, self.patch.text(chosen))
        with code.temporary_copy(self.patch.script, patched) as copy:
            target = replace(self.options.target, script=copy, argv0=None, env={**self.options.target.env, **{
                k: v for k, v in code.environment(self.patch.pins(chosen)).items() if k not in self.held}})
            yield replace(self.options, target=target)

    def timed_pairs(self, chosen: frozenset[str], less: frozenset[str]) -> tuple[list[Sample], list[Sample]] | None:
        """PAIRS pairs of single repeats of CHOSEN's code and LESS's, interleaved (less first, then chosen first,
        ...), so each pair sees one moment of the machine (fix/cost.py); None: the budget cannot pay for them."""
        per_run = len(self.options.schedule.devices)
        if not self.ledger.affords(2 * PAIRS * per_run):
            return None
        self.cost_runs += 1
        sides: dict[frozenset[str], list[Sample]] = {chosen: [], less: []}
        one = replace(self.options.schedule, repeats=1)
        for i in range(PAIRS):
            for knobs, side in ((less, "without"), (chosen, "with"))[::1 if i % 2 == 0 else -1]:
                with self._as_written(knobs) as options:
                    results = execute(replace(options, schedule=one), self.bench.run_dir, self.bench.on_done,
                                      prefix=f"fix-cost-{self.cost_runs}-{side}", cwd=self.bench.cwd,
                                      on_progress=self.bench.on_progress, first=len(sides[knobs]))
                self.ledger.pay(len(results))
                sides[knobs].extend(timing(self.bench.run_dir, results))
        return sides[chosen], sides[less]


def _not_found(base: FixReport, found: search.Search, trials: Sequence[Trial], report: Report,
               knobs: Sequence[Pin]) -> FixReport:
    """No set of knobs made the repeats agree: none controls the source, a crash hid it, or the budget ran out."""
    everything = trials[-1] if trials else None
    if found.uncontrolled and everything is not None and everything.verdict == "divergent":
        return replace(base, verdict="uncontrolled", notes=(uncontrolled_note(report, knobs),))
    if found.uncontrolled and everything is not None:  # a crash proves nothing about the source
        return replace(base, verdict="incomplete", notes=(
            f"with every knob at once the repeats did not run through ({everything.note}): whether a set "
            "of knobs controls the divergence is unknown (a knob's code may not suit this script: "
            "`torch.use_deterministic_algorithms(True)` raises on an op without a deterministic kernel)",))
    return replace(base, verdict="incomplete", notes=(
        f"the budget of {base.budget} repeats ran out before any set of knobs made the repeats agree",))


def _found(base: FixReport, found: search.Search, experiments: KnobTrials, by_set: dict[frozenset[str], Trial],
           perturbed: Sequence[str]) -> FixReport:
    """The minimal set's report: each knob with the trial that shows it needed and its cost, the patch, and how
    it was verified."""
    minimal = found.minimal
    assert minimal is not None  # _not_found reports a search that found none
    patch, held = experiments.patch, experiments.held
    pins = patch.pins(minimal)
    # each knob timed in pairs against the set less it; the whole fix against the script as it is (for one knob,
    # the same pairs)
    pairs = {p: experiments.timed_pairs(minimal, frozenset(minimal - {p})) for p in pins}
    whole = pairs[pins[0]] if len(pins) == 1 else experiments.timed_pairs(minimal, frozenset())
    fixes = tuple(KnobFix(p, tuple(code.prelude([p], patch.edits_only)[1:]), tuple(e for e in patch.edits
                                                                                      if e.pin == p),
                          by_set.get(frozenset(minimal - {p})), _priced(pairs[p])) for p in pins)
    chosen_edits = tuple(e for e in patch.edits if e.pin in minimal)
    lines = code.prelude(pins, patch.edits_only)
    final = by_set[minimal]
    changes = " and ".join(what for what, present in (("this prelude", lines), ("these line edits", [
        e for e in chosen_edits if e.applies])) if present)
    verification = (f"{final.repeats} repeats ran .{patch.script.stem}.detaudit-fix-XXXX.py, the script with "
                    f"{changes or 'no change'}, beside it"
                    + (" with this environment" if set(code.environment(pins)) - held else "")
                    + f" (`{final.files}-*` in the run directory): they agree"
                    + _under(perturbed, sorted(held & set(code.environment(pins)))))
    notes: tuple[str, ...] = () if found.complete else (
        f"the budget of {base.budget} repeats ran out before every knob was shown needed: the set agrees, but may "
        "not be the smallest (a larger --budget)",)
    return replace(
        base, verdict="fixed" if found.complete else "incomplete", knobs=fixes, prelude=tuple(lines),
        edits=chosen_edits, verified=final.verdict == "deterministic", verification=verification,
        patch=code.unified_diff(patch.name, patch.source, patch.text(minimal)),
        whole_run=None if whole is None else cost(*whole).run, repeats_used=experiments.ledger.spent, notes=notes)


def _priced(pairs: tuple[list[Sample], list[Sample]] | None) -> KnobCost | None:
    return None if pairs is None else cost(*pairs)


def _refuse_held_away(knobs: Sequence[Pin], held: frozenset[str], perturbed: Sequence[str]) -> None:
    """A UsageError when --perturb sets the very variables a knob consists of: that knob could never be
    tried, and a script that needs it would read as one no knob controls."""
    away = code.held_away(knobs, held)
    if not away:
        return
    named = ", ".join(f"{p.value} ({' '.join(f'{k}={v}' for k, v in code.KNOBS[p].env.items())})" for p in away)
    raise UsageError(
        f"--perturb {','.join(perturbed)}: `detaudit fix` cannot search under it, as the knob {named} is an "
        "environment variable the perturbation itself sets in every repeat, so no experiment could run with "
        f"the knob. See whether the script is sensitive with `detaudit run --perturb {','.join(perturbed)}`; "
        "the fix for that sensitivity is the variable set to one value on every machine (docs/fix.md)")


def _under(perturbed: Sequence[str], held: Sequence[str]) -> str:
    """The verification's words for --perturb: the groups it agreed across, and the knob variables it held."""
    if not perturbed:
        return ""
    text = f", across every group of --perturb {','.join(perturbed)}"
    if held:
        text += (f"; {', '.join(held)} stayed as the perturbation set them in each group, not the knob's value, so "
                 "the prelude is what made the groups agree")
    return text


def _written(report: FixReport) -> FixReport:
    """The report, also kept in the run directory as fix.json."""
    write_text_atomically(Path(report.run_dir) / FIX_FILE, json.dumps(report_json(report), indent=2) + "\n", 0o600)
    return report


def _where(report: Report) -> str:
    first = report.first_divergence
    if first is None:
        return ""
    rec = first.record
    return f"#{first.index} {rec.kind} {rec.name} step {rec.step}" if rec is not None else first.detail


def timing(run_dir: Path, results: Sequence[RepeatResult]) -> list[Sample]:
    """Each repeat's CPU time per step (its trace's footer; a torchrun repeat's first rank) and wall time."""
    samples = []
    for r in results:
        path = run_dir / r.trace
        if not path.is_file():
            path = run_dir / Layout.rank_file(r.trace, 0)
        footer = read_footer(path) if path.is_file() else None
        samples.append(Sample.of([float(t) for t in (footer or {}).get("step_cpu_times", [])], r.duration_s))
    return samples


def seed_edits(report: Report, run_dir: Path, results: Sequence[RepeatResult], script: Path,
               cwd: Path) -> tuple[list[code.Edit], set[Pin]]:
    """The RNG objects the script created without a seed before the divergence (causes/rng.py's evidence),
    each as the edit that seeds it: part of its library's knob, as no prelude reaches an object's seed. And the
    knobs whose global RNG was drawn from unseeded: they need the prelude's seed too."""
    divergence = report.first_divergence
    if divergence is None:
        return [], set()
    ctx = build(divergence, [run_dir / r.trace for r in results], results, report.op_finding)
    edits = []
    drawn = set()
    for pin, lib in LIBS.items():
        if rng.unseeded_draws(ctx, ctx.ref, lib):
            drawn.add(pin)
        for own in rng.own_rngs(ctx, lib):
            event = own.event
            if own.varying_value or event.get("entropy"):
                continue  # a seed the script sets from outside, or one no seed reaches: no knob's to fix
            loc = str(event.get("loc", ""))
            edits.append(code.seed_edit(pin, event["fn"], loc, rng.constant_seed(event["fn"], loc), script, cwd))
    return edits, drawn


def uncontrolled_note(report: Report, knobs: Sequence[Pin]) -> str:
    """Why no knob helped: what the causes' evidence points at."""
    tried = ", ".join(p.value for p in knobs)
    return (f"with every knob at once ({tried}) the repeats still diverge: no setting controls the source (the "
            "clock, the process id, the environment, the network, or a seed or order the script's own code makes), "
            "so the fix is a change to the script's code; the causes below say where")


def _confirmed_beyond_knobs(audited: Analysis, experiments: KnobTrials,
                            on_done: Callable[[RepeatResult], None] | None,
                            on_progress: Callable[[RepeatProgress], None] | None) -> Report:
    """No knob controls the source: `run`'s one cheap confirmation (explain's pin, which reaches what a knob's code
    cannot: the script's own seeding calls, the address layout) tests the top cause, paid from the budget. The
    audit's report with it applied, or as it was when there is no such experiment or the budget cannot pay."""
    report = audited.report_made()
    pin = cheap_pin_of(report)
    devices = len(experiments.options.schedule.devices)
    if pin is None or not experiments.ledger.affords(CHEAP_REPEATS * devices * (2 if also_pins(pin) else 1)):
        return report
    ran: list[RepeatResult] = []

    def done(result: RepeatResult) -> None:
        ran.append(result)
        if on_done is not None:
            on_done(result)

    explained = experiment_on(audited, FollowUp(cheap=True, script_args=tuple(experiments.options.target.script_args)),
                              done, on_progress)
    experiments.ledger.pay(len(ran))
    return explained.report_made()


def _judged(report: Report, trials: Sequence[Trial]) -> tuple[Cause, ...]:
    """The audit's causes as the search's experiments judge them, by the one rule `explain` uses
    (docs/causes.md#ranking): a cause whose own knob alone left the repeats diverging is ruled out, one whose knob
    alone made them agree is confirmed. A cause whose source no knob's code reaches (BEYOND_KNOBS) is not judged
    by the knobs' trials: a knob that failed to fix it says nothing about whether it is the cause."""
    first = report.first_divergence
    tried = [Experiment(t.name, t.name, t.verdict, None, t.note) for t in trials if t.verdict != "skipped"]
    leading = leads(report.causes, report.not_ruled_out)
    own_pins = {c.id: c.pins for c in leading}
    unreached = [replace(c, pins=[]) if c.id in BEYOND_KNOBS else c for c in leading]
    judged = apply(unreached, tried, first.index if first is not None else -1)
    return tuple(replace(c, pins=own_pins.get(c.id, c.pins)) if c.id in BEYOND_KNOBS else c
                 for c in split(judged)[0])
