"""One verdict, one ending (issue 43): for every mode that writes a verdict and every way its script can end,
the five outputs the one finisher (cli/session.finish_with) produces name the same verdict: the full terminal
report's summary line, the `-q` line, the JSON `verdict` (and `exit_code`), the HTML title (JUnit, for an audit:
failing exactly when the command fails) and the exit status.

Unit-level: typed reports made by hand or from synthetic run directories, each mode's own Presentation.
`run`, `report`, `explain`, `compare` and `demo` share the audit's (session.audit_presentation).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from io import StringIO
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from batchcases import ROUNDING, call, origin, spot
from rich.console import Console
from synthetic import training_records, write_run

import detaudit.cli.session as session
from detaudit.audit.pipeline import load_run
from detaudit.batch.diagnosis import diagnose_batch
from detaudit.batch.finding import analyse
from detaudit.batch.reporting import BatchReport, BatchSettings
from detaudit.causes.repetition import RepeatedRandomness
from detaudit.cli import batch_command, drift_command, fix, resume_command, watch_command
from detaudit.cli.commands import COMMANDS
from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_report import DriftReport, FloorSummary
from detaudit.errors import ExitCode
from detaudit.fix.fix_report import FixReport
from detaudit.report.model import Report
from detaudit.report.resume import ResumeReport
from detaudit.report.watch_model import Against, WatchReport, WatchSettings
from detaudit.results import RepeatResult
from detaudit.run.watchlog import Mismatch, WatchLog


@dataclass(frozen=True)
class Case:
    mode: str
    ending: str
    make: Callable[[Path], Any]  # the typed report, made in a temporary directory
    verdict: str
    code: ExitCode


# -- run (and report, explain, compare, demo): a Report ----------------------------------------------------------

def _audit(tmp: Path, second: list[Any] | None = None, **result: Any) -> Report:
    """Two repeats of a synthetic run (the second recording `second`, by default the first's records), then the
    second repeat's result changed as `result` says (how it ended)."""
    recs = training_records(steps=2)
    report = load_run(write_run(tmp / "run", [recs, recs if second is None else second]))
    return replace(report, runs=[report.runs[0], replace(report.runs[1], **result)])


def _diverged(tmp: Path, **result: Any) -> Report:
    recs = training_records(steps=2)
    return _audit(tmp, [recs[0].but(digest=99), *recs[1:]], **result)


def _failed(tmp: Path) -> Report:
    recs = training_records(steps=2)
    return load_run(write_run(tmp / "run", [recs, recs], exit_codes=[1, 1]))


def _nothing_recorded(tmp: Path) -> Report:
    return load_run(write_run(tmp / "run", [[], []]))


def _gated(tmp: Path) -> Report:
    repeated = RepeatedRandomness("train.py:12", "steps", "train.py:9", ["drew the same at steps 0 and 1"],
                                  "seed once, before the loop")
    return replace(_audit(tmp), fail_on_repeats=True, repeated_randomness=[repeated])


RUN = [
    Case("run", "completed", _audit, "deterministic", ExitCode.DETERMINISTIC),
    Case("run", "script failed", _failed, "failed", ExitCode.SCRIPT_FAILED),
    Case("run", "timed out", lambda t: _audit(t, timed_out=True, exit_code=None), "timeout", ExitCode.TIMEOUT),
    Case("run", "interrupted", lambda t: _audit(t, interrupted=True, exit_code=None), "inconclusive",
         ExitCode.INCONCLUSIVE),
    Case("run", "stopped at a bound", lambda t: _audit(t, stopped_at_step=1, stopped_by="max-steps"),
         "deterministic", ExitCode.DETERMINISTIC),
    Case("run", "stopped after diverging", lambda t: _diverged(t, stopped_at_step=1, stopped_by="divergence"),
         "divergent", ExitCode.DIVERGENT),
    Case("run", "diverged", _diverged, "divergent", ExitCode.DIVERGENT),
    Case("run", "inconclusive", _nothing_recorded, "inconclusive", ExitCode.INCONCLUSIVE),
    Case("run", "completed, --fail-on-repeated-randomness", _gated, "repeated-randomness", ExitCode.DIVERGENT),
]

# -- watch: a WatchReport ------------------------------------------------------------------------------------------

MISMATCH = Mismatch(1, "aten.index_put_.default", "net", "train.py:13", None, 1e-3, 126, "neither")


def _watched(log: WatchLog | None = None, against: Against | None = None, **result: Any) -> Callable[[Path], Any]:
    ended = RepeatResult(0, "cpu", 0, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    return lambda tmp: WatchReport("train.py", str(tmp), WatchSettings(), replace(ended, **result),
                                   log or WatchLog(steps=3, checked_steps=(0,), replayed_ops=5), against)


WATCH = [
    Case("watch", "completed", _watched(), "clean", ExitCode.DETERMINISTIC),
    Case("watch", "script failed", _watched(exit_code=1), "script-failed", ExitCode.SCRIPT_FAILED),
    Case("watch", "timed out", _watched(exit_code=None, timed_out=True), "timeout", ExitCode.TIMEOUT),
    Case("watch", "interrupted", _watched(exit_code=None, interrupted=True), "inconclusive", ExitCode.INCONCLUSIVE),
    Case("watch", "recording stopped", _watched(recording_stopped="a hook failed"), "inconclusive",
         ExitCode.INCONCLUSIVE),
    Case("watch", "stopped after diverging", _watched(against=Against("base", 0, replace(MISMATCH, check="against")),
                                                      stopped_at_step=1, stopped_by="divergence"),
         "mismatch", ExitCode.DIVERGENT),
    Case("watch", "diverged, then failed", _watched(WatchLog(steps=1, checked_steps=(0, 1), mismatches=(MISMATCH,)),
                                                    exit_code=1), "mismatch", ExitCode.DIVERGENT),
]

# -- batch: a BatchReport ------------------------------------------------------------------------------------------


def _batch(events: list[Any], run_to_run: str | None = None, **result: Any) -> Callable[[Path], Any]:
    ended = RepeatResult(0, "cpu", 0, 1.0, False, "batch-0.trace", "batch-0.stdout", "batch-0.stderr", "x")
    finding = analyse(events)
    return lambda tmp: BatchReport("serve.py", [], str(tmp), BatchSettings(), [replace(ended, **result)], finding,
                                   diagnose_batch(finding), run_to_run=run_to_run)


VARIANT = [call(ROUNDING), origin(spot("aten.addmm"), spot("fc"))]
BATCH = [
    Case("batch", "completed", _batch([call([])]), "batch-invariant", ExitCode.DETERMINISTIC),
    Case("batch", "diverged (rows)", _batch(VARIANT), "batch-variant", ExitCode.DIVERGENT),
    Case("batch", "diverged (run to run)", _batch([call([])], "divergent"), "run-to-run-divergent",
         ExitCode.DIVERGENT),
    Case("batch", "script failed", _batch(VARIANT, exit_code=1), "script-failed", ExitCode.SCRIPT_FAILED),
    Case("batch", "timed out", _batch(VARIANT, exit_code=None, timed_out=True), "timeout", ExitCode.TIMEOUT),
    Case("batch", "inconclusive", _batch([]), "inconclusive", ExitCode.INCONCLUSIVE),
]

# -- drift, fix, resume: reports whose verdict drift_check / fix.trials / resume_check decide from the endings ----


def _drift(verdict: str) -> Callable[[Path], Any]:
    return lambda tmp: DriftReport("train.py", [], str(tmp), verdict, Configuration("A"),  # type: ignore[arg-type]
                                   Configuration("B"), [], [], FloorSummary(10.0, 2, [], 0.0, None),
                                   reason=None if verdict in ("equivalent", "within-noise", "drift") else "why")


def _fix(verdict: str, audit_exit_code: int) -> Callable[[Path], Any]:
    return lambda tmp: FixReport("train.py", str(tmp), verdict, audit_exit_code)  # type: ignore[arg-type]


def _resume(verdict: str) -> Callable[[Path], Any]:
    def make(tmp: Path) -> ResumeReport:
        reference = _audit(tmp)
        return ResumeReport("train.py", [], [], str(tmp), 2, verdict, 2, None, None, [], [], [],  # type: ignore[arg-type]
                            reference, reference.runs)  # the reference's repeats stand for the two runs
    return make


OTHERS = [
    Case("drift", "completed", _drift("equivalent"), "equivalent", ExitCode.DETERMINISTIC),
    Case("drift", "completed, within noise", _drift("within-noise"), "within-noise", ExitCode.DETERMINISTIC),
    Case("drift", "diverged", _drift("drift"), "drift", ExitCode.DIVERGENT),
    Case("drift", "script failed", _drift("script-failed"), "script-failed", ExitCode.SCRIPT_FAILED),
    Case("drift", "timed out", _drift("timeout"), "timeout", ExitCode.TIMEOUT),
    Case("drift", "inconclusive", _drift("inconclusive"), "inconclusive", ExitCode.INCONCLUSIVE),
    Case("fix", "completed", _fix("deterministic", 0), "deterministic", ExitCode.DETERMINISTIC),
    Case("fix", "diverged, fixed", _fix("fixed", 1), "fixed", ExitCode.DIVERGENT),
    Case("fix", "diverged, uncontrolled", _fix("uncontrolled", 1), "uncontrolled", ExitCode.UNCONTROLLED),
    Case("fix", "script failed", _fix("failed", 3), "failed", ExitCode.SCRIPT_FAILED),
    Case("fix", "timed out", _fix("timeout", 5), "timeout", ExitCode.TIMEOUT),
    Case("fix", "inconclusive", _fix("inconclusive", 6), "inconclusive", ExitCode.INCONCLUSIVE),
    Case("resume", "completed", _resume("resume-equivalent"), "resume-equivalent", ExitCode.DETERMINISTIC),
    Case("resume", "diverged", _resume("resume-divergent"), "resume-divergent", ExitCode.DIVERGENT),
    Case("resume", "reference diverged", _resume("reference-divergent"), "reference-divergent", ExitCode.DIVERGENT),
]

PRESENTATIONS: dict[str, Callable[[], session.Presentation[Any]]] = {
    "run": session.audit_presentation, "watch": watch_command.presentation, "batch": batch_command.presentation,
    "drift": drift_command.presentation, "fix": fix.presentation, "resume": resume_command.presentation}


def _named(line: str) -> str:
    """The verdict a summary line starts with (`SCRIPT FAILED:`, `WITHIN NOISE ·`), as the JSON spells it."""
    return re.split(r":| ·", line.strip(), maxsplit=1)[0].lower().replace(" ", "-")


def _finish(report: Any, mode: str, paths: dict[str, Path | None], quiet: bool,
            monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """The finisher's exit status and what it printed (on either stream)."""
    printed = StringIO()
    console = Console(file=printed, width=400)
    monkeypatch.setattr(session, "err_console", console)
    monkeypatch.setattr(session, "stdout_console", lambda quiet=False: console)
    with pytest.raises(SystemExit) as ended:
        session.finish_with(report, PRESENTATIONS[mode](), paths, quiet)
    return int(ended.value.code or 0), printed.getvalue()


@pytest.mark.parametrize("case", RUN + WATCH + BATCH + OTHERS, ids=lambda c: f"{c.mode}: {c.ending}")
def test_every_output_of_a_report_names_its_one_verdict(case: Case, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    report = case.make(tmp_path)
    shown = PRESENTATIONS[case.mode]()
    paths: dict[str, Path | None] = {name: tmp_path / f"out.{name}" for name in shown.files}
    code, full = _finish(report, case.mode, paths, False, monkeypatch)
    quiet_code, line = _finish(report, case.mode, {}, True, monkeypatch)
    data = json.loads((tmp_path / "out.json").read_text())
    seen = {"exit status": code, "-q exit status": quiet_code, "JSON exit_code": data["exit_code"]}
    named = {"-q line": _named(line), "JSON": data["verdict"]}
    assert line.strip() in full  # the full report ends (or starts) with the -q line: the console line is it
    if "html" in shown.files:
        title = re.search(r"<title>[^:<]*: ([^<—]+)", (tmp_path / "out.html").read_text())
        named["HTML title"] = title[1].strip() if title else ""
    if "junit" in shown.files:
        suite = ET.parse(tmp_path / "out.junit").getroot()
        seen["JUnit fails"] = int(case.code) if int(suite.get("failures", 0)) + int(suite.get("errors", 0)) else 0
    assert (named, seen) == ({name: case.verdict for name in named}, {name: int(case.code) for name in seen})


# the commands that end with each mode's report (`run`'s Report: also report, explain, compare)
COMMANDS_OF = {"run": ("run", "report", "explain", "compare")}


@pytest.mark.parametrize("case", RUN + WATCH + BATCH + OTHERS, ids=lambda c: f"{c.mode}: {c.ending}")
def test_every_ending_s_exit_code_is_in_its_command_s_help(case: Case) -> None:
    names = COMMANDS_OF.get(case.mode, (case.mode,))
    assert [row.name for row in COMMANDS if row.name in names and case.code in row.codes] == list(names)
