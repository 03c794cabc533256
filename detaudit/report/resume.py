"""`detaudit resume`'s result as data, and its JSON rendering (docs/resume.md; terminal: cli/resume_command.py).

A ResumeReport holds the reference audit (a Report: the uninterrupted run against a repeat of itself), the
interrupted and resumed runs, what they saved and loaded, where the resumed run starts in the reference's
numbering, and where and why the two first differ.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from detaudit import __version__
from detaudit.codec import Codable
from detaudit.compare.traces import Comparison
from detaudit.errors import ExitCode
from detaudit.events import CheckpointPart
from detaudit.report.model import Report, divergence_to_dict, spread_to_list
from detaudit.results import Cause, Divergence, RepeatResult
from detaudit.run.files import write_output

SCHEMA_NAME = "detaudit-resume-report"
SCHEMA_VERSION = 1
RESUME_FILE = "resume.json"  # in the run directory, beside the reference's report.json

# reference-divergent: the uninterrupted run does not even reproduce itself, so resuming cannot be judged
ResumeVerdict = Literal["resume-equivalent", "resume-divergent", "reference-divergent"]
RunName = Literal["reference", "interrupted", "resumed"]


@dataclass(frozen=True)
class CheckpointCall:
    """One `torch.save` or `torch.load` of the interrupted or resumed run (its checkpoint-save/-load event)."""

    run: RunName
    path: str
    loc: str
    step: int  # optimizer steps completed when it was called (the run's own count)
    keys: list[str]
    parts: list[CheckpointPart]
    at: int = 0  # the index of the run's next record when it was called


@dataclass(frozen=True)
class ResumeReport(Codable):
    """The resume check, built once by audit/resume_check.py."""

    script: str
    script_args: list[str]
    resume_args: list[str]
    run_dir: str
    stop_at: int
    verdict: ResumeVerdict
    aligned_step: int | None  # the reference step the resumed run starts at (None: no step fits, or not compared)
    divergence: Divergence | None  # first difference; its record's step is in the reference's numbering
    comparison: Comparison | None  # resumed vs reference from the aligned step
    causes: list[Cause]
    saved: list[CheckpointCall]  # the interrupted run's saves up to --stop-at
    loaded: list[CheckpointCall]  # the resumed run's loads
    reference: Report  # the reference audit (two repeats of the uninterrupted run)
    runs: list[RepeatResult]  # the interrupted and the resumed run (empty for reference-divergent)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.DETERMINISTIC if self.verdict == "resume-equivalent" else ExitCode.DIVERGENT

    @property
    def first_divergence_step(self) -> int | None:
        record = self.divergence.record if self.divergence is not None else None
        return record.step if record is not None else None


def report_json(report: ResumeReport) -> dict[str, Any]:
    """The resume report's documented JSON (docs/resume.md); `report.to_dict()` is its complete typed form."""
    comp = report.comparison
    names = ("interrupted", "resumed")
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "detaudit_version": __version__,
        "script": report.script,
        "script_args": report.script_args,
        "resume_args": report.resume_args,
        "run_dir": report.run_dir,
        "verdict": report.verdict,
        "exit_code": int(report.exit_code),
        "stop_at": report.stop_at,
        "aligned_step": report.aligned_step,
        "first_divergence": divergence_to_dict(report.divergence),
        "causes": [asdict(c) for c in report.causes],
        "checkpoint": {"saved": [_call(c) for c in report.saved], "loaded": [_call(c) for c in report.loaded]},
        "spread": None if comp is None else {
            "records_compared": comp.records_compared, "records_differing": comp.records_differing,
            "by_step": spread_to_list(comp.by_step)},
        "reference": {"verdict": report.reference.verdict, "exit_code": int(report.reference.exit_code),
                      "run_dir": report.reference.run_dir,
                      "causes": [c.id for c in report.reference.causes]},
        "runs": [{"run": name, "exit_code": r.exit_code, "duration_s": r.duration_s,
                  "stopped_at_step": r.stopped_at_step, "trace": r.trace, "stdout": r.stdout, "stderr": r.stderr}
                 for name, r in zip(names, report.runs)],
    }


def _call(call: CheckpointCall) -> dict[str, Any]:
    return {"run": call.run, "path": call.path, "loc": call.loc, "step": call.step, "keys": call.keys,
            "parts": [dict(p) for p in call.parts]}


def write_json(report: ResumeReport, path: Path, mode: int | None = None) -> None:
    """The JSON report at `path` (`-`: stdout)."""
    write_output(path, json.dumps(report_json(report), indent=2) + "\n", mode)


def render_html(report: ResumeReport) -> str:
    """One self-contained page: the verdict, the first difference, the causes and the checkpoint calls."""
    def esc(value: Any) -> str:
        return html.escape(str(value))

    rows = "".join(f"<tr><td>{esc(c.run)}</td><td>torch.{call}</td><td>{esc(c.path)}</td><td>{esc(c.loc)}</td>"
                   f"<td>{c.step}</td><td>{esc(', '.join(p['role'] + ' ' + p['path'] for p in c.parts) or '-')}</td>"
                   "</tr>" for call, calls in (("save", report.saved), ("load", report.loaded)) for c in calls)
    causes = "".join(f"<li><b>{esc(c.id)}</b> ({esc(c.confidence)}): {esc(c.summary)}<ul>"
                     + "".join(f"<li>{esc(e)}</li>" for e in c.evidence)
                     + f"<li>fix: {esc(c.fix)}</li></ul></li>" for c in report.causes)
    record = report.divergence.record if report.divergence is not None else None
    where = "none" if report.divergence is None else (
        f"step {esc(record.step if record else None)}: {esc(record.kind if record else None)} "
        f"<code>{esc(record.name if record else None)}</code> {esc(record.location if record else '')}")
    spread = report.comparison.by_step if report.comparison is not None else []
    steps = "".join(f"<tr><td>{s.step}</td><td>{s.records}</td><td>{s.differing}</td></tr>" for s in spread)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>detaudit resume: {esc(report.verdict)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
            "</style></head><body>"
            f"<h1>{esc(report.verdict)}</h1><p>{esc(report.script)} stopped after step {report.stop_at} and "
            f"resumed with {esc(' '.join(report.resume_args))}; aligned to reference step "
            f"{esc(report.aligned_step)}.</p><h2>First difference</h2><p>{where}</p>"
            f"<h2>Causes</h2><ol>{causes or '<li>none</li>'}</ol>"
            "<h2>Checkpoint</h2><table><tr><th>run</th><th>call</th><th>file</th><th>line</th><th>step</th>"
            f"<th>parts</th></tr>{rows}</table>"
            "<h2>Records by step (reference numbering)</h2><table><tr><th>step</th><th>records</th><th>differing</th>"
            f"</tr>{steps}</table></body></html>\n")


def write_html(report: ResumeReport, path: Path) -> None:
    write_output(path, render_html(report))
