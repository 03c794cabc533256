"""What a command shows on the terminal while the library works, and how it ends: consoles that do
not wrap a pipe at 80 columns, progress of the repeats and the experiments on stderr, the audit with
its experiments, and the end of every command that produces a report (its files written, rendered,
exit with its code). With render.py and commands.py, the only terminal code.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar

from rich.console import Console, Group
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from detaudit.errors import DetauditError
from detaudit.results import Experiment, RepeatProgress, RepeatResult
from detaudit.run.files import naming, silence_stdout

if TYPE_CHECKING:
    from detaudit.audit.pipeline import AuditOptions
    from detaudit.report.model import Report

PIPE_WIDTH = 1000  # a pipe or CI log: tables and panels are laid out up to this wide, never cut at 80 columns
PROSE_WIDTH = 100  # ... and prose wraps here, readable in a log viewer (issue 45: lines of 867 characters)


class _PipeConsole(Console):
    """Off a terminal without COLUMNS: tables and panels as wide as they need (PIPE_WIDTH at most), prose (text
    printed on its own) wrapped at PROSE_WIDTH. A line printed with soft_wrap stays one line however long (the
    summary line, an error: CI logs and grep read them whole)."""

    def print(self, *objects: Any, **settings: Any) -> None:
        if objects and not settings.get("soft_wrap") and settings.get("width") is None and all(map(_prose, objects)):
            settings["width"] = PROSE_WIDTH
        super().print(*objects, **settings)


def _prose(renderable: Any) -> bool:
    """Text, or a group of nothing but text (a block of lines); a table or a panel is no prose."""
    if isinstance(renderable, Group):
        return all(map(_prose, renderable.renderables))
    return isinstance(renderable, (str, Text))


def _make_console(**settings: Any) -> Console:
    """A rich Console; off a terminal (and without COLUMNS) one that does not wrap tables at rich's default 80,
    and wraps prose at PROSE_WIDTH (_PipeConsole). COLUMNS, when set, is the width of everything."""
    console = Console(**settings)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = _PipeConsole(**settings, width=PIPE_WIDTH)
    return console


err_console = _make_console(stderr=True)


def stdout_console(quiet: bool = False) -> Console:
    """The console a command renders to (`quiet`: prints nothing)."""
    console = _make_console(quiet=quiet, highlight=False)
    # stdout closed by its reader (`| head`): stop writing, keep the verdict's exit code (rich would exit 1)
    console.on_broken_pipe = silence_stdout  # type: ignore[method-assign]
    return console


def plain_table(*columns: str) -> Table:
    """An edgeless table with these column headers: the mode reports' record and probe tables."""
    table = Table(show_edge=False)
    for column in columns:
        table.add_column(column)
    return table


class Finished(Protocol):
    """A report of any kind (Report, BatchReport, ResumeReport, FixReport): what the finisher needs of it."""

    @property
    def exit_code(self) -> int: ...


R = TypeVar("R", bound=Finished)
R_in = TypeVar("R_in", contravariant=True)


class Reporter(Protocol[R_in]):
    """A report file's writer, `render(report, file)` (`-`: standard output): the JSON, JUnit or HTML of a kind."""

    def __call__(self, report: R_in, path: Path, /) -> None: ...


@dataclass(frozen=True)
class Presentation(Generic[R]):
    """How one report kind ends a command: a Reporter per output option (`json`, `junit`, `html`, `sarif`), the one
    line `--quiet` prints, and the full terminal rendering."""

    files: Mapping[str, Reporter[R]]
    summary: Callable[[R], Text | str]
    render: Callable[[R, Console], None]
    on_stderr: bool = False  # rendered on standard error always: standard output is the script's own (watch)


def finish_with(report: R, shown: Presentation[R], paths: Mapping[str, Path | None], quiet: bool,
                exit_code: int | None = None) -> NoReturn:
    """The end of every command that produces a report: write the requested files (`paths`: output option ->
    path, None: not requested), render, and exit with the report's exit code unless told another."""
    for name, path in paths.items():
        if path is not None:
            shown.files[name](report, path)
    # a document on stdout (`--json -`, `--junit -`) stands alone there: the rendering goes to stderr
    console = err_console if shown.on_stderr or any(str(path) == "-" for path in paths.values()) \
        else stdout_console()
    with naming("standard error" if console is err_console else "standard output"):
        if quiet:
            console.print(shown.summary(report), soft_wrap=True)
        else:
            shown.render(report, console)
    sys.exit(report.exit_code if exit_code is None else exit_code)


