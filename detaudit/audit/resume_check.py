"""`detaudit resume`: does stopping a run at a checkpoint and resuming it reproduce the uninterrupted run?

Three launches of the script, one after the other, in the user's working directory (the script's checkpoints
live there): the reference (`SCRIPT ARGS`, audited against a second repeat of itself, as `run` does), the
interrupted run (`SCRIPT ARGS`, stopped right after step K as `--max-steps K` stops it) and the resumed run
(`SCRIPT ARGS RESUME_ARGS`). Every repeat records with the child config `resume` (recorder/checkpoints.py:
starting parameters, learning rates, GradScaler state). The resumed run is aligned to the reference step
whose parameters it starts from and compared with the reference from there (compare/resumed_alignment.py); the
causes are causes/resume_causes.py's (docs/resume.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from detaudit.audit.follow_up import run_audit
from detaudit.audit.pipeline import AuditOptions, execute
from detaudit.causes.resume_causes import ResumeRuns, diagnose
from detaudit.compare.resumed_alignment import Alignment, align, compare_resumed, read_steps
from detaudit.errors import Inconclusive, NoCheckpoint, ScriptFailed, UsageError
from detaudit.report.model import Report
from detaudit.report.resume import RESUME_FILE, CheckpointCall, ResumeReport, RunName, write_json
from detaudit.results import Divergence, RecordInfo, RepeatResult
from detaudit.run.failure import excerpt, read_error, stderr_tail
from detaudit.trace import read_events

INTERRUPTED, RESUMED = "interrupted", "resumed"  # the two runs' file prefixes in the run directory


@dataclass(frozen=True)
class ResumeOptions:
    """The reference's audit options (script, arguments, device, timeout, --max-steps, run directory), the step
    to stop the interrupted run after, and the arguments that make the script resume."""

    audit: AuditOptions
    stop_at: int
    resume_args: list[str]


def run_resume(options: ResumeOptions, on_done: Callable[[RepeatResult], None] | None = None,
               on_stage: Callable[[str], None] | None = None) -> ResumeReport | Report:
    """The resume check. A plain Report when the reference itself cannot be judged (it failed, timed out or
    recorded nothing comparable): there is nothing to resume against."""
    stop_at, bound = options.stop_at, options.audit.recording.max_steps
    if bound is not None and stop_at >= bound:
        raise UsageError(f"--stop-at {stop_at} must be below --max-steps {bound}: the run is stopped after step "
                         f"{stop_at} and resumed up to step {bound}")
    if len(options.audit.schedule.devices) != 1:
        raise UsageError("detaudit resume compares runs on one device: give --device once")
    base = options.audit.recorded(granularity="module", child_config={"resume": True})
    base = replace(base, schedule=replace(base.schedule, repeats=2, jobs=1))
    stage = on_stage or (lambda _: None)
    stage("reference: the uninterrupted run, twice")
    reference = run_audit(base, on_done)
    if reference.verdict not in ("deterministic", "divergent") or reference.timed_out:
        return reference
    run_dir = Path(reference.run_dir)
    if reference.verdict == "divergent":
        return ResumeReport(
            script=base.target.as_typed, script_args=list(base.target.script_args), resume_args=options.resume_args,
            run_dir=str(run_dir), stop_at=stop_at, verdict="reference-divergent", aligned_step=None,
            divergence=reference.first_divergence, comparison=None, causes=reference.causes, saved=[], loaded=[],
            reference=reference, runs=[])
    one = replace(base, schedule=replace(base.schedule, repeats=1))
    stage(f"interrupted: stopped after step {stop_at}")
    [interrupted] = execute(one.recorded(max_steps=stop_at), run_dir, on_done, prefix=INTERRUPTED)
    _check_ran(interrupted, run_dir, "interrupted", stop_at)
    saved = checkpoint_calls(run_dir / interrupted.trace, "checkpoint-save", "interrupted")
    if not saved:
        raise NoCheckpoint(f"the interrupted run saved no checkpoint by step {stop_at} (no `torch.save` call before "
                           f"it was stopped right after its optimizer step {stop_at}), so there is nothing to resume "
                           "from; give a --stop-at after the script's first checkpoint (a save that follows the "
                           f"optimizer step of step {stop_at} itself needs --stop-at {stop_at + 1}; traces: {run_dir})")
    stage(f"resumed: {' '.join(options.resume_args)}")
    target = replace(one.target, script_args=[*one.target.script_args, *options.resume_args])
    [resumed] = execute(replace(one, target=target), run_dir, on_done, prefix=RESUMED)
    _check_ran(resumed, run_dir, "resumed", None)
    loaded = checkpoint_calls(run_dir / resumed.trace, "checkpoint-load", "resumed")
    if not loaded:
        raise NoCheckpoint(f"the resumed run loaded no checkpoint (no `torch.load` call): the resume arguments "
                           f"{' '.join(options.resume_args)!r} did not make the script resume (its stdout: "
                           f"{run_dir / resumed.stdout})")
    reference_trace = run_dir / reference.runs[0].trace
    reference_steps, resumed_steps = read_steps(reference_trace), read_steps(run_dir / resumed.trace)
    if resumed_steps.initial is None:
        raise Inconclusive(f"the resumed run made no optimizer step after loading its checkpoint, so there is "
                           f"nothing to compare with the uninterrupted run (its stdout: {run_dir / resumed.stdout}); "
                           "give a --stop-at before the run's last checkpoint")
    # a checkpoint may be one the reference runs wrote, in the same working directory
    steps = {c.step for c in saved} | {int(e["step"]) for e in read_events(reference_trace, "checkpoint-save")}
    alignment = align(reference_steps, resumed_steps, steps, saved[-1].step)
    comparison = None
    divergence: Divergence | None
    if alignment.step is not None:
        bounded = bound is not None
        comparison = compare_resumed(reference_trace, run_dir / resumed.trace, alignment.step, loaded_at(loaded),
                                     [bounded or reference.runs[0].stopped_at_step is not None, bounded])
        divergence = comparison.first_divergence
    else:
        divergence = _unaligned(alignment, saved)
    causes = diagnose(ResumeRuns(reference_trace, run_dir / interrupted.trace, run_dir / resumed.trace, stop_at,
                                 alignment, divergence, reference_steps, resumed_steps))
    report = ResumeReport(
        script=base.target.as_typed, script_args=list(base.target.script_args), resume_args=options.resume_args,
        run_dir=str(run_dir), stop_at=stop_at,
        verdict="resume-divergent" if divergence is not None else "resume-equivalent",
        aligned_step=alignment.step, divergence=divergence, comparison=comparison, causes=causes, saved=saved,
        loaded=loaded, reference=reference, runs=[interrupted, resumed])
    write_json(report, run_dir / RESUME_FILE, mode=0o600)
    return report


def _check_ran(result: RepeatResult, run_dir: Path, name: str, stop_at: int | None) -> None:
    """The interrupted run must reach step `stop_at`; the resumed run must end by itself without an error."""
    failed = result.timed_out or result.ended_with_error
    if failed:
        why = "timed out" if result.timed_out else f"failed (exit status {result.exit_code})"
        error = excerpt(result.error or read_error(run_dir / result.trace), stderr_tail(run_dir / result.stderr))
        shown = error.replace("\n", " | ") if error else f"its stderr: {run_dir / result.stderr}"
        raise ScriptFailed(f"the {name} run {why}; nothing to compare. {shown}")
    if stop_at is not None and result.stopped_at_step is None:
        raise UsageError(f"the script ended before its step {stop_at}, so --stop-at {stop_at} never interrupted it; "
                         "give a step the run reaches")


def checkpoint_calls(trace: Path, kind: str, run: RunName) -> list[CheckpointCall]:
    events: list[Any] = read_events(trace, kind)
    return [CheckpointCall(run, e["path"], e["loc"], e["step"], list(e["keys"]), list(e["parts"]), e.get("at", 0))
            for e in events]


def loaded_at(loaded: list[CheckpointCall]) -> int:
    """The record index of the resumed run's last checkpoint load before its first step (its first if none)."""
    before = [c for c in loaded if c.step == 0]
    return (before or loaded)[-1].at


def _unaligned(alignment: Alignment, saved: list[CheckpointCall]) -> Divergence:
    """No reference step has the resumed run's starting parameters: a difference before its first step."""
    step = alignment.expected if alignment.expected is not None else saved[-1].step  # reference numbering
    name = alignment.differing[0] if alignment.differing else ""
    info = RecordInfo(index=-1, kind="param", name=name, module="", location="", step=step, shape="", dtype="",
                      op="", backward=False)
    return Divergence(-1, "content", info, [1], 0, detail="the parameters the resumed run starts from match no step "
                      "of the uninterrupted run")
