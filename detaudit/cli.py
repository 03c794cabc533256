"""The `detaudit` command line: parse options, call the library, render, exit with the right code.

Exit codes: 0 deterministic · 1 divergent (including repeats that end differently) ·
2 usage error · 3 the script failed in every repeat · 4 unreadable, corrupt or foreign trace ·
5 a repeat timed out · 6 inconclusive (nothing comparable was recorded) · 7 an output cannot be
written · 129/130/143 interrupted by SIGHUP/Ctrl-C/SIGTERM. Set DETAUDIT_DEBUG=1 to see detaudit's
own traceback on an internal error (70).
"""

from __future__ import annotations

import errno
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from detaudit import __version__
from detaudit.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OUTPUT,
    EXIT_USAGE,
    DetauditError,
    output_error,
)

if TYPE_CHECKING:
    from detaudit.stdout import StdoutMode

EXIT_CODES_HELP = """\b
Exit codes:
  0  deterministic: every repeat agrees
  1  divergent (including repeats that end differently)
  2  usage error (bad option, missing script, --out not empty)
  3  the script failed in every repeat
  4  unreadable, corrupt or foreign trace / run directory
  5  a repeat timed out
  6  inconclusive: nothing comparable was recorded (lost, cut short, no tensor)
  7  an output cannot be written (read-only, disk full, no permission)
  129/130/143 interrupted by SIGHUP / Ctrl-C / SIGTERM
"""

err_console = Console(stderr=True)


class FiniteFloat(click.ParamType):
    """A finite float (nan and inf are refused: they would compare as nothing and write invalid JSON)."""

    name = "float"

    def __init__(self, minimum: float | None = None) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.minimum is not None and number <= self.minimum:
            self.fail(f"{value!r} must be greater than {self.minimum:g}", param, ctx)
        return number

DEFAULT_GRANULARITY = "auto"  # module cost unless the repeats diverge (docs/granularity.md)
PIPE_WIDTH = 1000  # a pipe or CI log: lay the report out this wide, i.e. never wrap it at 80 columns


def _make_console(**settings: Any) -> Console:
    """A rich Console; off a terminal (and without COLUMNS) one that does not wrap at rich's default 80."""
    console = Console(**settings)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(**settings, width=PIPE_WIDTH)
    return console


err_console = _make_console(stderr=True)


def _console(quiet: bool = False) -> Console:
    console = _make_console(quiet=quiet, highlight=False)
    # stdout closed by its reader (`| head`): stop writing, keep the verdict's exit code (rich would exit 1)
    console.on_broken_pipe = _silence_stdout  # type: ignore[method-assign]
    return console


def _silence_stdout() -> None:
    from detaudit.output import silence_stdout

    silence_stdout()


class RunCommand(click.Command):
    """`run`: after SCRIPT, options detaudit does not know are the script's (detaudit/scriptargs.py)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from detaudit.scriptargs import OptionSpec, script_options, split_run_args

        specs = [OptionSpec(frozenset(p.opts + p.secondary_opts), not p.is_flag and not p.count, p.multiple)
                 for p in self.params if isinstance(p, click.Option)]
        split = split_run_args(args, specs, lambda script: script_options(Path(script)), prog=ctx.command_path)
        return super().parse_args(ctx, split.for_parser())


def stdout_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--stdout and its older alias --ignore-stdout (docs/stdout.md)."""
    from detaudit.stdout import STDOUT_MODES

    command = click.option("--ignore-stdout", is_flag=True, help="Same as --stdout ignore.")(command)
    return click.option("--stdout", "stdout_mode", type=click.Choice(STDOUT_MODES), default=None,
                        help="How to compare what the repeats print: masked (default for `run`: line by line, "
                             "timings, rates, timestamps, pids and addresses masked), strict (byte for byte) or "
                             "ignore. `report` and `compare` default to what the runs were recorded with "
                             "(docs/stdout.md).")(command)


