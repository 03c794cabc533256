"""The back half of an audit as named steps over one frozen `Analysis`: traces in, a Report out.

Each step is a function `(Analysis) -> Analysis` that fills in what it finds and reads only what the
steps before it filled in (pyinstrument's processors). `STEPS` is the order; a new feature adds a
step (and a field), never a branch in one big function. A later stage of the same audit extends
the Analysis it holds (`extend`: the op-level re-run, the self-check) by re-running the steps from
the first one its news affects, so each repeat's trace is compared once per audit.
A torchrun run is analysed rank by rank (ranks.py), each rank through these steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from detaudit import causes
from detaudit.causes import confirm as experiments
from detaudit.causes.context import RepeatEvidence
from detaudit.causes.context import load as load_evidence
from detaudit.causes.latent import latent_findings, recorded_versions
from detaudit.causes.repetition import RepeatedRandomness, repeated_randomness, silenced_sites
from detaudit.compare import baseline_diff
from detaudit.compare import match as verdict_basis
from detaudit.compare.baseline_diff import BaselineCheck
from detaudit.compare.match import Match
from detaudit.compare.oprules import OpFinding, find_op_source, op_level_note
from detaudit.compare.outcome import outcome_divergence
from detaudit.compare.perturb import PerturbationFinding, compare_perturbed
from detaudit.compare.saved_values import only_non_tensor_values_differ
from detaudit.compare.stdout import DEFAULT_STDOUT, recorded_mode
from detaudit.compare.tokens import TokenComparison, compare_tokens, read_tokens
from detaudit.compare.traces import Comparison, compare_traces
from detaudit.errors import TraceError
from detaudit.records import RunRecord, is_plain_name
from detaudit.report import baseline
from detaudit.report.model import CarriedOutput, Report, all_failed
from detaudit.results import Cause, Divergence, Ending, Experiment, RepeatResult, StdoutMode
from detaudit.run.failure import disk_full, excerpt, read_error, stderr_tail
from detaudit.run.rundir import read_experiments
from detaudit.trace import RecordStream


@dataclass(frozen=True)
class Analysis:
    """One run's analysis as it grows: the inputs first, then what each step found (None: not yet, or none)."""

    run_dir: Path
    record: RunRecord
    results: tuple[RepeatResult, ...]
    bitwise: bool = True  # what the report claims: bitwise equality, or agreement within the recorded tolerance
    labels: tuple[str, ...] | None = None  # the comparison groups (default: each repeat's device)
    explained: bool = True  # attach the `--explain` experiments stored in run_dir
    traces: tuple[Path, ...] = ()
    devices: tuple[str, ...] = ()
    repeat_errors: dict[int, str] = field(default_factory=dict)  # the excerpt of each repeat that failed
    disk_full: frozenset[int] = frozenset()  # repeats whose disk filled up: their end says nothing
    truncated: tuple[bool, ...] = ()  # repeats that recorded less than a whole run: compared up to where they stop
    comparison: Comparison | None = None
    stdout_mode: StdoutMode = DEFAULT_STDOUT
    ended: Divergence | None = None  # exit statuses or stdout that differ
    carried: CarriedOutput | None = None  # a difference explained by what earlier repeats left
    op_finding: OpFinding | None = None
    op_level: str = ""  # `auto`: why its op-level re-run named no op (skipped, or found none), when so
    perturbed: PerturbationFinding | None = None
    baseline_check: BaselineCheck | None = None
    inferred: tuple[Cause, ...] = ()  # causes as ranked from the evidence alone
    stored: tuple[Experiment, ...] = ()  # --explain's experiments kept in the run directory
    ranked: tuple[Cause, ...] = ()  # the causes after the experiments, each with evidence of its mechanism
    not_ruled_out: tuple[Cause, ...] = ()  # candidates no evidence supports: never in the summary line
    match: Match | None = None
    first_evidence: RepeatEvidence | None = None  # the first repeat's evidence (latent findings, versions)
    repeated: tuple[RepeatedRandomness, ...] = ()  # randomness that repeats where it should differ (issue 38)
    tokens: TokenComparison | None = None  # the generated tokens compared, when the script decodes
    report: Report | None = None

    @property
    def first(self) -> Divergence | None:
        """The first record-level divergence, when the comparison has run."""
        return self.comparison.first_divergence if self.comparison is not None else None

    @property
    def divergence(self) -> Divergence | None:
        """What the causes explain: the first record that differs, else how the repeats ended."""
        return self.first or self.ended

    def report_made(self) -> Report:
        """The Report, once `build_report` has run."""
        assert self.report is not None, "the analysis has not reached `build_report`"
        return self.report

    def compared(self) -> Comparison:
        """The comparison, for the steps after `compare` (it is never None there)."""
        assert self.comparison is not None, "a step that reads the comparison ran before `compare`"
        return self.comparison


