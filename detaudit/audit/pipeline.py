"""The audit pipeline: run repeats -> traces -> compare -> causes -> Report, and reload it from disk.

Only the pipeline: the run directory's layout and records are rundir.py's, stored experiments
and the re-ranking they imply causes/confirm.py's; `--explain`'s runner (explain/runner.py) sits above.
`detaudit report RUN_DIR` rebuilds the report from the run directory alone (`load_run`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from detaudit.audit import ranks
from detaudit.audit.analysis import Analysis, Step, extend, run_steps, start
from detaudit.compare.live import LiveWatch
from detaudit.compare.oprules import find_op_source, update_differs
from detaudit.compare.stdout import DEFAULT_STDOUT, most_lenient, recorded_mode
from detaudit.errors import TraceError, UsageError
from detaudit.records import OPS_PREFIX, RunRecord
from detaudit.report import baseline
from detaudit.report.model import Report
from detaudit.results import RepeatProgress, RepeatResult, StdoutMode, Tolerance
from detaudit.run import distributed, sharing
from detaudit.run.launcher import Interrupted, Launcher, RepeatPlan, check_script, plan_repeats
from detaudit.run.perturb_plan import Perturbation
from detaudit.run.provenance import git_state
from detaudit.run.rundir import (
    claim_run,
    host_environment,
    new_run_dir,
    read_run,
    stored_args,
    write_record,
)
from detaudit.trace import RecordStream, read_footer
from detaudit.trace.strip import strip_ops

GRANULARITIES = ("step", "module", "op", "auto")
PAIR = 2  # op-level re-runs of `auto` made first: a reference and one more (narrow)


@dataclass(frozen=True)
class Target:
    """What each repeat runs: the script (or `python -m MODULE`, the pytest plugin) with its arguments."""

    script: Path  # with `module`: that module's file (checked to exist, named in reports)
    script_args: list[str] = field(default_factory=list)
    module: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # variables added to each repeat's environment
    redact_args: bool = False  # --redact-args: the script's arguments are stored nowhere (they may hold secrets)
    argv0: str | None = None  # the script as typed, sys.argv[0] under plain python (a Path drops the `./` of `./-y.py`)
    python: str | None = None  # another interpreter for the repeats (`drift --a-python`); None: this one

    @property
    def as_typed(self) -> str:
        return self.argv0 or str(self.script)


@dataclass(frozen=True)
class Schedule:
    """How many repeats run, where, and how: per device, in parallel, under a timeout, under torchrun."""

    repeats: int = 3  # per device
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    own_device: bool = False  # --device auto: the script picks its device; `devices` only labels it
    timeout: float | None = None  # seconds per repeat
    jobs: int = 1
    nproc_per_node: int | None = None  # each repeat is a torchrun launch of this many ranks (distributed.py)
    torchrun_args: list[str] = field(default_factory=list)
    # --perturb: the settings the repeats differ in, the repeats alternating between their groups (`repeats`
    # counts them all: each group's share times the groups)
    perturbation: Perturbation | None = None


@dataclass(frozen=True)
class Recording:
    """What each repeat records (docs/granularity.md) and where it stops (recorder/bounds.py)."""

    granularity: str = "module"  # one of GRANULARITIES
    max_steps: int | None = None  # --max-steps: each repeat stops after this many steps
    max_time: float | None = None  # --max-time: ... at the first step boundary after this many seconds
    run_to_end: bool = False  # --run-to-end: never stop a repeat once it diverged (compare/live.py)
    child_config: dict[str, Any] = field(default_factory=dict)  # more for the child: pins, op window, perturbation


@dataclass(frozen=True)
class Checks:
    """How the repeats are compared, and with what else."""

    tolerance: Tolerance = field(default_factory=Tolerance)  # between devices (same device: bitwise)
    stdout: StdoutMode = DEFAULT_STDOUT  # how stdout is compared (docs/stdout.md)
    baseline: Path | None = None  # --baseline: a recorded run (detaudit/report/baseline.py) to compare with as well
    self_check: bool = False  # --self-check: one extra repeat with a one-ULP change, which must be seen
    fail_on_repeats: bool = False  # --fail-on-repeated-randomness: a gate on the verdict (Report.fail_on_repeats)


@dataclass(frozen=True)
class AuditOptions:
    """Everything `run_audit` needs, grouped: what runs, how often and where, what is recorded, how it
    is compared; `out_dir`: the run directory (default: a new one under .detaudit/runs)."""

    target: Target
    schedule: Schedule = field(default_factory=Schedule)
    recording: Recording = field(default_factory=Recording)
    checks: Checks = field(default_factory=Checks)
    out_dir: Path | None = None

    def recorded(self, **changes: Any) -> AuditOptions:
        """These options recording otherwise (Recording fields; child_config entries are added)."""
        extra = changes.pop("child_config", {})
        return replace(self, recording=replace(self.recording, **changes,
                                               child_config={**self.recording.child_config, **extra}))


def execute(options: AuditOptions, run_dir: Path,
            on_done: Callable[[RepeatResult], None] | None = None, prefix: str = "repeat",
            cwd: Path | None = None, on_progress: Callable[[RepeatProgress], None] | None = None,
            first: int = 0, baseline: tuple[Path, str] | None = None, narrow_ahead: bool = False) -> list[RepeatResult]:
    """Run the repeats into `run_dir`, numbered from `first`; `cwd`: the script's working directory;
    `baseline`: --baseline's trace and device, which the first repeat is followed against while it runs.
    `narrow_ahead` (`auto`, one repeat at a time): the repeats started after one diverged record ops over its
    window too (LiveWatch.configure); each leaves its whole trace as the op-level re-run's `ops-N.trace` and
    a copy without the op records as its own (split_op_windowed), so `narrow` needs fewer re-runs.

    Each repeat is compared with its reference while it runs (compare/live.py): one that diverged is
    stopped EXTRA_STEPS optimizer steps later unless `run_to_end`, and `on_progress` hears where each
    stands. The report's comparison is made afterwards, from the traces.
    Repeats run in parallel (-j) that wrote one file (run/sharing.py) are re-run one after another:
    detaudit's parallelism must never read as the script's nondeterminism.
    """
    target, schedule, recording = options.target, options.schedule, options.recording
    child_config = _child_config(options)
    # a torchrun repeat's ranks agree on the step they stop at through the job's store (recorder/agree.py);
    # a job over several nodes is not stopped: each node's audit would ask its own ranks only.
    # --perturb: every repeat runs to its end, as each group is compared within itself afterwards, and a repeat
    # stopped for differing from repeat 0 (another group's) would cut that comparison short
    stoppable = not recording.run_to_end and not distributed.multi_node(schedule.torchrun_args) \
        and schedule.perturbation is None
    plans = plan_repeats(run_dir, schedule.repeats, schedule.devices, recording.granularity, target.env,
                         child_config, prefix=prefix, own_device=schedule.own_device, stoppable=stoppable,
                         first=first)
    if schedule.perturbation is not None:
        plans = schedule.perturbation.assign(plans)
    layout = distributed.Layout(schedule.nproc_per_node, distributed.node_rank(schedule.torchrun_args)) \
        if schedule.nproc_per_node else None
    watch = LiveWatch(plans, options.checks.tolerance, stoppable, layout, on_progress, baseline,
                      narrow_ahead=narrow_ahead and stoppable) if stoppable or on_progress is not None else None

    def launch(batch: Sequence[RepeatPlan], jobs: int) -> list[RepeatResult]:
        launcher = distributed.launcher(schedule.nproc_per_node, schedule.torchrun_args, target.as_typed,
                                        target.script_args, schedule.timeout, jobs, cwd, watch) \
            or Launcher(target.as_typed, target.script_args, schedule.timeout, jobs, cwd=cwd, watch=watch,
                        python=target.python)
        return launcher.run(batch, None if on_done is None else lambda r: on_done(ended(r, run_dir, layout)))

    try:
        results = launch(plans, schedule.jobs)
        # a torchrun repeat's ranks write one file by design; its traces are per rank
        reasons = sharing.shared_writes(results, run_dir) if schedule.jobs > 1 and not schedule.nproc_per_node \
            else {}
        if reasons:
            results = _rerun_alone(plans, results, reasons, lambda again: launch(again, 1))
    except Interrupted as exc:
        exc.run_dir = run_dir
        raise
    finally:  # an interrupted run's traces too: `report` compares them as module-level repeats
        if watch is not None:
            split_op_windowed(run_dir, [p for p in plans if p.index in watch.op_windowed])
    return [ended(r, run_dir, layout) for r in results]


def _child_config(options: AuditOptions) -> dict[str, Any]:
    """What every repeat's child is told (RepeatPlan.child_config): the recording's own entries, the module to
    record, the bounds, the rank settings and the script's commit."""
    target, schedule, recording = options.target, options.schedule, options.recording
    bounds = {k: v for k, v in (("max_steps", recording.max_steps), ("max_time", recording.max_time))
              if v is not None}
    child_config = {**recording.child_config, **({"module": target.module} if target.module else {}),
                    **({"redact_args": True} if target.redact_args else {}), **bounds,
                    **distributed.rank_config(schedule.nproc_per_node)}
    # the script's commit, found here once: a git subprocess inside a repeat would shift its heap layout
    child_config["git"] = git_state(target.script)
    return child_config


