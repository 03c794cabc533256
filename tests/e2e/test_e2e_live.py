"""Live audits end to end: a repeat that diverged is stopped a few optimizer steps later, cleanly (its trace
whole, nothing it started left running), the report says where and why; --run-to-end runs every repeat
out; a repeat that records on after its reference ended, or crashes, is reported as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import CliResult, run_cli
from processes import alive

from detaudit.results import EXTRA_STEPS
from detaudit.trace import Kind, read_trace

pytestmark = [pytest.mark.slow, pytest.mark.process]

DIVERGES_AT = 4
STEPS = 150

# A seeded training loop that draws once from Python's unseeded `random` at DIVERGES_AT (every repeat differs
# there); it starts a helper process that would outlive it, and writes that helper's pid down. MARKER: a file
# the first repeat creates, so that later repeats can behave otherwise (ENDING: what they do then). A later
# repeat's steps after the divergence take 20 ms each: 150 steps of this model run in well under the parent's
# 0.1 s between polls, and a repeat that ended before the parent looked could not be stopped (seen in a full run).
SCRIPT = """
import os, random, subprocess, sys, time
import torch

marker = os.path.exists("first-done")
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(f"helper-{{os.getpid()}}.pid", "w") as fh:
    fh.write(str(helper.pid))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 8), torch.randn(32, 1)
