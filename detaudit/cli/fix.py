"""`detaudit fix SCRIPT [ARGS]`: the command and its terminal rendering (the search itself is fix/trials.py;
docs/fix.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from detaudit.cli.options import (
    RunCommand,
    audit_option_group,
    check_distinct,
    check_outputs,
    devices_option,
    jobs_option,
    json_option,
    max_steps_option,
    max_time_option,
    nproc_option,
    out_option,
    perturb_option,
    quiet_option,
    repeats_option,
    script_arguments,
    stdout_options,
    timeout_option,
    torchrun_args_option,
)
from detaudit.cli.render import causes_block
from detaudit.cli.session import (
    Presentation,
    RepeatsProgress,
    err_console,
    finish,
    finish_with,
    warn_oversubscription,
)
from detaudit.run.files import check_writable, write_output
from detaudit.safetext import printable

if TYPE_CHECKING:  # the fix stage is imported when the command runs
    from detaudit.audit.pipeline import AuditOptions
    from detaudit.fix.cost import Figure
    from detaudit.fix.fix_report import FixReport, Trial
    from detaudit.report.model import Report

_STYLE = {"deterministic": "bold green", "fixed": "bold yellow", "incomplete": "bold yellow",
          "uncontrolled": "bold red"}


@click.command(cls=RunCommand)  # its epilog: the command table (commands.py)
@script_arguments
@repeats_option("Repeats per device, of the audit and of each experiment.")
@devices_option("Device to run on (as for `run`). [default: auto]")
@timeout_option()
@out_option
@jobs_option("Repeats run in parallel (the cost table is measured with them: keep 1 for honest times).")
@stdout_options
@click.option("--budget", type=click.IntRange(min=1), default=None,
              help="Most repeats the search's experiments may run, the audit's not counted. [default: 24]")
@max_steps_option("Stop each repeat right after its N-th optimizer step (as for `run`).")
@max_time_option("Stop each repeat at the first step boundary after SECONDS (as for `run`).")
@nproc_option("Run each repeat under torchrun with this many ranks (docs/distributed.md).")
@torchrun_args_option("With --nproc-per-node: further torchrun options.")
@perturb_option
@click.option("--write-patch", "patch_path", type=click.Path(path_type=Path), default=None,
              help="Write the fix's changes to the script (prelude and line edits) as a unified diff.")
@json_option
@quiet_option()
@audit_option_group(granularity="module")  # run's cross-device tolerance; no baseline, no self-check
def fix(options: AuditOptions, budget: int | None, patch_path: Path | None, json_path: Path | None,
        quiet: bool) -> None:
    """Find the smallest set of settings that makes SCRIPT's repeats agree, as code, verified, with its cost.

    Audits SCRIPT as `run` does. If the repeats diverge, it searches the knobs (seeds, PYTHONHASHSEED,
    deterministic kernels, their fill of uninitialized memory, one thread, cuDNN/cuBLAS/TF32 on a GPU) for a
    minimal set whose repeats agree, each experiment running a copy of the script with the knobs' lines added
    at its top and their environment set, as you would. Prints the lines to paste, the proof that each knob is
    needed, and what each costs (paired runs: CPU per step, whole run). Arguments split as for `run`. With
    --perturb, the audit and every experiment run under its settings, and a set of knobs must make the repeats
    agree across them.
    """
    from detaudit.fix.trials import DEFAULT_BUDGET, run_fix
    from detaudit.run.distributed import NODES_FOLLOW_UP, multi_node

    if multi_node(options.schedule.torchrun_args):
        raise click.UsageError(NODES_FOLLOW_UP.format("fix"))
    out_dir, script = options.out_dir, options.target.script
    check_outputs(json_path, None, None, out_dir=out_dir, inputs={"the audited script": script})
    if patch_path is not None:  # checked as a report file is: writable, and never the script or the --json
        check_distinct({"--write-patch": patch_path, **({"--json": json_path} if json_path else {})},
                       {"--out": out_dir} if out_dir else {}, {"the audited script": script})
        check_writable(patch_path)
    warn_oversubscription(options.schedule.jobs, options.schedule.devices)
    budget = budget or DEFAULT_BUDGET
    progress = RepeatsProgress(quiet, options.schedule.repeats * len(options.schedule.devices) + budget, "fix: repeats")

    def said(text: str) -> None:
        if not quiet:
            err_console.print(escape(printable(text)), soft_wrap=True)

    def on_trial(trial: Trial) -> None:
        said(f"fix: tried {trial.name} -> {'agree' if trial.verdict == 'deterministic' else trial.verdict}"
             + (f" ({trial.note})" if trial.note else ""))

    audits: list[Report] = []  # the audit's own report, in memory: the one shown when it cannot be fixed

    def on_audit(report: Report) -> None:
        audits.append(report)
        if report.verdict == "divergent" and not report.timed_out:
            said(f"fix: the repeats diverge; searching the knobs (at most {budget} more repeats)")

    with progress:
        report = run_fix(options, budget, progress.on_done, progress.on_progress, on_trial, on_audit)
    if report.verdict in ("failed", "timeout", "inconclusive"):  # the audit's own report says why
        finish(audits[0], None, None, quiet,
               notes=("`detaudit fix` needs repeats that run to their end and record; these did not.",))
    if patch_path is not None:
        if report.patch:
            write_output(patch_path, report.patch)
        else:
            said(f"--write-patch: nothing written to {patch_path}: "
                 + ("the fix changes no line of the script (its knobs are environment variables)" if report.knobs
                    else "there is no fix to write"))
    finish_with(report, presentation(), {"json": json_path}, quiet)


def presentation() -> Presentation[FixReport]:
    """How a FixReport ends its command: JSON, the summary line, the terminal report."""
    from detaudit.fix.fix_report import write_json

    return Presentation({"json": write_json}, summary_line, render)


def summary_line(report: FixReport) -> Text:
    text = Text(report.verdict.upper(), style=_STYLE.get(report.verdict, "bold"))
    names = ", ".join(k.pin.value for k in report.knobs)
    under = f" under --perturb {','.join(report.perturb)}" if report.perturb else ""
    if report.verdict == "deterministic":
        text.append(f": the repeats agree{under}; nothing to fix")
    elif report.verdict == "fixed":
        text.append(f": {names} makes the repeats agree{under}, and it is needed" if len(report.knobs) == 1
                    else f": {names} make the repeats agree{under}, and each is needed")
        text.append(" · verified as written" if report.verified else " · NOT verified")
    elif report.verdict == "incomplete":
        text.append(f": {names} make the repeats agree; not shown minimal" if report.knobs
                    else ": no set of knobs made the repeats agree within the budget")
    elif report.verdict == "uncontrolled":
        text.append(f": no knob controls the divergence{under}, even all of them at once")
        cause = report.code_cause
        if cause is not None:
            text.append(f"; cause: {cause.id} ({cause.confidence}), fixed in the code")
    if report.repeats_used or report.verdict != "deterministic":
        text.append(f" · {report.repeats_used} of {report.budget} repeats")
    text.append(f" · run: {printable(report.run_dir)}")
    return text


def render(report: FixReport, console: Console) -> None:
    console.print(summary_line(report), soft_wrap=True)
    if report.verdict == "deterministic":
        return
    if report.first_divergence:
        console.print(Text(printable(f"The audit: the repeats first diverge at {report.first_divergence}")),
                      soft_wrap=True)
    if report.knobs:
        _render_fix(report, console)
    cause = report.code_cause
    if cause is not None:
        console.print(Text(f"Fix in the code — {cause.id} ({cause.confidence}); no setting controls it:",
                           style="bold"))
        console.print(Text(printable(f"    {cause.fix}"), style="green"), soft_wrap=True)
    for note in report.notes:
        console.print(Text(printable(note), style="yellow"), soft_wrap=True)
    if report.verdict == "uncontrolled":
        block = causes_block(report)
        if block is not None:
            console.print(block, soft_wrap=True)
    if report.trials:
        console.print(Text("Search", style="bold"))
        for trial in report.trials:
            verdict = "agree" if trial.verdict == "deterministic" else trial.verdict
            console.print(Text(printable(f"   {trial.files}: {trial.name}: {verdict} ({trial.repeats} repeats)"
                                         + (f"; {trial.note}" if trial.note and verdict != "agree" else ""))),
                          soft_wrap=True)


def _render_fix(report: FixReport, console: Console) -> None:
    script = Path(report.script).name
    if report.prelude:
        where = f"after line {report.insert_after}" if report.insert_after else "at line 1"
        console.print(Text(f"Add at the top of {script} ({where}):", style="bold"))
        console.print(Text("\n".join(f"    {line}" for line in report.prelude)), soft_wrap=True)
    if report.env:
        console.print(Text("Set in the environment, before python starts:", style="bold"))
        env = " ".join(f"{k}={v}" for k, v in report.env.items())
        console.print(Text(printable(f"    {env} python {script}")), soft_wrap=True)
    if report.edits:
        console.print(Text("Change at your own lines:", style="bold"))
        for e in report.edits:
            change = f"{e.before.strip()}  ->  {e.after.strip()}" if e.after is not None else e.advice
            state = "" if e.applies else "  (not applied by detaudit: not part of the verification)"
            console.print(Text(printable(f"    {e.file}:{e.line}: {change}{state}")), soft_wrap=True)
    table = Table(title="Knobs: each needed, and what it costs", title_justify="left", show_edge=False)
    for col in ("knob", "where", "without it", "CPU per step (with / without)", "whole run (with / without)",
                "cost (paired runs)"):
        table.add_column(col)
    for k in report.knobs:
        needed = "?" if k.needed is None else (
            f"{'diverge' if k.needed.verdict == 'divergent' else k.needed.verdict} ({k.needed.files or 'the audit'})")
        cost = k.cost
        table.add_row(k.pin.value, k.where, needed, _pair(cost.step if cost else None, 1000, "ms"),
                      _pair(cost.run if cost else None, 1, "s"),
                      cost.summary if cost else "not measured: the budget had no room for its paired runs")
    console.print(table)
    for k in report.knobs:
        if k.note:
            console.print(Text(printable(f"   {k.pin.value}: {k.note}"), style="dim"), soft_wrap=True)
    if report.whole_run is not None and report.whole_run.with_s is not None:
        run = report.whole_run
        console.print(Text(f"The whole fix: {run.with_s:.3g} s a run against {run.without_s:.3g} s without it "
                           f"({run.text('whole run')}), in pairs of runs back to back"), soft_wrap=True)
    console.print(Text(printable(("Verified: " if report.verified else "NOT verified: ") + report.verification)),
                  soft_wrap=True)


def _pair(figure: Figure | None, scale: float, unit: str) -> str:
    if figure is None or figure.with_s is None or figure.without_s is None:
        return "-"
    return f"{figure.with_s * scale:.3g} / {figure.without_s * scale:.3g} {unit}"
