"""`detaudit watch SCRIPT`: guard one run while it runs (docs/watch.md). The command and its rendering.

Standard output carries the script's own output and nothing else; detaudit's status lines and report go to
standard error, the JSON report to `--json PATH`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape

from detaudit.cli.options import (
    RunCommand,
    check_outputs,
    html_option,
    json_option,
    nproc_option,
    option_group,
    out_option,
    quiet_option,
    sarif_option,
    script_arguments,
    timeout_option,
    torchrun_args_option,
)
from detaudit.cli.session import Presentation, err_console, finish_with
from detaudit.report.sarif import write_watch_sarif
from detaudit.report.watch_html import write_watch_html
from detaudit.report.watch_model import (
    BACKWARD_STEPS,
    Against,
    Cadence,
    WatchReport,
    WatchSettings,
    write_watch_json,
)
from detaudit.results import Ending
from detaudit.safetext import printable


class CadenceType(click.ParamType):
    """`--status-every`: N steps, or `Ns` seconds."""

    name = "N|Ns"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Cadence:
        if isinstance(value, Cadence):
            return value
        text = str(value).strip()
        seconds = text.endswith("s")
        try:
            every = float(text.removesuffix("s")) if seconds else int(text)
        except ValueError:
            every = 0
        if not every > 0 or every == float("inf"):
            self.fail(f"{value!r} is neither a number of steps (100) nor of seconds (60s)", param, ctx)
        return Cadence(every, "seconds" if seconds else "steps")


def watch_settings(every: int, on_mismatch: str, status_every: Cadence, timeout: float | None,
                   against: Path | None, nproc_per_node: int | None, torchrun_args: str) -> WatchSettings:
    """watch's options as the one value the library takes (--torchrun-args parsed, its combinations checked)."""
    return WatchSettings(every, "stop" if on_mismatch == "stop" else "continue", status_every, timeout, against,
                         nproc_per_node, _torchrun(nproc_per_node, torchrun_args, against))


@click.command(cls=RunCommand)
@script_arguments
@click.option("--every", type=click.IntRange(min=1), default=WatchSettings.every, show_default=True,
              help="Replay every K-th step (the first one always): optimizer steps, or each backward() in a script "
                   "with no optimizer.")
@click.option("--on-mismatch", type=click.Choice(["stop", "continue"]), default="stop", show_default=True,
              help="stop: end the job before its next torch.save or optimizer.step after a mismatch (exit 1); "
                   "continue: record every mismatch and let the job finish.")
@click.option("--status-every", type=CadenceType(), default=str(WatchSettings.status_every), show_default=True,
              help="A status line on standard error every N optimizer steps, or every N seconds (`60s`).")
@timeout_option("Seconds the job may run.")
@out_option
@click.option("--against", type=click.Path(path_type=Path), default=None, metavar="RUN_DIR|BASELINE",
              help="Compare the run record by record with an earlier recording of the script while it runs (a "
                   "baseline saved by `run --save-baseline`, or a run directory's first repeat); the first "
                   "difference is a mismatch, and the job is stopped at its next step boundary.")
@nproc_option("Launch the script under torchrun with this many ranks (as `run` does); each rank is replayed, "
              "and the DDP replicas are compared across ranks at every step.")
@torchrun_args_option("With --nproc-per-node: further torchrun options, as one quoted string.")
@json_option
@html_option("Write the report as one self-contained HTML page.")
@sarif_option
@quiet_option("Print only the verdict line (on standard error).")
@option_group(watch_settings, "settings")  # --every ... --torchrun-args
def watch(script: str, script_args: tuple[str, ...], settings: WatchSettings, out_dir: Path | None,
          json_path: Path | None, html_path: Path | None, sarif_path: Path | None, quiet: bool) -> NoReturn:
    """Run SCRIPT once and check it while it runs: on the first optimizer step and every --every K-th after
    it, every op is executed a second time on copies of its inputs and must agree bit for bit (a mismatch is
    a nondeterministic kernel or a hardware fault). On the first mismatch the job is stopped before it saves a
    checkpoint or applies the update. The script's standard output is passed through untouched; detaudit
    writes to standard error only. Options may come before or after SCRIPT, as with `run`.
    """
    from detaudit.audit.watch import run_watch

    against = settings.against
    inputs = {"the watched script": Path(script), **({"--against": against} if against is not None else {})}
    if "-" in (str(json_path), str(html_path), str(sarif_path)):
        raise click.UsageError("watch's standard output is the script's own: write --json, --html and --sarif to "
                               "files")
    check_outputs(json_path, None, html_path, out_dir=out_dir, inputs=inputs, sarif_path=sarif_path)
    report = run_watch(script, list(script_args), out_dir, settings,
                       lambda line: err_console.print(escape(printable(line)), soft_wrap=True, highlight=False))
    finish_with(report, presentation(), {"json": json_path, "html": html_path, "sarif": sarif_path}, quiet)


