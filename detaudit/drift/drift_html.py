"""`detaudit drift --html`: the report as one self-contained page (no script, no external resource), with B's
largest difference from A and A's largest floor over the steps, on log scales (report/html.py's series plot)."""

from __future__ import annotations

import html
from pathlib import Path

from detaudit.drift.drift_report import DriftReport
from detaudit.report.html import log_series_svg


def render_html(report: DriftReport) -> str:
    """The page: verdict, configurations, the two series, the first drift and the candidate causes."""
    e = html.escape
    steps = [s.step for s in report.by_step]
    moved = log_series_svg("difference", "largest |B - A| per step", steps,
                           [(s.step, s.largest_difference) for s in report.by_step if s.largest_difference is not None])
    floor = log_series_svg("floor", "A's largest noise floor per step", steps,
                           [(s.step, s.largest_floor) for s in report.by_step])
    first = report.first_drift
    where = "" if first is None else (
        f"<h2>First drift</h2><p>step {first.step}, {e(first.kind)} <code>{e(first.name)}</code> (module "
        f"<code>{e(first.module or '-')}</code>) at <code>{e(first.location)}</code>: "
        + ("beyond any floor" if first.ratio_to_floor is None else f"{first.ratio_to_floor:.3g}x its floor")
        + (f", constant factor {first.factor:g}" if first.factor is not None else "") + "</p>")
    causes = "".join(f"<li><b>{e(c.setting)}</b>: {e(c.change())} ({e(c.family)}): {e(c.why)}</li>"
                     for c in report.causes)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>detaudit drift: {e(report.verdict)}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}</style></head><body>"
            f"<h1>detaudit drift: {e(report.verdict)}</h1><p><code>{e(report.script)}</code></p>"
            f"<p>A: <code>{e(report.a.described())}</code><br>B: <code>{e(report.b.described())}</code></p>"
            f"{moved}{floor}{where}" + (f"<h2>Candidate causes</h2><ul>{causes}</ul>" if causes else "")
            + "</body></html>\n")


def write_html(report: DriftReport, path: Path) -> None:
    from detaudit.run.files import write_output

    write_output(path, render_html(report))
