"""Multi-process repeats: each repeat is one torchrun launch, each rank records its own trace.

torchrun is the launcher people already use, so detaudit runs it rather than imitating it:
`python -m torch.distributed.run --standalone --nproc-per-node N --no-python python -u -m
detaudit.run.child CONFIG SCRIPT ARGS` (torchrun started through a few lines that make it, and so its ranks,
die with detaudit: run/guard.py). `--no-python` makes torchrun start exactly that command for
every rank, so the recorder is injected without touching the script. Inside a rank, the child
calls `enter_rank` to learn its rank from torchrun's environment and write to its own files.

Layout of a run directory (docs/distributed.md): `repeat-I.rank-R.trace`, `.stdout` and `.pid`
per rank; `repeat-I.stdout`/`.stderr` hold what torchrun itself printed (the ranks' stderr too).

torchrun starts every worker in a session of its own, so stopping the launcher's process group
does not reach them: after a repeat (and on Ctrl-C) every rank's group that is still alive is
killed from the pid files the ranks wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from detaudit.errors import TraceError, UsageError
from detaudit.results import RepeatResult, ScriptError
from detaudit.run.failure import first_error, stderr_tail
from detaudit.run.files import create_private
from detaudit.run.launcher import Launcher, RepeatPlan, Watch, child_command, torchrun_launcher

RANK_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "MASTER_ADDR",
            "MASTER_PORT")
COLLECTIVE_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_")
# torchrun options detaudit sets itself: passing them again through --torchrun-args is a usage error
_OWN_OPTIONS = ("--nproc-per-node", "--nproc_per_node", "--no-python", "--no_python", "--module", "-m",
                "--run-path", "--run_path")


@dataclass(frozen=True)
class Layout:
    """How a repeat's files are named per rank (`repeat-0.trace` -> `repeat-0.rank-1.trace`)."""

    nproc_per_node: int
    # --node-rank of a static rendezvous: this node's ranks start at node_rank * N; None where the rendezvous
    # places the nodes itself (c10d orders them by host name and agent pid): the ranks are those found here
    node_rank: int | None = 0

    @staticmethod
    def rank_file(name: str, rank: int) -> str:
        stem, dot, suffix = name.rpartition(".")
        if not dot:
            return f"{name}.rank-{rank}"
        return f"{stem}.rank-{rank}.{suffix}"

    def ranks(self, run_dir: Path, result: RepeatResult) -> list[int]:
        """The ranks of one repeat: every rank this node launched (when its place is known), and any
        further rank that wrote a trace here."""
        found = set()
        if self.node_rank is not None:
            first = self.node_rank * self.nproc_per_node
            found = set(range(first, first + self.nproc_per_node))
        stem = result.trace.removesuffix(".trace")
        for path in Path(run_dir).glob(f"{stem}.rank-*.trace"):
            match = re.fullmatch(re.escape(stem) + r"\.rank-(\d+)\.trace", path.name)
            if match:
                found.add(int(match.group(1)))
        return sorted(found)


def _option(torchrun_args: list[str], *names: str) -> str | None:
    """The value of a torchrun option (`--name V` or `--name=V`), None when absent."""
    for i, arg in enumerate(torchrun_args):
        name, eq, value = arg.partition("=")
        if name in names:
            return value if eq else (torchrun_args[i + 1] if i + 1 < len(torchrun_args) else "")
    return None


def multi_node(torchrun_args: list[str]) -> bool:
    """Whether `--nnodes` asks for more than one node (`2`, or a range such as `1:4`)."""
    nnodes = _option(torchrun_args, "--nnodes")
    return nnodes is not None and nnodes.strip() not in ("", "1", "1:1")


# several nodes: each node's detaudit decides from its own ranks, so a launch after the repeats would start
# on some nodes only and wait in the rendezvous for the others
NODES_FOLLOW_UP = ("{} cannot run with --nnodes above 1: it would launch the job again after the repeats, "
                   "decided by each node from its own ranks alone, and a node that launches alone waits in the "
                   "rendezvous for nodes that never come")


