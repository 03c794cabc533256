"""The `detaudit` command line: parse options, call the library, render, exit with the right code.

The commands, their help, and the one place that turns errors into messages and exit codes
(`main`); options become library values in options.py, and what a command shows while the
library works, and how it ends, is session.py.

Exit codes: errors.ExitCode (every command's --help lists them). Set DETAUDIT_DEBUG=1 to see
detaudit's own traceback on an internal error.
"""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.markup import escape
from rich.table import Table

from detaudit import __version__
from detaudit.cli.options import (
    DEFAULT_GRANULARITY,
    TOLERANCE,
    RunCommand,
    audit_option_group,
    check_outputs,
    compare_tolerance,
    demo_options,
    devices_option,
    jobs_option,
    max_steps_option,
    max_time_option,
    nproc_option,
    out_option,
    perturb_option,
    repeats_option,
    report_options,
    script_arguments,
    stdout_mode_of,
    stdout_options,
    timeout_option,
    torchrun_args_option,
)
from detaudit.cli.session import (
    audit_run,
    err_console,
    explain_run,
    finish,
    save_baseline_to,
    stdout_console,
    warn_oversubscription,
)
from detaudit.errors import DetauditError, ExitCode, output_error
from detaudit.results import EXTRA_STEPS

if TYPE_CHECKING:
    from detaudit.audit.pipeline import AuditOptions


def exit_codes_help(codes: Sequence[ExitCode] = tuple(ExitCode), meanings: Mapping[ExitCode, str] | None = None) -> str:
    """An exit-code table as --help ends with it (`\\b`: click keeps the lines as they are): `codes` with their
    meanings (`meanings`: a command's own words for a code, its verdicts')."""
    words = meanings or {}
    return "\b\nExit codes:\n" + "".join(f"  {int(code):<4} {words.get(code, code.meaning)}\n" for code in codes)


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=exit_codes_help())
@click.version_option(__version__, prog_name="detaudit")
def cli() -> None:
    """Audit a PyTorch script for run-to-run determinism: is it, where does it first diverge, and why."""


@click.command(cls=RunCommand)
@script_arguments
@repeats_option("Repeats per device (with --perturb: per device and combination of settings).")
@devices_option("Device to run on; repeat the option to compare devices within --atol/--rtol "
                "(`--device cpu --device cuda`; with cpu the script sees no GPU). "
                "[default: auto = wherever the script itself runs, unchanged]")
@timeout_option()
@out_option
@report_options
@jobs_option()
@click.option("--atol", type=TOLERANCE, default=1e-5, show_default=True, help="Cross-device absolute tolerance.")
@click.option("--rtol", type=TOLERANCE, default=1.3e-6, show_default=True, help="Cross-device relative tolerance.")
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
@max_steps_option("Stop each repeat right after its N-th optimizer step, as if the script ended there (a script "
                  "with no optimizer: its N-th call of the model). Exit status and later stdout are not compared.")
@max_time_option("Stop each repeat at the first step boundary after SECONDS; the steps every repeat completed "
                 "are compared.")
@click.option("--run-to-end", is_flag=True,
              help="Run every repeat to its end. By default a repeat is compared with repeat 0 while it runs and "
                   f"stopped {EXTRA_STEPS} optimizer steps after the step it first diverged in (as --max-steps "
                   "would stop it), which is enough for the spread table; its exit status and later stdout are "
                   "then not compared.")
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
@nproc_option("Run each repeat under torchrun with this many ranks, every rank recorded (docs/distributed.md).")
@perturb_option
@torchrun_args_option("With --nproc-per-node: further torchrun options, as one quoted string "
                      "(`--torchrun-args \"--nnodes 2 --rdzv-endpoint host:29400\"`).")
@click.option("--fail-on-repeated-randomness", "fail_on_repeats", is_flag=True,
              help="Exit 1 when draws repeat where they should differ (the report's \"Randomness that repeats\"; "
                   "docs/causes.md), even if the repeats agree.")
