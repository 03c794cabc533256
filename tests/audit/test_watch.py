"""`detaudit watch`'s report value and its live relay (detaudit/audit/watch.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from detaudit.audit.watch import Cadence, Relay, WatchReport, WatchSettings
from detaudit.compare.live import Follower
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


def _relay_files(tmp_path: Path, steps: int) -> tuple[RepeatPlan, Path]:
    plan = RepeatPlan(0, "auto", tmp_path / "w.trace", tmp_path / "w.stdout", tmp_path / "w.stderr")
    plan.stdout.write_bytes(b"step 0\n")
    plan.stderr.write_bytes(b"")
    events = tmp_path / "events"
    events.write_text("".join(json.dumps({"event": "step", "step": s, "checked": s % 2 == 0}) + "\n"
                              for s in range(steps)))
    return plan, events


def test_the_relay_passes_output_through_and_writes_a_status_line_every_n_steps(tmp_path: Path) -> None:
    plan, events = _relay_files(tmp_path, 4)
    lines: list[str] = []
    out, err = io.BytesIO(), io.BytesIO()
    relay = Relay([events], WatchSettings(every=2, status_every=Cadence(2)), lines.append,
                  [(plan.stdout, out, False), (plan.stderr, err, False)])
    relay.poll(plan, False)
    relay.poll(plan, True)
    assert out.getvalue() == b"step 0\n"
    assert lines == ["detaudit watch: step 2, 1 checked, 0 mismatches",
                     "detaudit watch: step 4, 2 checked, 0 mismatches"]


def test_a_status_every_n_seconds_is_written_once_n_seconds_passed(tmp_path: Path) -> None:
    plan, events = _relay_files(tmp_path, 3)
    ticks = iter([0.0, 5.0, 10.0, 31.0, 40.0])
    lines: list[str] = []
    relay = Relay([events], WatchSettings(status_every=Cadence(30, "seconds")), lines.append, [],
                  clock=lambda: next(ticks))
    for _ in range(4):
        relay.poll(plan, False)
    assert lines == ["detaudit watch: step 3, 2 checked, 0 mismatches"]


def test_the_status_line_says_how_far_the_run_agrees_with_its_reference(tmp_path: Path) -> None:
    plan, events = _relay_files(tmp_path, 2)
    follower = Follower(tmp_path / "absent.trace", tmp_path / "absent-ref.trace")
    follower.agrees_to = 1
    lines: list[str] = []
    relay = Relay([events], WatchSettings(status_every=Cadence(2)), lines.append, [], follower)
    relay.poll(plan, False)
    assert lines == ["detaudit watch: step 2, 1 checked, 0 mismatches; against the reference: agrees up to step 1"]


def test_each_ranks_lines_are_passed_on_whole(tmp_path: Path) -> None:
    plan, events = _relay_files(tmp_path, 0)
    rank = tmp_path / "w.rank-1.stdout"
    rank.write_bytes(b"whole\nhal")
    out = io.BytesIO()
    relay = Relay([events], WatchSettings(), [].append, [(rank, out, True)])
    relay.poll(plan, False)
    assert out.getvalue() == b"whole\n"
    relay.poll(plan, True)
    assert out.getvalue() == b"whole\nhal"


def test_a_replica_mismatch_counts_and_names_its_rank() -> None:
    replica = Mismatch(2, "module.2.weight", None, None, None, 0.25, 0, None, "replica", 1)
    data = WatchReport("t.py", "run", WatchSettings(), report(0).result, WatchLog(), replica=replica).to_json()
    assert (data["verdict"], data["mismatches"][0]["rank"]) == ("mismatch", 1)
