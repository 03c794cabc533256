"""`detaudit watch SCRIPT`: guard one run while it runs (docs/watch.md). The command and its rendering.

Standard output carries the script's own output and nothing else; detaudit's status lines and report go to
standard error, the JSON report to `--json PATH`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape

from detaudit.audit.watch import Against, WatchReport, WatchSettings
from detaudit.cli.options import (
    RunCommand,
    check_outputs,
    json_option,
    option_group,
    out_option,
    quiet_option,
    script_arguments,
    timeout_option,
)
from detaudit.cli.session import err_console
from detaudit.errors import ExitCode
from detaudit.run.files import write_output
from detaudit.safetext import printable

_EXIT_CODES = ("\b\nExit codes:\n  0    clean: every replayed op agreed bit for bit, the script exited 0\n"
               "  1    mismatch: an op's replay disagreed (the job was stopped unless --on-mismatch continue)\n"
               + "".join(f"  {int(code):<4} {code.meaning}\n" for code in ExitCode if code > 1))


@click.command(cls=RunCommand, epilog=_EXIT_CODES)
@script_arguments
@click.option("--every", type=click.IntRange(min=1), default=WatchSettings.every, show_default=True,
              help="Replay every K-th optimizer step (the first one always).")
@click.option("--on-mismatch", type=click.Choice(["stop", "continue"]), default="stop", show_default=True,
              help="stop: end the job before its next torch.save or optimizer.step after a mismatch (exit 1); "
                   "continue: record every mismatch and let the job finish.")
@click.option("--status-every", type=click.IntRange(min=1), default=WatchSettings.status_every, show_default=True,
              help="Steps between two status lines on standard error.")
@timeout_option("Seconds the job may run.")
@out_option
@click.option("--against", type=click.Path(path_type=Path), default=None, metavar="RUN_DIR|BASELINE",
              help="Compare the run record by record with an earlier recording of the script while it runs (a "
                   "baseline saved by `run --save-baseline`, or a run directory's first repeat); the first "
                   "difference is a mismatch, and the job is stopped at its next step boundary.")
@json_option
@quiet_option("Print only the verdict line (on standard error).")
@option_group(WatchSettings, "settings")  # --every, --on-mismatch, --status-every, --timeout, --against
def watch(script: str, script_args: tuple[str, ...], settings: WatchSettings, out_dir: Path | None,
          json_path: Path | None, quiet: bool) -> NoReturn:
    """Run SCRIPT once and check it while it runs: on the first optimizer step and every --every K-th after
    it, every op is executed a second time on copies of its inputs and must agree bit for bit (a mismatch is
    a nondeterministic kernel or a hardware fault). On the first mismatch the job is stopped before it saves a
    checkpoint or applies the update. The script's standard output is passed through untouched; detaudit
    writes to standard error only. Options may come before or after SCRIPT, as with `run`.
    """
    from detaudit.audit.watch import run_watch

    against = settings.against
    inputs = {"the watched script": Path(script), **({"--against": against} if against is not None else {})}
    check_outputs(json_path, None, None, out_dir=out_dir, inputs=inputs)
    report = run_watch(script, list(script_args), out_dir, settings,
                       lambda line: err_console.print(escape(printable(line)), soft_wrap=True, highlight=False))
    if json_path is not None:
        write_output(json_path, json.dumps(report.to_json(), indent=2) + "\n")
    if quiet:
        err_console.print(summary_line(report), soft_wrap=True)
    else:
        render_watch(report, err_console)
    sys.exit(report.exit_code)


def _clean(text: object) -> str:
    return escape(printable(str(text)))


def summary_line(report: WatchReport) -> str:
    log = report.log
    colour = "red" if report.verdict == "mismatch" else "green"
    found = len(report.mismatches)
    text = (f"[bold {colour}]{report.verdict}[/]: {log.steps} step{'s' if log.steps != 1 else ''}, "
            f"{len(log.checked_steps)} checked, {found} mismatch{'es' if found != 1 else ''}")
    if log.stopped is not None:
        text += f"; stopped before {log.stopped.before}"
    return text


def render_watch(report: WatchReport, console: Console) -> None:
    log = report.log
    console.print(f"[bold]detaudit watch[/] {_clean(report.script)}  (run directory {_clean(report.run_dir)})")
    console.print(f"checked steps: {_clean(_steps(log.checked_steps))} (every {report.settings.every}); "
                  f"{log.replayed_ops} ops replayed")
    if not log.replayed_ops and report.result.exit_code == 0:
        console.print("[yellow]no op was replayed: the script computed nothing with torch on the thread that "
                      "ends its steps (docs/watch.md), so \"clean\" here proves nothing[/]")
    if log.skipped_ops:
        console.print("not replayed: " + ", ".join(f"{count} {_clean(why)}" for why, count in
                                                   sorted(log.skipped_ops.items())))
    for m in report.mismatches:
        where = _clean(m.location or "?")
        what = _clean(m.op) + (f" (backward of {_clean(m.backward_of)})" if m.backward_of else "")
        module = f" in {_clean(m.module)}" if m.module else ""
        console.print(f"[bold red]mismatch[/] ({m.check}) at step {m.step}: {what}{module} at {where}: max |diff| "
                      f"{m.max_abs_diff:.3g}, {m.max_ulp} ULP — {_clean(m.verdict)}", soft_wrap=True)
    if report.against is not None:
        _render_against(report.against, console)
    stopped = log.stopped
    if stopped is not None:
        target = f": {_clean(stopped.target)} was not written" if stopped.target else ": the update was not applied"
        console.print(f"[bold]stopped[/] the job at step {stopped.step} before {stopped.before}{target}")
    if stopped is None and report.result.stopped_at_step is not None:
        console.print(f"[bold]stopped[/] the job after step {report.result.stopped_at_step}: it differed from the "
                      "reference")
    failed = report.result.exit_code not in (0, None) and stopped is None
    if failed or report.result.timed_out:
        how = "timed out" if report.result.timed_out else f"exited with status {report.result.exit_code}"
        console.print(f"[yellow]the script {how}[/]; see {_clean(Path(report.run_dir) / report.result.stderr)}")
    console.print(summary_line(report), soft_wrap=True)


def _render_against(against: Against, console: Console) -> None:
    agreed = "no step" if against.agrees_to_step is None else f"step {against.agrees_to_step}"
    verdict = "differs" if against.difference is not None else "agrees"
    console.print(f"against {_clean(against.reference)}: {verdict} (agreed up to {agreed})")
    for change in against.changes:
        console.print(f"  changed: {_clean(change.field)}: {_clean(change.baseline)} → {_clean(change.current)}",
                      soft_wrap=True)


def _steps(steps: tuple[int, ...]) -> str:
    if not steps:
        return "none"
    shown = ", ".join(str(s) for s in steps[:8])
    return shown + (f" and {len(steps) - 8} more" if len(steps) > 8 else "")
