"""End to end under torchrun: 2 ranks, gloo on CPU, each repeat a real `torch.distributed.run` launch.

Slow by nature (three interpreters per repeat); every scenario keeps to 2 repeats of a tiny model.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, start_allowing
from processes import alive

from detaudit.trace import Flag, read_trace

pytestmark = [pytest.mark.slow, pytest.mark.process,
              pytest.mark.skipif(not __import__("torch").distributed.is_available(),
                                 reason="torch.distributed is not built in")]
TIMEOUT = 600  # two cores shared with others: a 2-rank launch can take a minute


def audit(scripts: Path, tmp_path: Path, script: str, *extra: str, granularity: str = "module") -> Any:
    return run_cli(["run", str(scripts / script), "-n", "2", "--nproc-per-node", "2", "--granularity", granularity,
                    "--out", "run", "--json", "report.json", *extra], cwd=tmp_path, timeout=TIMEOUT)


def ranks(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in report["ranks"]}


def test_seeded_ddp_job_is_deterministic_with_equal_replicas(scripts: Path, tmp_path: Path) -> None:
    result = audit(scripts, tmp_path, "train_ddp.py", "--timeout", "300", "--", "--steps", "3")
    assert result.returncode == 0, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "deterministic"
    assert report["replica_divergence"] is None
    assert report["nproc_per_node"] == 2
    assert [(r["rank"], r["role"]) for r in report["ranks"]] == [(0, None), (1, None)]
    run = tmp_path / "run"
    for repeat in range(2):
        for rank in range(2):
            assert (run / f"repeat-{repeat}.rank-{rank}.trace").is_file()
    assert "final loss" in (run / "repeat-0.rank-0.stdout").read_text()
    assert "Ranks" in result.stdout


def test_max_steps_stops_every_rank_at_the_same_step(scripts: Path, tmp_path: Path) -> None:
    result = audit(scripts, tmp_path, "train_ddp.py", "--timeout", "300", "--max-steps", "2", "--", "--steps", "6")
    assert result.returncode == 0, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "deterministic"
    for rank in range(2):
        footer = read_trace(tmp_path / "run" / f"repeat-0.rank-{rank}.trace").footer
        assert footer is not None
        assert footer["exit_code"] == 0
    steps = {int(s) for s in read_trace(tmp_path / "run" / "repeat-0.rank-1.trace").records["step"]}
    assert steps == {0, 1}


def test_unseeded_rank_is_the_origin_and_the_other_a_receiver(scripts: Path, tmp_path: Path) -> None:
    result = audit(scripts, tmp_path, "train_ddp_seeded_main.py", "--timeout", "300", "--explain", "--budget", "2")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    by_rank = ranks(report)
    assert by_rank[1]["role"] == "origin"
    assert by_rank[1]["first_divergence"]["kind"] == "input"
    assert by_rank[0]["role"] == "receiver"
    assert by_rank[0]["first_divergence"]["kind"] == "grad"
    assert report["first_divergence"]["rank"] == 1
    assert report["first_divergence"]["kind"] == "input"
    assert report["causes"]
    assert report["causes"][0]["id"] == "unseeded-torch-rng"
    assert report["causes"][0]["confidence"] == "confirmed"  # --explain re-ran the torchrun job with it pinned
    assert any("rank 1" in line for line in report["causes"][0]["evidence"])
    assert by_rank[0]["causes"] == []  # the receiver is not blamed
    assert "receiver" in result.stdout
    assert "origin" in result.stdout


def test_per_rank_seed_before_wrapping_is_no_false_positive(scripts: Path, tmp_path: Path) -> None:
    result = audit(scripts, tmp_path, "train_ddp_rank_init.py", "--timeout", "300")
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["verdict"] == "deterministic"
    assert result.report["replica_divergence"] is None
    # its DistributedSampler shuffles but never gets set_epoch: deterministic, but worth a note
    assert any("set_epoch" in note for note in result.report["notes"])


def test_parameter_changed_on_one_rank_is_a_replica_divergence(scripts: Path, tmp_path: Path) -> None:
    result = audit(scripts, tmp_path, "train_ddp_clipped.py", "--timeout", "300")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    assert report["first_divergence"] is None  # every repeat agrees with every other
    replica = report["replica_divergence"]
    assert replica["name"] == "module.2.weight"
    assert replica["ranks"] == [1]
    assert replica["reference"] == 0
    assert replica["repeats"] == [0, 1]
    assert replica["max_abs_diff"] > 0
    assert "DDP replicas differ" in result.stdout


def test_every_collective_into_empty_buffers_is_deterministic_and_never_uninitialised(scripts: Path,
                                                                                     tmp_path: Path) -> None:
    """all_gather, all_gather_into_tensor, reduce_scatter, all_to_all, all_reduce, broadcast, send/recv and
    barrier, each writing into torch.empty buffers, recorded op by op: their outputs are written, not read,
    and hashed once the collective has written them."""
    result = audit(scripts, tmp_path, "train_ddp_collectives.py", "--timeout", "300", granularity="op")
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["verdict"] == "deterministic"
    for rank in range(2):
        trace = read_trace(tmp_path / "run" / f"repeat-0.rank-{rank}.trace")
        ops = {trace.strings[r["name"]].split(".")[1] for r in trace.records
               if trace.strings[r["name"]].startswith("c10d.")}
        assert {"allgather_", "_allgather_base_", "reduce_scatter_", "alltoall_", "allreduce_", "broadcast_",
                "recv_"} <= ops
        uninit = [trace.strings[r["name"]] for r in trace.records if int(r["flags"]) & Flag.UNINIT]
        assert uninit == [], uninit
        assert not [r for r in trace.records if int(r["flags"]) & Flag.NO_DATA]  # every async output was read


def test_one_rank_fed_by_an_unseeded_generator_through_collectives_is_the_origin(scripts: Path,
                                                                               tmp_path: Path) -> None:
    # auto: the op-level re-run shows rank 0's all_gather output differing from equal inputs (received)
    # and rank 1's fed its own differing data (born there); module records alone see both batches differ
    result = audit(scripts, tmp_path, "train_ddp_collectives.py", "--timeout", "300", "--no-explain", "--",
                   "--unseeded-rank", "1", granularity="auto")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    by_rank = ranks(report)
    assert by_rank[1]["role"] == "origin"
    assert by_rank[0]["role"] == "receiver"
    assert report["first_divergence"]["rank"] == 1
    assert report["causes"][0]["id"] == "unseeded-numpy-rng"
    assert all(c["id"] != "uninitialized-memory" for c in report["causes"])


def test_hang_on_one_rank_times_out_and_leaves_no_orphan(scripts: Path, tmp_path: Path) -> None:
    # both ranks of both repeats must start (the pid files checked below) before the timeout: forked from the warm
    # servers they do in about a second, real interpreters in under 10 s on a loaded 2-core machine; both repeats
    # at once (-j 2): the subject is the timeout and what it leaves, not running them in turn
    result = audit(scripts, tmp_path, "train_ddp_wait.py", "--timeout", start_allowing(12, 30), "-j", "2")
    assert result.returncode == 5, result.output
    assert result.report is not None
    assert result.report["timed_out"]
    pid_files = sorted((tmp_path / "run").glob("repeat-*.rank-*.pid"))
    assert len(pid_files) == 4  # both ranks of both repeats started
    pids = [int(p.read_text()) for p in pid_files]
    assert not [pid for pid in pids if alive(pid)]
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, str(tmp_path))]
    assert not leftovers


def _cmdline_has(proc: Path, text: str) -> bool:
    try:
        return text.encode() in (proc / "cmdline").read_bytes() and alive(int(proc.name)) \
            and int(proc.name) != os.getpid()
    except OSError:
        return False


def test_abort_in_teardown_after_a_complete_trace_is_a_teardown_crash(scripts: Path, tmp_path: Path) -> None:
    result = audit(scripts, tmp_path, "train_ddp_fast_exit.py", "--timeout", "300")
    assert result.returncode == 0, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "deterministic"
    crashes = report["teardown_crashes"]
    assert [c["repeat"] for c in crashes] == [0, 1]
    assert all(c["ranks"] == [1] and c["signal"] == "SIGABRT" and c["exit_code"] == 1 for c in crashes)
    assert all(run["exit_code"] == 0 for run in report["runs"])
    assert "teardown" in result.stdout


def test_ctrl_c_stops_every_rank(scripts: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "detaudit", "run", str(scripts / "train_ddp_wait.py"), "-n", "2",
                             "--nproc-per-node", "2", "--granularity", "module", "--out", "run"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "run"
    deadline = time.monotonic() + TIMEOUT
    while len(list(run.glob("repeat-0.rank-*.trace"))) < 2 and time.monotonic() < deadline:  # both ranks recording
        time.sleep(0.5)
    pids = [int(p.read_text()) for p in run.glob("repeat-0.rank-*.pid")]
    assert len(pids) == 2
    assert all(alive(pid) for pid in pids)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    time.sleep(0.5)
    assert not [pid for pid in pids if alive(pid)]
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, str(tmp_path))]


def two_nodes(scripts: Path, tmp_path: Path, script: str) -> tuple[list[Any], Any]:
    """Two nodes simulated on this machine: two `detaudit run`s, each one torchrun agent of 2 ranks, started
    together on one c10d rendezvous (as on two machines), then `detaudit compare` of their run directories."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def node(k: int) -> Any:
        return run_cli(["run", str(scripts / script), "-n", "2", "--nproc-per-node", "2", "--granularity", "module",
                        "--no-explain", "--timeout", "120", "--out", f"node{k}", "--json", f"node{k}.json",
                        "--torchrun-args",
                        f"--nnodes 2 --node-rank {k} --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} "
                        "--rdzv-id detaudit-test"], cwd=tmp_path, timeout=TIMEOUT)

    with ThreadPoolExecutor(2) as pool:
        nodes = list(pool.map(node, (0, 1)))
    for k, result in enumerate(nodes):
        # 6: c10d numbers the nodes by host name then agent pid, so on one host a node's ranks may move
        # between repeats, and that node alone then has no rank to compare (its report says so)
        assert result.returncode in (0, 1, 6), result.output
        assert (tmp_path / f"node{k}" / "run.json").is_file()
    held = {rank: k for k in (0, 1) for rank in range(4) if (tmp_path / f"node{k}" / f"repeat-0.rank-{rank}.trace")
            .is_file()}
    assert sorted(held) == [0, 1, 2, 3]
    assert set(held.values()) == {0, 1}
    return nodes, run_cli(["compare", "node0", "node1", "--json", "report.json"], cwd=tmp_path, timeout=TIMEOUT)