def finish(report: Report, json_path: Path | None, junit_path: Path | None, quiet: bool,
           html_path: Path | None = None, notes: tuple[str, ...] = (), exit_code: int | None = None,
           sarif_path: Path | None = None) -> NoReturn:
    """finish_with for an audit's Report (`notes`: shown just before the closing summary line)."""
    finish_with(report, audit_presentation(notes),
                {"json": json_path, "junit": junit_path, "html": html_path, "sarif": sarif_path}, quiet, exit_code)


def audit_presentation(notes: tuple[str, ...] = ()) -> Presentation[Report]:
    """How an audit's Report ends `run`, `report`, `explain`, `compare` and `demo`: JSON, JUnit, HTML, SARIF, the
    summary line, the terminal report (`notes` just before its closing summary line)."""
    from detaudit.cli.render import render, summary_line
    from detaudit.report.html import write_html
    from detaudit.report.junit import write_junit
    from detaudit.report.model import write_json
    from detaudit.report.sarif import write_sarif

    return Presentation({"json": write_json, "junit": write_junit, "html": write_html, "sarif": write_sarif},
                        summary_line,
                        lambda r, console: render(r, console, notes))


PLAIN_EVERY_S = 10.0  # off a terminal (a CI log), a running repeat's progress line at most this often


def describe_progress(p: RepeatProgress) -> str:
    """A running repeat in one line: its step and rate, how far it agrees with its reference, the time left."""
    parts = [f"{p.label}: step {p.step}" + (f", {p.steps_per_s:.1f} steps/s" if p.steps_per_s else "")]
    other = "the baseline" if p.against_baseline else f"repeat {p.reference}"
    if p.diverged_at_step is not None:
        parts.append(f"diverged from {other} at step {p.diverged_at_step}"
                     + (f", stopping after step {p.stopping_at_step}" if p.stopping_at_step is not None else ""))
    elif p.agrees_to_step is not None:
        parts.append(f"agrees with {other} through step {p.agrees_to_step}")
    if p.eta_s is not None:
        parts.append(f"about {_duration(p.eta_s)} left")
    return "; ".join(parts)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class RepeatsProgress:
    """Progress of the repeats on stderr: a bar with the running repeat's line on a terminal; off one, a
    line per repeat that ended and, at most every PLAIN_EVERY_S, one per running repeat (`running ...`,
    from its first step on). Quiet: nothing
    (`on_done` and `on_progress` are None). Told from the repeats' threads, hence the lock."""

    def __init__(self, quiet: bool, total: int, label: str = "running repeats") -> None:
        self.bar: Progress | None = None
        self.on_done: Callable[[RepeatResult], None] | None = None
        self.on_progress: Callable[[RepeatProgress], None] | None = None
        self._lock = threading.Lock()
        self._printed: dict[str, float] = {}
        if quiet:
            return
        self.on_done, self.on_progress = self._done, self._progress
        if err_console.is_terminal:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.fields[status]}"), console=err_console,
                                transient=True)
            self._task = self.bar.add_task(label, total=total, status="")

    def __enter__(self) -> RepeatsProgress:
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)

    def restart(self, total: int | None = None, label: str | None = None) -> None:
        """A new round of repeats (the op-level re-run, the experiments): the bar starts again (`total`, `label`:
        its new length and words, else as they were)."""
        if self.bar is not None:
            self.bar.reset(self._task, total=total, description=label, status="")

    def _done(self, result: RepeatResult) -> None:
        if self.bar is not None:
            self.bar.advance(self._task)
            return
        status = "timed out" if result.timed_out else f"exit {result.exit_code}"
        if result.stopped_at_step is not None:
            status = f"stopped after step {result.stopped_at_step}" + (
                f" (diverged at step {result.diverged_at_step})" if result.diverged_at_step is not None else "")
        name = result.trace.removesuffix(".trace")
        with self._lock:
            self._printed.pop(name, None)
            err_console.print(f"{name} ({result.device}): {status} in {result.duration_s:.1f}s")

    def _progress(self, progress: RepeatProgress) -> None:
        line = describe_progress(progress)
        if self.bar is not None:
            self.bar.update(self._task, status=escape(line))
            return
        now = time.monotonic()
        with self._lock:
            if progress.step == 0 or now - self._printed.get(progress.label, now - PLAIN_EVERY_S) < PLAIN_EVERY_S:
                return  # not a line per poll, nor one before the repeat's first step
            self._printed[progress.label] = now
            err_console.print(f"running {line}", markup=False, highlight=False)