def _rerun_alone(plans: Sequence[RepeatPlan], results: list[RepeatResult], reasons: dict[int, str],
                 launch_alone: Callable[[Sequence[RepeatPlan]], list[RepeatResult]]) -> list[RepeatResult]:
    """`results` with the repeats that wrote a shared file (`reasons`, run/sharing.py) re-run one after
    another; interrupted, the exception carries every result, re-run or not."""
    again = [p for p in plans if p.index in reasons]
    for plan in again:
        sharing.discard(plan)
    try:
        alone = {r.index: replace(r, rerun_alone=reasons[r.index]) for r in launch_alone(again)}
    except Interrupted as exc:
        partial = {r.index: r for r in exc.results}
        exc.results = [partial.get(r.index, r) for r in results]
        raise
    return [alone.get(r.index, r) for r in results]


def split_op_windowed(run_dir: Path, plans: Sequence[RepeatPlan]) -> None:
    """Each op-windowed repeat's trace becomes the op-level re-run's `ops-N.trace`, and its own trace a copy
    without the op records (trace/strip.py): what a module-level repeat writes. A repeat that left no trace,
    or one that cannot be read, is left as it is (the report then reads it, and says what is wrong with it)."""
    for plan in plans:
        if not os.path.lexists(plan.trace):
            continue
        whole = run_dir / f"{OPS_PREFIX}-{plan.index}.trace"
        os.rename(plan.trace, whole)
        try:
            strip_ops(whole, plan.trace, {"granularity": "module", "op_window": None})
        except (TraceError, OSError):  # unreadable: left whole as the repeat's own trace, which the report reads
            Path(plan.trace).unlink(missing_ok=True)
            os.rename(whole, plan.trace)


