"""`detaudit watch`'s live relay (detaudit/audit/watch.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from synthetic import Rec, write_trace

from detaudit.audit.watch import Relay
from detaudit.audit.watch_replicas import ReplicaWatch
from detaudit.compare.live import Follower
from detaudit.report.watch_model import Cadence, WatchSettings
from detaudit.run.launcher import RepeatPlan
from detaudit.trace import Kind


def _relay_files(tmp_path: Path, steps: int) -> tuple[RepeatPlan, Path]:
    plan = RepeatPlan(0, "auto", tmp_path / "w.trace", tmp_path / "w.stdout", tmp_path / "w.stderr")
    plan.stdout.write_bytes(b"step 0\n")
    plan.stderr.write_bytes(b"")
    return plan, _ended(tmp_path / "events", steps)


def _ended(path: Path, steps: int) -> Path:
    """An events file in which steps 0 to `steps` - 1 ended, every second one checked."""
    path.write_text("".join(json.dumps({"event": "step", "step": s, "checked": s % 2 == 0}) + "\n"
                            for s in range(steps)))
    return path


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


def _ddp_traces(tmp_path: Path, values: dict[int, tuple[int, ...]],
                footer: dict[str, Any] | None = None) -> dict[int, Path]:
    """Each rank's trace of one DDP parameter, a record per step (no footer: still being written)."""
    ddp = {"type": "ddp", "loc": "t.py:5", "params": ["module.fc.weight"], "ignored": [], "backend": "gloo",
           "bucket_cap_mb": None, "gradient_as_bucket_view": False, "static_graph": False,
           "find_unused_parameters": False, "buffers": []}
    return {rank: write_trace(tmp_path / f"w.rank-{rank}.trace",
                              [Rec("module.fc.weight", v, step, Kind.PARAM) for step, v in enumerate(steps)],
                              footer, events=[(0, ddp)])
            for rank, steps in values.items()}


def test_a_drifting_replica_asks_every_rank_to_stop_after_it(tmp_path: Path) -> None:
    traces = _ddp_traces(tmp_path, {0: (1, 2, 3), 1: (1, 7, 8)}, {"exit_code": 0})
    plan = RepeatPlan(0, "auto", tmp_path / "w.trace", tmp_path / "w.stdout", tmp_path / "w.stderr",
                      child_config={"stop_file": str(tmp_path / "w.stop")})
    lines: list[str] = []
    relay = Relay([], WatchSettings(), lines.append, [], replicas=ReplicaWatch(traces))
    relay.poll(plan, False)
    assert json.loads((tmp_path / "w.stop").read_text()) == {"at_step": 2, "diverged_at_step": 1}
    assert lines == ["detaudit watch: DDP replica module.fc.weight differs on rank 1 from rank 0 at step 1"]


def test_a_step_every_rank_said_ended_is_compared_and_the_handshake_names_its_difference(tmp_path: Path) -> None:
    """The ranks' traces end at step 1 (the next step's records are not written yet: rank 0 waits in a
    torch.save): their events say step 1 ended, so it is compared now, and a waiting save learns it differs."""
    traces = _ddp_traces(tmp_path, {0: (1, 2), 1: (1, 7)})
    events = [_ended(tmp_path / f"events.rank-{rank}", 2) for rank in (0, 1)]
    plan = RepeatPlan(0, "auto", tmp_path / "w.trace", tmp_path / "w.stdout", tmp_path / "w.stderr",
                      child_config={"stop_file": str(tmp_path / "w.stop")})
    relay = Relay(events, WatchSettings(), [].append, [], replicas=ReplicaWatch(traces),
                  handshake=tmp_path / "watch-checked.json")
    relay.poll(plan, False)
    assert json.loads((tmp_path / "watch-checked.json").read_text())["mismatch_at"] == 1


def test_the_handshake_claims_no_step_the_job_has_not_said_ended(tmp_path: Path) -> None:
    """The follower compared records of step 5, but the job said only step 2 ended: the records of step 3 the
    follower saw may be only part of it, so the handshake says step 2."""
    plan, events = _relay_files(tmp_path, 3)
    follower = Follower(tmp_path / "absent.trace", tmp_path / "absent-ref.trace")
    follower.agrees_to = 5
    relay = Relay([events], WatchSettings(), [].append, [], follower, handshake=tmp_path / "watch-checked.json")
    relay.poll(plan, False)
    assert json.loads((tmp_path / "watch-checked.json").read_text()) == {"checked_to": 2, "mismatch_at": None}