def _stdout_mode(stdout_mode: str | None, ignore_stdout: bool) -> StdoutMode | None:
    """The --stdout mode asked for (None: the command's default), with --ignore-stdout as its alias."""
    if ignore_stdout and stdout_mode not in (None, "ignore"):
        raise click.UsageError(f"--ignore-stdout contradicts --stdout {stdout_mode}; give one of them")
    return "ignore" if ignore_stdout else cast("StdoutMode | None", stdout_mode)


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="detaudit")
def cli() -> None:
    """Audit a PyTorch script for run-to-run determinism: is it, where does it first diverge, and why."""


def report_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--json, --junit, --html and --quiet: how every command that produces a report delivers it."""
    command = click.option("-q", "--quiet", is_flag=True, help="Print only the verdict line.")(command)
    command = click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
                           help="Write a self-contained HTML report with plots.")(command)
    command = click.option("--junit", "junit_path", type=click.Path(path_type=Path), default=None,
                           help="Write JUnit XML.")(command)
    return click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
                        help="Write the JSON report.")(command)


def _finish(report: Any, json_path: Path | None, junit_path: Path | None, quiet: bool,
            html_path: Path | None = None, notes: tuple[str, ...] = (), exit_code: int | None = None) -> NoReturn:
    """Write the requested report files, render (`notes` just before the closing summary line), and
    exit with the report's exit code unless told another."""
    from detaudit.html import write_html
    from detaudit.junit import write_junit
    from detaudit.render import render, summary_line
    from detaudit.report import write_json

    if json_path is not None:
        write_json(report, json_path)
    if junit_path is not None:
        write_junit(report, junit_path)
    if html_path is not None:
        write_html(report, html_path)
    # with `--json -` / `--junit -` stdout carries the document alone: the rendering goes to stderr
    console = err_console if "-" in (str(json_path), str(junit_path)) else _console()
    if quiet:
        console.print(summary_line(report), soft_wrap=True)
    else:
        render(report, console, notes)
    sys.exit(report.exit_code if exit_code is None else exit_code)


def _check_outputs(json_path: Path | None, junit_path: Path | None, html_path: Path | None = None) -> None:
    """Before any repeat runs: the report files can be written (else exit 7 now, not after the run)."""
    from detaudit.output import check_writable

    for path in (json_path, junit_path, html_path):
        if path is not None:
            check_writable(path)
    if str(json_path) == "-" and str(junit_path) == "-":
        raise click.UsageError("--json - and --junit - cannot both write to stdout")


def _progress_runner(quiet: bool, total: int, label: str = "running repeats") -> tuple[Any, Any]:
    """A context manager and an on_done callback: a rich bar on a terminal, plain lines otherwise."""
    from contextlib import nullcontext

    if quiet:
        return nullcontext(), None
    if err_console.is_terminal:
        progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=err_console, transient=True)
        task = progress.add_task("repeats", total=total)

        def advance(result: Any) -> None:
            progress.advance(task)

        return progress, advance

    def line(result: Any) -> None:
        status = "timed out" if result.timed_out else f"exit {result.exit_code}"
        if result.stopped_at_step is not None:
            status = f"stopped after step {result.stopped_at_step}"
        name = result.trace.removesuffix(".trace")
        err_console.print(f"{name} ({result.device}): {status} in {result.duration_s:.1f}s")

    return nullcontext(), line


