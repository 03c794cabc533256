"""`detaudit resume SCRIPT [ARGS]... --stop-at K --resume-args "ARGS"`: the command and its terminal rendering.

The check itself is audit/resume_check.py's; the report, report/resume.py's (docs/resume.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.text import Text

from detaudit.cli.options import (
    RunCommand,
    audit_option_group,
    check_outputs,
    devices_option,
    html_option,
    json_option,
    max_steps_option,
    out_option,
    quiet_option,
    sarif_option,
    script_arguments,
    timeout_option,
)
from detaudit.cli.render import causes_block, escape
from detaudit.cli.session import Presentation, RepeatsProgress, err_console, finish, finish_with
from detaudit.safetext import printable

if TYPE_CHECKING:  # the resume stage is imported when the command runs
    from detaudit.audit.pipeline import AuditOptions
    from detaudit.report.resume import ResumeReport
    from detaudit.results import RepeatResult

_PULLED = ("--stop-at", "--resume-args")  # detaudit's wherever they stand before `--`
_STYLE = {"resume-equivalent": "bold green", "resume-divergent": "bold red", "reference-divergent": "bold red"}


class ResumeCommand(RunCommand):
    """`resume`: --stop-at and --resume-args are detaudit's anywhere before `--` (they follow the script's own
    arguments in the documented spelling); the rest splits as `run`'s arguments do."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        pulled: list[str] = []
        rest: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                rest.extend(args[i:])
                break
            name = arg.split("=", 1)[0]
            if name in _PULLED:
                width = 1 if "=" in arg or i + 1 == len(args) else 2
                pulled.extend(args[i:i + width])
                i += width
                continue
            rest.append(arg)
            i += 1
        return super().parse_args(ctx, [*pulled, *rest])


@click.command(cls=ResumeCommand)  # its epilog: the command table (commands.py)
@script_arguments
@click.option("--stop-at", type=click.IntRange(min=1), required=True, metavar="K",
              help="Stop the interrupted run right after its K-th optimizer step (as --max-steps K does); the "
                   "script's own checkpointing must have saved by then.")
@click.option("--resume-args", required=True, metavar="ARGS",
              help="What the script is given, after its ARGS, to resume from its checkpoint, as one quoted string "
                   "(`--resume-args \"--init_from=resume\"`).")
@max_steps_option("Stop the reference and the resumed run after this many optimizer steps (each its own count); "
                  "only the steps both made are compared.")
@devices_option("Device to run on. [default: auto = wherever the script itself runs]", once=True)
@timeout_option("Seconds allowed per run.")
@out_option
@json_option
@html_option("Write an HTML report.")
@sarif_option
@quiet_option()
@audit_option_group(repeats=2, granularity="module")  # the reference: two repeats of the uninterrupted run
def resume(options: AuditOptions, stop_at: int, resume_args: str, json_path: Path | None, html_path: Path | None,
           sarif_path: Path | None, quiet: bool) -> None:
    """Does stopping SCRIPT at a checkpoint and resuming it reproduce the uninterrupted run, bit for bit?

    Runs, one after the other in this directory: the reference (`SCRIPT ARGS`, twice: a script that does not
    reproduce itself is reported as such first), the interrupted run (`SCRIPT ARGS`, stopped after step K)
    and the resumed run (`SCRIPT ARGS RESUME_ARGS`). The resumed run is aligned to the reference step whose
    parameters it starts from and compared with the reference from there; when they differ, the causes
    name what the checkpoint forgot (RNG state, optimizer state, LR scheduler, GradScaler, data position,
    weights) with the fix at the script's line. docs/resume.md.

    --stop-at and --resume-args are detaudit's anywhere before `--`. The other options go before SCRIPT, or
    after it ahead of the script's own: as for `run`, an option detaudit does not know hands the rest of the
    line to the script, and a script option detaudit knows too (`--device=cpu`) goes after `--`.
    """
    from detaudit.audit.resume_check import ResumeOptions, run_resume
    from detaudit.report.resume import ResumeReport

    extra = shlex.split(resume_args)
    if not extra:
        raise click.UsageError("--resume-args is empty: give the arguments that make the script resume")
    check_outputs(json_path, None, html_path, out_dir=options.out_dir, sarif_path=sarif_path,
                  inputs={"the audited script": options.target.script})
    progress = RepeatsProgress(quiet, 4, "resume check")

    def stage(text: str) -> None:
        if not quiet:
            err_console.print(escape(text), soft_wrap=True)

    with progress:
        report = run_resume(ResumeOptions(options, stop_at, extra), progress.on_done, stage)
    if not isinstance(report, ResumeReport):  # the reference failed or timed out: reported as `run` would
        finish(report, json_path, None, quiet, html_path, sarif_path=sarif_path,
               notes=("The resume check needs an uninterrupted run to compare with; this one did not give one.",))
    finish_with(report, presentation(), {"json": json_path, "html": html_path, "sarif": sarif_path}, quiet)