Step = Callable[[Analysis], Analysis]


def locate_traces(a: Analysis) -> Analysis:
    """Each repeat's trace and comparison label; no trace at all is an error, not a verdict."""
    traces = tuple(a.run_dir / r.trace for r in a.results)
    stopped = any(r.ending in (Ending.TIMED_OUT, Ending.INTERRUPTED) for r in a.results)
    if not any(os.path.lexists(t) for t in traces) and not stopped:
        failure = stderr_excerpt(a.run_dir, a.results[0])
        raise TraceError(f"no trace was written (did the script start?); {failure}" if failure
                         else "no trace was written")
    devices = a.labels if a.labels is not None else tuple(r.device for r in a.results)
    return replace(a, traces=traces, devices=devices)


def note_failures(a: Analysis) -> Analysis:
    """The excerpt of each failed repeat, which of them ran out of disk, and which recorded less than a whole run."""
    errors = {r.index: stderr_excerpt(a.run_dir, r) for r in a.results if r.ended_with_error}
    # a repeat whose disk filled up ended for want of space: its end and what it failed to record say nothing
    full = frozenset(i for i, shown in errors.items() if disk_full(shown))
    # a repeat that timed out, was interrupted or hit --max-steps/--max-time was stopped, one recorded
    # elsewhere without a footer has an unknown end, and one whose recording stopped (a hook failed)
    # recorded less: only what every repeat recorded is compared
    truncated = tuple(not r.recorded_whole or r.index in full for r in a.results)
    return replace(a, repeat_errors=errors, disk_full=full, truncated=truncated)


def compare(a: Analysis) -> Analysis:
    """The traces side by side: the first record that differs; a repeat that recorded nothing is an error."""
    comparison = compare_traces(list(a.traces), list(a.devices), a.record.tolerance, truncated=list(a.truncated))
    if comparison.recording_failed:  # no records is no evidence: never let it read as "deterministic"
        index, why = next(iter(comparison.recording_failed.items()))
        raise TraceError(f"repeat {index}: detaudit could not record this repeat ({why}); its trace has "
                         f"no evidence to compare. Rerun with DETAUDIT_DEBUG=1 and report it.")
    return replace(a, comparison=comparison, stdout_mode=recorded_mode(a.record))


def outcome(a: Analysis) -> Analysis:
    """Exit statuses and stdout that differ between repeats (a full disk's end is not compared)."""
    ended = outcome_divergence([r for r in a.results if r.index not in a.disk_full], a.stdout_mode, a.run_dir)
    return replace(a, ended=ended)


def carried_state(a: Analysis) -> Analysis:
    """A saved path or a stdout line numbered after what earlier repeats left is reported, not a divergence."""
    comparison, ended = a.compared(), a.ended
    carried = _carried_saved_value(a)
    if carried is not None:  # a checkpoint's path numbered after what earlier repeats left: no divergence
        comparison = replace(comparison, first_divergence=None)
    if comparison.first_divergence is None and ended is not None and ended.stdout is not None:
        shape_only = comparison.records_shape_only
        ended = replace(ended, detail=f"{ended.detail}; all {comparison.records_compared} recorded tensor records agree"
                        + (f" ({shape_only} of them by dtype and shape only)" if shape_only else "")
                        + (f"; {carried.divergence.detail}" if carried else ""))
        # explained by what earlier repeats left (a log directory's next version_N): reported, no divergence
        evidence = causes.carried_output(ended, list(a.traces), list(a.results))
        if evidence is not None:
            carried, ended = CarriedOutput(ended, evidence), None
    return replace(a, comparison=comparison, ended=ended, carried=carried)


def structure_note(a: Analysis) -> Analysis:
    """A difference in what was recorded says how the repeats ended and whose recording was cut short."""
    first, comparison = a.first, a.compared()
    if first is None or first.category != "structure":
        return a
    if a.ended is not None:
        first = replace(first, category="outcome", detail=f"{a.ended.detail}; {first.detail}")
    cut = [i for i in first.repeats if i < len(a.results) and not comparison.complete[i]
           and not a.results[i].timed_out]
    if cut:
        first = replace(first, detail=f"{first.detail}; the recording of repeat(s) "
                                      f"{', '.join(map(str, cut))} is incomplete (no footer: killed, or "
                                      "crashed hard)")
    return replace(a, comparison=replace(comparison, first_divergence=first))