@cli.command(cls=RunCommand, epilog=EXIT_CODES_HELP)
@click.argument("script", type=click.Path(path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("-n", "--repeats", type=click.IntRange(min=2), default=3, show_default=True,
              help="Repeats per device.")
@click.option("--device", "devices", type=click.Choice(["cpu", "cuda", "auto"]), multiple=True,
              help="Device to run on; repeat the option to compare devices within --atol/--rtol "
                   "(`--device cpu --device cuda`; with cpu the script sees no GPU). "
                   "[default: auto = wherever the script itself runs, unchanged]")
@click.option("--timeout", type=FiniteFloat(minimum=0), default=None, help="Seconds allowed per repeat.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Run directory (default: a new folder under .detaudit/runs/).")
@report_options
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Repeats run in parallel.")
@click.option("--atol", type=FiniteFloat(), default=1e-5, show_default=True, help="Cross-device absolute tolerance.")
@click.option("--rtol", type=FiniteFloat(), default=1.3e-6, show_default=True, help="Cross-device relative tolerance.")
@stdout_options
@click.option("--granularity", type=click.Choice(["step", "module", "op", "auto"]), default=DEFAULT_GRANULARITY,
              show_default=True,
              help="What each repeat records. step: gradients, parameters and optimizer state at each optimizer "
                   "step. module: also every module's output. op: also every aten op with its inputs (slowest). "
                   "auto: module; if the repeats diverge, re-run them once recording ops around the first "
                   "divergent step, to name the op and the line (docs/granularity.md).")
@click.option("--explain", is_flag=True, help="If the repeats diverge, confirm the causes by re-running with one "
              "source pinned at a time (docs/causes.md).")
@click.option("--explain-all", is_flag=True, help="With --explain: try every candidate pin, not only up to the "
              "first that confirms a cause.")
@click.option("--budget", type=click.IntRange(min=1), default=None,
              help="With --explain: most extra repeats the experiments may run. [default: 12]")
@click.option("--max-steps", type=click.IntRange(min=1), default=None,
              help="Stop each repeat right after its N-th optimizer step, as if the script ended there (a script "
                   "with no optimizer: its N-th call of the model). Exit status and later stdout are not compared.")
@click.option("--max-time", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop each repeat at the first step boundary after SECONDS; the steps every repeat completed "
                   "are compared.")
@click.option("--baseline", "baseline_dir", type=click.Path(path_type=Path), default=None,
              help="Also compare with this recorded baseline (from --save-baseline); exit 1 if the run differs "
                   "from it, naming what changed in the environment.")
@click.option("--save-baseline", "save_baseline", type=click.Path(path_type=Path), default=None,
              help="If the repeats agree, keep the first as a baseline in this directory (small; commit it "
                   "or keep it as a CI artifact).")
@click.option("--redact-args", is_flag=True, help="Store the script's arguments nowhere (run directory, traces, "
              "reports): each is written as <redacted>. The script still receives them.")
@click.option("--no-explain", is_flag=True, help="Do not run the default confirmation: when the top cause has "
              "one cheap, decisive experiment (a pinned RNG seed, PYTHONHASHSEED=0, address randomization off), a "
              "divergent run re-runs the script twice with it to confirm the cause.")
@click.option("--self-check", is_flag=True, help="If the repeats agree, run one more with a one-ULP change injected "
              "into one recorded tensor, which must be reported at exactly that record: proof the audit could have "
              "seen a difference.")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=None,
              help="Run each repeat under torchrun with this many ranks, every rank recorded "
                   "(docs/distributed.md).")
@click.option("--torchrun-args", default="", metavar="ARGS",
              help="With --nproc-per-node: further torchrun options, as one quoted string "
                   "(`--torchrun-args \"--nnodes 2 --rdzv-endpoint host:29400\"`).")
def run(script: Path, script_args: tuple[str, ...], repeats: int, devices: tuple[str, ...], timeout: float | None,
        out_dir: Path | None, json_path: Path | None, junit_path: Path | None, jobs: int, atol: float,
        rtol: float, quiet: bool, stdout_mode: str | None, ignore_stdout: bool, granularity: str, explain: bool,
        explain_all: bool, budget: int | None, html_path: Path | None = None, baseline_dir: Path | None = None,
        save_baseline: Path | None = None, redact_args: bool = False, max_steps: int | None = None,
        max_time: float | None = None, no_explain: bool = False, self_check: bool = False,
        nproc_per_node: int | None = None, torchrun_args: str = "") -> None:
    """Run SCRIPT several times, each in a fresh interpreter, and compare what it computed.

    Options may come before or after SCRIPT. After SCRIPT, an option detaudit does not know goes to the
    script with everything after it (`detaudit run train.py data.txt --epochs 1 -n 5` gives the script
    `data.txt --epochs 1 -n 5`); one the script defines too is refused with both spellings. Arguments
    after `--` go to the script untouched: `detaudit run train.py --repeats 5 -- --epochs 1`.
    """
    from detaudit.audit import AuditOptions, Checks, Recording, Schedule, Target
    from detaudit.compare import Tolerance
    from detaudit.devices import own_device, resolve_devices
    from detaudit.stdout import DEFAULT_STDOUT

    _check_outputs(json_path, junit_path, html_path)

    options = AuditOptions(
        Target(script, list(script_args), redact_args=redact_args),
        Schedule(repeats=repeats, devices=resolve_devices(devices), own_device=own_device(devices), timeout=timeout,
                 jobs=jobs, **_torchrun(nproc_per_node, torchrun_args,
                                        baseline_dir is not None or save_baseline is not None, max_time is not None)),
        Recording(granularity=granularity, max_steps=max_steps, max_time=max_time),
        Checks(tolerance=Tolerance(atol, rtol), stdout=_stdout_mode(stdout_mode, ignore_stdout) or DEFAULT_STDOUT,
               baseline=baseline_dir, self_check=self_check),
        out_dir=out_dir,
    )
    report = _audit(options, explain or explain_all, explain_all, budget, quiet, cheap=not no_explain)
    if save_baseline is not None:
        _save_baseline(report, save_baseline)
    _finish(report, json_path, junit_path, quiet, html_path)


def _warn_oversubscription(jobs: int, devices: list[str]) -> None:
    from detaudit.devices import oversubscription

    warning = oversubscription(jobs, devices, os.environ, os.cpu_count())
    if warning is not None:
        err_console.print(f"[bold yellow]detaudit: warning:[/] {escape(warning)}", soft_wrap=True)


def _audit(options: Any, explain: bool, explain_all: bool, budget: int | None, quiet: bool,
           cheap: bool = False) -> Any:
    """Run the audit with progress on stderr, and the experiments when asked and the repeats diverged;
    `cheap`: otherwise the top cause's one cheap, decisive experiment, if it has one (explain.cheap_pin)."""
    from detaudit.audit import run_audit
    from detaudit.explain import cheap_pin

    schedule = options.schedule
    _warn_oversubscription(schedule.jobs, schedule.devices)
    context, on_done = _progress_runner(quiet, schedule.repeats * len(schedule.devices))

    def on_narrow(window: list[int]) -> None:
        if isinstance(context, Progress):
            context.reset(context.task_ids[0])
        if not quiet:
            err_console.print(f"the repeats diverged; re-running them recording ops in steps {window[0]}–{window[1]}")

    with context:
        report = run_audit(options, on_done, on_narrow)
    if report.verdict == "divergent" and not report.timed_out:
        args = options.target.script_args if options.target.redact_args else None
        if explain:
            report = _explain(Path(report.run_dir), budget, explain_all, schedule.jobs, quiet, args)
        elif cheap and cheap_pin(report.causes) is not None:
            report = _explain(Path(report.run_dir), None, False, schedule.jobs, quiet, args, cheap=True)
    return report


def _save_baseline(report: Any, dest: Path) -> None:
    from detaudit import baseline

    try:
        saved = baseline.save(Path(report.run_dir), report, dest)
    except DetauditError as exc:  # the run's own verdict and exit code still stand
        err_console.print(f"[bold yellow]detaudit:[/] {escape(str(exc))}", soft_wrap=True)
        return
    size = sum(p.stat().st_size for p in saved.iterdir() if p.is_file())
    err_console.print(f"baseline saved to {escape(str(saved))} ({size / 1024:.1f} KiB)", soft_wrap=True)


def _torchrun(nproc_per_node: int | None, torchrun_args: str, baseline: bool, max_time: bool) -> dict[str, Any]:
    """Schedule fields of --nproc-per-node/--torchrun-args."""
    from detaudit.distributed import parse_torchrun_args

    if not nproc_per_node:
        if torchrun_args:
            raise click.UsageError("--torchrun-args needs --nproc-per-node")
        return {}
    if baseline:
        raise click.UsageError("--baseline and --save-baseline do not support --nproc-per-node yet (a baseline "
                               "keeps one trace; a torchrun run has one per rank)")
    if max_time:
        raise click.UsageError("--max-time cannot bound a torchrun run: each rank would stop by its own clock, "
                               "at different steps, and leave the others waiting in a collective; use --max-steps")
    return {"nproc_per_node": nproc_per_node, "torchrun_args": parse_torchrun_args(torchrun_args)}


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("run_dir", type=click.Path(path_type=Path))
@stdout_options
@report_options
def report(run_dir: Path, stdout_mode: str | None, ignore_stdout: bool, json_path: Path | None,
           junit_path: Path | None, quiet: bool, html_path: Path | None) -> None:
    """Re-render the report of a finished run from its directory (stdout compared as recorded unless --stdout)."""
    from detaudit.audit import load_run

    _check_outputs(json_path, junit_path, html_path)
    _finish(load_run(run_dir, _stdout_mode(stdout_mode, ignore_stdout)), json_path, junit_path, quiet, html_path)


def _explain(run_dir: Path, budget: int | None, explain_all: bool, jobs: int, quiet: bool,
             script_args: list[str] | None = None, cheap: bool = False) -> Any:
    from detaudit.explain import CHEAP_REPEATS, DEFAULT_BUDGET, run_experiments

    def line(experiment: Any) -> None:
        if not quiet:
            err_console.print(f"explain: pinned {escape(experiment.description)} -> {experiment.verdict}"
                              + (f" ({escape(experiment.note)})" if experiment.note else ""))

    budget = budget or DEFAULT_BUDGET
    if not quiet:
        err_console.print("explain: confirming the top cause with its one cheap experiment (--no-explain skips it)"
                          if cheap else f"explain: re-running with one source of nondeterminism pinned at a time "
                          f"(at most {budget} more repeats)")
    context, on_done = _progress_runner(quiet, CHEAP_REPEATS if cheap else budget, "explain: pinned repeats")
    with context:
        return run_experiments(run_dir, budget, explain_all, jobs=jobs, on_done=on_done, on_experiment=line,
                               script_args=script_args, cheap=cheap)


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--budget", type=click.IntRange(min=1), default=None,
              help="Most extra repeats the experiments may run. [default: 12]")
