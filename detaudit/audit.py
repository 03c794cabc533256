"""The audit pipeline: run repeats -> traces -> compare -> causes -> Report, and reload it from disk.

The run directory holds everything: `run.json` (how it was run and how each repeat ended),
one trace plus stdout/stderr per repeat, and `report.json`. `detaudit report RUN_DIR` rebuilds
the report from these files alone.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from detaudit import __version__, baseline, causes, distributed, explain, match, schema
from detaudit.compare import Divergence, RecordInfo, Tolerance, compare_traces
from detaudit.errors import OutputError, TraceError, UsageError, output_error
from detaudit.launcher import Interrupted, Launcher, RepeatResult, check_script, plan_repeats
from detaudit.oprules import OpFinding, find_op_source
from detaudit.provenance import git_state
from detaudit.report import Report, write_json, write_text_atomically
from detaudit.safetext import printable
from detaudit.stdout import DEFAULT_STDOUT, StdoutMode, compare_stdout, most_lenient, recorded_mode
from detaudit.trace import RecordStream, load_json, open_regular, read_footer

RUN_FORMAT = "detaudit-run"
RUN_VERSION = 1
DEFAULT_RUNS_DIR = Path(".detaudit") / "runs"
GRANULARITIES = ("step", "module", "op", "auto")
OPS_PREFIX = "ops"  # traces of the op-level re-run under --granularity auto
MAX_RECORD_BYTES = 64 << 20  # run.json / explain.json larger than this were not written by detaudit
STDERR_TAIL_BYTES = 64 << 10  # how much of a repeat's stderr the report reads (its end)


@dataclass
class AuditOptions:
    script: Path
    script_args: list[str] = field(default_factory=list)
    repeats: int = 3
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    timeout: float | None = None
    jobs: int = 1
    out_dir: Path | None = None
    granularity: str = "module"
    tolerance: Tolerance = field(default_factory=Tolerance)
    env: dict[str, str] = field(default_factory=dict)
    child_config: dict[str, Any] = field(default_factory=dict)
    own_device: bool = False  # --device auto: the script picks its device; `devices` only labels it
    stdout: StdoutMode = DEFAULT_STDOUT  # how stdout is compared (docs/stdout.md)
    module: str | None = None  # run `python -m MODULE` (the pytest plugin); `script` is then the module's file
    baseline: Path | None = None  # --baseline: a recorded run (detaudit/baseline.py) to compare with as well
    redact_args: bool = False  # --redact-args: the script's arguments are stored nowhere (they may hold secrets)
    max_steps: int | None = None  # --max-steps: each repeat stops after this many steps (recorder/bounds.py)
    max_time: float | None = None  # --max-time: ... at the first step boundary after this many seconds
    self_check: bool = False  # --self-check: one extra repeat with a one-ULP change, which must be seen
    nproc_per_node: int | None = None  # each repeat is a torchrun launch of this many ranks (distributed.py)
    torchrun_args: list[str] = field(default_factory=list)


def new_run_dir(script: Path, out_dir: Path | None) -> Path:
    """A fresh directory for this run (mode 0700: traces hold the script's arguments and data digests).

    Never reuses one that already holds a run. The directory is claimed by creating it, or, for an
    existing empty `--out`, by `claim_run` creating run.json exclusively: two runs started together
    with one `--out` cannot both write into it.
    """
    try:
        if out_dir is not None:
            if out_dir.exists() and not out_dir.is_dir():
                raise UsageError(f"--out {out_dir} is a file, not a directory; give a new or empty directory")
            above = next((p for p in out_dir.absolute().parents if p.exists()), None)
            if above is not None and not above.is_dir():
                raise OutputError(f"cannot write {out_dir}: {above} is a file, not a directory")
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                out_dir.mkdir(mode=0o700)
            except FileExistsError:
                if any(out_dir.iterdir()):
                    raise UsageError(f"--out {out_dir} already exists and is not empty; detaudit never overwrites "
                                     "a run") from None
            return out_dir
        home = DEFAULT_RUNS_DIR.parent
        if not home.exists():
            home.mkdir(parents=True, exist_ok=True)
            # runs are local artefacts (traces can be large): keep them out of the user's repository
            (home / ".gitignore").write_text("# created by detaudit: its run directories are not for version "
                                             "control\n*\n")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = DEFAULT_RUNS_DIR / f"{stamp}-{script.stem}"
        base.parent.mkdir(parents=True, exist_ok=True)
        candidate, n = base, 1
        while True:
            try:
                candidate.mkdir(mode=0o700)
                return candidate
            except FileExistsError:
                n += 1
                candidate = base.with_name(f"{base.name}-{n}")
    except OSError as exc:
        raise output_error(out_dir if out_dir is not None else DEFAULT_RUNS_DIR, exc) from None


def claim_run(run_dir: Path, record: dict[str, Any]) -> None:
    """Write the first run.json exclusively: whoever creates it owns the directory."""
    path = run_dir / "run.json"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise UsageError(f"--out {run_dir} was taken by another detaudit run started at the same time; give each "
                         "run its own directory") from None
    except OSError as exc:
        raise output_error(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(record, indent=2))
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise output_error(path, exc) from None


def host_environment() -> dict[str, Any]:
    return {
        "detaudit": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def execute(options: AuditOptions, run_dir: Path,
            on_done: Callable[[RepeatResult], None] | None = None, prefix: str = "repeat",
            cwd: Path | None = None) -> list[RepeatResult]:
    """Run the repeats into `run_dir` (no comparison); `cwd`: the script's working directory."""
    bounds = {k: v for k, v in (("max_steps", options.max_steps), ("max_time", options.max_time)) if v is not None}
    child_config = {**options.child_config, **({"module": options.module} if options.module else {}),
                    **({"redact_args": True} if options.redact_args else {}), **bounds,
                    **distributed.run_record(options.nproc_per_node)}
    # the script's commit, found here once: a git subprocess inside a repeat would shift its heap layout
    child_config["git"] = git_state(options.script)
    plans = plan_repeats(run_dir, options.repeats, options.devices, options.granularity, options.env,
                         child_config, prefix=prefix, own_device=options.own_device)
    launcher = distributed.launcher(options.nproc_per_node, options.torchrun_args, options.script,
                                    options.script_args, options.timeout, options.jobs, cwd) \
        or Launcher(options.script, options.script_args, options.timeout, options.jobs, cwd=cwd)
    try:
        results = launcher.run(plans, None if on_done is None else lambda r: on_done(ended(r, run_dir)))
    except Interrupted as exc:
        exc.run_dir = run_dir
        raise
    return [ended(r, run_dir) for r in results]


def ended(result: RepeatResult, run_dir: Path) -> RepeatResult:
    """The result with what its trace's footer says about an early end: stopped by --max-steps or
    --max-time (`stopped_at_step`), or recording stopped because a hook failed (`recording_stopped`)."""
    footer = read_footer(run_dir / result.trace) or {}
    step, why = footer.get("stopped_at_step"), footer.get("recording_stopped")
    return replace(result, stopped_at_step=step if isinstance(step, int) else None,
                   recording_stopped=str(why) if why else None)


def run_audit(options: AuditOptions, on_done: Callable[[RepeatResult], None] | None = None,
              on_narrow: Callable[[list[int]], None] | None = None) -> Report:
    """Run, compare and diagnose. Under granularity `auto` a divergent run is re-run once, recording
    ops only around the first divergent step (`on_narrow` is told the window first)."""
    check_script(options.script)
    if options.granularity not in GRANULARITIES:
        raise UsageError(f"unknown granularity {options.granularity!r}; use one of {', '.join(GRANULARITIES)}")
    if options.baseline is not None:  # refuse an unusable baseline before spending time on repeats
        reference = baseline.load(options.baseline)
        if reference.granularity != baseline.effective_granularity(options.granularity):
            raise UsageError(f"--baseline {options.baseline} was recorded at granularity {reference.granularity}; "
                             f"run with --granularity {reference.granularity} to compare with it")
    run_dir = new_run_dir(options.script, options.out_dir)
    record = {
        "format": RUN_FORMAT, "version": RUN_VERSION, "script": str(options.script),
        "script_args": stored_args(options.script_args, options.redact_args), "args_redacted": options.redact_args,
        "cwd": str(Path.cwd()), "repeats": options.repeats,
        "devices": options.devices, "granularity": options.granularity, "timeout": options.timeout,
        "tolerance": asdict(options.tolerance), "env": options.env, "own_device": options.own_device,
        "stdout": options.stdout, "module": options.module, "max_steps": options.max_steps,
        "max_time": options.max_time,
        "baseline": str(options.baseline.resolve()) if options.baseline is not None else None, "results": None,
        **distributed.run_record(options.nproc_per_node, options.torchrun_args),
        "environment": host_environment(), "started": time.time(),
    }
    claim_run(run_dir, record)
    auto = options.granularity == "auto"
    try:
        results = execute(replace(options, granularity="module") if auto else options, run_dir, on_done)
    except Interrupted as exc:  # keep what the repeats recorded: `report` and `compare` can read it
        record["results"], record["interrupted"] = [r.to_dict() for r in exc.results], True
        _write_record(run_dir, record)
        raise
    record["results"] = [r.to_dict() for r in results]
    _write_record(run_dir, record)
    report = analyse(run_dir, record, results)
    window = op_window(report) if auto else None
    if window is not None:
        if on_narrow is not None:
            on_narrow(window)
        narrowed = replace(options, granularity="op", child_config={**options.child_config, "op_window": window})
        try:
            ops_results = execute(narrowed, run_dir, on_done, prefix=OPS_PREFIX)
        except Interrupted:  # the module-level run is whole and recorded: report it without the op re-run
            _write_record(run_dir, record)
            raise
        record["narrowing"] = {"window": window, "prefix": OPS_PREFIX, "results": [r.to_dict() for r in ops_results]}
        _write_record(run_dir, record)
        report = analyse(run_dir, record, results)
    if options.self_check and report.verdict == "deterministic":
        record["self_check"] = self_check(options, run_dir, results[0])
        _write_record(run_dir, record)
        report = analyse(run_dir, record, results)
    write_json(report, run_dir / "report.json", mode=0o600)
    return report


def self_check(options: AuditOptions, run_dir: Path, reference: RepeatResult) -> dict[str, Any] | None:
    """The negative control: one more repeat with a one-ULP change at a chosen record (detaudit/match.py)."""
    chosen = match.choose_record(run_dir / reference.trace)
    if chosen is None:
        return None
    perturbed = replace(options, repeats=1, devices=[reference.device],
                        granularity="module" if options.granularity == "auto" else options.granularity,
                        child_config={**options.child_config, "perturb_record": chosen[0]})
    [result] = execute(perturbed, run_dir, prefix=match.SELF_CHECK_PREFIX)
    if result.exit_code != reference.exit_code or not (run_dir / result.trace).is_file():
        return {"record": chosen[0], "step": chosen[1], "name": chosen[2], "detected_at": None}
    found = match.detect(run_dir / reference.trace, run_dir / result.trace, chosen, options.tolerance, True)
    return asdict(found)


REDACTED = "<redacted>"


def stored_args(args: Sequence[str], redact: bool) -> list[str]:
    """The script arguments as run files and reports keep them: each one replaced under --redact-args."""
    return [REDACTED] * len(args) if redact else list(args)


def op_window(report: Report) -> list[int] | None:
    """Steps to record ops in after a module-level run: the first divergent step and the one before."""
    first = report.comparison.first_divergence
    if first is None or first.record is None or first.record.step < 0 or report.verdict != "divergent" \
            or report.timed_out:
        return None
    step = first.record.step
    return [max(0, step - 1), step]


def op_source(run_dir: Path, record: dict[str, Any], traces: Sequence[Path],
              devices: Sequence[str]) -> OpFinding | None:
    """The op behind the divergence: from the op-level re-run when there was one, else from the
    run's own traces when they hold op records."""
    narrowing = record.get("narrowing")
    if narrowing:
        ops_results = repeat_results(narrowing["results"], run_dir / "run.json", "narrowing.results")
        paths = [run_dir / r.trace for r in ops_results]
        if not all(p.is_file() for p in paths):
            return None
        finding = find_op_source(paths, [r.device for r in ops_results])
        if finding is not None:
            finding = replace(finding, traces=str(narrowing.get("prefix", OPS_PREFIX)), window=narrowing.get("window"))
        return finding
    if not traces or not all(t.is_file() for t in traces) \
            or RecordStream(traces[0]).header.get("granularity") != "op":
        return None
    return find_op_source(traces, devices)


def _write_record(run_dir: Path, record: dict[str, Any]) -> None:
    write_text_atomically(run_dir / "run.json", json.dumps(record, indent=2), mode=0o600)


def load_run(run_dir: Path, stdout: StdoutMode | None = None) -> Report:
    """Rebuild the report of a finished run from its directory; `stdout`: compare stdout this way
    instead of the way the run was recorded with."""
    record, results = read_run(run_dir)
    if stdout is not None:
        record = {**record, "stdout": stdout}
    return analyse(Path(run_dir), record, results)


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[RepeatResult]]:
    """The run record and per-repeat results of a run directory (a partial one after an interrupt too).

    Everything in run.json is checked here: field types (schema.RUN_RECORD) and every file it
    names, which must be a plain file name inside the run directory.
    """
    path = Path(run_dir) / "run.json"
    if not Path(run_dir).exists():
        raise UsageError(f"no such run directory: {run_dir}")
    if not path.is_file():
        raise TraceError(f"{run_dir}: not a detaudit run directory (no run.json)")
    record = read_json_record(path, "run record")
    if not isinstance(record, dict) or record.get("format") != RUN_FORMAT:
        raise TraceError(f"{path}: not a detaudit run record")
    if record.get("version") != RUN_VERSION:
        raise TraceError(f"{path}: run record version {record.get('version')!r} is not supported "
                         f"(this detaudit reads version {RUN_VERSION})")
    schema.check(record, schema.RUN_RECORD, str(path))
    if not record.get("results"):
        raise TraceError(f"{path}: the run did not finish (no results recorded)")
    results = repeat_results(record["results"], path, "results")
    if record.get("narrowing"):
        repeat_results(record["narrowing"]["results"], path, "narrowing.results")
    return record, results


