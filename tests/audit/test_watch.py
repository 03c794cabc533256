"""`detaudit watch`'s report value and its live relay (detaudit/audit/watch.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from detaudit.audit.watch import Relay, WatchReport, WatchSettings
from detaudit.results import RepeatResult
from detaudit.run.launcher import RepeatPlan
from detaudit.run.watchlog import Mismatch, WatchLog

MISMATCH = Mismatch(3, "aten.mm.default", None, "t.py:4", None, 1e-7, 1, "first")


def report(exit_code: int | None, timed_out: bool = False, log: WatchLog | None = None) -> WatchReport:
    result = RepeatResult(0, "auto", exit_code, 1.0, timed_out, "watch-0.trace", "watch-0.stdout", "watch-0.stderr",
                          "")
    return WatchReport("t.py", "run", WatchSettings(), result, log or WatchLog())


@pytest.mark.parametrize(("made", "code"), [
    (report(0), 0), (report(1, log=WatchLog(mismatches=(MISMATCH,))), 1), (report(2), 3),
    (report(None, timed_out=True), 5),
])
def test_the_exit_code_says_mismatch_before_the_scripts_own_failure(made: WatchReport, code: int) -> None:
    assert made.exit_code == code


def test_the_json_carries_the_verdict_and_the_mismatches() -> None:
    data = report(1, log=WatchLog(steps=4, checked_steps=(0, 2), mismatches=(MISMATCH,))).to_json()
    assert (data["verdict"], data["steps"], data["checked_steps"]) == ("mismatch", 4, [0, 2])
    assert data["mismatches"][0]["check"] == "replay"


def test_the_relay_passes_output_through_and_writes_a_status_line_every_n_steps(tmp_path: Path) -> None:
    plan = RepeatPlan(0, "auto", tmp_path / "w.trace", tmp_path / "w.stdout", tmp_path / "w.stderr")
    plan.stdout.write_bytes(b"step 0\n")
    plan.stderr.write_bytes(b"")
    events = tmp_path / "events"
    events.write_text("".join(json.dumps({"event": "step", "step": s, "checked": s % 2 == 0}) + "\n"
                              for s in range(4)))
    lines: list[str] = []
    out, err = io.BytesIO(), io.BytesIO()
    relay = Relay(events, WatchSettings(every=2, status_every=2), lines.append, out, err)
    relay.poll(plan, False)
    relay.poll(plan, True)
    assert out.getvalue() == b"step 0\n"
    assert lines == ["detaudit watch: step 2, 1 checked, 0 mismatches",
                     "detaudit watch: step 4, 2 checked, 0 mismatches"]