@click.option("--all", "explain_all", is_flag=True,
              help="Try every candidate pin, not only up to the first that confirms a cause.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Repeats run in parallel.")
@report_options
def explain(run_dir: Path, budget: int | None, explain_all: bool, jobs: int, json_path: Path | None,
            junit_path: Path | None, quiet: bool, html_path: Path | None) -> None:
    """Confirm why a finished run diverged: re-run it with one source pinned at a time.

    Each experiment pins one candidate source (seeded RNGs, PYTHONHASHSEED, deterministic
    algorithms, one thread, ...), in the order of the ranked causes (a toss-up's separating experiment
    first); a cause whose pin alone makes the repeats agree is marked confirmed. If only every pin at
    once does, the set of pins is bisected down to one source. Results are stored in RUN_DIR
    (explain.json), so `detaudit report RUN_DIR` shows them too.
    """
    _check_outputs(json_path, junit_path, html_path)
    from detaudit.rundir import read_run

    record, _ = read_run(run_dir)
    _warn_oversubscription(jobs, list(record.get("devices") or ["cpu"]))
    _finish(_explain(run_dir, budget, explain_all, jobs, quiet), json_path, junit_path, quiet, html_path)


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("recordings", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--atol", type=FiniteFloat(), default=None,
              help="Compare within this absolute tolerance instead of bitwise.")