def presentation() -> Presentation[WatchReport]:
    """How a WatchReport ends its command: JSON, HTML, SARIF, the summary line, the report, all on standard error."""
    return Presentation({"json": write_watch_json, "html": write_watch_html, "sarif": write_watch_sarif}, summary_line,
                        render_watch, on_stderr=True)


def _torchrun(nproc_per_node: int | None, torchrun_args: str, against: Path | None) -> tuple[str, ...]:
    from detaudit.run.distributed import parse_torchrun_args

    if not nproc_per_node:
        if torchrun_args:
            raise click.UsageError("--torchrun-args needs --nproc-per-node")
        return ()
    if against is not None:
        raise click.UsageError("--against does not support --nproc-per-node yet (a reference keeps one trace; a "
                               "torchrun job has one per rank)")
    return tuple(parse_torchrun_args(torchrun_args))


def _clean(text: object) -> str:
    return escape(printable(str(text)))


_COLOURS = {"clean": "green", "mismatch": "red"}  # the others: yellow


def summary_line(report: WatchReport) -> str:
    log = report.log
    word, colour = report.verdict.replace("-", " "), _COLOURS.get(report.verdict, "yellow")
    found = len(report.mismatches)
    text = (f"[bold {colour}]{word}[/]: {log.steps} step{'s' if log.steps != 1 else ''}, "
            f"{log.checked_phrase}, {found} mismatch{'es' if found != 1 else ''}")
    if log.stopped is not None:
        text += f"; stopped before {log.stopped.before_text}"
    if report.compiled:
        text += "; compiled regions not checked"
    return text


def render_watch(report: WatchReport, console: Console) -> None:
    log = report.log
    console.print(f"[bold]detaudit watch[/] {_clean(report.script)}  (run directory {_clean(report.run_dir)})")
    _render_steps(report, console)
    for warning in (report.unchecked_sentence, report.compiled_sentence):
        if warning is not None:
            console.print(f"[yellow]{_clean(warning)}[/]", soft_wrap=True)
    if log.skipped_ops:
        console.print("not replayed: " + ", ".join(f"{count} {_clean(why)}" for why, count in
                                                   sorted(log.skipped_ops.items())))
    if report.not_results:
        console.print(f"not results: {_clean(report.not_results)} (replayed, not compared: memory an op keeps for "
                      "its backward, whose bytes the kernel need not define)")
    for m in report.mismatches:
        where = f" at {_clean(m.location or '?')}" if m.check != "replica" else ""
        what = _clean(m.op) + (f" (backward of {_clean(m.backward_of)})" if m.backward_of else "")
        module = f" in {_clean(m.module)}" if m.module else ""
        rank = f" on rank {m.rank}" if m.rank is not None else ""
        ulp = f", {m.max_ulp} ULP" if m.check != "replica" else ""
        console.print(f"[bold red]mismatch[/] ({m.check}) at step {m.step}{rank}: {what}{module}{where}: max |diff| "
                      f"{m.max_abs_diff:.3g}{ulp} — {_clean(m.verdict)}", soft_wrap=True)
    if report.against is not None:
        _render_against(report.against, console)
    stop = report.stop_sentence
    if stop is not None:
        console.print("[bold]stopped[/]" + _clean(stop.removeprefix("stopped")))
    for save in log.unchecked_saves:
        console.print(f"[yellow]torch.save to {_clean(save.target)} at step {save.step} was written before the "
                      "check had caught up[/] (it waited its whole patience)", soft_wrap=True)
    ending = report.result.ending
    if ending is Ending.TIMED_OUT or (ending is Ending.FAILED and log.stopped is None):
        how = "timed out" if ending is Ending.TIMED_OUT else f"exited with status {report.result.exit_code}"
        console.print(f"[yellow]the script {how}[/]; see {_clean(Path(report.run_dir) / report.result.stderr)}")
    console.print(summary_line(report), soft_wrap=True)


def _render_steps(report: WatchReport, console: Console) -> None:
    """The steps checked, and what ended the steps when it was not the optimizer's step."""
    log = report.log
    console.print(f"checked steps: {_clean(_steps(log.checked_steps))} (every {report.settings.every}); "
                  f"{log.replayed_ops} ops replayed")
    if log.boundary == "backward":
        console.print(BACKWARD_STEPS)


def _render_against(against: Against, console: Console) -> None:
    agreed = "agreed on no step" if against.agrees_to_step is None else f"agreed up to step {against.agrees_to_step}"
    verdict = "differs" if against.difference is not None else "agrees"
    console.print(f"against {_clean(against.reference)}: {verdict} ({agreed})")
    for change in against.changes:
        console.print(f"  changed: {_clean(change.field)}: {_clean(change.baseline)} → {_clean(change.current)}",
                      soft_wrap=True)


def _steps(steps: tuple[int, ...]) -> str:
    if not steps:
        return "none"
    shown = ", ".join(str(s) for s in steps[:8])
    return shown + (f" and {len(steps) - 8} more" if len(steps) > 8 else "")