def recorded_ahead(run_dir: Path, results: Sequence[RepeatResult], window: list[int]) -> list[RepeatResult]:
    """The repeats whose op records over `window` were made while they ran (split_op_windowed), as results of
    the op-level re-run: their `ops-N.trace`, the rest as the repeat ended. One recorded over another window
    (a later repeat diverged earlier than the one that set it) is removed: the re-run writes that name."""
    ahead = []
    for result in results:
        whole = run_dir / f"{OPS_PREFIX}-{result.index}.trace"
        if not whole.is_file() or whole.is_symlink():
            continue
        try:
            header = RecordStream(whole).header
        except TraceError:
            continue
        if header.get("op_window") == window:
            ahead.append(replace(result, trace=whole.name))
        else:
            whole.unlink()
    return ahead


def ended(result: RepeatResult, run_dir: Path, layout: distributed.Layout | None = None) -> RepeatResult:
    """The result with what its trace's footer says about an early end (RepeatResult.ended_as); a torchrun
    repeat's (`layout`), as its first rank here recorded it (every rank stops at the same step)."""
    trace = result.trace
    if layout is not None:
        ranks = layout.ranks(run_dir, result)
        trace = distributed.Layout.rank_file(trace, ranks[0]) if ranks else trace
    return result.ended_as(read_footer(run_dir / trace))


