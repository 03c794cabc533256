"""`detaudit batch SCRIPT`: does a request's result depend on what else is in its batch? The command
(options as `run` has them) and its terminal rendering (docs/batch.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from detaudit.batch.finding import BatchFinding, FirstVariant
from detaudit.batch.reporting import BatchReport, BatchSettings, write_html, write_json
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
    repeats_option,
    script_arguments,
    timeout_option,
)
from detaudit.cli.session import Presentation, RepeatsProgress, finish_with, plain_table
from detaudit.results import Ending
from detaudit.safetext import printable

if TYPE_CHECKING:
    from detaudit.audit.pipeline import AuditOptions


def _sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...]:
    """--sizes K,K,... as row counts."""
    if not value:
        return ()
    try:
        sizes = tuple(int(part) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of row counts (`1,7,32`)") from None
    if any(k < 1 for k in sizes):
        raise click.BadParameter("every size must be at least 1")
    return sizes


@click.command(cls=RunCommand)
@script_arguments
@repeats_option("Repeats; more than one also compares them with each other (run-to-run, as `run`).", minimum=1,
                default=1)
@devices_option("Device to run on (auto: wherever the script itself runs).", once=True, default="auto")
@timeout_option()
@out_option
@json_option
@html_option("Write an HTML report.")
@quiet_option()
@max_steps_option("Stop after the model's N-th call (its N-th optimizer step in a training script): the first N "
                  "calls are probed.")
@click.option("--module", "module_name", default=None, metavar="NAME",
              help="Probe the calls of this module (qualified name such as `encoder`, or class name) instead of "
                   "the outermost modules.")
@click.option("--batch-dim", type=click.IntRange(min=0), default=None,
              help="The batch dimension of the tensor arguments (those whose size there is the batch's). Default: "
                   "where the model's layers declare it (batch_first of RNN and attention layers), else dim 0.")
@click.option("--sizes", default=None, metavar="K,K,...", callback=_sizes,
              help="Prefix sizes to probe (default: PyTorch's halving ladder n/2, n/4, ..., 1 of an n-row batch, and "
                   "an odd size, 7, it lacks).")
@click.option("--redact-args", is_flag=True, help="Store the script's arguments nowhere (run directory, traces, "
              "reports).")
@audit_option_group(granularity="module")
def batch(options: AuditOptions, json_path: Path | None, html_path: Path | None, quiet: bool,
          module_name: str | None, batch_dim: int | None, sizes: tuple[int, ...]) -> None:
    """Does a request's result depend on what else is in its batch? Run SCRIPT and, at each call of the
    model (its outermost modules), re-evaluate the call on row subsets of its batch (prefixes of n/2, n/4,
    ..., 1 rows as PyTorch's harness does, an odd size, the batch reversed, its rows mixed with another
    call's) and compare each row bit for bit with the same row of the whole batch. When rows differ, name the
    first module and op where that starts.

    The probes run on a copy of the model under torch.no_grad() with the RNG states restored: the script
    computes what a plain run computes. Options may come before or after SCRIPT, as with `run`.
    """
    from detaudit.batch.auditing import run_batch

    check_outputs(json_path, None, html_path, out_dir=options.out_dir,
                  inputs={"the audited script": options.target.script})
    progress = RepeatsProgress(quiet, options.schedule.repeats, "running the script with batch probes")
    with progress:
        report = run_batch(options, BatchSettings(module_name, batch_dim, sizes), progress.on_done)
    finish_batch(report, json_path, html_path, quiet)


def finish_batch(report: BatchReport, json_path: Path | None, html_path: Path | None, quiet: bool) -> NoReturn:
    """Write the requested files, render, exit with the verdict's code."""
    finish_with(report, presentation(), {"json": json_path, "html": html_path}, quiet)


def presentation() -> Presentation[BatchReport]:
    """How a BatchReport ends its command: JSON, HTML, the summary line, the terminal report."""
    return Presentation({"json": write_json, "html": write_html}, summary_line, render_batch)


def _clean(text: object) -> str:
    return escape(printable(str(text)))


def summary_line(report: BatchReport) -> str:
    finding = report.finding
    verdict = report.verdict
    colour = {"batch-invariant": "green", "batch-variant": "red", "run-to-run-divergent": "red"}.get(verdict, "yellow")
    text = f"[bold {colour}]{verdict}[/]: {finding.probed_calls} call{'s' if finding.probed_calls != 1 else ''} probed"
    first = finding.first_variant
    if first is not None:
        where = first.op or first.module
        text += f"; {_clean(first.sizes_text)}"
        if where is not None:
            text += f"; starts at {_clean(where.name)} ({_clean(where.location)})"
        if first.large:
            text += " [bold red]— large difference: rows read each other's data[/]"
    if report.run_to_run is not None:
        text += f"; run to run: {_clean(report.run_to_run)}"
    return text


def _render_subsets(finding: BatchFinding, console: Console) -> None:
    """The probes' table: each subset size, how its rows compared, and its status in the harness's terms."""
    if not finding.subsets:
        return
    table = plain_table("probe", "rows", "calls", "result", "rows differ", "max |diff|", "max ULP", "harness")
    for s in finding.subsets:
        table.add_row(s.kind, str(s.size), str(s.probes),
                      "[green]agree[/]" if s.agree else f"[red]differ in {s.probes - s.agreed}[/]",
                      str(s.rows_differ), f"{s.max_abs_diff:.3g}", str(s.max_ulp),
                      ("pass" if s.agree else f"fail_batch_invariance_at_{s.size}") if s.ladder else "added")
    console.print(table)


def render_batch(report: BatchReport, console: Console) -> None:
    finding = report.finding
    console.print(f"[bold]detaudit batch[/] {_clean(report.script)}  (run directory {_clean(report.run_dir)})")
    failed = [r for r in report.results if r.ending is Ending.FAILED]
    if failed:
        console.print(f"[yellow]the script exited with status {failed[0].exit_code}[/]; see "
                      f"{_clean(Path(report.run_dir) / failed[0].stderr)}")
    for use in finding.batch_dims:
        console.print(f"batch dim {use.dim} ({use.source}) for {use.calls} call{'s' if use.calls != 1 else ''}: "
                      f"{_clean(use.detail)}")
    _render_subsets(finding, console)
    _render_harness(report, console)
    if finding.first_variant is not None:
        _render_first(finding.first_variant, console)
    if finding.tokens is not None:
        _render_tokens(finding, console)
    for cause in report.causes:
        console.print(f"[bold]cause[/] {_clean(cause.id)} ({cause.confidence}): {_clean(cause.summary)}")
        console.print(f"  fix: {_clean(cause.fix)}")
    for why, count in sorted(finding.skipped.items()):
        console.print(f"not probed or not comparable: {count} call{'s' if count != 1 else ''} ({_clean(why)}): "
                      f"{_clean(finding.skip_details.get(why, ''))}")
    if finding.not_reproduced:
        console.print(f"[yellow]{finding.not_reproduced} call(s) did not reproduce bit for bit when re-evaluated "
                      "whole (grad mode or run-to-run nondeterminism): their probes are compared with the "
                      "re-evaluation[/]")
    console.print(f"two properties: batch-invariant (a row's result independent of the rest of its batch): "
                  f"{_clean(finding.verdict)}; deterministic (the same inputs at the same shape, run to run): "
                  + (_clean(report.run_to_run) if report.run_to_run is not None
                     else "not checked with one repeat (-n 2 compares repeats)"))
    if report.run_to_run_detail:
        console.print(f"run to run: {_clean(report.run_to_run_detail)}")
    reason = report.inconclusive_reason
    if reason:
        console.print(f"[yellow]{_clean(reason)}[/]")
    console.print(summary_line(report), soft_wrap=True)


def _render_first(first: FirstVariant, console: Console) -> None:
    """The first variant call: its sizes, its first module and op, and how large its difference is."""
    console.print(f"[bold]first variant call[/]: {_clean(first.call_module)} call {first.call} "
                  f"({first.rows} rows, at {_clean(first.location or '?')}): {_clean(first.sizes_text)}")
    for label, spot in (("first module", first.module), ("first op", first.op)):
        if spot is not None:
            what = _clean(spot.name) + (f" ({_clean(spot.cls)})" if spot.cls else "")
            console.print(f"  {label}: {what} at {_clean(spot.location or '?')} — "
                          + ("reduced over the batch, differs" if spot.across_rows else
                             "its shape changes with the batch" if spot.shape_changed else
                             f"max |diff| {spot.max_abs_diff:.3g}, {spot.max_ulp} ULP"))
    if first.note:
        console.print(f"  [yellow]{_clean(first.note)}[/]")
    if first.large:
        console.print(f"[bold red]LARGE DIFFERENCE[/]: max |diff| {first.max_abs_diff:.3g} on values up to "
                      f"{first.scale:.3g} — not rounding: rows read each other's data (a mask or padding bug)")


def _render_tokens(finding: BatchFinding, console: Console) -> None:
    """The token answer: the earliest divergent token, and how many sequences and sizes have one."""
    tokens = finding.tokens
    assert tokens is not None
    tied = (f"{tokens.steps} decode step{'s' if tokens.steps != 1 else ''}, {tokens.tied} chose from a probed "
            f"call's output" + (f" ({tokens.untied} probed call(s) with scores no step chose from)" if tokens.untied
                                else ""))
    first = tokens.earliest
    if first is None:
        console.print(f"tokens: no greedy token changes with the batch ({tied})")
        return
    first_variant = finding.first_variant
    op = (first_variant.op or first_variant.module) if first_variant is not None else None
    size = f"a batch of {first.size}" if first.subset == "prefix" else f"the batch {first.subset}"
    margin = "not finite" if first.margin is None else format(first.margin, ".3g")
    console.print(f"[bold]first divergent token[/]: sequence {first.sequence} at position {first.position} "
                  f"({_clean(first.loc)}): {first.token} in the whole batch, {first.other} in {size} "
                  f"(margin {margin})" + (f"; starts at {_clean(op.name)} ({_clean(op.location)})"
                                          if op is not None else ""))
    console.print(f"  {len(tokens.first)} sequence/size pair(s) with a divergent token; {tied}")


def _render_harness(report: BatchReport, console: Console) -> None:
    """PyTorch's harness's status, what was not compared, and the mode the script called in."""
    finding = report.finding
    harness = finding.harness
    console.print(f"PyTorch harness terms: [bold]{_clean(harness.status)}[/]"
                  + (f" — {_clean(harness.reason)}" if harness.reason else ""))
    if finding.not_compared:
        console.print("not compared (no batch rows: aggregates): "
                      + ", ".join(f"{_clean(path)} in {n} call{'s' if n != 1 else ''}"
                                  for path, n in finding.not_compared.items()))
    if finding.train_mode_calls:
        console.print(f"{finding.train_mode_calls} probed call(s) ran in train mode, as the script called them "
                      "(PyTorch's harness probes in eval())")
