"""`detaudit drift SCRIPT`: is the difference between two configurations of one script the size of
floating-point noise, and if not, where does the real change start? The command (options for configurations A
and B) and its terminal rendering (docs/drift.md)."""

from __future__ import annotations

import inspect
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from detaudit.cli.options import (
    RunCommand,
    check_outputs,
    html_option,
    json_option,
    max_steps_option,
    option_group,
    out_option,
    quiet_option,
    sarif_option,
    script_arguments,
    timeout_option,
)
from detaudit.cli.render import MAX_TOKEN_SEQUENCES
from detaudit.cli.session import Presentation, RepeatsProgress, finish_with, plain_table
from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_html import write_html
from detaudit.drift.drift_report import DriftReport, FirstDrift, RecordRow, write_json
from detaudit.report.sarif import write_drift_sarif
from detaudit.safetext import printable

if TYPE_CHECKING:
    from detaudit.audit.pipeline import AuditOptions

DEVICES = click.Choice(["cpu", "cuda", "auto"])
SHOWN_ROWS = 12


def _environment(values: tuple[str, ...], option: str) -> dict[str, str]:
    env = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint=option)
        env[name] = value
    return env


def _arguments(text: str | None, option: str) -> list[str]:
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise click.BadParameter(f"{text!r} cannot be split as a shell would: {exc}", param_hint=option) from None


def _python(path: str | None, option: str) -> str | None:
    if path is not None and not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise click.BadParameter(f"{path!r} is not an executable file (the interpreter to run the script with)",
                                 param_hint=option)
    return path


def configuration(label: str, env: tuple[str, ...], args: str | None, threads: int | None, python: str | None,
                  device: str, nproc: int | None = None) -> Configuration:
    """One side's options as a Configuration (bad values: a usage error naming the option's value)."""
    side = label.lower()
    if nproc is not None and python is not None:
        raise click.UsageError(f"--{side}-nproc and --{side}-python cannot be combined: torchrun starts the ranks "
                               "with detaudit's own interpreter")
    return Configuration(label, _environment(env, f"--{side}-env"), _arguments(args, f"--{side}-args"), threads,
                         _python(python, f"--{side}-python"), device, nproc)


_SIDE = ("env", "args", "threads", "python", "device", "nproc")  # --<side>-<field>: a Configuration's options


