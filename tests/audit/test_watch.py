"""`detaudit watch`'s live relay (detaudit/audit/watch.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

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


def test_a_drifting_replica_asks_every_rank_to_stop_after_it(tmp_path: Path) -> None:
    ddp = {"type": "ddp", "loc": "t.py:5", "params": ["module.fc.weight"], "ignored": [], "backend": "gloo",
           "bucket_cap_mb": None, "gradient_as_bucket_view": False, "static_graph": False,
           "find_unused_parameters": False, "buffers": []}
    traces = {rank: write_trace(tmp_path / f"w.rank-{rank}.trace",
                                [Rec("module.fc.weight", v, step, Kind.PARAM) for step, v in enumerate(values)],
                                {"exit_code": 0}, events=[(0, ddp)])
              for rank, values in ((0, (1, 2, 3)), (1, (1, 7, 8)))}
    plan = RepeatPlan(0, "auto", tmp_path / "w.trace", tmp_path / "w.stdout", tmp_path / "w.stderr",
                      child_config={"stop_file": str(tmp_path / "w.stop")})
    lines: list[str] = []
    relay = Relay([], WatchSettings(), lines.append, [], replicas=ReplicaWatch(traces))
    relay.poll(plan, False)
    assert json.loads((tmp_path / "w.stop").read_text()) == {"at_step": 2, "diverged_at_step": 1}
    assert lines == ["detaudit watch: DDP replica module.fc.weight differs on rank 1 from rank 0 at step 1"]
