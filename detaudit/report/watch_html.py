"""`detaudit watch --html PATH`: the watch report as one self-contained page, in the style of the run report's
(report/html.py: its page, tables and verdict badge). Reads the typed WatchReport, as every renderer does."""

from __future__ import annotations

from html import escape
from pathlib import Path

from detaudit import __version__
from detaudit.report.html import kv, page, table, verdict_badge
from detaudit.report.watch_model import Against, WatchReport
from detaudit.run.files import write_output

_COLOURS = {"clean": "#1a7f37", "mismatch": "#cf222e"}  # the others (the job failed, timed out...): amber


def render_watch_html(report: WatchReport) -> str:
    """The whole page of a WatchReport."""
    log = report.log
    body = [
        f"<h1>detaudit watch {verdict_badge(report.verdict, _COLOURS.get(report.verdict, '#9a6700'))}</h1>",
        f"<p class='mono'>{escape(report.script)}</p>",
        f"<p>{escape(_summary(report))}</p>",
        "<h2>The job</h2>" + kv([
            ("exit status", report.result.exit_code), ("ended", report.result.ending.value),
            ("ranks per node", report.settings.nproc_per_node), ("replayed", f"every {report.settings.every} steps"),
            ("on a mismatch", report.settings.on_mismatch),
            ("steps end at", {"backward": "each backward() (no optimizer was made before the first)",
                              "optimizer.step": "each optimizer step"}.get(log.step_boundary or "")),
            ("checked steps", ", ".join(str(s) for s in log.checked_steps) or "none"),
            ("ops replayed", log.replayed_ops),
            ("not replayed", ", ".join(f"{n} {why}" for why, n in sorted(log.skipped_ops.items())) or None),
            ("not results (not compared)", report.not_results),
            ("not checked", report.unchecked_sentence), ("compiled, not checked", report.compiled_sentence),
            ("stopped", report.stop_sentence),
            ("written before the check caught up",
             ", ".join(f"{save.target} (step {save.step})" for save in log.unchecked_saves) or None)]),
        _mismatches_section(report),
        _against_section(report.against),
        f"<p class='muted'>run directory <span class='mono'>{escape(report.run_dir)}</span> · "
        f"detaudit {escape(__version__)}</p>",
    ]
    return page(f"detaudit watch: {report.verdict} — {Path(report.script).name}", body)


def write_watch_html(report: WatchReport, path: Path) -> None:
    """Write the HTML page of `report` to `path` (`-`: stdout)."""
    write_output(path, render_watch_html(report))


def _summary(report: WatchReport) -> str:
    log = report.log
    found = len(report.mismatches)
    kind = "" if log.boundary == "backward" else "optimizer "
    return (f"{log.steps} {kind}step{'s' if log.steps != 1 else ''} completed, {log.checked_phrase}, "
            f"{found} mismatch{'es' if found != 1 else ''}.")


def _mismatches_section(report: WatchReport) -> str:
    if not report.mismatches:
        return ""
    rows = [(m.step, m.check, m.rank, m.op + (f" (backward of {m.backward_of})" if m.backward_of else ""), m.module,
             m.location, m.max_abs_diff, m.max_ulp if m.check != "replica" else None, m.verdict)
            for m in report.mismatches]
    return "<h2>Mismatches</h2><div class='wide'>" + table(
        ["step", "check", "rank", "op or record", "module", "where", "max |diff|", "max ULP", "what it means"], rows,
        numeric=["step", "max |diff|", "max ULP"]) + "</div>"


def _against_section(against: Against | None) -> str:
    if against is None:
        return ""
    agreed = "no step" if against.agrees_to_step is None else f"step {against.agrees_to_step}"
    changes = table(["what changed", "reference", "this run"],
                    [(c.field, c.baseline, c.current) for c in against.changes]) if against.changes else ""
    return "<h2>Against the reference</h2>" + kv([
        ("reference", against.reference), ("verdict", "differs" if against.difference is not None else "agrees"),
        ("agreed up to", agreed)]) + changes