@audit_option_group()
def run(options: AuditOptions, json_path: Path | None, junit_path: Path | None, html_path: Path | None,
        sarif_path: Path | None, quiet: bool, explain: bool, explain_all: bool, budget: int | None, no_explain: bool,
        save_baseline: Path | None) -> None:
    """Run SCRIPT several times, each in a fresh interpreter, and compare what it computed.

    Options may come before or after SCRIPT. After SCRIPT, an option detaudit does not know goes to the
    script with everything after it (`detaudit run train.py data.txt --epochs 1 -n 5` gives the script
    `data.txt --epochs 1 -n 5`); one the script defines too is refused with both spellings. Arguments
    after `--` go to the script untouched: `detaudit run train.py --repeats 5 -- --epochs 1`.
    """
    from detaudit.run.distributed import NODES_FOLLOW_UP, multi_node

    if (explain or explain_all) and multi_node(options.schedule.torchrun_args):
        raise click.UsageError(NODES_FOLLOW_UP.format("--explain"))
    if (explain or explain_all) and options.schedule.perturbation is not None:
        raise click.UsageError("--explain and --perturb cannot be combined: --perturb's repeats already differ on "
                               "purpose; audit with --explain and with --perturb in two runs")
    baseline_dir = options.checks.baseline
    check_outputs(json_path, junit_path, html_path, save_baseline=save_baseline, out_dir=options.out_dir,
                  sarif_path=sarif_path,
                  inputs={"the audited script": options.target.script,
                          **({"the --baseline": baseline_dir} if baseline_dir else {})})
    report = audit_run(options, explain or explain_all, explain_all, budget, quiet, cheap=not no_explain)
    code = save_baseline_to(report, save_baseline) if save_baseline is not None else None
    finish(report, json_path, junit_path, quiet, html_path, exit_code=code, sarif_path=sarif_path)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@stdout_options
@report_options
def report(run_dir: Path, stdout_mode: str | None, ignore_stdout: bool, json_path: Path | None,
           junit_path: Path | None, quiet: bool, html_path: Path | None, sarif_path: Path | None) -> None:
    """Re-render the report of a finished run from its directory (stdout compared as recorded unless --stdout)."""
    from detaudit.audit.pipeline import load_run

    check_outputs(json_path, junit_path, html_path, inputs={"the run directory": run_dir}, sarif_path=sarif_path)
    finish(load_run(run_dir, stdout_mode_of(stdout_mode, ignore_stdout)), json_path, junit_path, quiet, html_path,
           sarif_path=sarif_path)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--budget", type=click.IntRange(min=1), default=None,
              help="Most extra repeats the experiments may run. [default: 12]")
@click.option("--all", "explain_all", is_flag=True,
              help="Try every candidate pin, not only up to the first that confirms a cause.")
@jobs_option()
@report_options
def explain(run_dir: Path, budget: int | None, explain_all: bool, jobs: int, json_path: Path | None,
            junit_path: Path | None, quiet: bool, html_path: Path | None, sarif_path: Path | None) -> None:
    """Confirm why a finished run diverged: re-run it with one source pinned at a time.

    Each experiment pins one candidate source (seeded RNGs, PYTHONHASHSEED, deterministic
    algorithms, one thread, ...), in the order of the ranked causes (a toss-up's separating experiment
    first); a cause whose pin alone makes the repeats agree is marked confirmed. If only every pin at
    once does, the set of pins is bisected down to one source. Results are stored in RUN_DIR
    (explain.json), so `detaudit report RUN_DIR` shows them too.
    """
    check_outputs(json_path, junit_path, html_path, inputs={"the run directory": run_dir}, sarif_path=sarif_path)
    from detaudit.run.rundir import read_run

    record, _ = read_run(run_dir)
    warn_oversubscription(jobs, list(record.devices or ["cpu"]))
    finish(explain_run(run_dir, budget, explain_all, jobs, quiet), json_path, junit_path, quiet, html_path,
           sarif_path=sarif_path)


@click.command()
@click.argument("recordings", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--atol", type=TOLERANCE, default=None,
              help="Compare within this absolute tolerance instead of bitwise.")
@click.option("--rtol", type=TOLERANCE, default=None,
              help="Compare within this relative tolerance instead of bitwise.")
