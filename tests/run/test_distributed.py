"""torchrun command construction, per-rank file layout, rank identity and the rank sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from detaudit.errors import UsageError
from detaudit.results import RepeatResult
from detaudit.run.distributed import (
    Layout,
    enter_rank,
    kill_ranks,
    multi_node,
    node_rank,
    parse_torchrun_args,
    rank_identity,
    torchrun_command,
)


def test_rank_files_sit_beside_the_repeat_files() -> None:
    assert Layout.rank_file("repeat-0.trace", 1) == "repeat-0.rank-1.trace"
    assert Layout.rank_file("explain-hash-seed.2-1.stdout", 0) == "explain-hash-seed.2-1.rank-0.stdout"


def test_ranks_are_the_planned_ones_and_any_extra_trace(tmp_path: Path) -> None:
    (tmp_path / "repeat-0.rank-3.trace").write_bytes(b"")
    (tmp_path / "repeat-10.rank-5.trace").write_bytes(b"")  # another repeat's: not this one's
    result = RepeatResult(0, "cpu", 0, 1.0, False, "repeat-0.trace", "repeat-0.stdout", "repeat-0.stderr", "")
    assert Layout(2).ranks(tmp_path, result) == [0, 1, 3]
    assert Layout(2, node_rank=2).ranks(tmp_path, result) == [3, 4, 5]


@pytest.mark.parametrize(("args", "rank"), [([], 0), (["--node-rank", "1"], 1), (["--node_rank=3"], 3),
                                            (["--node-rank"], 0)])
def test_node_rank_is_read_from_the_torchrun_args(args: list[str], rank: int) -> None:
    assert node_rank(args) == rank


@pytest.mark.parametrize(("args", "rank"), [
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d"], None),  # c10d numbers the nodes itself
    (["--nnodes=2", "--node-rank=1", "--rdzv_backend=static"], 1), (["--nnodes", "2", "--node-rank", "1"], 1),
    (["--nnodes", "1", "--node-rank", "0", "--rdzv-backend", "c10d"], 0)])
def test_several_nodes_under_a_dynamic_rendezvous_have_no_known_place(args: list[str], rank: int | None) -> None:
    assert node_rank(args) == rank


@pytest.mark.parametrize(("args", "several"), [([], False), (["--nnodes", "1"], False), (["--nnodes=1:1"], False),
                                               (["--nnodes", "2"], True), (["--nnodes=1:4"], True)])
def test_multi_node_is_read_from_nnodes(args: list[str], several: bool) -> None:
    assert multi_node(args) is several


def test_a_node_without_a_known_place_has_the_ranks_it_found(tmp_path: Path) -> None:
    (tmp_path / "repeat-0.rank-3.trace").write_bytes(b"")
    result = RepeatResult(0, "cpu", 0, 1.0, False, "repeat-0.trace", "repeat-0.stdout", "repeat-0.stderr", "")
    assert Layout(2, node_rank=None).ranks(tmp_path, result) == [3]


def test_torchrun_command_is_standalone_with_the_worker_after_no_python() -> None:
    cmd = torchrun_command(2, ["--max-restarts", "0"], ["python", "-m", "detaudit.run.child", "c.json", "t.py"])
    assert cmd[:2] == [sys.executable, "-c"]
    assert "run_module(\"torch.distributed.run\"" in cmd[2]
    assert "--standalone" in cmd
    i = cmd.index("--no-python")
    assert cmd[i + 1:] == ["python", "-m", "detaudit.run.child", "c.json", "t.py"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert "--max-restarts" in cmd[:i]


def test_a_given_rendezvous_replaces_standalone() -> None:
    args = parse_torchrun_args("--nnodes 2 --node-rank 0 --rdzv-endpoint=host:29400 --rdzv-backend c10d")
    assert "--standalone" not in torchrun_command(2, args, ["w"])


@pytest.mark.parametrize("text", ["--nproc-per-node 4", "--no-python", "-m", "--nproc_per_node=3", "'unclosed"])
def test_torchrun_args_refuse_what_detaudit_sets(text: str) -> None:
    with pytest.raises(UsageError, match="--torchrun-args"):
        parse_torchrun_args(text)


def test_rank_identity_keeps_torchrun_and_collective_variables_only() -> None:
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0",
           "NCCL_ALGO": "Ring", "TORCH_NCCL_BLOCKING_WAIT": "1", "GLOO_SOCKET_IFNAME": "lo", "HOME": "/root",
           "AWS_SECRET_ACCESS_KEY": "x"}
    identity = rank_identity(env)
    assert identity["rank"] == 1
    assert identity["env"] == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert identity["collective_env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_ALGO": "Ring",
                                          "TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_an_ordinary_repeat_is_left_alone() -> None:
    config = {"trace": "/x/repeat-0.trace"}
    assert enter_rank(config) is None
    assert config == {"trace": "/x/repeat-0.trace"}


@pytest.mark.process
def test_a_rank_writes_its_own_trace_stdout_and_pid_file(tmp_path: Path) -> None:
    code = (
        "import json, sys; from detaudit.run.distributed import enter_rank\n"
        f"config = {{'trace': {str(tmp_path / 'repeat-0.trace')!r}, 'nproc_per_node': 2, "
        f"'watch': {{'events': {str(tmp_path / 'watch-events.jsonl')!r}, 'every': 20}}}}\n"
        "header = enter_rank(config)\n"
        "print('hello from', header['rank'])\n"
        "sys.stderr.write(json.dumps(config))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "RANK": "1"}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr)["trace"] == str(tmp_path / "repeat-0.rank-1.trace")
    assert json.loads(proc.stderr)["watch"]["events"] == str(tmp_path / "watch-events.rank-1.jsonl")
    assert (tmp_path / "repeat-0.rank-1.stdout").read_text() == "hello from 1\n"
    assert proc.stdout == ""
    assert int((tmp_path / "repeat-0.rank-1.pid").read_text()) > 0


@pytest.mark.process
@pytest.mark.slow
def test_kill_ranks_kills_a_live_rank_group_and_spares_strangers(tmp_path: Path) -> None:
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "detaudit.run.child", str(tmp_path)],
                            start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / "repeat-0.rank-0.pid").write_text(str(rank.pid))
        (tmp_path / "repeat-0.rank-1.pid").write_text(str(stranger.pid))  # not our child: left alone
        assert kill_ranks(tmp_path, "repeat-0.trace") == [rank.pid]
        assert rank.wait(timeout=10) == -9
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        rank.kill()
        stranger.kill()
        rank.wait()
        stranger.wait()


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("args", [["--torchrun-args", "--max-restarts 1"],
                                  ["--nproc-per-node", "2", "--torchrun-args", "--nproc-per-node 4"],
                                  ["--nproc-per-node", "2", "--save-baseline", "base"],
                                  ["--nproc-per-node", "2", "--max-time", "5"],
                                  ["--nproc-per-node", "0"]])
def test_distributed_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "x.py").write_text("print(1)\n")
    result = run_cli(["run", "x.py", "-n", "2", *args], cwd=tmp_path)
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / ".detaudit").exists()


def test_a_failed_launch_carries_the_lowest_raising_ranks_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from detaudit.run.distributed import DistributedLauncher
    from detaudit.run.launcher import Launcher, plan_repeats
    from detaudit.trace import TraceWriter

    def frame(line: int) -> dict[str, object]:
        return {"file": "train.py", "line": line, "function": "main", "text": None, "user": True}

    for rank, footer in ((0, None), (1, {"exit_code": 1, "exception": {"type": "E", "message": "one", "frames": [
            frame(1)]}}), (2, {"exit_code": 1, "exception": {"type": "E", "message": "two", "frames": [frame(2)]}})):
        writer = TraceWriter(tmp_path / f"repeat-0.rank-{rank}.trace", {"repeat": 0})
        writer.close(footer) if footer else writer.abandon()  # rank 0: killed by torchrun, no footer
    script = tmp_path / "train.py"
    script.write_text("")
    [plan] = plan_repeats(tmp_path, 1, ["cpu"])
    for code, expected in ((1, "one"), (0, None)):
        monkeypatch.setattr(Launcher, "launch", lambda self, p, timeout, code=code: RepeatResult(
            p.index, "cpu", code, 1.0, False, p.trace.name, p.stdout.name, p.stderr.name, ""))
        launcher = DistributedLauncher(script, [], None, nproc_per_node=3, torchrun_args=[])
        result = launcher.run_one(plan)
        assert (result.error.message if result.error else None) == expected


@pytest.mark.parametrize(("footers", "torchrun_args", "expected"), [
    # two nodes: every rank here ended by itself (footer written), the agent then waited at the exit barrier
    ([{"exit_code": 0}, {"exit_code": 0}], ["--nnodes", "2"], (False, 0, True)),
    ([{"exit_code": 0}, {"exit_code": 3}], ["--nnodes", "2"], (False, 3, True)),
    # a rank stopped by the timeout writes no footer: the script itself timed out
    ([{"exit_code": 0}, None], ["--nnodes", "2"], (True, None, False)),
    # one node: its agent's exit barrier waits for nobody, a timeout is the script's
    ([{"exit_code": 0}, {"exit_code": 0}], [], (True, None, False)),
])
def test_a_timeout_after_every_rank_here_ended_is_the_exit_barrier_not_the_script(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, footers: list[dict[str, int] | None],
        torchrun_args: list[str], expected: tuple[bool, int | None, bool]) -> None:
    from detaudit.run.distributed import DistributedLauncher
    from detaudit.run.launcher import Launcher, plan_repeats
    from detaudit.trace import TraceWriter

    for rank, footer in enumerate(footers):
        writer = TraceWriter(tmp_path / f"repeat-0.rank-{rank}.trace", {"repeat": 0})
        writer.close(footer) if footer else writer.abandon()
    script = tmp_path / "train.py"
    script.write_text("")
    [plan] = plan_repeats(tmp_path, 1, ["cpu"])
    monkeypatch.setattr(Launcher, "launch", lambda self, p, timeout: RepeatResult(
        p.index, "cpu", None, 120.0, True, p.trace.name, p.stdout.name, p.stderr.name, ""))
    launcher = DistributedLauncher(script, [], 120.0, nproc_per_node=2, torchrun_args=torchrun_args)
    result = launcher.run_one(plan)
    assert (result.timed_out, result.exit_code, result.exit_barrier_waited) == expected


@pytest.mark.parametrize(("stderr", "rank_started", "torchrun_args", "launches"), [
    # the other node's previous agent still held the store: closed rendezvous, no rank started -> launched again
    ("torch.distributed.elastic.rendezvous.api.RendezvousClosedError\n", False, ["--nnodes", "2"], 2),
    # a rank started: the script ran, its failure is the repeat's
    ("torch.distributed.elastic.rendezvous.api.RendezvousClosedError\n", True, ["--nnodes", "2"], 1),
    # not a rendezvous failure
    ("ValueError: bad argument\n", False, ["--nnodes", "2"], 1),
    # one node: nothing else can hold its rendezvous
    ("torch.distributed.elastic.rendezvous.api.RendezvousClosedError\n", False, [], 1),
])
def test_a_launch_that_never_met_the_other_nodes_is_launched_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr: str, rank_started: bool,
        torchrun_args: list[str], launches: int) -> None:
    from detaudit.run import distributed
    from detaudit.run.distributed import DistributedLauncher
    from detaudit.run.launcher import plan_repeats

    script = tmp_path / "train.py"
    script.write_text("")
    [plan] = plan_repeats(tmp_path, 1, ["cpu"])
    calls = []

    def launch(self: DistributedLauncher, p: Any, timeout: float | None) -> RepeatResult:
        calls.append(timeout)
        first = len(calls) == 1
        p.stdout.write_text("")
        p.stderr.write_text(stderr if first else "")
        if rank_started:
            (tmp_path / "repeat-0.rank-0.pid").write_text("1")
        return RepeatResult(p.index, "cpu", 1 if first else 0, 1.0, False, p.trace.name, p.stdout.name,
                            p.stderr.name, "")

    monkeypatch.setattr(DistributedLauncher, "launch", launch)
    monkeypatch.setattr(distributed, "RENDEZVOUS_RETRY_S", 0.0)
    result = DistributedLauncher(script, [], 60.0, nproc_per_node=2, torchrun_args=torchrun_args).run_one(plan)
    assert len(calls) == launches
    assert result.rendezvous_retries == launches - 1
    assert result.exit_code == (0 if launches == 2 else 1)
    assert calls[-1] is not None
    assert calls[-1] <= 60.0
    kept = sorted(p.name for p in tmp_path.glob("repeat-0.rendezvous-*"))
    assert kept == (["repeat-0.rendezvous-1.stderr", "repeat-0.rendezvous-1.stdout"] if launches == 2 else [])