def _side_options(side: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--<side>-env, --<side>-args, --<side>-threads, --<side>-python, --<side>-device, --<side>-nproc, reaching
    the command as one Configuration, its parameter `side` (options.option_group)."""
    upper = side.upper()

    def build(**values: Any) -> Configuration:
        return configuration(upper, *(values[f"{side}_{name}"] for name in _SIDE))

    build.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # what option_group reads
        [inspect.Parameter(f"{side}_{name}", inspect.Parameter.KEYWORD_ONLY) for name in _SIDE])

    def add(command: Callable[..., Any]) -> Callable[..., Any]:
        command = option_group(build, side)(command)
        for option in reversed((
            click.option(f"--{side}-env", f"{side}_env", multiple=True, metavar="NAME=VALUE",
                         help=f"An environment variable of configuration {upper} (repeatable)."),
            click.option(f"--{side}-args", f"{side}_args", default=None, metavar="'ARGS'",
                         help=f"Script arguments of {upper}, after the common ones (split as a shell would)."),
            click.option(f"--{side}-threads", f"{side}_threads", type=click.IntRange(min=1), default=None,
                         help=f"Intra-op threads of {upper} (OMP_NUM_THREADS, MKL_NUM_THREADS)."),
            click.option(f"--{side}-python", f"{side}_python", default=None, metavar="PATH",
                         help=f"Another interpreter for {upper} (another torch release); it must be able to import "
                              "detaudit's dependencies (numpy, xxhash)."),
            click.option(f"--{side}-device", f"{side}_device", type=DEVICES, default="cpu", show_default=True,
                         help=f"Device of {upper} (auto: the script's own choice)."),
            click.option(f"--{side}-nproc", f"{side}_nproc", type=click.IntRange(min=1), default=None,
                         help=f"Run {upper} under torchrun with N ranks (its world size; docs/drift.md)."),
        )):
            command = option(command)
        return command
    return add


def drift_options(script: str, script_args: tuple[str, ...], timeout: float | None, max_steps: int | None,
                  out_dir: Path | None) -> AuditOptions:
    """The options drift shares with `run` (SCRIPT and its arguments, --timeout, --max-steps, --out) as the
    AuditOptions its recordings take."""
    from detaudit.audit.pipeline import AuditOptions, Recording, Schedule, Target

    return AuditOptions(Target(Path(script), list(script_args), argv0=script), Schedule(timeout=timeout),
                        Recording(max_steps=max_steps), out_dir=out_dir)


@click.command(cls=RunCommand)
@script_arguments
@_side_options("a")
@_side_options("b")
@timeout_option()
@max_steps_option("Stop each repeat after N steps.")
@out_option
@json_option
@html_option("Write an HTML page: B's largest difference from A and A's floor over the steps.")
@sarif_option
@quiet_option()
@click.option("--no-op-window", "no_ops", is_flag=True,
              help="On a drift, do not re-run A and B over the drifting step to name the first op that departs.")
@click.option("--baseline", type=click.Path(path_type=Path), default=None, metavar="RUN_DIR",
              help="Keep A from an earlier `detaudit drift` run directory (its recordings and floor): only B runs, "
                   "e.g. on another machine or release. The --a-* options are then refused.")
@click.option("--b-from", "b_from", type=click.Path(path_type=Path), default=None, metavar="RUN_DIR",
              help="Keep B from an earlier `detaudit drift` run directory (its recording): B does not run; with "
                   "--baseline, two existing recordings are compared. The --b-* options are then refused.")
@option_group(drift_options, "options")
def drift(options: AuditOptions, a: Configuration, b: Configuration, json_path: Path | None, html_path: Path | None,
          sarif_path: Path | None, quiet: bool, baseline: Path | None, no_ops: bool, b_from: Path | None) -> None:
    """Noise or a real change? Run SCRIPT under configuration A and under configuration B and judge B's
    difference from A record by record against A's own noise floor: A is run twice plainly and once more per
    perturbed setting (the thread count; on CUDA also cuBLAS's workspace and cuDNN's algorithm choice), which
    changes only the order of its floating-point reductions. Records are lined up by what they are (module
    and call, parameter name, torch.save key), not by position.

    EQUIVALENT: bit for bit. WITHIN NOISE: B never moves beyond 10x A's floor. DRIFT: the first record beyond it,
    with the kind of change (a constant factor, a sign flip, a dtype or shape change, NaN on one side, a
    change that starts large) and the settings A and B differ in, ranked as candidate causes.
    """
    from detaudit.drift.drift_check import B_REPEATS, run_drift

    if baseline is not None and a != Configuration("A"):
        raise click.UsageError("--baseline keeps A from an earlier run: its --a-* options cannot change it")
    if b_from is not None and b != Configuration("B"):
        raise click.UsageError("--b-from keeps B from an earlier run: its --b-* options cannot change it")
    kept = {f"the kept recording {option} {path}": path for option, path in (("--baseline", baseline),
                                                                              ("--b-from", b_from)) if path}
    check_outputs(json_path, None, html_path, out_dir=options.out_dir, sarif_path=sarif_path,
                  inputs={"the audited script": options.target.script, **kept})
    progress = RepeatsProgress(quiet, (0 if baseline else 3) + (0 if b_from else B_REPEATS),
                               "running configurations A and B")
    with progress:
        report = run_drift(options, a, b, progress.on_done, baseline, not no_ops, b_from)
    finish_drift(report, json_path, html_path, quiet, sarif_path)


def finish_drift(report: DriftReport, json_path: Path | None, html_path: Path | None, quiet: bool,
                 sarif_path: Path | None = None) -> NoReturn:
    """Write the requested files, render, exit with the verdict's code."""
    finish_with(report, presentation(), {"json": json_path, "html": html_path, "sarif": sarif_path}, quiet)


def presentation() -> Presentation[DriftReport]:
    """How a DriftReport ends its command: JSON, HTML, SARIF, the summary line, the terminal report."""
    return Presentation({"json": write_json, "html": write_html, "sarif": write_drift_sarif}, summary_line,
                        render_drift)


def _render_op_window(report: DriftReport, console: Console) -> None:
    window, first = report.op_window, report.first_drift
    if window is not None:
        phase = "backward" if window.backward else "forward"
        where = f"{_clean(window.op)} ({phase}, module {_clean(window.module) or '-'}) at {_clean(window.location)}"
        console.print(f"[bold]first op[/] of step {window.step} where B departs: {where}: " + (
            f"{window.ratio_to_floor:.3g}x its ULP bound" if window.ratio_to_floor is not None else
            "B has no such op" + (f"; B ran {_clean(', '.join(window.b_ops))} there" if window.b_ops else "")))
    elif first is not None and first.starts_in_update and report.verdict == "drift":
        console.print(f"no op window: the first drift is a {_clean(first.kind)} record whose step's other records "
                      "are within noise: the change starts in optimizer.step() (its learning rate or other "
                      "settings, its state), whose ops are not recorded")
    elif report.op_runs and first is not None:
        console.print(f"op window: no op of step {first.step} departs in B beyond {report.floor.k:g} times its ULP "
                      "bound")


def _render_tokens(report: DriftReport, console: Console) -> None:
    """A decoding script's answer in tokens (compare/tokens.py), B against A's first plain repeat; A's own repeats'
    distinct outputs (its noise in tokens); and what came first, the first drift's record or the token."""
    tokens = report.tokens
    if tokens is None:
        return
    t = tokens.compared
    console.print(f"[bold]{_clean(t.answer('A and B', lambda i: 'AB'[i], MAX_TOKEN_SEQUENCES))}[/]", soft_wrap=True)
    noisy = tokens.a_distinct > 1
    console.print(f"  A's own {tokens.a_repeats} repeats (plain and perturbed): {tokens.a_distinct} distinct "
                  f"output{'s' if noisy else ''}" + (": A's tokens move with its reordering alone" if noisy else ""))
    if not t.divergences:
        return
    d, first, window = t.earliest, report.first_drift, report.op_window
    op = "" if window is None else f" (op {_clean(window.op)} at {_clean(window.location)})"
    if first is not None and d.follows(tokens.first_drift_record):
        console.print(f"  token {d.position} was chosen after the first drift (record #{tokens.first_drift_record}: "
                      f"step {first.step} {first.kind} {_clean(first.name)}) already differed{op}")
    else:
        console.print(f"  token {d.position} differs before any record drifts: the choice itself is the first "
                      "difference")


def _clean(text: object) -> str:
    return escape(printable(str(text)))


def _ratio(ratio: float | None, detail: str | None = None) -> str:
    """`3.2x floor` (with how it was sized, where it was re-recorded), or why a record has no ratio."""
    if ratio is None:
        return "beyond any floor" if detail is None else _clean(detail)
    return f"{ratio:.3g}x floor" + ("" if detail is None else f" ({_clean(detail)})")


def summary_line(report: DriftReport) -> str:
    colour = {"equivalent": "green", "within-noise": "green", "drift": "red"}.get(report.verdict, "yellow")
    text = f"[bold {colour}]{report.verdict.upper().replace('-', ' ')}[/]"
    c = report.counts
    if report.verdict in ("equivalent", "within-noise", "drift") or c.aligned:
        text += f" · {c.aligned} records aligned: {c.equivalent} equivalent, {c.within_noise} within noise, " \
                f"{c.drift} beyond the floor" + (f", {c.size_unknown} of unknown size" if c.size_unknown else "") \
            + (f", {c.structure} only one side holds (structure)" if c.structure else "")
    first = report.first_drift
    if first is not None:
        size = "structure" if first.structure else "size unknown" if first.ratio_to_floor is None \
            and first.detail is not None else _ratio(first.ratio_to_floor)
        text += f" · first drift: step {first.step} {first.kind} {_clean(first.name)} ({size})"
        if first.factor is not None:
            text += f", constant factor {first.factor:g}"
    if report.outcome is not None:
        ended = report.outcome
        text += f" · stdout line {ended.line} differs" if ended.line is not None else f" · {_clean(ended.detail)}"
    if report.reason:
        text += f" · {_clean(report.reason)}"
    return text + f" · run: {_clean(report.run_dir)}"


def _configuration(config: Configuration) -> str:
    return _clean(config.described())


def _floor_runs(report: DriftReport) -> str:
    """`A plain (threads 2) x2, perturbed: threads 1`: A's repeats by the settings they ran with."""
    settings = report.floor.perturbed
    if not settings:
        return f"A run {len(report.results_a)} times"
    plain = settings[0]
    shown = [", ".join(f"{k} {v}" for k, v in s.items() if plain.get(k) != v) for s in settings if s != plain]
    return _clean(f"A plain ({', '.join(f'{k} {v}' for k, v in plain.items())}) x{settings.count(plain)}, "
                  f"perturbed: {'; '.join(shown) or 'none'}")


def _evidence(first: FirstDrift) -> list[str]:
    """The first drift's evidence, one line each."""
    e = first.evidence
    lines = [f"constant factor {first.factor:g} (B = {first.factor:g} x A)"] if first.factor is not None else []
    lines += ["sign flip"] if e.sign_flip else []
    lines += [f"NaN on {e.nan_on.upper()} only"] if e.nan_on is not None else []
    lines += [e.layout] if e.layout is not None else []
    lines += [f"over the steps: {e.growth}"] if e.growth is not None else []
    return lines


def _difference(row: RecordRow) -> str:
    """|B-A| in the table: the sampled difference, `size unknown` where it was not recorded, `-` (no pair)."""
    if row.detail is not None and row.difference is None:
        return "size unknown"
    return "-" if row.difference is None else f"{row.difference:.3g}"


def _status(row: RecordRow) -> str:
    """A row's status as the counts have it: a difference whose size was not recorded is `size unknown`, neither
    within noise nor a drift (the trial's table said `drift` where the counts said 0 drifts)."""
    if row.unrecorded:
        return "[yellow]size unknown[/]"
    return "[red]drift[/]" if row.status == "drift" else "within noise"


def _record_name(row: RecordRow) -> str:
    """A row's name, with its rank where two torchrun runs' per-rank records are compared rank by rank."""
    return _clean(row.name + (f" (rank {row.rank})" if row.rank else ""))


def _render_outcome(report: DriftReport, console: Console) -> None:
    """B's stdout (or exit status) that differs from A's, and where A's own repeats print otherwise."""
    ended = report.outcome
    if ended is not None:
        console.print(f"[bold red]B ends otherwise[/]: {_clean(ended.detail)}")
        if ended.line is not None:
            console.print(f"  A: {_clean(ended.a)!s}\n  B: {_clean(ended.b)!s}")
    if report.stdout_unsteady:
        lines = ", ".join(map(str, report.stdout_unsteady))
        console.print(f"stdout line(s) {lines} not judged: A's own repeats print them otherwise (a number its "
                      "reordering moves)")


def _render_ranks(report: DriftReport, console: Console) -> None:
    """Per-rank records set aside (another world size) and shared records a side's ranks disagree on."""
    for left in report.not_comparable:
        console.print(f"not comparable: {left.kind} records (A {left.records_a}, B {left.records_b}): "
                      f"{_clean(left.reason)}")
    for d in report.rank_disagreements:
        console.print(f"[yellow]ranks disagree[/]: {d.side.upper()} rank {d.rank}'s step {d.step} {d.kind} "
                      f"{_clean(d.name)} differs from rank 0's (rank 0's is compared)")


def _render_rerecorded(report: DriftReport, console: Console) -> None:
    """The records of unknown size A and B were re-recorded to size: how many were, and why the others were not."""
    done = report.rerecorded
    if done is None:
        return
    sized = [r for r in done.records if r.sized]
    console.print(f"re-recorded A and B once more keeping the full values of {len(done.records)} record(s) of "
                  f"unknown size ({done.interpreters} interpreters): {len(sized)} sized by re-recording (rows marked "
                  "`sized`)")
    for r in [r for r in done.records if not r.sized][:5]:
        console.print(f"  not sized: step {r.step} {r.kind} {_clean(r.name)}: {_clean(r.reason)}")


def _render_records(report: DriftReport, console: Console) -> None:
    """The table of the records judged (the first SHOWN_ROWS)."""
    if not report.records:
        return
    table = plain_table("step", "kind", "name", "status", "|B-A|", "floor", "ratio", "location")
    for row in report.records[:SHOWN_ROWS]:
        status = _status(row) + (" (sized)" if row.sized else "")  # by re-recording (_render_rerecorded says so)
        table.add_row(str(row.step), row.kind, _record_name(row), status, _difference(row), f"{row.floor:.3g}",
                      "-" if row.ratio_to_floor is None else f"{row.ratio_to_floor:.3g}", _clean(row.location))
    console.print(table)


def render_drift(report: DriftReport, console: Console) -> None:
    console.print(f"[bold]detaudit drift[/] {_clean(report.script)}  (run directory {_clean(report.run_dir)})")
    kept = f" (kept from {_clean(report.baseline)})" if report.baseline else ""
    kept_b = f" (kept from {_clean(report.b_from)})" if report.b_from else ""
    console.print(f"  A: {_configuration(report.a)}{kept}\n  B: {_configuration(report.b)}{kept_b}")
    console.print(f"  floor: {_floor_runs(report)}, at least {report.floor.ulps} ULP; K = {report.floor.k:g}")
    if report.a_disagrees:  # said first: every figure below is measured against a nondeterministic A
        console.print(f"[bold yellow]A disagrees with itself[/]: {_clean(report.a_disagrees)}")
    _render_tokens(report, console)
    _render_records(report, console)
    first = report.first_drift
    if first is not None:
        console.print(f"[bold red]first drift[/]: step {first.step}, {first.kind} {_clean(first.name)} "
                      f"(module {_clean(first.module) or '-'}, {first.dtype}[{_clean(first.shape)}]) at "
                      f"{_clean(first.location)}: {_ratio(first.ratio_to_floor, first.detail)}")
        for text in _evidence(first):
            console.print(f"  evidence: {_clean(text)}")
    _render_op_window(report, console)
    _render_outcome(report, console)
    for side, names in (("A", report.only_a), ("B", report.only_b)):
        if names:
            listed = ", ".join(f"step {n.step} {n.kind} {n.name}" for n in names[:5])
            console.print(f"only {side} records {len(names)}: {_clean(listed)}{' ...' if len(names) > 5 else ''}")
    _render_ranks(report, console)
    for cause in report.causes:
        console.print(f"[bold]candidate[/] {_clean(cause.setting)}: {_clean(cause.change())} "
                      f"({cause.family}): {_clean(cause.why)}")
    _render_rerecorded(report, console)
    started = report.interpreters
    parts = [f"{report.rerecorded.interpreters} to size records by re-recording"] if report.rerecorded else []
    parts += [f"{report.op_runs} for the op window"] if report.op_runs else []
    console.print(f"{started} interpreter{'s' if started != 1 else ''} started"
                  + (f" ({', '.join(parts)})" if parts else ""))
    console.print(summary_line(report), soft_wrap=True)