def recorded_audit(options: AuditOptions, on_done: Callable[[RepeatResult], None] | None,
              on_progress: Callable[[RepeatProgress], None] | None) -> tuple[AuditOptions, Analysis]:
    """The audit's repeats run into a new run directory (run.json written before and after) and analysed; the
    options as the repeats ran with them."""
    target, schedule, recording, checks = options.target, options.schedule, options.recording, options.checks
    check_script(target.script)
    if recording.granularity not in GRANULARITIES:
        raise UsageError(f"unknown granularity {recording.granularity!r}; use one of {', '.join(GRANULARITIES)}")
    against = None
    if checks.baseline is not None:  # refuse an unusable baseline before spending time on repeats
        reference = baseline.load(checks.baseline)
        if reference.granularity != baseline.effective_granularity(recording.granularity):
            raise UsageError(f"--baseline {checks.baseline} was recorded at granularity {reference.granularity}; "
                             f"run with --granularity {reference.granularity} to compare with it")
        against = (reference.trace, reference.result.device)
    # resolved as explain resolves it: the summary line names one path whether or not the confirmation ran
    run_dir = new_run_dir(target.script, options.out_dir).resolve()
    record = RunRecord(
        script=target.as_typed, script_args=tuple(stored_args(target.script_args, target.redact_args)),
        args_redacted=target.redact_args, cwd=str(Path.cwd()), repeats=schedule.repeats,
        devices=tuple(schedule.devices), granularity=recording.granularity, timeout=schedule.timeout,
        tolerance=checks.tolerance, env=dict(target.env), own_device=schedule.own_device, stdout=checks.stdout,
        module=target.module, max_steps=recording.max_steps, max_time=recording.max_time,
        run_to_end=recording.run_to_end,
        baseline=str(checks.baseline.resolve()) if checks.baseline is not None else None,
        nproc_per_node=schedule.nproc_per_node, torchrun_args=tuple(schedule.torchrun_args),
        environment=host_environment(), started=time.time(),
        perturb=() if schedule.perturbation is None else tuple(s.knob.value for s in schedule.perturbation.specs),
        not_perturbed={} if schedule.perturbation is None else schedule.perturbation.not_tested,
        fail_on_repeats=checks.fail_on_repeats,
    )
    claim_run(run_dir, record)
    # what an earlier repeat changed is told apart by time (recorder/evidence/file_access.py)
    options = options.recorded(child_config={"audit_started": record.started})
    auto = recording.granularity == "auto"
    try:
        results = execute(options.recorded(granularity="module") if auto else options, run_dir, on_done,
                          on_progress=on_progress, baseline=against, narrow_ahead=auto and one_at_a_time(schedule))
    except Interrupted as exc:  # keep what the repeats recorded: `report` and `compare` can read it
        write_record(run_dir, replace(record, results=tuple(exc.results), interrupted=True))
        raise
    record = replace(record, results=tuple(results))
    write_record(run_dir, record)
    return options, analysed(run_dir, record, results)


def gated(report: Report, record: RunRecord) -> Report:
    """The run's report with the gate its run asked for (--fail-on-repeated-randomness, kept in run.json) as part
    of its verdict: the audit's and `report RUN_DIR`'s alike. Not in `analyse`, which also judges the explain
    experiments' repeats, whose agreement is all they ask."""
    return replace(report, fail_on_repeats=record.fail_on_repeats)