@click.option("--rtol", type=FiniteFloat(), default=None,
              help="Compare within this relative tolerance instead of bitwise.")
@stdout_options
@report_options
def compare(recordings: tuple[Path, ...], atol: float | None, rtol: float | None, stdout_mode: str | None,
            ignore_stdout: bool, json_path: Path | None, junit_path: Path | None, quiet: bool,
            html_path: Path | None) -> None:
    """Compare traces (or run directories, or baselines) recorded elsewhere: another machine, another release.

    Bitwise by default; give --atol/--rtol to compare within a tolerance (as across devices).
    A run directory contributes its first repeat, and its stdout, compared as the runs were recorded
    (the most lenient of their --stdout modes) unless --stdout says otherwise; a baseline
    (--save-baseline) contributes its reference trace.
    """
    from detaudit.audit import compare_recorded
    from detaudit.compare import Tolerance

    _check_outputs(json_path, junit_path, html_path)
    tolerance = None
    if atol is not None or rtol is not None:
        tolerance = Tolerance(atol if atol is not None else 0.0, rtol if rtol is not None else 0.0)
    _finish(compare_recorded(list(recordings), tolerance, _stdout_mode(stdout_mode, ignore_stdout)),
            json_path, junit_path, quiet, html_path)


@cli.command()
@click.argument("trace_path", metavar="TRACE", type=click.Path(path_type=Path))
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="Records to print (0: all).")
@click.option("--events/--no-events", default=True, show_default=True, help="Print evidence events.")
def show(trace_path: Path, limit: int, events: bool) -> None:
    """Print one trace readably: header, records, evidence events and footer."""
    from detaudit.align import Aligner, describe
    from detaudit.safetext import printable
    from detaudit.trace import RecordStream

    def clean(value: Any) -> str:  # a trace may come from anywhere: no markup, no terminal controls
        return escape(printable(str(value)))

    if not trace_path.exists():
        raise click.UsageError(f"no such trace: {trace_path}")
    stream = RecordStream(trace_path)
    console = _console()
    console.print(f"[bold]{clean(trace_path)}[/] — format {clean(stream.header.get('format'))} "
                  f"v{clean(stream.header.get('version'))}")
    for key in ("script", "argv", "repeat", "device_request", "granularity", "torch", "pid"):
        if key in stream.header:
            console.print(f"  {key}: {clean(stream.header[key])}")
    def new_table(header: bool) -> Table:
        table = Table(show_edge=False, show_header=header)
        for col in ("#", "step", "kind", "name", "tensor", "digest", "location"):
            table.add_column(col, no_wrap=col == "digest", min_width=16 if col == "digest" else None)
        return table

    table = new_table(True)
    shown = 0
    total = 0
    aligner = Aligner([stream], chunk=4096)  # a lockstep walk of one trace: bounded memory, strings checked
    for block in aligner:
        for row in block.chunks[0]:
            if limit == 0 or shown < limit:
                info = describe(stream, row, total)
                name = (f"{info.op} ({info.node or 'bwd'})" if info.backward else f"{info.op} (fwd)") \
                    + (f" in {info.module}" if info.module else "") if info.op else info.name
                table.add_row(str(total), str(info.step), info.kind, clean(name), clean(f"{info.dtype}[{info.shape}]"),
                              f"{int(row['digest']):016x}", clean(info.location))
                shown += 1
            total += 1
        if table.row_count >= 4096:  # printed as it goes: `--limit 0` on a long trace keeps memory bounded
            console.print(table)
            table = new_table(False)
    aligner.finish()
    if table.row_count or not shown:
        console.print(table)
    if limit and total > shown:
        console.print(f"  … {total - shown} more records (use --limit 0 to print all)")
    if events and stream.events:
        console.print("[bold]Evidence events[/]")
        for event in stream.events:
            console.print("  " + clean(event))
    if stream.footer is None:
        console.print("[bold yellow]incomplete[/]: no footer (the repeat was killed or crashed hard)")
    else:
        console.print(f"footer: {clean(stream.footer)}")