def repeat_results(entries: list[dict[str, Any]], path: Path, where: str) -> list[RepeatResult]:
    """RepeatResults from (schema-checked) run-file entries; the files they name stay in the run directory."""
    results = [RepeatResult(**{k: v for k, v in e.items() if k in _RESULT_FIELDS}) for e in entries]
    for i, r in enumerate(results):
        for key in ("trace", "stdout", "stderr"):
            name = getattr(r, key)
            if not is_plain_name(name):
                raise TraceError(f"{path}: field `{where}[{i}].{key}` must name a file inside the run directory, "
                                 f"not {name!r}")
    return results


_RESULT_FIELDS = frozenset(RepeatResult.__dataclass_fields__)


def tolerance_of(record: dict[str, Any]) -> Tolerance:
    """The run's tolerance (keys this release does not know are ignored)."""
    stored = record.get("tolerance") or {}
    return Tolerance(**{k: float(stored[k]) for k in ("atol", "rtol") if k in stored})


def is_plain_name(name: str) -> bool:
    """A file name with no directory part: it can only resolve inside the run directory."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def read_json_record(path: Path, what: str) -> Any:
    """A JSON record file of a run directory: a regular file, size-capped, deep nesting refused."""
    with open_regular(path, what) as fh:
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise TraceError(f"{path}: {what} larger than {MAX_RECORD_BYTES >> 20} MB; detaudit writes far smaller")
    return load_json(data, f"{path}: unreadable {what}")


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
    results = []
    modes: list[StdoutMode] = []
    for i, path in enumerate(paths):
        path = Path(path)
        if path.is_dir() and (path / baseline.MANIFEST).is_file():
            results.append(replace(baseline.load(path).result, index=i))
        elif path.is_dir():
            run_record, run_results = read_run(path)
            if run_record.get("nproc_per_node"):
                raise UsageError(f"{path} is a torchrun run: it has one trace per rank; compare one rank's traces "
                                 f"(e.g. {path / distributed.Layout.rank_file(run_results[0].trace, 0)})")
            modes.append(recorded_mode(run_record))
            first = run_results[0]
            if not (path / first.trace).is_file():
                raise TraceError(f"{path}: its first repeat left no trace ({first.trace})")
            # absolute, not resolved: a symlink planted in the run directory stays a symlink (never followed)
            results.append(replace(first, index=i, trace=str((path / first.trace).absolute()),
                                   stdout=str((path / first.stdout).absolute()),
                                   stderr=str((path / first.stderr).absolute())))
        elif path.is_file():
            stream = RecordStream(path)
            stream.drain()
            footer = stream.footer  # schema-checked by the reader: exit_code int|None, duration_s a number
            code = None if footer is None else footer.get("exit_code", 0)
            duration = float((footer or {}).get("duration_s", 0.0))
            results.append(RepeatResult(
                index=i, device=str(stream.header.get("device_request", "recorded")), exit_code=code,
                duration_s=duration, timed_out=False, trace=str(path.resolve()), stdout="", stderr="",
                stdout_digest="",
            ))
        elif path.exists():
            raise TraceError(f"{path}: not a regular file or a run directory")
        else:
            raise UsageError(f"no such trace or run directory: {path}")
    record: dict[str, Any] = {"script": ", ".join(str(p) for p in paths), "script_args": [],
              "tolerance": asdict(tolerance or Tolerance()), "environment": host_environment(),
              "stdout": stdout or most_lenient(modes), "argv": None}
    # one label for all when bitwise (a recording's device is shown, not used to loosen the
    # comparison); with a tolerance, every recording is compared with the first within it
    labels = ["recorded"] * len(results) if tolerance is None else [f"recording-{r.index}" for r in results]
    return analyse(Path.cwd(), record, results, bitwise=tolerance is None, labels=labels, explained=False)


def analyse(run_dir: Path, record: dict[str, Any], results: Sequence[RepeatResult], bitwise: bool = True,
            labels: Sequence[str] | None = None, explained: bool = True) -> Report:
    """Compare the traces, find outcome differences and causes, and assemble the Report. Reads only.

    `labels`: the comparison groups (default: each repeat's device; same label bitwise, another
    label within the recorded tolerance of repeat 0). `bitwise` says which the report claims.
    `explained`: attach the `--explain` experiments stored in `run_dir`.
    A torchrun run is analysed rank by rank, each rank with this function (ranks.py).
    """
    if record.get("nproc_per_node"):
        from detaudit import ranks
        return ranks.analyse_ranks(run_dir, record, results, analyse, explained)
    traces = [run_dir / r.trace for r in results]
    if not any(t.is_file() for t in traces) and not any(r.timed_out or r.interrupted for r in results):
        failure = _stderr_tail(run_dir, results[0])
        raise TraceError(f"no trace was written (did the script start?); {failure}" if failure
                         else "no trace was written")
    tolerance = tolerance_of(record)
    devices = list(labels) if labels is not None else [r.device for r in results]
    # a repeat that timed out, was interrupted or hit --max-steps/--max-time was stopped, one recorded
    # elsewhere without a footer has an unknown end, and one whose recording stopped (a hook failed)
    # recorded less: only what every repeat recorded is compared
    comparison = compare_traces(traces, devices, tolerance,
                                truncated=[r.timed_out or r.interrupted or r.exit_code is None
                                           or r.stopped_at_step is not None or r.recording_stopped is not None
                                           for r in results])
    if comparison.recording_failed:  # no records is no evidence: never let it read as "deterministic"
        index, why = next(iter(comparison.recording_failed.items()))
        raise TraceError(f"repeat {index}: detaudit could not record this repeat ({why}); its trace has "
                         f"no evidence to compare. Rerun with DETAUDIT_DEBUG=1 and report it.")
    report = Report(
        script=record["script"], script_args=record.get("script_args", []), run_dir=str(run_dir),
        runs=list(results), comparison=comparison, environment=record.get("environment", {}), bitwise=bitwise,
    )
    # the script's sys.argv in every repeat (the child sets it so); compare_recorded has no one command line
    report.argv = record.get("argv", [str(record["script"]), *record.get("script_args", [])])
    report.stdout_mode = recorded_mode(record)
    report.outcome_divergence = outcome_divergence(results, report.stdout_mode, run_dir)
    first = comparison.first_divergence
    ended = report.outcome_divergence
    if first is None and ended is not None and ended.stdout is not None:
        ended.detail += f"; all {comparison.records_compared} recorded tensor records agree"
    if first is not None and first.category == "structure":
        if report.outcome_divergence is not None:
            first.category = "outcome"
            first.detail = f"{report.outcome_divergence.detail}; {first.detail}"
        cut = [i for i in first.repeats if i < len(results) and not comparison.complete[i]
               and not results[i].timed_out]
        if cut:
            first.detail += (f"; the recording of repeat(s) {', '.join(map(str, cut))} is incomplete "
                             "(no footer: killed, or crashed hard)")
    report.repeat_errors = {r.index: _stderr_tail(run_dir, r) for r in results
                            if r.exit_code not in (0, None) and not r.timed_out and r.stopped_at_step is None}
    if report.verdict == "failed":
        report.failure = report.repeat_errors.get(results[0].index, "")
    if first is not None:
        report.op_finding = op_source(run_dir, record, traces, devices)
    if record.get("baseline"):
        report.baseline = baseline.check(baseline.load(Path(record["baseline"])), run_dir, record, results,
                                         recorded_mode(record))
    if report.first_divergence is not None:
        report.causes = causes.diagnose(report.first_divergence, traces, results, report.op_finding)
        report.inferred = [c.id for c in report.causes]
        if explained:
            explain.apply_saved(report, run_dir)
    if traces and traces[0].is_file():
        report.match = match.describe_match(
            traces[0], comparison, bitwise=bitwise, tolerance=tolerance, devices=[r.device for r in results],
            granularity=str(record.get("granularity") or RecordStream(traces[0]).header.get("granularity", "?")),
            stdout=recorded_mode(record) if all(r.stdout_digest for r in results) else "ignore",
            self_check=match.self_check_from(record.get("self_check")))
    return report


def outcome_divergence(results: Sequence[RepeatResult], stdout: StdoutMode = DEFAULT_STDOUT,
                       run_dir: Path = Path(".")) -> Divergence | None:
    """Repeats that end differently: another exit status, or another line on stdout (docs/stdout.md).

    Only repeats that ended by themselves count: a timed-out repeat, or one stopped by
    --max-steps/--max-time, was stopped, and an incomplete recording's exit status is unknown. Stdout is
    compared between repeats on one device.
    """
    ended = [r for r in results if not r.timed_out and r.exit_code is not None and r.stopped_at_step is None]
    if len(ended) < 2:
        return None
    ref = ended[0]
    codes = [r for r in ended if r.exit_code != ref.exit_code]
    if codes:
        detail = "exit status differs: " + ", ".join(f"repeat {r.index} exited {r.exit_code}" for r in ended)
        return Divergence(-1, "outcome", None, [r.index for r in codes], ref.index, detail=detail)
    printed = [r for r in ended if r.device == ref.device and r.stdout and (run_dir / r.stdout).is_file()]
    if stdout == "ignore" or len(printed) < 2 or printed[0] is not ref:
        return None
    found = compare_stdout([run_dir / r.stdout for r in printed], [r.index for r in printed], stdout)
    if found is None:
        return None
    hint = "; `--stdout ignore` skips stdout" if stdout == "masked" else \
        "; the default `--stdout masked` ignores timings (docs/stdout.md)"
    record = RecordInfo(-1, "stdout", f"line {found.line}", "", "", -1, "", "", "", False)
    return Divergence(-1, "outcome", record, found.repeats, ref.index, stdout=found,
                      detail=f"stdout line {found.line} differs ({found.mode} comparison){hint}")


def _stderr_tail(run_dir: Path, result: RepeatResult, lines: int = 15) -> str:
    """The end of a repeat's stderr file: a regular file in the run directory, its last 64 KB only."""
    if not result.stderr or not is_plain_name(Path(result.stderr).name):
        return ""
    path = run_dir / result.stderr
    try:
        with open_regular(path, "stderr capture", follow_symlinks=False) as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - STDERR_TAIL_BYTES))
            text = fh.read(STDERR_TAIL_BYTES).decode(errors="replace")
    except (OSError, TraceError):
        return ""
    return printable(_ANSI.sub("", error_excerpt(text, lines)))


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour and cursor sequences of a script's coloured output