def op_finding(a: Analysis) -> Analysis:
    """The op behind the first divergence, from the op-level re-run or the run's own op records."""
    if a.first is None:
        return replace(a, op_finding=None, op_level="")
    found = op_source(a.run_dir, a.record, a.traces, a.devices)
    return replace(a, op_finding=found, op_level=_op_level(a.record, a.first) if found is None else "")


def _op_level(record: RunRecord, first: Divergence) -> str:
    """Under `auto`, the one line that says why no op is named: its re-run found none, or never ran because the
    optimizer's update itself differs (pipeline.op_window)."""
    if record.granularity != "auto":
        return ""
    if record.narrowing is None:
        return op_level_note(first, None)
    window = record.narrowing.window
    return op_level_note(first, (window[0], window[1])) if window else ""


def perturbation(a: Analysis) -> Analysis:
    """`run --perturb`: what each varied setting changed, against its own group's control."""
    if not a.record.perturb:
        return a
    return replace(a, perturbed=compare_perturbed(list(a.traces), list(a.results), list(a.devices),
                                                  a.record.tolerance, list(a.truncated), a.record.not_perturbed))


def baseline_check(a: Analysis) -> Analysis:
    """`--baseline`: this run against a kept recording."""
    if not a.record.baseline:
        return a
    checked = baseline_diff.check(baseline.load(Path(a.record.baseline)), a.run_dir, a.record, list(a.results),
                             a.stdout_mode, a.perturbed)
    return replace(a, baseline_check=checked)


def diagnose(a: Analysis) -> Analysis:
    """Causes inferred from the evidence: of the divergence, or of a perturbed run's own control group."""
    if a.perturbed is not None and a.perturbed.control is not None:
        # repeats with equal settings differ already: diagnose that, among them alone (the settings the groups
        # differ in would read as causes)
        group = next(g for g in a.perturbed.groups if a.perturbed.control.reference in g)
        chosen = [i for i, r in enumerate(a.results) if r.index in group]
        inferred = causes.diagnose(a.perturbed.control, [a.traces[i] for i in chosen], [a.results[i] for i in chosen])
    elif a.divergence is not None:
        inferred = causes.diagnose(a.divergence, list(a.traces), list(a.results), a.op_finding, a.perturbed)
    else:
        inferred = []
    return replace(a, inferred=tuple(inferred), ranked=tuple(inferred))


def stored_experiments(a: Analysis) -> Analysis:
    """Stored `--explain` experiments re-rank the causes; one with no evidence of its mechanism is a candidate."""
    divergence = a.divergence
    # the detector reads no file: the stored experiments are handed in
    stored = [e.experiment for e in read_experiments(a.run_dir)] if a.explained and divergence is not None else []
    ranked = experiments.apply(list(a.inferred), stored, divergence.index) if stored and divergence is not None \
        else list(a.inferred)
    with_evidence, candidates = causes.split(ranked)
    return replace(a, stored=tuple(stored), ranked=tuple(with_evidence), not_ruled_out=tuple(candidates))


def describe_match(a: Analysis) -> Analysis:
    """What the verdict rests on: records, stdout, exit statuses compared, and what was not."""
    if not a.traces or not a.traces[0].is_file():
        return replace(a, match=None)
    results = a.results
    found = verdict_basis.describe_match(
        a.traces[0], a.compared(), bitwise=a.bitwise, tolerance=a.record.tolerance,
        devices=[r.device for r in results],
        granularity=str(a.record.granularity or RecordStream(a.traces[0]).header.get("granularity", "?")),
        stdout=a.stdout_mode if all(r.stdout_digest for r in results) else "ignore",
        # a repeat stopped by a timeout, an interrupt or a bound has no exit status of its own to compare
        exit_status=all(r.has_own_exit_status and r.index not in a.disk_full for r in results),
        self_check=a.record.self_check, stopped=verdict_basis.not_compared(results))
    return replace(a, match=found)


def first_evidence(a: Analysis) -> Analysis:
    """The first repeat's evidence: the versions it ran with and the latent findings."""
    first = a.results[0]
    return replace(a, first_evidence=load_evidence(a.traces[0], first.index, first.device))


def repeated_draws(a: Analysis) -> Analysis:
    """Random draws of the first repeat that repeat where they should differ (sites in DETAUDIT_REPEATS_OK aside)."""
    if a.first_evidence is None:
        return a
    return replace(a, repeated=tuple(repeated_randomness(a.first_evidence, silenced_sites(os.environ))))


def generated_tokens(a: Analysis) -> Analysis:
    """The tokens a decoding script generated, repeat against repeat: distinct outputs, first divergent tokens."""
    return replace(a, tokens=compare_tokens([read_tokens(t) for t in a.traces], [r.index for r in a.results]))