def presentation() -> Presentation[ResumeReport]:
    """How a ResumeReport ends its command: JSON, HTML, SARIF, the summary line, the terminal report."""
    from detaudit.report.resume import write_html, write_json
    from detaudit.report.sarif import write_resume_sarif

    return Presentation({"json": write_json, "html": write_html, "sarif": write_resume_sarif}, summary_line, render)


def summary_line(report: ResumeReport) -> Text:
    text = Text(report.verdict.upper(), style=_STYLE[report.verdict])
    if report.verdict == "reference-divergent":
        text.append(": the uninterrupted run does not reproduce itself, so resuming cannot be judged; "
                    "fix that first")
    elif report.aligned_step is None:
        text.append(f": the resumed run starts from weights no step of the uninterrupted run had "
                    f"(stopped after step {report.stop_at})")
    elif report.divergence is None:
        text.append(f": stopped after step {report.stop_at} and resumed from step {report.aligned_step}, the run "
                    f"reproduces the uninterrupted one bit for bit "
                    f"({report.comparison.records_compared if report.comparison is not None else 0} records)")
    else:
        text.append(f": stopped after step {report.stop_at} and resumed from step {report.aligned_step}, the run "
                    f"first differs at step {report.first_divergence_step}")
    if report.causes:
        text.append(f" · {report.causes[0].id}", style="bold")
    text.append(f" · run: {printable(report.run_dir)}")
    return text


def render(report: ResumeReport, console: Console) -> None:
    from detaudit.cli.render import render as render_audit

    console.print(summary_line(report), soft_wrap=True)
    if report.verdict == "reference-divergent":
        console.print(Text("The reference audit (two repeats of the uninterrupted run):", style="bold"))
        render_audit(report.reference, console)
        return
    d = report.divergence
    if d is not None and d.record is not None:
        r = d.record
        line = Text("First difference: ", style="bold")
        line.append(printable(f"{r.kind} `{r.name}` at step {r.step} (reference numbering)"
                              + (f" in {r.module}" if r.module else "") + (f", {r.location}" if r.location else "")
                              + f": {d.detail}"))
        console.print(line, soft_wrap=True)
    block = causes_block(report)
    if block is not None:
        console.print(block, soft_wrap=True)
    console.print(Text("Checkpoint", style="bold"))
    for verb, calls in (("saved", report.saved), ("loaded", report.loaded)):
        for call in calls:
            parts = ", ".join(f"{p['role']} ({p['path']})" if p["path"] else p["role"] for p in call.parts)
            console.print(Text(printable(f"   {verb} by the {call.run} run at {call.loc}, after step {call.step}: "
                                         f"{call.path} — {parts or 'no state dict or RNG state recognised'}")),
                          soft_wrap=True)
    console.print(Text(printable(_runs(report)), style="dim"), soft_wrap=True)


def _runs(report: ResumeReport) -> str:
    reference = report.reference.runs
    times = ", ".join(f"{r.duration_s:.1f} s" for r in reference)
    rest: Sequence[RepeatResult] = report.runs
    return (f"runs: reference {times}; interrupted {rest[0].duration_s:.1f} s; resumed {rest[1].duration_s:.1f} s; "
            f"run directory {report.run_dir}")
