"""The audit pipeline: run repeats -> traces -> compare -> causes -> Report, and reload it from disk.

The run directory holds everything: `run.json` (how it was run and how each repeat ended),
one trace plus stdout/stderr per repeat, and `report.json`. `detaudit report RUN_DIR` rebuilds
the report from these files alone.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from detaudit import __version__, baseline, causes, explain, match
from detaudit.compare import Divergence, RecordInfo, Tolerance, compare_traces
from detaudit.errors import TraceError, UsageError
from detaudit.launcher import Launcher, RepeatResult, plan_repeats
from detaudit.oprules import OpFinding, find_op_source
from detaudit.provenance import git_state
from detaudit.report import Report, write_json, write_text_atomically
from detaudit.stdout import DEFAULT_STDOUT, StdoutMode, compare_stdout, most_lenient, recorded_mode
from detaudit.trace import RecordStream

RUN_FORMAT = "detaudit-run"
RUN_VERSION = 1
DEFAULT_RUNS_DIR = Path(".detaudit") / "runs"
GRANULARITIES = ("step", "module", "op", "auto")
OPS_PREFIX = "ops"  # traces of the op-level re-run under --granularity auto


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
    self_check: bool = False  # --self-check: one extra repeat with a one-ULP change, which must be seen


def new_run_dir(script: Path, out_dir: Path | None) -> Path:
    """A fresh directory for this run; never reuse one that already holds a run."""
    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            raise UsageError(f"--out {out_dir} is a file, not a directory; give a new or empty directory")
        if out_dir.exists() and any(out_dir.iterdir()):
            raise UsageError(f"--out {out_dir} already exists and is not empty; detaudit never overwrites a run")
        out_dir.mkdir(parents=True, exist_ok=True)
        return out_dir
    home = DEFAULT_RUNS_DIR.parent
    if not home.exists():
        home.mkdir(parents=True, exist_ok=True)
        # runs are local artefacts (traces can be large): keep them out of the user's repository
        (home / ".gitignore").write_text("# created by detaudit: its run directories are not for version control\n*\n")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = DEFAULT_RUNS_DIR / f"{stamp}-{script.stem}"
    candidate, n = base, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")


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
    child_config = {**options.child_config, **({"module": options.module} if options.module else {})}
    # the script's commit, found here once: a git subprocess inside a repeat would shift its heap layout
    child_config["git"] = git_state(options.script)
    plans = plan_repeats(run_dir, options.repeats, options.devices, options.granularity, options.env,
                         child_config, prefix=prefix, own_device=options.own_device)
    launcher = Launcher(options.script, options.script_args, options.timeout, options.jobs, cwd=cwd)
    return launcher.run(plans, on_done)


def run_audit(options: AuditOptions, on_done: Callable[[RepeatResult], None] | None = None,
              on_narrow: Callable[[list[int]], None] | None = None) -> Report:
    """Run, compare and diagnose. Under granularity `auto` a divergent run is re-run once, recording
    ops only around the first divergent step (`on_narrow` is told the window first)."""
    if not options.script.is_file():
        raise UsageError(f"script not found: {options.script}")
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
        "script_args": options.script_args, "cwd": str(Path.cwd()), "repeats": options.repeats,
        "devices": options.devices, "granularity": options.granularity, "timeout": options.timeout,
        "tolerance": asdict(options.tolerance), "env": options.env, "own_device": options.own_device,
        "stdout": options.stdout, "module": options.module,
        "baseline": str(options.baseline.resolve()) if options.baseline is not None else None, "results": None,
        "environment": host_environment(), "started": time.time(),
    }
    _write_record(run_dir, record)
    auto = options.granularity == "auto"
    results = execute(replace(options, granularity="module") if auto else options, run_dir, on_done)
    record["results"] = [r.to_dict() for r in results]
    _write_record(run_dir, record)
    report = analyse(run_dir, record, results)
    window = op_window(report) if auto else None
    if window is not None:
        if on_narrow is not None:
            on_narrow(window)
        narrowed = replace(options, granularity="op", child_config={**options.child_config, "op_window": window})
        ops_results = execute(narrowed, run_dir, on_done, prefix=OPS_PREFIX)
        record["narrowing"] = {"window": window, "prefix": OPS_PREFIX, "results": [r.to_dict() for r in ops_results]}
        _write_record(run_dir, record)
        report = analyse(run_dir, record, results)
    if options.self_check and report.verdict == "deterministic":
        record["self_check"] = self_check(options, run_dir, results[0])
        _write_record(run_dir, record)
        report = analyse(run_dir, record, results)
    write_json(report, run_dir / "report.json")
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
        try:
            ops_results = [RepeatResult(**r) for r in narrowing["results"]]
        except (TypeError, KeyError):
            raise TraceError(f"{run_dir}/run.json: malformed narrowing record") from None
        paths = [run_dir / r.trace for r in ops_results]
        if not all(p.is_file() for p in paths):
            return None
        finding = find_op_source(paths, [r.device for r in ops_results])
        if finding is not None:
            finding.traces, finding.window = str(narrowing.get("prefix", OPS_PREFIX)), narrowing.get("window")
        return finding
    if not traces or not all(t.is_file() for t in traces) \
            or RecordStream(traces[0]).header.get("granularity") != "op":
        return None
    return find_op_source(traces, devices)


def _write_record(run_dir: Path, record: dict[str, Any]) -> None:
    write_text_atomically(run_dir / "run.json", json.dumps(record, indent=2))


def load_run(run_dir: Path, stdout: StdoutMode | None = None) -> Report:
    """Rebuild the report of a finished run from its directory; `stdout`: compare stdout this way
    instead of the way the run was recorded with."""
    record, results = read_run(run_dir)
    if stdout is not None:
        record = {**record, "stdout": stdout}
    return analyse(Path(run_dir), record, results)


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[RepeatResult]]:
    """The run record and per-repeat results of a finished run directory."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise TraceError(f"{run_dir}: not a detaudit run directory (no run.json)")
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: unreadable run record ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != RUN_FORMAT:
        raise TraceError(f"{path}: not a detaudit run record")
    if record.get("version") != RUN_VERSION:
        raise TraceError(f"{path}: run record version {record.get('version')} is not supported "
                         f"(this detaudit reads version {RUN_VERSION})")
    if not record.get("results"):
        raise TraceError(f"{path}: the run did not finish (no results recorded)")
    try:
        results = [RepeatResult(**r) for r in record["results"]]
    except TypeError:
        raise TraceError(f"{path}: malformed results") from None
    return record, results


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
            modes.append(recorded_mode(run_record))
            first = run_results[0]
            results.append(replace(first, index=i, trace=str((path / first.trace).resolve()),
                                   stdout=str((path / first.stdout).resolve()),
                                   stderr=str((path / first.stderr).resolve())))
        elif path.is_file():
            stream = RecordStream(path)
            stream.drain()
            footer = stream.footer
            if footer is not None and not isinstance(footer, dict):
                raise TraceError(f"{path}: corrupt trace: the footer is not a JSON object")
            try:
                code = None if footer is None else int(footer.get("exit_code", 0))
                duration = float((footer or {}).get("duration_s", 0.0))
            except (TypeError, ValueError):
                raise TraceError(f"{path}: corrupt trace: the footer's exit_code or duration_s is not a number") \
                    from None
            results.append(RepeatResult(
                index=i, device=str(stream.header.get("device_request", "recorded")), exit_code=code,
                duration_s=duration, timed_out=False, trace=str(path.resolve()), stdout="", stderr="",
                stdout_digest="",
            ))
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
    """
    traces = [run_dir / r.trace for r in results]
    if not any(t.is_file() for t in traces) and not any(r.timed_out for r in results):
        failure = _stderr_tail(run_dir, results[0])
        raise TraceError(f"no trace was written (did the script start?); {failure}" if failure
                         else "no trace was written")
    tolerance = Tolerance(**record.get("tolerance", {}))
    devices = list(labels) if labels is not None else [r.device for r in results]
    # a repeat that timed out was stopped from outside: only what every repeat recorded is compared
    comparison = compare_traces(traces, devices, tolerance, truncated=[r.timed_out for r in results])
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
                            if r.exit_code not in (0, None) and not r.timed_out}
    if report.verdict == "failed":
        report.failure = report.repeat_errors.get(results[0].index, "")
    if first is not None:
        first.op_finding = op_source(run_dir, record, traces, devices)
    if record.get("baseline"):
        report.baseline = baseline.check(baseline.load(Path(record["baseline"])), run_dir, record, results,
                                         recorded_mode(record))
    if report.first_divergence is not None:
        report.causes = causes.diagnose(report.first_divergence, traces, results)
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

    Only repeats that ended by themselves count: a timed-out repeat was stopped, and an
    incomplete recording's exit status is unknown. Stdout is compared between repeats on one device.
    """
    ended = [r for r in results if not r.timed_out and r.exit_code is not None]
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
    try:
        text = (run_dir / result.stderr).read_text(errors="replace")
    except OSError:
        return ""
    return error_excerpt(text, lines)


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