def node_rank(torchrun_args: list[str]) -> int | None:
    """Where this node's ranks start, as `--node-rank` says (0 when none or not a number: torchrun will
    complain). None on several nodes under a rendezvous other than `static`: torchrun then ignores
    `--node-rank` and numbers the nodes itself (c10d: by host name, then agent pid)."""
    backend = _option(torchrun_args, "--rdzv-backend", "--rdzv_backend")
    if multi_node(torchrun_args) and backend not in (None, "static"):
        return None
    value = _option(torchrun_args, "--node-rank", "--node_rank") or ""
    return int(value) if value.isdigit() else 0


def parse_torchrun_args(text: str) -> list[str]:
    """`--torchrun-args "..."`: shell-split, refusing the options detaudit must own."""
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--torchrun-args: cannot split {text!r}: {exc}") from None
    for arg in args:
        if arg.split("=", 1)[0] in _OWN_OPTIONS:
            raise UsageError(f"--torchrun-args: {arg.split('=', 1)[0]} is set by detaudit "
                             "(use --nproc-per-node on detaudit itself)")
    return args


def torchrun_command(nproc_per_node: int, torchrun_args: list[str], worker: list[str]) -> list[str]:
    """The launcher command of one repeat; `--standalone` unless the user gave a rendezvous."""
    rendezvous = any(a.split("=", 1)[0] in ("--rdzv-endpoint", "--rdzv_endpoint", "--master-addr",
                                            "--master_addr", "--standalone") for a in torchrun_args)
    return [*torchrun_launcher(), *([] if rendezvous else ["--standalone"]),
            "--nproc-per-node", str(nproc_per_node), *torchrun_args, "--no-python", *worker]


