"""Rank-by-rank analysis of torchrun runs, on synthetic run directories (no launches)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from synthetic import Rec, write_trace

from detaudit.audit.pipeline import compare_recorded, load_run
from detaudit.audit.ranks import classify
from detaudit.compare.oprules import OpFinding, Verdict
from detaudit.errors import ExitCode, Inconclusive, UsageError
from detaudit.records import RUN
from detaudit.report.junit import to_junit
from detaudit.report.model import report_json
from detaudit.results import Divergence, RecordInfo, RepeatResult, Tolerance
from detaudit.trace import Kind

DDP = {"type": "ddp", "params": ["module.fc.weight"], "ignored": [], "backend": "gloo"}
ROOT_CAUSE = """Failures:
[1]:
  time      : 2026-11-23_00:40:00
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4241)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4241
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_00:40:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 4242
"""


def step_records(step: int, x: int, grad: int, param: int) -> list[Rec]:
    return [Rec("DistributedDataParallel.input[0]", x, step, Kind.INPUT, samples=(x, 0, 0, 0)),
            Rec("module.fc", x + 1, step, Kind.OUTPUT, samples=(x + 1, 0, 0, 0)),
            Rec("module.fc.weight", grad, step, Kind.GRAD, samples=(grad, 0, 0, 0)),
            Rec("module.fc.weight", param, step, Kind.PARAM, samples=(param, 0, 0, 0))]


def write_dist_run(run_dir: Path, traces: Sequence[Sequence[list[Rec]]], exit_codes: Sequence[int] | None = None,
                   rank_exit: int = 0, stderr: str = "", events: Sequence[dict[str, Any]] = (DDP,),
                   collective_env: Sequence[dict[str, str]] | None = None,
                   ranks: Sequence[Sequence[int]] | None = None, torchrun_args: Sequence[str] = ()) -> Path:
    """traces[repeat][rank]: a torchrun run directory as `detaudit run --nproc-per-node` leaves it;
    `ranks[repeat]`: the global rank of each of those traces (one node of several), 0, 1, ... by default."""
    run_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for i, per_rank in enumerate(traces):
        for rank, recs in zip(ranks[i] if ranks else range(len(per_rank)), per_rank):
            write_trace(run_dir / f"repeat-{i}.rank-{rank}.trace", recs, {"exit_code": rank_exit, "error": None},
                        events=[(0, e) for e in events], header={"repeat": i, "distributed": {
                            "rank": rank, "collective_env": collective_env[i] if collective_env else {}}})
            (run_dir / f"repeat-{i}.rank-{rank}.stdout").write_text("")
        (run_dir / f"repeat-{i}.stdout").write_text("")
        (run_dir / f"repeat-{i}.stderr").write_text(stderr)
        code = exit_codes[i] if exit_codes else 0
        results.append(RepeatResult(i, "cpu", code, 1.0, False, f"repeat-{i}.trace", f"repeat-{i}.stdout",
                                    f"repeat-{i}.stderr", "d"))
    record = {**RUN.stamp(), "script": "train.py", "script_args": [],
              "cwd": str(run_dir), "repeats": len(traces), "devices": ["cpu"], "granularity": "module",
              "timeout": None, "tolerance": {"atol": 1e-5, "rtol": 1.3e-6}, "env": {}, "environment": {},
              "started": time.time(), "nproc_per_node": len(traces[0]), "torchrun_args": list(torchrun_args),
              "results": [r.to_dict() for r in results]}
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def test_identical_ranks_and_repeats_are_deterministic(tmp_path: Path) -> None:
    rank = step_records(0, 10, 20, 30) + step_records(1, 11, 21, 31)
    report = load_run(write_dist_run(tmp_path, [[rank, rank], [rank, rank]]))
    data = report_json(report)
    assert data["verdict"] == "deterministic"
    assert data["exit_code"] == 0
    assert data["ranks"] == [{"rank": 0, "first_divergence": None, "role": None, "causes": []},
                             {"rank": 1, "first_divergence": None, "role": None, "causes": []}]
    assert data["replica_divergence"] is None
    assert data["teardown_crashes"] == []


def test_ranks_whose_dataloader_workers_draw_alike_are_reported_across_ranks(tmp_path: Path) -> None:
    """Each rank's worker evidence is read together with the others': equal augmentation states on ranks 0 and 1
    are randomness that repeats across ranks (beside the verdict, which stays deterministic)."""
    rank = step_records(0, 10, 20, 30)
    run_dir = write_dist_run(tmp_path, [[rank, rank], [rank, rank]])
    for r in (0, 1):
        draw = {"type": "random-draw", "lib": "torch", "fn": "torch.rand", "loc": "data.py:14", "site": "data.py:14",
                "source": "global", "state": "same-state", "value": "v", "size": 16, "epoch": 0, "n": 0, "step": -1,
                "grad": True, "rank": r, "worker": 0, "at": 0}
        (run_dir / f"repeat-0.rank-{r}.trace.workers.jsonl").write_text(json.dumps(draw) + "\n")
    data = report_json(load_run(run_dir))
    assert data["verdict"] == "deterministic"
    assert [(x["site"], x["across"]) for x in data["repeated_randomness"]] == [("data.py:14", "ranks")]


def test_input_differs_on_one_rank_origin_there_receiver_elsewhere(tmp_path: Path) -> None:
    rank0 = step_records(0, 10, 20, 30)
    rank1 = step_records(0, 50, 20, 30)
    # repeat 1: rank 1 got other data; the all-reduced gradient then differs on both ranks
    other0 = step_records(0, 10, 21, 31)
    other1 = step_records(0, 60, 21, 31)
    report = load_run(write_dist_run(tmp_path, [[rank0, rank1], [other0, other1]]))
    data = report_json(report)
    roles = {r["rank"]: (r["role"], r["first_divergence"]["kind"]) for r in data["ranks"]}
    assert roles == {0: ("receiver", "grad"), 1: ("origin", "input")}
    assert data["first_divergence"]["rank"] == 1
    assert data["first_divergence"]["kind"] == "input"
    assert data["verdict"] == "divergent"
    assert data["ranks"][0]["causes"] == []  # a receiver is not blamed for what it received


def test_a_gradient_no_collective_touched_is_an_origin(tmp_path: Path) -> None:
    a = step_records(0, 10, 20, 30)
    b = step_records(0, 10, 21, 31)
    report = load_run(write_dist_run(tmp_path, [[a, a], [b, b]], events=()))
    assert {s.role for s in report.distributed.ranks} == {"origin"}  # type: ignore[union-attr]
    assert report.distributed.rank == 0  # type: ignore[union-attr]


def test_only_receivers_report_the_earliest_of_them(tmp_path: Path) -> None:
    a = step_records(0, 10, 20, 30)
    b = step_records(0, 10, 21, 31)  # every rank's gradient differs, nothing local did: the collective
    report = load_run(write_dist_run(tmp_path, [[a, a], [b, b]]))
    assert [s.role for s in report.distributed.ranks] == ["receiver", "receiver"]  # type: ignore[union-attr]
    assert report.distributed.rank == 0
    assert report.verdict == "divergent"
    found = {c.id: c for c in report.causes}
    assert found["collective-algorithm"].confidence == "possible"  # gloo, same settings: only a suspect
    assert any("DistributedDataParallel" in line and "gloo" in line for line in found["collective-algorithm"].evidence)


def test_collective_settings_that_differ_make_the_collective_likely(tmp_path: Path) -> None:
    a = step_records(0, 10, 20, 30)
    b = step_records(0, 10, 21, 31)
    report = load_run(write_dist_run(tmp_path, [[a, a], [b, b]],
                                     collective_env=[{"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Tree"}]))
    assert report.causes[0].id == "collective-algorithm"
    assert report.causes[0].confidence == "likely"
    assert any("NCCL_ALGO" in line for line in report.causes[0].evidence)


def test_replicas_that_differ_in_every_repeat_alike_are_divergent(tmp_path: Path) -> None:
    rank0 = step_records(0, 10, 20, 30) + step_records(1, 11, 21, 31)
    rank1 = step_records(0, 12, 20, 30) + step_records(1, 13, 21, 35)
    report = load_run(write_dist_run(tmp_path, [[rank0, rank1], [rank0, rank1]]))
    data = report_json(report)
    assert data["first_divergence"] is None
    assert data["replica_divergence"] == {"step": 1, "name": "module.fc.weight", "ranks": [1], "reference": 0,
                                          "max_abs_diff": 4.0, "repeats": [0, 1]}
    assert data["verdict"] == "divergent"
    assert data["exit_code"] == 1
    junit = to_junit(report)
    assert 'name="DDP replicas agree"' in junit
    assert "module.fc.weight on rank(s) 1 differs from rank 0" in junit


def test_parameters_outside_ddp_are_not_replicas(tmp_path: Path) -> None:
    rank0 = step_records(0, 10, 20, 30)
    rank1 = step_records(0, 12, 20, 99)  # e.g. an FSDP shard: no `ddp` event names it
    report = load_run(write_dist_run(tmp_path, [[rank0, rank1], [rank0, rank1]], events=()))
    assert report.replica_divergence is None
    assert report.verdict == "deterministic"


def test_abort_after_every_rank_finished_is_a_teardown_crash(tmp_path: Path) -> None:
    rank = step_records(0, 10, 20, 30)
    report = load_run(write_dist_run(tmp_path, [[rank, rank], [rank, rank]], exit_codes=[1, 0], stderr=ROOT_CAUSE))
    data = report_json(report)
    assert data["verdict"] == "deterministic"
    assert data["exit_code"] == 0
    assert data["teardown_crashes"] == [{"repeat": 0, "exit_code": 1, "ranks": [1], "signal": "SIGABRT"}]
    assert [r["exit_code"] for r in data["runs"]] == [0, 0]


def test_a_rank_that_failed_in_its_script_is_no_teardown_crash(tmp_path: Path) -> None:
    rank = step_records(0, 10, 20, 30)
    report = load_run(write_dist_run(tmp_path, [[rank, rank], [rank, rank]], exit_codes=[1, 1], rank_exit=1,
                                     stderr=ROOT_CAUSE))
    assert report.distributed.teardown_crashes == []  # type: ignore[union-attr]
    assert report.verdict == "failed"
    assert report.failure


def _grad_divergence(op: str, verdict: Verdict) -> tuple[Divergence, OpFinding]:
    rec = RecordInfo(6, "grad", "module.fc.weight", "", "train.py:27", 0, "4", "float32", "", False)
    op_rec = RecordInfo(4, "op", op, "", "train.py:19", 0, "4", "float32", op, False)
    return Divergence(6, "content", rec, [1], 0), OpFinding(verdict, op_rec, [1], 0)


def test_a_collective_op_behind_the_divergence_makes_a_receiver(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.trace", [], {"exit_code": 0})
    # equal inputs, different output: for a local op an origin, for a collective the other ranks' data
    for op, verdict, role in (("c10d.allgather_.default", "uninitialized-memory", "receiver"),
                              ("aten.index_add_.default", "nondeterministic-op", "origin")):
        divergence, found = _grad_divergence(op, verdict)  # type: ignore[arg-type]
        assert classify(divergence, [path], found) == role


def test_a_collective_fed_different_data_by_this_rank_makes_an_origin(tmp_path: Path) -> None:
    """A rank whose own (unseeded) data reaches an all_gather first: the collective's inputs differ and
    nothing before it did, so the divergence was born on this rank, not received."""
    path = write_trace(tmp_path / "t.trace", [], {"exit_code": 0})
    rec = RecordInfo(4, "op", "c10d.allgather_.default", "", "train.py:15", 0, "4x8", "float32",
                     "c10d.allgather_.default", False)
    for verdict, role in (("inputs-differ", "origin"), ("nondeterministic-op", "receiver")):
        found = OpFinding(verdict, rec, [1], 0)  # type: ignore[arg-type]
        assert classify(Divergence(4, "content", rec, [1], 0), [path], found) == role


def test_a_buffer_ddp_broadcasts_is_received_and_one_it_does_not_is_born_here(tmp_path: Path) -> None:
    """DDP (broadcast_buffers) sends rank 0's running statistics before each forward: a rank whose buffer is
    the first thing to differ received it; a buffer DDP does not broadcast differs by this rank's doing."""
    event = {**DDP, "buffers": ["module.bn.running_mean"]}
    path = write_trace(tmp_path / "t.trace", [], {"exit_code": 0}, events=[(0, event)])
    for name, role in (("bn.running_mean", "receiver"), ("ema.shadow", "origin")):
        rec = RecordInfo(9, "buffer", name, "", "train.py:30", 1, "8", "float32", "", False)
        assert classify(Divergence(9, "content", rec, [1], 0), [path]) == role