@stdout_options
@report_options
def compare(recordings: tuple[Path, ...], atol: float | None, rtol: float | None, stdout_mode: str | None,
            ignore_stdout: bool, json_path: Path | None, junit_path: Path | None, quiet: bool,
            html_path: Path | None, sarif_path: Path | None) -> None:
    """Compare traces (or run directories, or baselines) recorded elsewhere: another machine, another release.

    Bitwise by default; give --atol/--rtol to compare within a tolerance (as across devices).
    A run directory contributes its first repeat, and its stdout, compared as the runs were recorded
    (the most lenient of their --stdout modes) unless --stdout says otherwise; a baseline
    (--save-baseline) contributes its reference trace. The run directories of a multi-node torchrun
    job's nodes (one `run` per node), given together, are compared as one job: every repeat and rank.
    """
    from detaudit.audit.pipeline import compare_recorded

    check_outputs(json_path, junit_path, html_path, inputs={f"the recording {path}": path for path in recordings},
                  sarif_path=sarif_path)
    stdout = stdout_mode_of(stdout_mode, ignore_stdout)
    report = compare_recorded(list(recordings), compare_tolerance(atol, rtol), stdout)
    finish(report, json_path, junit_path, quiet, html_path, sarif_path=sarif_path)


@click.command()
@click.argument("trace_path", metavar="TRACE", type=click.Path(path_type=Path))
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="Records to print (0: all).")
@click.option("--events/--no-events", default=True, show_default=True, help="Print evidence events.")
def show(trace_path: Path, limit: int, events: bool) -> None:
    """Print one trace readably: header, records, evidence events and footer."""
    from detaudit.run.files import naming

    with naming("standard output"):
        _show(trace_path, limit, events)


def _show(trace_path: Path, limit: int, events: bool) -> None:
    from detaudit.compare.listing import TraceListing
    from detaudit.safetext import printable

    def clean(value: Any) -> str:  # a trace may come from anywhere: no markup, no terminal controls
        return escape(printable(str(value)))

    if not trace_path.exists():
        raise click.UsageError(f"no such trace: {trace_path}")
    if trace_path.is_dir():
        traces = sorted(p.name for p in trace_path.glob("repeat-*.trace"))[:2]
        hint = f"; this run directory has {', '.join(traces)}" if traces else ""
        raise click.UsageError(f"{trace_path} is a directory: `show` prints one trace file{hint} "
                               "(`detaudit report RUN_DIR` shows a run)")
    listing = TraceListing(trace_path)
    console = stdout_console()
    console.print(f"[bold]{clean(trace_path)}[/] — format {clean(listing.header.get('format'))} "
                  f"v{clean(listing.header.get('version'))}")
    for key in ("script", "argv", "repeat", "device_request", "granularity", "torch", "pid"):
        if key in listing.header:
            console.print(f"  {key}: {clean(listing.header[key])}")

    def new_table(header: bool) -> Table:
        table = Table(show_edge=False, show_header=header)
        for col in ("#", "step", "kind", "name", "tensor", "digest", "location"):
            table.add_column(col, no_wrap=col == "digest", min_width=16 if col == "digest" else None)
        return table

    table = new_table(True)
    shown = total = 0
    for row in listing.records():
        if limit == 0 or shown < limit:
            table.add_row(str(row.index), str(row.step), row.kind, clean(row.name), clean(row.tensor), row.digest,
                          clean(row.location))
            shown += 1
        total += 1
        if table.row_count >= 4096:  # printed as it goes: `--limit 0` on a long trace keeps memory bounded
            console.print(table)
            table = new_table(False)
    if table.row_count or not shown:
        console.print(table)
    if limit and total > shown:
        console.print(f"  … {total - shown} more records (use --limit 0 to print all)")
    if events and listing.events:
        console.print("[bold]Evidence events[/]")
        for event in listing.events:
            console.print("  " + clean(event))
    if listing.footer is None:
        console.print(f"[bold yellow]incomplete[/]: no footer {listing.why_no_footer()}")
    else:
        console.print(f"footer: {clean(listing.footer)}")