def narrow(options: AuditOptions, run_dir: Path, on_done: Callable[[RepeatResult], None] | None = None,
           on_progress: Callable[[RepeatProgress], None] | None = None,
           ahead: Sequence[RepeatResult] = ()) -> list[RepeatResult]:
    """The op-level re-run of `auto`, each repeat stopping after the window: two repeats first, one after
    the other, and the rest only when those two hold no divergent op, so a divergence that shows in some
    runs only still gets as many chances as there are repeats. On several devices, under torchrun, with -j,
    or under --perturb (whose groups go by a repeat's place in the batch), every repeat at once.
    `ahead`: repeats of the audit that recorded ops over the window while they ran (recorded_ahead); they
    count among the re-run's repeats, so fewer are re-run."""
    schedule = options.schedule
    if not one_at_a_time(schedule):
        return execute(options, run_dir, on_done, prefix=OPS_PREFIX, on_progress=on_progress)

    def rerun(count: int, first: int) -> list[RepeatResult]:
        if count <= 0:
            return []
        return execute(replace(options, schedule=replace(schedule, repeats=count)), run_dir, on_done,
                       prefix=OPS_PREFIX, on_progress=on_progress, first=first)

    ahead = list(ahead)[:schedule.repeats]
    # numbered from 0: the repeats recorded ahead are the audit's last ones (started after a divergence), so
    # the re-run's numbers up to repeats - len(ahead) are free
    fresh = rerun(min(PAIR, schedule.repeats) - len(ahead), 0)
    pair = sorted([*fresh, *ahead], key=lambda r: r.index)
    paths = [run_dir / r.trace for r in pair]
    if len(pair) >= schedule.repeats or \
            (all(p.is_file() for p in paths) and find_op_source(paths, [r.device for r in pair]) is not None):
        return pair
    return sorted(pair + rerun(schedule.repeats - len(pair), len(fresh)), key=lambda r: r.index)


def one_at_a_time(schedule: Schedule) -> bool:
    """Repeats on one device, one process each, one after another, alike: what `narrow` re-runs a pair of first
    (and what records ops ahead, LiveWatch.configure)."""
    return len(schedule.devices) == 1 and not schedule.nproc_per_node and schedule.jobs == 1 \
        and schedule.perturbation is None


def op_window(report: Report) -> list[int] | None:
    """Steps to record ops in after a module-level run: the first divergent step and the one before. None where
    the optimizer's update itself differs (oprules.update_differs): its ops are not recorded, so no op would be
    named, and the report says why instead (Report.op_level)."""
    first = report.comparison.first_divergence
    if first is None or first.record is None or first.record.step < 0 or report.verdict != "divergent" \
            or report.timed_out or update_differs(first):
        return None
    step = first.record.step
    return [max(0, step - 1), step]


def load_run(run_dir: Path, stdout: StdoutMode | None = None) -> Report:
    """Rebuild the report of a finished run from its directory; `stdout`: compare stdout this way
    instead of the way the run was recorded with."""
    analysis = loaded(run_dir, stdout)
    return gated(analysis.report_made(), analysis.record)


def loaded(run_dir: Path, stdout: StdoutMode | None = None) -> Analysis:
    """The Analysis behind `load_run`'s Report (ungated), for a later stage to extend (`detaudit explain RUN_DIR`)."""
    record, results = read_run(run_dir)
    if stdout is not None:
        record = replace(record, stdout=stdout, ignore_stdout=False)
    return analysed(Path(run_dir), record, results)


