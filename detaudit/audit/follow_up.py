"""An audit and what follows it, decided here once for every front end (`run`, `demo`, the pytest plugin,
`fix`): the repeats (pipeline.recorded_audit), then for a divergence the top cause's one cheap confirmation, the
op-level re-run over the first divergent step (`--granularity auto`), the self-check for an agreement, and
`--explain`'s experiments last. Each extends the audit's one `Analysis` in memory, so the audit's traces are
compared once.

The experiments are explain's, a stage above this one (an experiment is an audit with a pin): they come in
as an `Experimenter`, so the policy lives in the core and the pinned re-runs stay where they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from detaudit.audit import analysis as analysis_steps
from detaudit.audit.analysis import Analysis
from detaudit.audit.pipeline import (
    AuditOptions,
    execute,
    extended,
    gated,
    narrow,
    op_window,
    recorded_ahead,
    recorded_audit,
)
from detaudit.compare import match
from detaudit.records import OPS_PREFIX, Narrowing, RunRecord
from detaudit.report.model import Report, write_json
from detaudit.results import RepeatProgress, RepeatResult, SelfCheck
from detaudit.run.distributed import multi_node
from detaudit.run.launcher import Interrupted
from detaudit.run.rundir import REPORT_FILE, write_record


@dataclass(frozen=True)
class FollowUp:
    """What a divergent audit is followed by. The default is none: a library call runs the repeats only."""

    cheap: bool = False  # the top cause's one cheap, decisive experiment (explain.runner.cheap_pin)
    explain: bool = False  # --explain: the experiments up to the first confirmation
    explain_all: bool = False  # --explain-all: every candidate's (with `explain`)
    budget: int | None = None  # --budget: the experiments' extra repeats at most (None: explain's default)
    jobs: int = 1  # the experiments' repeats in parallel
    script_args: tuple[str, ...] | None = None  # a --redact-args run's real arguments (its run.json has none)

    def confirms(self, record: RunRecord) -> bool:
        """The cheap confirmation runs unless --explain runs the experiments in its place, the repeats differ on
        purpose (--perturb: its own groups prove the causes), or the run is one node of several (an experiment
        would be a launch of every node)."""
        return self.cheap and not self.explain and not record.perturb and not multi_node(list(record.torchrun_args))

    def explains(self, record: RunRecord) -> bool:
        """--explain's experiments run, except on a --perturb run (a pinned re-run would mix its settings)."""
        return self.explain and not record.perturb


NONE = FollowUp()


def diverged(analysis: Analysis) -> bool:
    """A divergence worth an experiment: the repeats diverged, and every one ran to its end."""
    report: Report = analysis.report_made()
    return report.verdict == "divergent" and not report.timed_out


class Experimenter(Protocol):
    """The experiments that follow an audit (explain.confirmation.PinnedExperiments): each takes the audit's
    Analysis and returns it extended with what the experiments stored, its traces not compared again."""

    def confirm(self, analysis: Analysis, follow_up: FollowUp) -> Analysis:
        """The top cause's cheap confirmation, when it has one and none ran yet; else `analysis` as it was."""
        ...

    def explain(self, analysis: Analysis, follow_up: FollowUp) -> Analysis:
        """--explain's experiments, within `follow_up.budget`."""
        ...


def run_audit(options: AuditOptions, on_done: Callable[[RepeatResult], None] | None = None,
              on_narrow: Callable[[list[int]], None] | None = None,
              on_progress: Callable[[RepeatProgress], None] | None = None,
              follow_up: FollowUp = NONE, experimenter: Experimenter | None = None) -> Report:
    """`audit`'s Report."""
    return audit(options, on_done, on_narrow, on_progress, follow_up, experimenter).report_made()


def audit(options: AuditOptions, on_done: Callable[[RepeatResult], None] | None = None,
          on_narrow: Callable[[list[int]], None] | None = None,
          on_progress: Callable[[RepeatProgress], None] | None = None,
          follow_up: FollowUp = NONE, experimenter: Experimenter | None = None) -> Analysis:
    """Run, compare and diagnose, then follow a divergence up as `follow_up` says (audit/follow_up.py), with
    `experimenter`'s experiments: the cheap confirmation first, then under granularity `auto` one re-run
    recording ops only around the first divergent step (`on_narrow` is told the window first), the cheap
    confirmation again where only the op-level causes have one, and --explain last. Each extends the one
    Analysis: the repeats' traces are compared once. `on_progress`: where each running repeat stands (execute)."""
    options, analysis = recorded_audit(options, on_done, on_progress)
    record, results, run_dir = analysis.record, analysis.results, analysis.run_dir

    def confirmed(analysis: Analysis) -> Analysis:
        if experimenter is None or not follow_up.confirms(analysis.record) or not diverged(analysis):
            return analysis
        return experimenter.confirm(analysis, follow_up)

    analysis = confirmed(analysis)
    window = op_window(analysis.report_made()) if options.recording.granularity == "auto" else None
    if window is not None:  # the op behind it is part of "where", confirmed or not
        if on_narrow is not None:
            on_narrow(window)
        narrowed = options.recorded(granularity="op", child_config={"op_window": window})
        try:
            ops_results = narrow(narrowed, run_dir, on_done, on_progress, recorded_ahead(run_dir, results, window))
        except Interrupted:  # the module-level run is whole and recorded: report it without the op re-run
            write_record(run_dir, record)
            raise
        record = replace(analysis.record, narrowing=Narrowing(tuple(ops_results), window, OPS_PREFIX))
        write_record(run_dir, record)
        analysis = extended(analysis, record, analysis_steps.op_finding)  # with what the confirmation stored
        analysis = confirmed(analysis)  # the op-level causes may have the cheap experiment the others had not
    if options.checks.self_check and analysis.report_made().agreement == "deterministic":
        record = replace(record, self_check=self_check(options, run_dir, results[0]))
        write_record(run_dir, record)
        analysis = extended(analysis, record, analysis_steps.describe_match)
    if experimenter is not None and follow_up.explains(record) and diverged(analysis):
        analysis = experimenter.explain(analysis, follow_up)
    analysis = replace(analysis, report=gated(analysis.report_made(), analysis.record))
    write_json(analysis.report_made(), run_dir / REPORT_FILE, mode=0o600)
    return analysis


def self_check(options: AuditOptions, run_dir: Path, reference: RepeatResult) -> SelfCheck:
    """The negative control: one more repeat with a one-ULP change at a chosen record (detaudit/compare/match.py).
    One that cannot be made says why (`not_run`): the report then calls agreement inconclusive."""
    chosen = match.choose_record(run_dir / reference.trace)
    if chosen is None:
        return SelfCheck(None, None, None, None, not_run=(
            "no recorded tensor could carry the one-ULP change (every record is content-less, empty, made on "
            "another thread, or of a dtype without a lowest bit to flip)"))
    granularity = options.recording.granularity
    perturbed = replace(options.recorded(granularity="module" if granularity == "auto" else granularity,
                                         child_config={"perturb_record": chosen[0]}),
                        schedule=replace(options.schedule, repeats=1, devices=[reference.device]))
    [result] = execute(perturbed, run_dir, prefix=match.SELF_CHECK_PREFIX)
    if result.exit_code != reference.exit_code or not (run_dir / result.trace).is_file():
        ended = "left no trace" if result.exit_code == reference.exit_code else \
            f"exited with status {result.exit_code}, the reference with {reference.exit_code}"
        return SelfCheck(*chosen, None, not_run=f"the control repeat {ended}")
    return match.detect(run_dir / reference.trace, run_dir / result.trace, chosen, options.checks.tolerance, True)