class DistributedLauncher(Launcher):
    """A Launcher whose repeats are torchrun launches; it sweeps the ranks' process groups after each."""

    def __init__(self, *args: Any, nproc_per_node: int, torchrun_args: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout = Layout(nproc_per_node, node_rank(torchrun_args))
        self.torchrun_args = torchrun_args
        self._traces: dict[int, Path] = {}  # repeat -> its trace path (the rank files sit beside it)

    def _command(self, config_path: Path) -> list[str]:
        worker = child_command(config_path, self.script_arg, self.script_args, python_flags=["-u"])
        return torchrun_command(self.layout.nproc_per_node, self.torchrun_args, worker)

    def run_one(self, plan: RepeatPlan) -> RepeatResult:
        self._traces[plan.index] = plan.trace
        started = time.monotonic()
        window = self.timeout if self.timeout is not None else RENDEZVOUS_WINDOW_S
        retries = 0
        while True:
            left = None if self.timeout is None else max(0.0, self.timeout - (time.monotonic() - started))
            try:
                result = self.launch(plan, left)
            finally:
                kill_ranks(plan.trace.parent, plan.trace.name)
            if not self._never_met(plan, result) or time.monotonic() - started + RENDEZVOUS_RETRY_S >= window:
                break
            retries += 1
            for capture in (plan.stdout, plan.stderr):  # kept: the failed launch's own words
                capture.rename(capture.with_name(capture.name.replace(".std", f".rendezvous-{retries}.std")))
            time.sleep(RENDEZVOUS_RETRY_S)
        result = replace(result, rendezvous_retries=retries)
        if result.timed_out:
            result = self._ended_before_the_barrier(plan, result)
        failed = result.exit_code
        error = rank_error(plan.trace.parent, result, self.layout, stderr_tail(plan.stderr)) if failed else None
        return replace(result, stdout_digest=self._ranks_digest(plan, result), error=error)

    def _never_met(self, plan: RepeatPlan, result: RepeatResult) -> bool:
        """Whether a launch of several nodes failed in torchrun's rendezvous, before any rank started here.

        The nodes' repeats are launched independently, so one node's next launch can reach the rendezvous
        store while another node's previous agent still holds it (waiting at its exit barrier after a failed
        repeat, or exiting): the rendezvous there is closed and torchrun fails at once. The script never ran,
        so the launch is retried until the rendezvous of this repeat forms (within the repeat's --timeout).
        """
        if not multi_node(self.torchrun_args) or result.exit_code in (0, None) or result.timed_out \
                or result.interrupted or self._stopping:
            return False
        stem = result.trace.removesuffix(".trace")
        if any(plan.trace.parent.glob(f"{stem}.rank-*.pid")):
            return False
        return _RENDEZVOUS_ERROR.search(stderr_tail(plan.stderr)) is not None

    def _ended_before_the_barrier(self, plan: RepeatPlan, result: RepeatResult) -> RepeatResult:
        """A repeat stopped by --timeout whose every rank here had ended by itself (each wrote its footer,
        which a rank stopped by the timeout never does): its agent was waiting at torchrun's exit barrier for
        another node's agent, which never comes when that node's repeat failed (torchrun skips the barrier on
        failure). The script did not time out here: the repeat ended as its ranks did."""
        from detaudit.trace import read_footer  # here: the child imports this module before the script

        if not multi_node(self.torchrun_args):  # one agent: its exit barrier waits for nobody
            return result
        codes = []
        for rank in self.layout.ranks(plan.trace.parent, result):
            footer = read_footer(plan.trace.parent / Layout.rank_file(result.trace, rank))
            if footer is None or not isinstance(footer.get("exit_code"), int):
                return result
            codes.append(footer["exit_code"])
        if not codes:
            return result
        return replace(result, timed_out=False, exit_code=next((c for c in codes if c), 0), exit_barrier_waited=True)

    def _ranks_digest(self, plan: RepeatPlan, result: RepeatResult) -> str:
        """One digest over every rank's stdout, in rank order (ranks print concurrently)."""
        from detaudit.trace import sha256_regular  # here: the child imports this module before the script
        h = hashlib.sha256()
        for rank in self.layout.ranks(plan.trace.parent, result):
            path = plan.trace.parent / Layout.rank_file(plan.stdout.name, rank)
            h.update(f"rank {rank}\n".encode())
            with contextlib.suppress(OSError, TraceError):
                h.update(bytes.fromhex(sha256_regular(path, "stdout capture")))
        return h.hexdigest()[:16]

    def kill_now(self) -> None:
        """Ctrl-C (`stop` ends here) or a second Ctrl-C: the ranks' own groups go with the launchers'."""
        super().kill_now()
        for trace in list(self._traces.values()):
            kill_ranks(trace.parent, trace.name)


# torch.distributed.elastic.rendezvous's errors, as torchrun's traceback names them
_RENDEZVOUS_ERROR = re.compile(r"\bRendezvous(Closed|Connection|Timeout|State)Error\b")
RENDEZVOUS_RETRY_S = 2.0
# without --timeout: as long as another node's agent may hold the store (torchrun's exit barrier: 300 s)
RENDEZVOUS_WINDOW_S = 330.0

_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


def root_cause(torchrun_stderr: str) -> list[tuple[int, int]]:
    """(rank, exit code) of the ranks torchrun's failure summary lists under "Root Cause" (the first
    observed failure; the others it stopped are listed above it); every listed rank without that heading."""
    text = torchrun_stderr
    text = text[text.rfind("Root Cause"):] if "Root Cause" in text else text
    return [(int(rank), int(code)) for rank, code in _ROOT_CAUSE.findall(text)]


def rank_error(run_dir: Path, result: RepeatResult, layout: Layout, torchrun_stderr: str) -> ScriptError | None:
    """The exception that failed a torchrun repeat: the root-cause rank's when it recorded one, else the
    lowest rank's that did (the ranks torchrun stopped often raised only "connection closed by peer")."""
    first = [rank for rank, _ in root_cause(torchrun_stderr)]
    ranks = sorted(layout.ranks(run_dir, result), key=lambda rank: (rank not in first, rank))
    return first_error(Path(run_dir) / Layout.rank_file(result.trace, rank) for rank in ranks)


def kill_ranks(run_dir: Path, trace_name: str) -> list[int]:
    """SIGKILL the process group of every rank of a repeat that is still alive; the pids killed.

    A rank leads its own group (torchrun starts workers with start_new_session), so its DataLoader
    workers go with it. A pid is only signalled while it still runs detaudit's child for this run
    (a recycled pid is left alone).
    """
    from detaudit.trace import read_regular  # here: the child imports this module before the script

    stem = trace_name.removesuffix(".trace")
    killed = []
    for pid_file in Path(run_dir).glob(f"{stem}.rank-*.pid"):
        try:
            pid = int(read_regular(pid_file, "pid file", 64).strip())
        except (OSError, ValueError, TraceError):
            continue
        if not runs_our_child(pid, run_dir):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def runs_our_child(pid: int, run_dir: Path) -> bool:
    """Whether process `pid` is alive and a repeat (or rank) writing into `run_dir` (pids are reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        try:
            os.kill(pid, 0)  # no /proc (macOS): alive is all that can be checked
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return any(b"detaudit.run.child" in part for part in cmdline) and any(str(run_dir).encode() in part
                                                                         for part in cmdline)


def rank_config(nproc_per_node: int | None) -> dict[str, Any]:
    """What each rank's child config says about the launch; empty for a single process."""
    return {"nproc_per_node": nproc_per_node} if nproc_per_node else {}


def launcher(nproc_per_node: int | None, torchrun_args: list[str], script: Path | str, script_args: list[str],
             timeout: float | None, jobs: int, cwd: Path | None, watch: Watch | None = None
             ) -> DistributedLauncher | None:
    """The launcher of a torchrun run, or None for a single-process one."""
    if not nproc_per_node:
        return None
    return DistributedLauncher(script, script_args, timeout, jobs, cwd=cwd, nproc_per_node=nproc_per_node,
                               torchrun_args=torchrun_args, watch=watch)


def rank_identity(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """What a rank records about its place in the job: torchrun's variables and the collective
    libraries' settings (NCCL_*, TORCH_NCCL_*, GLOO_*), which change the reduction order."""
    env = os.environ if environ is None else environ
    return {
        "rank": int(env.get("RANK", "0")),
        "env": {k: env[k] for k in RANK_ENV if k in env},
        "collective_env": {k: v for k, v in sorted(env.items()) if k.startswith(COLLECTIVE_ENV_PREFIXES)},
    }


def enter_rank(config: dict[str, Any]) -> dict[str, Any] | None:
    """In a rank of a distributed repeat: point the config at this rank's trace (and `watch` events), send
    this rank's stdout to its own file and leave a pid file for the launcher. Returns the header entry
    (`distributed`), or None for an ordinary repeat (config unchanged)."""
    if not config.get("nproc_per_node"):
        return None
    identity = rank_identity()
    rank = identity["rank"]
    trace = Path(config["trace"])
    config["trace"] = str(trace.with_name(Layout.rank_file(trace.name, rank)))
    if config.get("watch"):  # `detaudit watch`: each rank appends to its own events file
        events = Path(config["watch"]["events"])
        config["watch"] = {**config["watch"], "events": str(events.with_name(Layout.rank_file(events.name, rank)))}
    stdout = trace.with_name(Layout.rank_file(trace.name.removesuffix(".trace") + ".stdout", rank))
    pid_file = trace.with_name(Layout.rank_file(trace.name.removesuffix(".trace") + ".pid", rank))
    with open(create_private(pid_file), "w") as fh:
        fh.write(str(os.getpid()))
    sys.stdout.flush()
    fd = create_private(stdout)  # as the launcher's files: exclusively, never through a planted link
    os.dup2(fd, 1)
    os.close(fd)
    return {**identity, "nproc_per_node": config["nproc_per_node"]}