@cli.command()
@click.option("-n", "--repeats", type=click.IntRange(min=2), default=3, show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None)
def demo(repeats: int, out_dir: Path | None) -> None:
    """Audit a small training script shipped with detaudit (with --explain), to see a real report.

    The script diverges on purpose: the demo exits 0 when it found that divergence (`run` exits 1 on one).
    """
    from detaudit.audit import AuditOptions, Recording, Schedule, Target
    from detaudit.devices import oversubscription, own_device, resolve_devices

    script = Path(str(resources.files("detaudit") / "demo" / "train_demo.py"))
    devices = resolve_devices(())
    jobs = 2 if oversubscription(2, devices, os.environ, os.cpu_count()) is None else 1
    options = AuditOptions(Target(script), Schedule(repeats, devices, own_device(()), timeout=120.0, jobs=jobs),
                           Recording(DEFAULT_GRANULARITY), out_dir=out_dir)
    report = _audit(options, True, False, None, False)
    if report.verdict == "divergent":
        note = ("The demo script diverges on purpose (an unseeded NumPy RNG), so this demo exits 0: it showed "
                "what it meant to. `detaudit run` on your own script exits 1 on a divergence.")
        _finish(report, None, None, False, notes=(note,), exit_code=0)
    if report.verdict == "deterministic":
        _finish(report, None, None, False, notes=("The demo meant to show a divergence, but the repeats agreed.",),
                exit_code=1)
    _finish(report, None, None, False)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _on_stop_signal(signum: int, frame: Any) -> None:
    """Ctrl-C, SIGTERM (CI cancellation, `timeout`) and SIGHUP all stop the run the same way.

    The first raises `Interrupted` where the main thread is: the launcher stops every repeat's
    process group and the CLI exits 128+signal. Any further one (impatience, or a second
    SIGTERM from CI) kills every repeat's group at once and lets the stop finish: never a hang,
    never a traceback.
    """
    from detaudit import launcher

    global _interrupted
    if _interrupted:
        launcher.hurry()
        return
    _interrupted = True
    raise launcher.Interrupted(signum)