steps = {steps}
for step in range(steps):
    {draw}
    {ending}
    if marker and step > {diverges_at}:
        time.sleep(0.02)  # a later repeat outlasts the parent's polls (every 0.1 s) after diverging, however fast
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
open("first-done", "w").close()
print("trained", steps, "steps")
"""
UNSEEDED = f"if step == {DIVERGES_AT}: x = x + random.random() * 1e-3"


def write_script(where: Path, draw: str = UNSEEDED, ending: str = "pass", steps: int = STEPS) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / "train.py"
    path.write_text(SCRIPT.format(draw=draw, ending=ending, steps=steps, diverges_at=DIVERGES_AT))
    return path


def audit(where: Path, *options: str, repeats: int = 3) -> CliResult:
    script = write_script(where) if not (where / "train.py").exists() else where / "train.py"
    result = run_cli(["run", "-n", str(repeats), "--granularity", "module", "--no-explain", "--out", "run",
                      "--json", "r.json", *options, str(script)], cwd=where, timeout=900)
    assert result.report is not None, result.output
    return result


def helpers_left(where: Path) -> list[int]:
    return [pid for f in where.glob("helper-*.pid") if alive(pid := int(f.read_text()))]


def runs(result: CliResult) -> list[dict[str, Any]]:
    assert result.report is not None
    return list(result.report["runs"])


def test_a_divergent_repeat_stops_soon_after_with_a_whole_trace_and_nothing_left_running(tmp_path: Path) -> None:
    result = audit(tmp_path)
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    stop = DIVERGES_AT + 1 + EXTRA_STEPS  # asked for; a repeat already past it stops at its next step
    first, *others = runs(result)
    assert first["stopped_at_step"] is None
    assert first["exit_code"] == 0
    assert first["stopped_by"] is None
    for run in others:
        assert (run["stopped_by"], run["diverged_at_step"]) == ("divergence", DIVERGES_AT)
        assert stop <= run["stopped_at_step"] < STEPS
        assert run["complete"] is True
        trace = read_trace(tmp_path / "run" / run["trace"])  # whole and readable, ending at the stop
        assert trace.footer is not None
        assert trace.footer["stopped_at_step"] == run["stopped_at_step"]
        assert int(trace.records["step"].max()) == run["stopped_at_step"] - 1
    assert report["first_divergence"]["step"] == DIVERGES_AT
    stopped = min(run["stopped_at_step"] for run in others)
    assert [s["step"] for s in report["spread"]["by_step"] if s["differing"]] == list(range(DIVERGES_AT, stopped))
    assert report["match"]["exit_status_compared"] is False
    [line] = report["match"]["not_compared"]
    assert f"1 after step {others[0]['stopped_at_step']} (diverged at step {DIVERGES_AT})" in line
    assert "--run-to-end" in line
    assert "a few steps after diverging" in result.stdout
    assert "not compared: repeat(s) 1 after step" in result.stdout
    assert not list((tmp_path / "run").glob("*.stop"))  # the requests are cleaned up

    # --explain's experiments: the pinned repeats agree and run to their end; the control's (nothing pinned)
    # diverge again and the second is stopped
    explained = run_cli(["explain", "run", "--json", "e.json"], cwd=tmp_path, timeout=900)
    assert explained.report is not None, explained.output
    def stopped_by(experiment: str) -> list[str | None]:
        traces = sorted((tmp_path / "run").glob(f"explain-{experiment}-*.trace"))
        return [footer.get("stopped_by") for footer in (read_trace(p).footer or {} for p in traces)]

    assert stopped_by("python-rng") == [None, None, None]
    assert stopped_by("control") == [None, "divergence", "divergence"]
    assert helpers_left(tmp_path) == []


def test_under_auto_a_repeat_started_after_the_divergence_records_its_ops_and_saves_a_re_run(tmp_path: Path) -> None:
    write_script(tmp_path)
    result = run_cli(["run", "-n", "3", "--no-explain", "--out", "run", "--json", "r.json", "train.py"], cwd=tmp_path,
                     timeout=900)  # granularity auto, the default
    assert result.returncode == 1, result.output
    assert result.report is not None, result.output
    run_dir = tmp_path / "run"
    window = [DIVERGES_AT - 1, DIVERGES_AT]
    narrowing = json.loads((run_dir / "run.json").read_text())["narrowing"]
    # repeat 2 started once repeat 1 had diverged: its trace is one of the op-level re-run's, so one re-run is made
    assert narrowing["window"] == window
    assert [(r["index"], r["trace"]) for r in narrowing["results"]] == [(0, "ops-0.trace"), (2, "ops-2.trace")]
    assert sorted(p.name for p in run_dir.glob("ops-*.trace")) == ["ops-0.trace", "ops-2.trace"]
    whole, own = read_trace(run_dir / "ops-2.trace"), read_trace(run_dir / "repeat-2.trace")
    ops = whole.records[whole.records["kind"] == Kind.OP]
    assert len(ops)
    assert sorted(set(ops["step"].tolist())) == window
    assert own.header["granularity"] == "module"
    assert Kind.OP not in set(own.records["kind"].tolist())
    assert len(own.records) == len(whole.records) - len(ops)
    assert own.footer is not None
    third = runs(result)[2]  # compared, stopped and reported as any repeat
    assert (third["trace"], third["stopped_by"], third["diverged_at_step"]) == ("repeat-2.trace", "divergence",
                                                                               DIVERGES_AT)
    assert result.report["first_divergence"]["step"] == DIVERGES_AT
    finding = result.report["first_divergence"]["op_finding"]
    assert finding is not None
    assert finding["window"] == window
    assert finding["traces"] == "ops"
    assert finding["location"].endswith(f"train.py:{SCRIPT.splitlines().index('    {draw}') + 1}")  # the draw
    assert helpers_left(tmp_path) == []


def test_run_to_end_runs_every_repeat_out(tmp_path: Path) -> None:
    result = audit(tmp_path, "--run-to-end", repeats=2)
    assert result.returncode == 1, result.output
    assert [(r["stopped_at_step"], r["exit_code"]) for r in runs(result)] == [(None, 0), (None, 0)]
    records = [r["records"] for r in runs(result)]
    assert records[0] == records[1]
    assert result.report is not None
    assert result.report["match"]["not_compared"] == []
    assert '"run_to_end": true' in (tmp_path / "run" / "run.json").read_text()
    assert helpers_left(tmp_path) == []


def test_a_repeat_that_trains_on_after_its_reference_ended_is_stopped_and_reported(tmp_path: Path) -> None:
    # repeat 0 trains 10 steps; later ones (the marker exists) train on
    write_script(tmp_path, draw="pass", ending="if not marker and step == 10: break")
    result = audit(tmp_path, repeats=2)
    assert result.returncode == 1, result.output
    assert result.report is not None
    first = result.report["first_divergence"]
    assert first["category"] == "structure"
    assert "repeat(s) 0 stopped recording" in first["detail"]
    assert first["step"] == 10
    later = runs(result)[1]
    assert later["diverged_at_step"] == 10
    assert 10 + 1 + EXTRA_STEPS <= later["stopped_at_step"] < STEPS


def test_a_repeat_that_crashes_after_diverging_is_reported_as_a_crash(tmp_path: Path) -> None:
    # later repeats draw at step 4 and raise at step 6, before the stop asked for after step 8
    write_script(tmp_path, draw=f"if marker and step == {DIVERGES_AT}: x = x + random.random() * 1e-3",
                 ending="if marker and step == 6: raise RuntimeError('boom')")
    result = audit(tmp_path, repeats=2)
    assert result.returncode == 1, result.output
    assert result.report is not None
    crashed = runs(result)[1]
    assert crashed["exit_code"] == 1
    assert crashed["stopped_at_step"] is None
    assert "boom" in crashed["error"]
    assert result.report["first_divergence"]["step"] == DIVERGES_AT
    assert result.report["match"]["not_compared"] == []
    assert helpers_left(tmp_path) == []


DDP_SCRIPT = """
import random
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(rank)
x = torch.randn(8, 8, generator=gen)
for step in range(400):
    if step == 2 and rank == 1:
        x = x + random.random() * 1e-3  # rank 1 only, unseeded
    loss = nn.functional.mse_loss(model(x), x.mean(dim=1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
"""


def test_every_rank_of_a_torchrun_repeat_stops_at_the_same_step_and_none_is_left(tmp_path: Path) -> None:
    from processes import processes_mentioning

    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    result = run_cli(["run", "ddp.py", "-n", "2", "--nproc-per-node", "2", "--granularity", "module", "--no-explain",
                      "--timeout", "300", "--out", "run", "--json", "r.json"], cwd=tmp_path, timeout=900)
    assert result.returncode == 1, result.output
    later = runs(result)[1]
    assert (later["stopped_by"], later["diverged_at_step"]) == ("divergence", 2)
    footers = [read_trace(tmp_path / "run" / f"repeat-1.rank-{rank}.trace").footer for rank in (0, 1)]
    assert all(footer is not None and footer["exit_code"] == 0 for footer in footers)
    assert footers[0]["stopped_at_step"] == footers[1]["stopped_at_step"] == later["stopped_at_step"]  # type: ignore[index]
    assert 2 + 1 + EXTRA_STEPS <= later["stopped_at_step"] < 400
    assert not list((tmp_path / "run").glob("*.stop"))
    assert processes_mentioning(str(tmp_path)) == []