def build_report(a: Analysis) -> Analysis:
    """The Report, assembled once from what the steps found."""
    record, results, evidence = a.record, list(a.results), a.first_evidence
    assert evidence is not None, "`build_report` ran before `first_evidence`"
    failed = all_failed(results) and not any(r.timed_out for r in results)  # the verdict `failed`
    report = Report(
        script=record.script, script_args=list(record.script_args), run_dir=str(a.run_dir),
        runs=results, comparison=a.compared(), outcome_divergence=a.ended, causes=list(a.ranked),
        experiments=list(a.stored), not_ruled_out=list(a.not_ruled_out),
        environment={**record.environment.to_dict(), **recorded_versions(evidence)},
        failure=a.repeat_errors.get(results[0].index, "") if failed else "", repeat_errors=dict(a.repeat_errors),
        bitwise=a.bitwise, stdout_mode=a.stdout_mode,
        argv=[record.script, *record.script_args],  # the script's sys.argv in every repeat (the child sets it so)
        baseline=a.baseline_check, inferred=[c.id for c in causes.split(list(a.inferred))[0]],
        match=a.match, op_finding=a.op_finding, op_level=a.op_level,
        carried_output=a.carried, perturbation=a.perturbed, latent=latent_findings(evidence, results),
        repeated_randomness=list(a.repeated), tokens=a.tokens,
    )
    return replace(a, report=report)


STEPS: tuple[Step, ...] = (
    locate_traces, note_failures, compare, outcome, carried_state, structure_note, op_finding, perturbation,
    baseline_check, diagnose, stored_experiments, describe_match, first_evidence, repeated_draws, generated_tokens,
    build_report,
)


def run_steps(analysis: Analysis, steps: Sequence[Step] = STEPS) -> Analysis:
    """Apply the steps in order."""
    for step in steps:
        analysis = step(analysis)
    return analysis


def start(run_dir: Path, record: RunRecord, results: Sequence[RepeatResult], bitwise: bool = True,
          labels: Sequence[str] | None = None, explained: bool = True) -> Analysis:
    """A run's analysis before any step."""
    return Analysis(run_dir, record, tuple(results), bitwise, tuple(labels) if labels is not None else None, explained)


def extend(analysis: Analysis, record: RunRecord, from_step: Step) -> Analysis:
    """The same run after a later stage added to its record (the op-level re-run, the self-check): the steps
    from `from_step` on run again over what the earlier steps found; the traces are not compared again."""
    return run_steps(replace(analysis, record=record), STEPS[STEPS.index(from_step):])


def op_source(run_dir: Path, record: RunRecord, traces: Sequence[Path],
              devices: Sequence[str]) -> OpFinding | None:
    """The op behind the divergence: from the op-level re-run when there was one, else from the
    run's own traces when they hold op records."""
    narrowing = record.narrowing
    if narrowing is not None and narrowing.results:
        paths = [run_dir / r.trace for r in narrowing.results]
        if not all(p.is_file() for p in paths):
            return None
        finding = find_op_source(paths, [r.device for r in narrowing.results])
        if finding is not None:
            finding = replace(finding, traces=narrowing.prefix, window=narrowing.window)
        return finding
    if not traces or not all(t.is_file() for t in traces) \
            or RecordStream(traces[0]).header.get("granularity") != "op":
        return None
    return find_op_source(traces, devices)


def _carried_saved_value(a: Analysis) -> CarriedOutput | None:
    """The first divergence as carried state, when it is a saved value that is no tensor (a path), every tensor
    agrees, and each differing repeat read or listed what an earlier repeat left; else None."""
    first = a.first
    if first is None or first.record is None or not only_non_tensor_values_differ(
            first, list(a.traces), list(a.devices), a.record.tolerance, list(a.truncated)):
        return None
    evidence = causes.carried_output(first, list(a.traces), list(a.results))
    if evidence is None:
        return None
    what = (f"saved value {first.record.name} ({first.record.dtype}) differs in repeat(s) "
            f"{', '.join(map(str, first.repeats))}; every recorded tensor agrees")
    return CarriedOutput(replace(first, detail=what), evidence)


def stderr_excerpt(run_dir: Path, result: RepeatResult, lines: int = 15) -> str:
    """What the report shows of a failed repeat: its exception's frames (trace footer), else its stderr's end."""
    return excerpt(result.error or read_error(run_dir / result.trace), _stderr_text(run_dir, result), lines)


def _stderr_text(run_dir: Path, result: RepeatResult) -> str:
    """The end of a repeat's stderr file: a regular file in the run directory, its last 64 KB only."""
    if not result.stderr or not is_plain_name(Path(result.stderr).name):
        return ""
    return stderr_tail(run_dir / result.stderr)