def compare_recorded(paths: Sequence[Path], tolerance: Tolerance | None = None,
                     stdout: StdoutMode | None = None) -> Report:
    """Compare recordings made elsewhere (another machine, another day): trace files, run directories
    or baselines.

    A run directory contributes its first repeat, a baseline its reference trace. Bitwise unless a
    tolerance is given, whatever devices the recordings were made on. A trace without a footer
    (killed, or crashed hard) is incomplete: its exit status is unknown (None) and it is compared
    as far as it goes. Stdout (run directories only) is compared as `stdout` says, else as the
    recordings were made (the most lenient of their modes).
    """
    if len(paths) < 2:
        raise UsageError("compare needs at least two traces or run directories")
    if all(Path(p).is_dir() and not os.path.lexists(Path(p) / baseline.MANIFEST) for p in paths):
        runs = [(Path(p), *read_run(Path(p))) for p in paths]
        if any(record.nproc_per_node for _, record, _ in runs):
            return compare_nodes(runs, tolerance, stdout)
    results = []
    modes: list[StdoutMode] = []
    for i, path in enumerate(paths):
        path = Path(path)
        if path.is_dir() and os.path.lexists(path / baseline.MANIFEST):
            results.append(replace(baseline.load(path).result, index=i))
        elif path.is_dir():
            run_record, run_results = read_run(path)
            if run_record.nproc_per_node:
                raise UsageError(f"{path} is a torchrun run: it has one trace per rank; compare it with the run "
                                 "directories of the job's other nodes, or one rank's traces "
                                 f"(e.g. {path / distributed.Layout.rank_file(run_results[0].trace, 0)})")
            modes.append(recorded_mode(run_record))
            first = run_results[0]
            if not os.path.lexists(path / first.trace):  # a link is refused by its reader, naming it
                raise TraceError(f"{path}: its first repeat left no trace ({first.trace})")
            # absolute, not resolved: a symlink planted in the run directory stays a symlink (never followed)
            results.append(replace(first, index=i, trace=str((path / first.trace).absolute()),
                                   stdout=str((path / first.stdout).absolute()),
                                   stderr=str((path / first.stderr).absolute())))
        elif path.is_file():
            stream = RecordStream(path.resolve())  # a trace file the user names: a link is theirs to follow
            stream.drain()
            footer = stream.footer  # schema-checked by the reader: exit_code int|None, duration_s a number
            code = None if footer is None else footer.get("exit_code", 0)
            took = (footer or {}).get("duration_s")  # none without a footer (or in a footer that could not time it)
            duration = float(took) if took is not None else None
            results.append(RepeatResult(
                index=i, device=str(stream.header.get("device_request", "recorded")), exit_code=code,
                duration_s=duration, timed_out=False, trace=str(path.resolve()), stdout="", stderr="",
                stdout_digest="",
            ))
        elif path.exists():
            raise TraceError(f"{path}: not a regular file or a run directory")
        else:
            raise UsageError(f"no such trace or run directory: {path}")
    _refuse_the_same_recording_twice(paths, results)
    record = RunRecord(script=", ".join(str(p) for p in paths), tolerance=tolerance or Tolerance(),
                       environment=host_environment(), stdout=stdout or most_lenient(modes))
    # one label for all when bitwise (a recording's device is shown, not used to loosen the
    # comparison); with a tolerance, every recording is compared with the first within it
    labels = ["recorded"] * len(results) if tolerance is None else [f"recording-{r.index}" for r in results]
    report = analyse(Path.cwd(), record, results, bitwise=tolerance is None, labels=labels, explained=False)
    # recordings made elsewhere have no one command line; each is named as the user gave it
    return replace(report, argv=None, recordings=[str(p) for p in paths])