def test_compare_refuses_a_torchrun_run_directory_and_names_a_rank_trace(tmp_path: Path) -> None:
    rank = step_records(0, 10, 20, 30)
    run = write_dist_run(tmp_path / "run", [[rank, rank], [rank, rank]])
    with pytest.raises(UsageError, match=r"other nodes, or one rank's traces.*repeat-0\.rank-0\.trace"):
        compare_recorded([run, run / "repeat-1.rank-0.trace"])
    report = compare_recorded([run / "repeat-0.rank-1.trace", run / "repeat-1.rank-1.trace"])
    assert report.verdict == "deterministic"


def _raised(message: str, line: int) -> dict[str, Any]:
    return {"type": "ValueError", "message": message, "frames": [
        {"file": "train.py", "line": line, "function": "main", "text": "step()", "user": True}]}


@pytest.mark.parametrize("rank0_raised", [False, True])
def test_a_failed_repeat_shows_the_root_cause_ranks_frames_not_torchruns_summary(tmp_path: Path,
                                                                                 rank0_raised: bool) -> None:
    """Rank 1 failed first (torchrun's "Root Cause"); rank 0 finished, or raised only because its peer went."""
    rank = step_records(0, 10, 20, 30)
    run = write_dist_run(tmp_path, [[rank, rank], [rank, rank]], exit_codes=[1, 1], stderr=ROOT_CAUSE)
    for repeat in range(2):
        for r, footer in ((0, {"exit_code": 1, "exception": _raised("connection closed by peer", 7)}),
                          (1, {"exit_code": 1, "exception": _raised("shard 3 has no labels", 41)})):
            if r == 0 and not rank0_raised:
                continue
            path = run / f"repeat-{repeat}.rank-{r}.trace"
            path.unlink()
            write_trace(path, rank, footer, events=[(0, DDP)],
                        header={"repeat": repeat, "distributed": {"rank": r, "collective_env": {}}})
    report = load_run(run)
    assert report.verdict == "failed"
    assert report.failure == "train.py:41, in main\n    step()\nValueError: shard 3 has no labels"