@click.command()
@click.option("-n", "--repeats", type=click.IntRange(min=2), default=3, show_default=True)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None)
def demo(repeats: int, out_dir: Path | None) -> None:
    """Audit a small training script shipped with detaudit (with --explain), to see a real report.

    The script diverges on purpose: the demo exits 0 when it found that divergence (`run` exits 1 on one).
    """
    script = Path(str(resources.files("detaudit") / "demo" / "train_demo.py"))
    report = audit_run(demo_options(script, repeats, out_dir), True, False, None, False)
    if report.verdict == "divergent":
        note = ("The demo script diverges on purpose (an unseeded NumPy RNG), so this demo exits 0: it showed "
                "what it meant to. `detaudit run` on your own script exits 1 on a divergence.")
        finish(report, None, None, False, notes=(note,), exit_code=0)
    if report.verdict == "deterministic":
        finish(report, None, None, False, notes=("The demo meant to show a divergence, but the repeats agreed.",),
                exit_code=1)
    finish(report, None, None, False)


# What every command can exit with: 0, a usage error, an unreadable input, an output that cannot be written, a bug,
# an interrupt (main() maps these for every command); a command that reports a verdict adds the verdicts' codes.
_ALWAYS = (ExitCode.DETERMINISTIC, ExitCode.USAGE, ExitCode.BAD_TRACE, ExitCode.OUTPUT, ExitCode.INTERNAL,
           ExitCode.SIGHUP, ExitCode.INTERRUPTED, ExitCode.SIGTERM)
VERDICTS = (*_ALWAYS, ExitCode.DIVERGENT, ExitCode.SCRIPT_FAILED, ExitCode.TIMEOUT, ExitCode.INCONCLUSIVE)


@dataclass(frozen=True)
class CommandRow:
    """One command of `detaudit`: its name, where its click command is (`module:function`; the help is the
    function's docstring), a one-line summary for `detaudit --help`'s list, and the exit codes it can return
    (`meanings`: its own words for a code, its verdicts'), from which its --help's epilog is made."""

    name: str
    where: str
    summary: str
    codes: frozenset[ExitCode] = frozenset(VERDICTS)
    meanings: Mapping[ExitCode, str] = field(default_factory=dict)

    @property
    def epilog(self) -> str:
        return exit_codes_help(sorted(self.codes), self.meanings)

    def load(self) -> click.Command:
        """The command, with this row's summary and epilog."""
        module, function = self.where.split(":")
        command = getattr(importlib.import_module(module), function)
        assert isinstance(command, click.Command) and command.name == self.name, self.where
        command.short_help, command.epilog = self.summary, self.epilog
        return command


_HERE = __name__
COMMANDS = (
    CommandRow("run", f"{_HERE}:run", "Run a script several times and compare what it computed."),
    CommandRow("report", f"{_HERE}:report", "Re-render the report of a finished run from its directory."),
    CommandRow("explain", f"{_HERE}:explain", "Confirm why a finished run diverged, one pinned source at a time."),
    CommandRow("compare", f"{_HERE}:compare", "Compare recordings made elsewhere: another machine or release."),
    CommandRow("fix", "detaudit.cli.fix:fix", "Find the smallest set of settings that makes the repeats agree.",
               frozenset({*VERDICTS, ExitCode.UNCONTROLLED})),
    CommandRow("batch", "detaudit.cli.batch_command:batch",
               "Does a request's result depend on what else is in its batch?", meanings={
                   ExitCode.DETERMINISTIC: "batch-invariant: every probed row agrees bit for bit",
                   ExitCode.DIVERGENT: "batch-variant: some row's result depends on its batch (or, with --repeats, "
                                       "the repeats differ)"}),
    CommandRow("resume", "detaudit.cli.resume_command:resume",
               "Does resuming from a checkpoint reproduce the uninterrupted run?",
               frozenset({*VERDICTS, ExitCode.NO_CHECKPOINT})),
    CommandRow("watch", "detaudit.cli.watch_command:watch",
               "Run a script once and check its steps' ops while it runs.", meanings={
                   ExitCode.DETERMINISTIC: "clean: every replayed op agreed bit for bit, the script exited 0",
                   ExitCode.DIVERGENT: "mismatch: an op's replay disagreed (the job was stopped unless --on-mismatch "
                                       "continue)"}),
    CommandRow("drift", "detaudit.cli.drift_command:drift",
               "Noise or a real change between two configurations of a script?", meanings={
                   ExitCode.DETERMINISTIC: "equivalent (bit for bit) or within noise: B never moves beyond K times "
                                           "A's floor (a CI pass)",
                   ExitCode.DIVERGENT: "drift: some record of B is beyond its floor"}),
    CommandRow("show", f"{_HERE}:show", "Print one trace readably.", frozenset(_ALWAYS),
               {ExitCode.DETERMINISTIC: "the trace was printed"}),
    CommandRow("demo", f"{_HERE}:demo", "Audit a small script shipped with detaudit, to see a real report.",
               meanings={ExitCode.DETERMINISTIC: "the demo found the divergence its script has on purpose",
                         ExitCode.DIVERGENT: "the demo's repeats agreed: it showed no divergence"}),
)
for _row in COMMANDS:
    cli.add_command(_row.load())


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _on_stop_signal(signum: int, frame: Any) -> None:
    """Ctrl-C, SIGTERM (CI cancellation, `timeout`) and SIGHUP all stop the run the same way.

    The first raises `Interrupted` where the main thread is: the launcher stops every repeat's
    process group and the CLI exits 128+signal. Any further one (impatience, or a second
    SIGTERM from CI) kills every repeat's group at once and lets the stop finish: never a hang,
    never a traceback.
    """
    from detaudit.run import launcher

    global _interrupted
    if _interrupted:
        launcher.hurry()
        return
    _interrupted = True
    raise launcher.Interrupted(signum)