_LIBRARY_MARKERS = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python")


def error_excerpt(stderr: str, lines: int = 15) -> str:
    """The end of a repeat's stderr; for a long traceback, the user's own frames and the error.

    Library frames (torch's, most often) crowd the user's line out of a plain tail.
    """
    all_lines = stderr.rstrip().splitlines()
    starts = [i for i, line in enumerate(all_lines) if line.startswith("Traceback (most recent call last)")]
    if not starts or len(all_lines) - starts[-1] <= lines:
        return "\n".join(all_lines[-lines:])
    block = all_lines[starts[-1]:]
    frames = [i for i, line in enumerate(block) if line.startswith('  File "')]
    if not frames:  # no frame lines (a chained or hand-written "traceback"): the plain tail
        return "\n".join(all_lines[-lines:])
    end_of_frames = frames[-1] + 1
    while end_of_frames < len(block) and block[end_of_frames].startswith("    "):
        end_of_frames += 1
    kept = [block[0]]
    for n, start in enumerate(frames):
        stop = frames[n + 1] if n + 1 < len(frames) else end_of_frames
        if n == len(frames) - 1 or not any(m in block[start] for m in _LIBRARY_MARKERS):
            kept.extend(block[start:stop])
        elif kept[-1] != "  ...":
            kept.append("  ...")
    return "\n".join(kept + block[end_of_frames:])