def warn_oversubscription(jobs: int, devices: list[str]) -> None:
    from detaudit.run.devices import oversubscription

    warning = oversubscription(jobs, devices, os.environ, os.cpu_count())
    if warning is not None:
        err_console.print(f"[bold yellow]detaudit: warning:[/] {escape(warning)}", soft_wrap=True)


def audit_run(options: AuditOptions, explain: bool, explain_all: bool, budget: int | None, quiet: bool,
              cheap: bool = False) -> Report:
    """Run the audit and its follow-up (audit/follow_up.py: the top cause's cheap confirmation with `cheap`, the
    op-level re-run, the experiments with `explain`), with progress on stderr and each experiment's result as a
    line there."""
    from detaudit.audit.follow_up import FollowUp, run_audit
    from detaudit.explain.confirmation import PinnedExperiments

    schedule, target = options.schedule, options.target
    warn_oversubscription(schedule.jobs, schedule.devices)
    progress = RepeatsProgress(quiet, schedule.repeats * len(schedule.devices))

    def on_narrow(window: list[int]) -> None:
        progress.restart()
        if not quiet:
            err_console.print(f"the repeats diverged; re-running them recording ops in steps {window[0]}–{window[1]}")

    def on_round(cheap: bool, most: int) -> None:
        progress.restart(most, "running repeats" if cheap else "explain: pinned repeats")
        _explain_line(quiet, cheap, most)

    said: set[str] = set()

    def on_skipped(why: str) -> None:
        if not quiet and why not in said:  # asked again after the op-level re-run: said once
            said.add(why)
            err_console.print(f"explain: no cheap confirmation: {escape(why)}", soft_wrap=True)

    follow_up = FollowUp(cheap, explain, explain_all, budget, schedule.jobs,
                         tuple(target.script_args) if target.redact_args else None)
    experimenter = PinnedExperiments(progress.on_done, progress.on_progress, _experiment_line(quiet), on_round,
                                     on_skipped)
    with progress:
        return run_audit(options, progress.on_done, on_narrow, progress.on_progress, follow_up, experimenter)


def save_baseline_to(report: Any, dest: Path) -> int | None:
    """Keep the run as a baseline; the exit code the command must end with instead of the report's, if any.

    The report is still written and shown. A baseline not saved after repeats that agreed fails the
    command with its error's code (a CI job must notice that nothing was kept); after repeats that did
    not agree, the run's own non-zero exit code already does.
    """
    from detaudit.report import baseline

    try:
        replaced = baseline.replaces(dest)
        saved = baseline.save(Path(report.run_dir), report, dest)
    except DetauditError as exc:
        err_console.print(f"[bold yellow]detaudit:[/] {escape(str(exc))}", soft_wrap=True)
        return exc.exit_code if report.exit_code == 0 else None
    size = sum(p.lstat().st_size for p in saved.iterdir() if p.is_file())
    err_console.print(f"baseline saved to {escape(str(saved))} ({size / 1024:.1f} KiB)"
                      + (f"; it replaces {escape(replaced)}" if replaced else ""), soft_wrap=True)
    return None


def explain_run(run_dir: Path, budget: int | None, explain_all: bool, jobs: int, quiet: bool) -> Report:
    """`detaudit explain RUN_DIR`: the --explain experiments of a finished run, each one's result as a line on
    stderr."""
    from detaudit.explain.runner import DEFAULT_BUDGET, run_experiments

    budget = budget or DEFAULT_BUDGET
    _explain_line(quiet, False, budget)
    with RepeatsProgress(quiet, budget, "explain: pinned repeats") as progress:
        return run_experiments(run_dir, budget, explain_all, jobs=jobs, on_done=progress.on_done,
                               on_progress=progress.on_progress, on_experiment=_experiment_line(quiet))


def _explain_line(quiet: bool, cheap: bool, budget: int) -> None:
    """What the experiments about to run are, on stderr."""
    if not quiet:
        err_console.print("explain: confirming the top cause with its one cheap experiment (--no-explain skips it)"
                          if cheap else f"explain: re-running with one source of nondeterminism pinned at a time "
                          f"(at most {budget} more repeats)")


def _experiment_line(quiet: bool) -> Callable[[Experiment], None] | None:
    """Each experiment's result as a line on stderr; none when quiet."""
    if quiet:
        return None

    def line(experiment: Experiment) -> None:
        err_console.print(f"explain: pinned {escape(experiment.description)} -> {experiment.verdict}"
                          + (f" ({escape(experiment.note)})" if experiment.note else ""))
    return line