C10D = ("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "host:29400")


def two_nodes(tmp_path: Path, rank0: Sequence[list[Rec]], rank1: Sequence[list[Rec]],
              moved: bool = False) -> tuple[Path, Path]:
    """One rank per node, two repeats; `moved`: the rendezvous swapped the nodes in repeat 1 (c10d on one host)."""
    order = [[0], [1]] if moved else [[0], [0]]
    a = write_dist_run(tmp_path / "a", [[rank0[0]], [(rank0, rank1)[order[1][0]][1]]], ranks=[[0], order[1]],
                       torchrun_args=C10D)
    b = write_dist_run(tmp_path / "b", [[rank1[0]], [(rank1, rank0)[order[1][0]][1]]],
                       ranks=[[1], [1 - order[1][0]]], torchrun_args=C10D)
    return a, b


def test_the_nodes_of_a_job_compared_together_name_origin_and_receiver_across_nodes(tmp_path: Path) -> None:
    # rank 1 (node b) got other data in repeat 1; rank 0 (node a) only received it through the all-reduce
    a, b = two_nodes(tmp_path, [step_records(0, 10, 20, 30), step_records(0, 10, 21, 31)],
                     [step_records(0, 50, 20, 30), step_records(0, 60, 21, 31)])
    data = report_json(compare_recorded([a, b]))
    roles = {r["rank"]: (r["role"], r["first_divergence"]["kind"]) for r in data["ranks"]}
    assert roles == {0: ("receiver", "grad"), 1: ("origin", "input")}
    assert data["first_divergence"]["rank"] == 1
    assert data["verdict"] == "divergent"
    # each node alone sees one rank, and says it is one node of several
    alone = report_json(load_run(a))
    assert [r["rank"] for r in alone["ranks"]] == [0]
    assert "one node of a multi-node job" in alone["notes"][0]


def test_replicas_are_checked_across_the_nodes(tmp_path: Path) -> None:
    rank0 = step_records(0, 10, 20, 30)
    rank1 = step_records(0, 12, 20, 33)  # rank 1's copy of the parameter drifted, alike in both repeats
    a, b = two_nodes(tmp_path, [rank0, rank0], [rank1, rank1])
    data = report_json(compare_recorded([a, b]))
    assert data["first_divergence"] is None
    assert data["verdict"] == "divergent"
    assert data["replica_divergence"]["ranks"] == [1]
    assert data["replica_divergence"]["reference"] == 0
    assert load_run(a).verdict == "deterministic"  # one node alone cannot see it


def test_ranks_that_moved_between_nodes_are_compared_together_and_not_alone(tmp_path: Path) -> None:
    rank0 = step_records(0, 10, 20, 30)
    rank1 = step_records(0, 50, 20, 30)
    a, b = two_nodes(tmp_path, [rank0, rank0], [rank1, rank1], moved=True)
    assert (a / "repeat-1.rank-1.trace").is_file()
    assert (b / "repeat-1.rank-0.trace").is_file()
    data = report_json(compare_recorded([a, b]))
    assert data["verdict"] == "deterministic"
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    with pytest.raises(Inconclusive, match="no rank left its traces here in every repeat") as caught:
        load_run(a)
    assert caught.value.exit_code == ExitCode.INCONCLUSIVE


def test_run_directories_that_are_not_one_jobs_nodes_are_refused(tmp_path: Path) -> None:
    rank = step_records(0, 10, 20, 30)
    a, b = two_nodes(tmp_path, [rank, rank], [rank, rank])
    with pytest.raises(UsageError, match="same run directory"):
        compare_recorded([a, a])
    with pytest.raises(UsageError, match="both .* hold rank 0's trace"):
        compare_recorded([a, write_dist_run(tmp_path / "c", [[rank], [rank]], torchrun_args=C10D)])
    with pytest.raises(UsageError, match="not one job's nodes"):
        compare_recorded([a, write_dist_run(tmp_path / "d", [[rank]] * 3, ranks=[[1]] * 3, torchrun_args=C10D)])
    with pytest.raises(UsageError, match="compared bitwise"):
        compare_recorded([a, b], Tolerance(1e-3, 0.0))