_interrupted = False


def _interrupt_message(exc: BaseException) -> tuple[str, int]:
    from detaudit.launcher import Interrupted

    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    text = f"detaudit: interrupted ({name}); every repeat was stopped"
    run_dir = exc.run_dir if isinstance(exc, Interrupted) else None
    if run_dir is not None and (Path(run_dir) / "run.json").is_file():
        text += (f". What the repeats recorded is in {run_dir}: `detaudit report {run_dir}` shows it, "
                 f"`detaudit compare {run_dir}/repeat-0.trace {run_dir}/repeat-1.trace` compares two recordings "
                 "as far as they go")
    return text, 128 + signum


def main(argv: list[str] | None = None) -> None:
    """Entry point: the one place that turns errors into messages and exit codes."""
    from detaudit.safetext import printable

    global _interrupted
    _interrupted = False
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, _on_stop_signal) for signum in _STOP_SIGNALS}
    try:
        _main(argv, printable)
    finally:
        for signum, handler in previous.items():
            # interrupted: every repeat is already stopped and detaudit is exiting; a late signal is ignored
            # (python resets its own handlers to the default while it shuts down: one would kill it mid-exit)
            signal.signal(signum, signal.SIG_IGN if _interrupted else handler)


def _main(argv: list[str] | None, printable: Callable[[str], str]) -> None:
    try:
        cli.main(args=argv, prog_name="detaudit", standalone_mode=False)
    except click.exceptions.Abort as exc:  # click turns a KeyboardInterrupt (our Interrupted) into Abort
        text, code = _interrupt_message(exc.__context__) if isinstance(exc.__context__, KeyboardInterrupt) \
            else ("detaudit: interrupted", EXIT_INTERRUPTED)
        err_console.print(escape(printable(text)), soft_wrap=True)
        sys.exit(code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE if exc.exit_code not in (0,) else 0)
    except DetauditError as exc:
        # soft_wrap: one line however long the path in it (CI logs and grep read it whole)
        err_console.print(f"[bold red]detaudit: error:[/] {escape(printable(str(exc)))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        text, code = _interrupt_message(exc)
        err_console.print(escape(printable(text)), soft_wrap=True)
        sys.exit(code)
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS or os.environ.get("DETAUDIT_DEBUG"):
            _internal_error(exc)
        err_console.print(f"[bold red]detaudit: error:[/] {escape(printable(str(output_error(exc.filename, exc))))}",
                          soft_wrap=True)
        sys.exit(EXIT_OUTPUT)
    except Exception as exc:
        _internal_error(exc)


_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM, errno.EFBIG}


def _internal_error(exc: Exception) -> NoReturn:
    if os.environ.get("DETAUDIT_DEBUG"):
        raise exc
    err_console.print(f"[bold red]detaudit: internal error:[/] {escape(type(exc).__name__)}: {escape(str(exc))}. "
                      "This is a bug in detaudit; rerun with DETAUDIT_DEBUG=1 for a traceback and report it.",
                      soft_wrap=True)
    sys.exit(EXIT_INTERNAL)
