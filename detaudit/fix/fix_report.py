"""`detaudit fix`'s report: the minimal set of knobs, each as code with where it goes, the proof that each is
needed, what each costs, and the experiments the search ran -> JSON (`detaudit-fix`, docs/fix.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from detaudit.codec import Codable, FileFormat
from detaudit.errors import ExitCode
from detaudit.fix.code import KNOBS, Edit, environment
from detaudit.fix.cost import Figure, KnobCost
from detaudit.pin import SEP, Pin
from detaudit.results import Cause, ExperimentVerdict
from detaudit.run.files import write_output

FIX = FileFormat("detaudit-fix", 1, "fix report")
# fixed: a minimal set, verified; incomplete: a set that agrees, not shown minimal (the budget ran out) or none
# found within the budget; uncontrolled: every knob at once still diverges; the rest: the audit's own verdict
FixVerdict = Literal["deterministic", "fixed", "incomplete", "uncontrolled", "failed", "timeout", "inconclusive"]


@dataclass(frozen=True)
class Trial:
    """One experiment of the search: the script with these knobs' code, `repeats` times."""

    knobs: tuple[Pin, ...]
    verdict: ExperimentVerdict
    repeats: int
    note: str = ""
    files: str = ""  # the repeats' file prefix in the run directory ("": the audit's own repeats)

    @property
    def name(self) -> str:
        return SEP.join(self.knobs) or "nothing (the audit)"


@dataclass(frozen=True)
class KnobFix:
    """One knob of the minimal set: its code, the experiment that shows it is needed, and its cost."""

    pin: Pin
    code: tuple[str, ...]  # the knob's own prelude lines, imports included
    edits: tuple[Edit, ...]
    needed: Trial | None  # the minimal set less this knob: it diverged
    cost: KnobCost | None

    @property
    def env(self) -> dict[str, str]:
        return environment([self.pin])

    @property
    def where(self) -> str:
        parts = (["prelude"] if self.code else []) + (["environment"] if self.env else []) \
            + [f"line {e.file}:{e.line}" for e in self.edits]
        return " + ".join(parts)

    @property
    def fix(self) -> str:
        lines = [*self.code, *(f"{k}={v}  (set before python starts)" for k, v in self.env.items())]
        lines += [f"{e.file}:{e.line}: {e.after.strip()}" if e.after is not None else f"{e.file}:{e.line}: {e.advice}"
                  for e in self.edits]
        return "\n".join(lines)

    @property
    def note(self) -> str:
        return KNOBS[self.pin].note


@dataclass(frozen=True)
class FixReport(Codable):
    script: str
    run_dir: str
    verdict: FixVerdict
    audit_exit_code: int
    knobs: tuple[KnobFix, ...] = ()
    prelude: tuple[str, ...] = ()  # the lines added at the top of the script
    edits: tuple[Edit, ...] = ()  # every edit of the minimal set (applied to the verifying copy or not)
    insert_after: int = 0  # lines of the script above the prelude
    verified: bool = False
    verification: str = ""
    trials: tuple[Trial, ...] = ()
    repeats_used: int = 0
    budget: int = 0
    causes: tuple[Cause, ...] = ()
    first_divergence: str = ""
    patch: str = ""
    whole_run: Figure | None = None  # the script as it is against the script with the fix: whole-run time
    perturb: tuple[str, ...] = ()  # --perturb's settings: the audit and every experiment ran with its groups
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def env(self) -> dict[str, str]:
        return environment([k.pin for k in self.knobs])

    @property
    def code_cause(self) -> Cause | None:
        """No knob controls the divergence: the cause to fix in the script's code, when one is identified (the top
        cause, neither ruled out nor made unnecessary by an experiment, nor `unknown`)."""
        top = self.causes[0] if self.causes else None
        if self.verdict != "uncontrolled" or top is None or top.id == "unknown" \
                or top.confidence in ("ruled-out", "not-needed"):
            return None
        return top

    @property
    def exit_code(self) -> int:
        return {"deterministic": ExitCode.DETERMINISTIC, "fixed": ExitCode.DIVERGENT,
                "incomplete": ExitCode.DIVERGENT, "uncontrolled": ExitCode.UNCONTROLLED}.get(
            self.verdict, self.audit_exit_code)


def _figure(f: Figure | None) -> dict[str, Any] | None:
    if f is None:
        return None
    return {"with_s": f.with_s, "without_s": f.without_s, "change": f.change, "low": f.low, "high": f.high,
            "pairs": f.pairs, "measurable": f.measurable}


def _trial(t: Trial | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {"knobs": list(t.knobs), "verdict": t.verdict, "repeats": t.repeats, "note": t.note, "files": t.files}


def report_json(report: FixReport) -> dict[str, Any]:
    """The report as JSON (docs/fix.md): `verdict`, `knobs` [{name, fix, where, cost, ...}], `verified`,
    `repeats_used` and the search behind them."""
    return {
        **FIX.stamp(), "script": report.script, "run_dir": report.run_dir,
        "verdict": report.verdict, "exit_code": int(report.exit_code),
        "knobs": [{"name": k.pin.value, "fix": k.fix, "where": k.where,
                   "cost": None if k.cost is None else {"summary": k.cost.summary, "step_time": _figure(k.cost.step),
                                                        "whole_run": _figure(k.cost.run)},
                   "prelude": list(k.code), "env": k.env, "note": k.note, "needed": _trial(k.needed),
                   "edits": [{"file": e.file, "line": e.line, "before": e.before, "after": e.after,
                              "advice": e.advice, "applied": e.applies} for e in k.edits]}
                  for k in report.knobs],
        "prelude": list(report.prelude), "insert_after_line": report.insert_after, "env": report.env,
        "perturb": list(report.perturb), "verified": report.verified, "verification": report.verification,
        "repeats_used": report.repeats_used, "budget": report.budget,
        "whole_run": _figure(report.whole_run),
        "search": [_trial(t) for t in report.trials],
        "first_divergence": report.first_divergence,
        "causes": [{"id": c.id, "confidence": c.confidence, "summary": c.summary, "evidence": c.evidence,
                    "fix": c.fix} for c in report.causes],
        "code_fix": None if report.code_cause is None else {
            "cause": report.code_cause.id, "confidence": report.code_cause.confidence, "fix": report.code_cause.fix},
        "notes": list(report.notes),
    }


def write_json(report: FixReport, path: Path) -> None:
    """Write the JSON report (`-`: standard output)."""
    write_output(path, json.dumps(report_json(report), indent=2) + "\n")