def compare_nodes(runs: Sequence[tuple[Path, RunRecord, list[RepeatResult]]], tolerance: Tolerance | None,
                  stdout: StdoutMode | None) -> Report:
    """One report over the run directories that the nodes of one torchrun job recorded (one `detaudit run`
    per node, started together): every rank compared across repeats, wherever each repeat left its files,
    origin and receiver across all ranks, and the replica check across all ranks (ranks.analyse_nodes).
    Bitwise, as each node's run was; a tolerance is refused (the nodes' repeats are one job's)."""
    if tolerance is not None:
        raise UsageError("--atol/--rtol: the run directories of a torchrun job's nodes are compared bitwise, "
                         "as each node's repeats were")
    for path, record, _ in runs:
        if not record.nproc_per_node:
            raise UsageError(f"{path} is not a torchrun run: the run directories of a job's nodes are compared "
                             "together, and a single-process run is not one of them")
        if record.interrupted or record.results is None:
            raise UsageError(f"{path}: its run was interrupted; a node's run directory is compared once its "
                             "repeats have ended")
    repeats = {len(results) for _, _, results in runs}
    scripts = {Path(record.script).name for _, record, _ in runs}
    if len(repeats) > 1 or len(scripts) > 1:
        raise UsageError("the run directories are not one job's nodes: "
                         + "; ".join(f"{path}: {Path(record.script).name}, {len(results)} repeat(s)"
                                     for path, record, results in runs)
                         + " (each node runs the same script with the same --repeats, started together)")
    seen: dict[tuple[int, int], Path] = {}
    for path, _, _ in runs:  # one node's directory twice would hold every rank twice
        st = os.stat(path)
        if (st.st_dev, st.st_ino) in seen:
            raise UsageError(f"{seen[st.st_dev, st.st_ino]} and {path} are the same run directory: give each "
                             "node's run directory once")
        seen[st.st_dev, st.st_ino] = path
    nodes = [ranks.Node(path, results, distributed.Layout(record.nproc_per_node or 1, None))
             for path, record, results in runs]
    first = runs[0][1]
    record = replace(first, narrowing=None, self_check=None, baseline=None,
                     stdout=stdout or most_lenient([recorded_mode(r) for _, r, _ in runs]), ignore_stdout=False)
    return replace(ranks.analyse_nodes(nodes, record, analyse, explained=False), argv=None)


def _refuse_the_same_recording_twice(paths: Sequence[Path], results: Sequence[RepeatResult]) -> None:
    """One trace file given twice (the same path, a run directory and its own trace, a link) would agree
    with itself: a DETERMINISTIC that compared nothing. A UsageError instead."""
    seen: dict[tuple[int, int], Path] = {}
    for path, result in zip(paths, results):
        try:
            st = os.stat(result.trace)
        except OSError:
            continue  # unreadable: the comparison says so
        earlier = seen.get((st.st_dev, st.st_ino))
        if earlier is not None:
            same = f"{earlier} and {path} are the same recording" if earlier != Path(path) \
                else f"{path} is given twice"
            raise UsageError(f"{same} ({result.trace}): a recording always agrees with "
                             "itself, so comparing them proves nothing; give two different recordings")
        seen[(st.st_dev, st.st_ino)] = Path(path)


def analyse(run_dir: Path, record: RunRecord, results: Sequence[RepeatResult], bitwise: bool = True,
            labels: Sequence[str] | None = None, explained: bool = True) -> Report:
    """Compare the traces, find outcome differences and causes, and assemble the Report. Reads only.

    The steps are analysis.py's; a torchrun run is analysed rank by rank, each rank with this function (ranks.py).
    """
    return analysed(run_dir, record, results, bitwise, labels, explained).report_made()


def analysed(run_dir: Path, record: RunRecord, results: Sequence[RepeatResult], bitwise: bool = True,
             labels: Sequence[str] | None = None, explained: bool = True) -> Analysis:
    """The Analysis behind `analyse`'s Report, for a later stage to extend; a torchrun run's carries only its Report."""
    if record.nproc_per_node:
        return Analysis(run_dir, record, tuple(results), report=ranks.analyse_ranks(run_dir, record, results, analyse,
                                                                                    explained))
    return run_steps(start(run_dir, record, results, bitwise, labels, explained))


def extended(analysis: Analysis, record: RunRecord, from_step: Step) -> Analysis:
    """`analysis` after a later stage added to the run's record: a torchrun run is analysed again (rank by rank),
    any other extended from `from_step` without comparing its traces again."""
    if record.nproc_per_node:
        return analysed(analysis.run_dir, record, analysis.results, analysis.bitwise, analysis.labels,
                        analysis.explained)
    return extend(analysis, record, from_step)
