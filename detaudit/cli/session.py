"""What a command shows on the terminal while the library works, and how it ends: consoles that do
not wrap a pipe at 80 columns, progress of the repeats and the experiments on stderr, the audit with
its experiments, and the end of every command that produces a report (its files written, rendered,
exit with its code). With render.py and cli.py, the only terminal code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from detaudit.errors import DetauditError
from detaudit.run.files import naming, silence_stdout

PIPE_WIDTH = 1000  # a pipe or CI log: lay the report out this wide, i.e. never wrap it at 80 columns


def _make_console(**settings: Any) -> Console:
    """A rich Console; off a terminal (and without COLUMNS) one that does not wrap at rich's default 80."""
    console = Console(**settings)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(**settings, width=PIPE_WIDTH)
    return console


err_console = _make_console(stderr=True)


def stdout_console(quiet: bool = False) -> Console:
    """The console a command renders to (`quiet`: prints nothing)."""
    console = _make_console(quiet=quiet, highlight=False)
    # stdout closed by its reader (`| head`): stop writing, keep the verdict's exit code (rich would exit 1)
    console.on_broken_pipe = silence_stdout  # type: ignore[method-assign]
    return console


def finish(report: Any, json_path: Path | None, junit_path: Path | None, quiet: bool,
           html_path: Path | None = None, notes: tuple[str, ...] = (), exit_code: int | None = None) -> NoReturn:
    """Write the requested report files, render (`notes` just before the closing summary line), and
    exit with the report's exit code unless told another."""
    from detaudit.cli.render import render, summary_line
    from detaudit.report.html import write_html
    from detaudit.report.junit import write_junit
    from detaudit.report.model import write_json

    if json_path is not None:
        write_json(report, json_path)
    if junit_path is not None:
        write_junit(report, junit_path)
    if html_path is not None:
        write_html(report, html_path)
    # with `--json -` / `--junit -` stdout carries the document alone: the rendering goes to stderr
    console = err_console if "-" in (str(json_path), str(junit_path)) else stdout_console()
    with naming("standard error" if console is err_console else "standard output"):
        if quiet:
            console.print(summary_line(report), soft_wrap=True)
        else:
            render(report, console, notes)
    sys.exit(report.exit_code if exit_code is None else exit_code)


def progress_runner(quiet: bool, total: int, label: str = "running repeats") -> tuple[Any, Any]:
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


def warn_oversubscription(jobs: int, devices: list[str]) -> None:
    from detaudit.run.devices import oversubscription

    warning = oversubscription(jobs, devices, os.environ, os.cpu_count())
    if warning is not None:
        err_console.print(f"[bold yellow]detaudit: warning:[/] {escape(warning)}", soft_wrap=True)


def audit_run(options: Any, explain: bool, explain_all: bool, budget: int | None, quiet: bool,
              cheap: bool = False) -> Any:
    """Run the audit with progress on stderr, and the experiments when asked and the repeats diverged;
    `cheap`: otherwise the top cause's one cheap, decisive experiment, if it has one (explain.cheap_pin)."""
    from detaudit.audit.pipeline import run_audit
    from detaudit.explain.runner import cheap_pin
    from detaudit.run.distributed import multi_node

    schedule = options.schedule
    cheap = cheap and not multi_node(schedule.torchrun_args)  # its one experiment is a launch (commands.run)
    warn_oversubscription(schedule.jobs, schedule.devices)
    context, on_done = progress_runner(quiet, schedule.repeats * len(schedule.devices))

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
            report = explain_run(Path(report.run_dir), budget, explain_all, schedule.jobs, quiet, args)
        elif cheap and cheap_pin(report.causes) is not None:
            report = explain_run(Path(report.run_dir), None, False, schedule.jobs, quiet, args, cheap=True)
    return report


def save_baseline_to(report: Any, dest: Path) -> int | None:
    """Keep the run as a baseline; the exit code the command must end with instead of the report's, if any.

    The report is still written and shown. A baseline not saved after repeats that agreed fails the
    command with its error's code (a CI job must notice that nothing was kept); after repeats that did
    not agree, the run's own non-zero exit code already does.
    """
    from detaudit.report import baseline

    try:
        saved = baseline.save(Path(report.run_dir), report, dest)
    except DetauditError as exc:
        err_console.print(f"[bold yellow]detaudit:[/] {escape(str(exc))}", soft_wrap=True)
        return exc.exit_code if report.exit_code == 0 else None
    size = sum(p.lstat().st_size for p in saved.iterdir() if p.is_file())
    err_console.print(f"baseline saved to {escape(str(saved))} ({size / 1024:.1f} KiB)", soft_wrap=True)
    return None


def explain_run(run_dir: Path, budget: int | None, explain_all: bool, jobs: int, quiet: bool,
                script_args: list[str] | None = None, cheap: bool = False) -> Any:
    """The --explain experiments of a finished run, each one's result as a line on stderr (`cheap`: only the
    top cause's one cheap, decisive experiment)."""
    from detaudit.explain.runner import CHEAP_REPEATS, DEFAULT_BUDGET, run_experiments

    def line(experiment: Any) -> None:
        if not quiet:
            err_console.print(f"explain: pinned {escape(experiment.description)} -> {experiment.verdict}"
                              + (f" ({escape(experiment.note)})" if experiment.note else ""))

    budget = budget or DEFAULT_BUDGET
    if not quiet:
        err_console.print("explain: confirming the top cause with its one cheap experiment (--no-explain skips it)"
                          if cheap else f"explain: re-running with one source of nondeterminism pinned at a time "
                          f"(at most {budget} more repeats)")
    context, on_done = progress_runner(quiet, CHEAP_REPEATS if cheap else budget, "explain: pinned repeats")
    with context:
        return run_experiments(run_dir, budget, explain_all, jobs=jobs, on_done=on_done, on_experiment=line,
                               script_args=script_args, cheap=cheap)