def test_two_nodes_compared_together_check_replicas_across_nodes(scripts: Path, tmp_path: Path) -> None:
    # rank 0 clamps its copy of a weight after DDP's update: the other three ranks, on both nodes, differ from it
    nodes, result = two_nodes(scripts, tmp_path, "train_ddp_clipped.py")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    assert report["first_divergence"] is None
    assert [(r["rank"], r["role"]) for r in report["ranks"]] == [(0, None), (1, None), (2, None), (3, None)]
    replica = report["replica_divergence"]
    assert replica["name"] == "module.2.weight"
    assert replica["reference"] == 0
    assert replica["ranks"] == [1, 2, 3]
    assert replica["repeats"] == [0, 1]
    # a node's own report covers its own ranks only, and says so (or, its ranks moved, that it has none)
    for node in nodes:
        if node.returncode == 6:
            assert "no rank left its traces here in every repeat" in node.stderr
            assert "compare" in node.stderr
        else:
            assert "one node of a multi-node job" in node.report["notes"][0], node.output
    # one node's directory twice is not a job
    again = run_cli(["compare", "node0", "node0"], cwd=tmp_path)
    assert again.returncode == 2
    assert "the same run directory" in again.stderr


def test_two_nodes_compared_together_name_the_origin_and_the_receiver_across_nodes(scripts: Path,
                                                                                  tmp_path: Path) -> None:
    # torch is seeded on rank 0 only: ranks 1-3 draw different batches in every repeat (origins), and rank 0,
    # on the first node, only receives their difference through DDP's all-reduce
    _, result = two_nodes(scripts, tmp_path, "train_ddp_seeded_main.py")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    by_rank = ranks(report)
    assert by_rank[0]["role"] == "receiver"
    assert by_rank[0]["first_divergence"]["kind"] == "grad"
    assert all(by_rank[r]["role"] == "origin" and by_rank[r]["first_divergence"]["kind"] == "input" for r in (1, 2, 3))
    assert report["first_divergence"]["rank"] == 1
    assert report["causes"][0]["id"] == "unseeded-torch-rng"
    assert by_rank[0]["causes"] == []
    assert report["replica_divergence"] is None  # DDP kept the replicas equal on both nodes
