"""Start each repeat in a fresh interpreter and collect what it left behind.

Never fork a warmed parent: a fork inherits the hash seed, RNG states and address layout and
would hide real nondeterminism. Each repeat gets its own process group so a timeout or Ctrl-C
stops it and everything it started (DataLoader workers included).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from detaudit.errors import UsageError

GRACE_S = 3.0


@dataclass(frozen=True)
class RepeatPlan:
    """What one repeat runs with; `env` holds only the variables added or changed for it."""

    index: int
    device: str
    trace: Path
    stdout: Path
    stderr: Path
    env: dict[str, str] = field(default_factory=dict)
    child_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class RepeatResult:
    index: int
    device: str
    exit_code: int | None  # None: unknown (a recording compared without its footer)
    duration_s: float
    timed_out: bool
    trace: str
    stdout: str
    stderr: str
    stdout_digest: str
    stopped_at_step: int | None = None  # stopped by --max-steps/--max-time after this many steps
    recording_stopped: str | None = None  # a detaudit hook failed: recorded only up to there (why)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_repeats(
    out_dir: Path, repeats: int, devices: Sequence[str], granularity: str = "module",
    env: dict[str, str] | None = None, child_config: dict[str, Any] | None = None, prefix: str = "repeat",
    own_device: bool = False,
) -> list[RepeatPlan]:
    """Repeats for every requested device, numbered in order (device by device).

    Paths are absolute: the repeats run in the script's working directory, not ours. `own_device`:
    the script picks its device itself (`--device auto`), so a `cpu` label hides no GPU.
    """
    out_dir = Path(out_dir).resolve()
    plans: list[RepeatPlan] = []
    for device in devices:
        for _ in range(repeats):
            i = len(plans)
            extra = dict(env or {})
            if device == "cpu" and not own_device:
                extra["CUDA_VISIBLE_DEVICES"] = ""  # a script that picks CUDA when present must see none
            config = {"repeat": i, "device": device, "granularity": granularity, **(child_config or {})}
            # names built whole: a prefix with a dot (`explain-hash-seed.2`) is no file suffix to replace
            stem = f"{prefix}-{i}"
            plans.append(RepeatPlan(i, device, out_dir / f"{stem}.trace", out_dir / f"{stem}.stdout",
                                    out_dir / f"{stem}.stderr", extra, config))
    return plans


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


class Launcher:
    """Runs planned repeats, `jobs` at a time; `stop()` (Ctrl-C) kills every live process group."""

    def __init__(self, script: Path, script_args: Sequence[str], timeout: float | None, jobs: int = 1,
                 cwd: Path | None = None) -> None:
        if not script.is_file():
            raise UsageError(f"script not found: {script}")
        self.script = script
        self.script_args = list(script_args)
        self.timeout = timeout
        self.jobs = max(1, jobs)
        self.cwd = cwd or Path.cwd()
        self._live: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self._stopping = False

    def _command(self, config_path: Path) -> list[str]:
        return [sys.executable, "-m", "detaudit.child", str(config_path), str(self.script), *self.script_args]

    def run_one(self, plan: RepeatPlan) -> RepeatResult:
        config_path = plan.trace.with_name(plan.trace.name.removesuffix(".trace") + ".config.json")
        config_path.write_text(json.dumps({**plan.child_config, "trace": str(plan.trace)}))
        env = {**os.environ, **plan.env}
        started = time.perf_counter()
        timed_out = False
        with open(plan.stdout, "wb") as out, open(plan.stderr, "wb") as err:
            with self._lock:
                if self._stopping:
                    raise KeyboardInterrupt
                proc = subprocess.Popen(self._command(config_path), cwd=self.cwd, env=env, stdout=out,
                                        stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
                self._live[plan.index] = proc
            try:
                code = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                code = proc.returncode
            finally:
                with self._lock:
                    self._live.pop(plan.index, None)
        config_path.unlink(missing_ok=True)
        return RepeatResult(
            index=plan.index, device=plan.device, exit_code=code if code is not None else -9,
            duration_s=round(time.perf_counter() - started, 4), timed_out=timed_out,
            trace=plan.trace.name, stdout=plan.stdout.name, stderr=plan.stderr.name,
            stdout_digest=_digest(plan.stdout),
        )

    def run(self, plans: Sequence[RepeatPlan],
            on_done: Callable[[RepeatResult], None] | None = None) -> list[RepeatResult]:
        """Run every plan; results come back in plan order."""
        results: dict[int, RepeatResult] = {}
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        try:
            pending: set[Future[RepeatResult]] = {pool.submit(self.run_one, p) for p in plans}
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for future in done:
                    result = future.result()
                    results[result.index] = result
                    if on_done:
                        on_done(result)
        except BaseException:
            self.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return [results[p.index] for p in plans]

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            live = list(self._live.values())
        for proc in live:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the repeat's process group (the child flushes its trace), then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        break
    with contextlib.suppress(ProcessLookupError, PermissionError):  # stragglers (workers) after the leader
        os.killpg(proc.pid, signal.SIGKILL)