_interrupted = False


def _interrupt_message(exc: BaseException) -> tuple[str, int]:
    from detaudit.run.launcher import Interrupted

    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    text = f"detaudit: interrupted ({name}); every process it started (repeat, watched job, experiment) was stopped"
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
            else ("detaudit: interrupted", ExitCode.INTERRUPTED)
        err_console.print(escape(printable(text)), soft_wrap=True)
        sys.exit(code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(ExitCode.USAGE if exc.exit_code not in (0,) else 0)
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
        where = exc.filename if exc.filename is not None else "an output (standard output or a report file)"
        err_console.print(f"[bold red]detaudit: error:[/] {escape(printable(str(output_error(where, exc))))}",
                          soft_wrap=True)
        sys.exit(ExitCode.OUTPUT)
    except Exception as exc:
        _internal_error(exc)


_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM, errno.EFBIG}


def _broken_import(exc: BaseException) -> str | None:
    """Where a module from outside detaudit (PYTHONPATH, site-packages) failed while detaudit imported it:
    `file:line`, or the missing module's name; None when the failure is detaudit's own."""
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    if isinstance(exc, SyntaxError) and exc.filename and not os.path.abspath(exc.filename).startswith(own):
        return f"{exc.filename}:{exc.lineno}"
    tb = exc.__traceback__
    while tb is not None:  # python trims the import machinery's frames: a module's body is what is left
        code = tb.tb_frame.f_code
        if code.co_name == "<module>" and not code.co_filename.startswith(("<", own)):
            return f"{code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    missing = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and missing and not missing.startswith("detaudit"):
        return f"module {missing!r} (not installed)"
    return None


def _internal_error(exc: Exception) -> NoReturn:
    if os.environ.get("DETAUDIT_DEBUG"):
        raise exc
    where = _broken_import(exc)
    if where is not None:  # the environment's fault, not a bug in detaudit
        err_console.print(f"[bold red]detaudit: error:[/] a module detaudit imports is broken: {escape(where)}: "
                          f"{escape(type(exc).__name__)}: {escape(str(exc))}. It comes from the environment "
                          "(PYTHONPATH, the installed packages), not from detaudit: fix or remove it.", soft_wrap=True)
        sys.exit(ExitCode.USAGE)
    err_console.print(f"[bold red]detaudit: internal error:[/] {escape(type(exc).__name__)}: {escape(str(exc))}. "
                      "This is a bug in detaudit; rerun with DETAUDIT_DEBUG=1 for a traceback and report it.",
                      soft_wrap=True)
    sys.exit(ExitCode.INTERNAL)
