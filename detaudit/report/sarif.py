"""A report as SARIF 2.1.0 (`--sarif PATH`), so that GitHub code scanning (and any SARIF viewer) shows each
finding on the line of the script it points at: the first divergence (or drift, or watch mismatch) as an
error, each candidate cause at the `file:line`s its evidence names as a warning, draws that repeat where
they should differ and CPU-only findings as warnings and notes (docs/ci.md, "Code scanning").

One renderer for every report kind: each kind's findings become `Finding`s (`audit_findings`, ...), which
`sarif_log` lays out. A location is the first `file:line` of a record's location (the user's line, before `via` a
library's) or every one an evidence line names; paths are as the repeats saw them,
relative to the directory the script ran in, and are written relative to the repository root above it
(`uriBaseId` %SRCROOT%), or as a file URI when outside it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import quote

from detaudit import __version__
from detaudit.causes.context import where
from detaudit.report.model import Report
from detaudit.report.resume import ResumeReport
from detaudit.report.watch_model import WatchReport
from detaudit.results import Cause, Divergence
from detaudit.run.files import write_output

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
INFORMATION_URI = "https://pypi.org/project/detaudit/"
ROOT_ID = "%SRCROOT%"
Level = Literal["error", "warning", "note"]

# the rules every kind of report may name besides its causes' ids (docs/causes.md), with their descriptions
RULES = {
    "first-divergence": "The repeats of the script first differ here.",
    "baseline-difference": "The run first differs from its --baseline here.",
    "drift": "Configuration B first moves beyond configuration A's noise floor here.",
    "drift-candidate": "A setting configurations A and B differ in, ranked as a candidate cause of the drift.",
    "watch-mismatch": "An op's second execution, the reference or a DDP replica disagreed here while the job ran.",
    "repeated-randomness": "Draws repeat here where they should differ (workers, ranks, epochs, steps, samples).",
}
_SITE = re.compile(r"(?P<path>[^\s:()'\"`,;]+\.pyw?):(?P<line>\d+)\b")


@dataclass(frozen=True)
class Finding:
    """One SARIF result: its rule, level, message, and the `file:line`s it is shown at (none: the script's first
    line, so that code scanning still shows it)."""

    rule: str
    level: Level
    message: str
    sites: tuple[str, ...]
    title: str = ""  # the rule's description, for a rule outside RULES (a cause's summary)


def sites(texts: Iterable[str | None]) -> tuple[str, ...]:
    """The `file:line`s the texts name, in order, once each; a library's line reached `via` the user's is left
    out (the user's line stands for it)."""
    found: dict[str, None] = {}
    for text in texts:
        body = text or ""
        for match in _SITE.finditer(body):
            if not body[:match.start()].endswith("via "):
                found[match.group(0)] = None
    return tuple(found)


def _divergence(rule: str, lead: str, d: Divergence, extra: str = "") -> Finding:
    record = d.record
    diff = f"; max |diff| {d.max_abs_diff:.3g}" if d.max_abs_diff is not None else ""
    others = ", ".join(map(str, d.repeats))
    return Finding(rule, "error", f"{lead} {where(d)}: repeat(s) {others} differ from repeat {d.reference}{diff}"
                   f"{extra}", sites([record.location if record is not None else None]))


def _causes(causes: Sequence[Cause], fallback: tuple[str, ...]) -> list[Finding]:
    """Each cause not ruled out, at the lines its evidence names (else where the divergence is)."""
    return [Finding(c.id, "warning", f"{c.summary} ({c.confidence}). Fix: {c.fix}" if c.fix else
                    f"{c.summary} ({c.confidence})", sites(c.evidence) or fallback, c.summary)
            for c in causes if c.confidence not in ("ruled-out", "not-needed")]


def audit_findings(report: Report) -> list[Finding]:
    """An audit's (`run`, `report`, `explain`, `compare`): the first divergence (at the op's line when ops were
    recorded), the difference from --baseline, the causes, repeated draws, and the CPU-only findings."""
    found: list[Finding] = []
    d, op = report.first_divergence, report.op_finding
    if d is not None:
        first = _divergence("first-divergence", "The repeats diverge first at", d,
                            f"; the op: {op.summary}" if op is not None else "")
        found.append(Finding(first.rule, first.level, first.message,
                             sites([op.record.location]) + first.sites if op is not None else first.sites))
    elif report.replica_divergence is not None:
        r = report.replica_divergence
        found.append(Finding("first-divergence", "error", f"DDP replica {r.name} differs on rank(s) "
                             f"{', '.join(map(str, r.ranks))} from rank {r.reference} after step {r.step}", ()))
    moved = report.baseline.divergence if report.baseline is not None else None
    if moved is not None:
        found.append(_divergence("baseline-difference", "The run differs from its baseline first at", moved))
    found += _causes(report.causes, found[0].sites if found else ())
    gated: Level = "error" if report.verdict == "repeated-randomness" else "warning"
    found += [Finding("repeated-randomness", gated, f"Draws repeat across {x.across} here. Fix: {x.fix}",
                      sites([x.site, x.created_at])) for x in report.repeated_randomness]
    found += [Finding(x.id, "note", f"Deterministic on this CPU, not on CUDA: {x.summary}. Fix: {x.fix}",
                      sites(x.evidence), x.summary) for x in report.latent]
    return found


def resume_findings(report: ResumeReport) -> list[Finding]:
    """`resume`'s: where the resumed run first differs from the reference, and what the checkpoint forgot; when
    the reference does not reproduce itself, the reference audit's findings."""
    if report.verdict == "reference-divergent":
        return audit_findings(report.reference)
    if report.divergence is None:
        return []
    first = _divergence("first-divergence", "The resumed run differs from the uninterrupted one first at",
                        report.divergence)
    return [first, *_causes(report.causes, first.sites)]


def watch_findings(report: WatchReport) -> list[Finding]:
    """`watch`'s: every mismatch (an op's replay, the first difference from --against's reference, a DDP
    replica) at the line that ran it."""
    found = []
    for m in report.mismatches:
        what = {"replay": "its replay disagreed with what the script computed",
                "against": "the first record that differs from the reference",
                "replica": f"this DDP-replicated parameter differs from the lowest rank's on rank {m.rank}"}[m.check]
        where_ = f" in {m.module}" if m.module else ""
        found.append(Finding("watch-mismatch", "error", f"step {m.step}: {m.op}{where_}: {what} (max |diff| "
                             f"{m.max_abs_diff:.3g}, {m.max_ulp} ULP)", sites([m.location])))
    return found


class DriftPoint(Protocol):
    """What SARIF reads of a drift's first record beyond the floor (drift/drift_report.FirstDrift) or of its op
    window (OpWindow): report/ sits below drift/, so the report is read by its shape."""

    @property
    def step(self) -> int: ...
    @property
    def location(self) -> str: ...
    @property
    def ratio_to_floor(self) -> float | None: ...


class FirstDriftShape(DriftPoint, Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...


class OpWindowShape(DriftPoint, Protocol):
    @property
    def op(self) -> str: ...


class CandidateShape(Protocol):
    @property
    def setting(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def why(self) -> str: ...
    def change(self) -> str: ...


class DriftShape(Protocol):
    """What SARIF reads of a DriftReport (drift/drift_report.py)."""

    @property
    def script(self) -> str: ...
    @property
    def first_drift(self) -> FirstDriftShape | None: ...
    @property
    def op_window(self) -> OpWindowShape | None: ...
    @property
    def causes(self) -> Sequence[CandidateShape]: ...


def _times(point: DriftPoint) -> str:
    return "beyond any floor" if point.ratio_to_floor is None else f"{point.ratio_to_floor:.3g}x A's floor"


def drift_findings(report: DriftShape) -> list[Finding]:
    """`drift`'s: the first record of B beyond A's floor (and the first op where B departs, when the op window
    named one), then each candidate cause there."""
    first = report.first_drift
    if first is None:
        return []
    window = report.op_window
    message = f"step {first.step} {first.kind} {first.name}: B differs from A by {_times(first)}"
    if window is not None:
        message += f"; the first op where B departs: {window.op} at {window.location} ({_times(window)})"
    at = sites([window.location if window is not None else None, first.location])
    return [Finding("drift", "error", message, at), *[
        Finding("drift-candidate", "warning", f"{c.setting}: {c.change()} ({c.family}): {c.why}", at)
        for c in report.causes]]


def repository_root(cwd: Path) -> Path:
    """The repository `cwd` is in (the nearest directory with a .git), else `cwd`: what %SRCROOT% stands for."""
    return next((p for p in (cwd, *cwd.parents) if (p / ".git").exists()), cwd)


def _location(site: str, root: Path, cwd: Path) -> dict[str, Any]:
    path, _, line = site.rpartition(":")
    full = Path(os.path.normpath(cwd / path))
    try:
        artifact = {"uri": quote(full.relative_to(root).as_posix()), "uriBaseId": ROOT_ID}
    except ValueError:
        artifact = {"uri": full.as_uri()}
    return {"physicalLocation": {"artifactLocation": artifact, "region": {"startLine": max(int(line), 1)}}}


def _rule(rule: str, title: str) -> dict[str, Any]:
    text = RULES.get(rule) or title or f"The cause of nondeterminism {rule} (docs/causes.md)."
    return {"id": rule, "name": rule, "shortDescription": {"text": text}}


def sarif_log(findings: Sequence[Finding], script: str, root: Path, cwd: Path) -> dict[str, Any]:
    """The SARIF document: one run of detaudit, its rules (those its results name), a result per finding (one at
    `script`'s first line when a finding names no line); paths relative to `cwd`, written relative to `root`."""
    titles = {f.rule: f.title for f in reversed(findings)}  # a rule's first finding's
    rules = list(dict.fromkeys(f.rule for f in findings))
    results = [{"ruleId": f.rule, "ruleIndex": rules.index(f.rule), "level": f.level, "message": {"text": f.message},
                "locations": [_location(site, root, cwd) for site in (f.sites or (f"{script}:1",))]}
               for f in findings]
    driver = {"name": "detaudit", "version": __version__, "informationUri": INFORMATION_URI,
              "rules": [_rule(rule, titles[rule]) for rule in rules]}
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION,
            "runs": [{"tool": {"driver": driver}, "results": results,
                      "originalUriBaseIds": {ROOT_ID: {"uri": root.as_uri().rstrip("/") + "/"}}}]}


def _write(findings: Sequence[Finding], script: str, path: Path) -> None:
    cwd = Path.cwd()
    write_output(path, json.dumps(sarif_log(findings, script, repository_root(cwd), cwd), indent=2) + "\n")


def write_sarif(report: Report, path: Path) -> None:
    """An audit's SARIF at `path` (`-`: stdout)."""
    _write(audit_findings(report), report.script, path)


def write_resume_sarif(report: ResumeReport, path: Path) -> None:
    _write(resume_findings(report), report.script, path)


def write_watch_sarif(report: WatchReport, path: Path) -> None:
    _write(watch_findings(report), report.script, path)


def write_drift_sarif(report: DriftShape, path: Path) -> None:
    _write(drift_findings(report), report.script, path)
