"""Start each repeat in a fresh interpreter and collect what it left behind.

Never fork a warmed parent: a fork inherits the hash seed, RNG states and address layout and
would hide real nondeterminism. Each repeat gets its own process group so a timeout or Ctrl-C
stops it and everything it started (DataLoader workers included).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from detaudit.errors import UsageError, output_error
from detaudit.results import RepeatResult
from detaudit.run.failure import read_error
from detaudit.run.files import create_private, name_taken, write_text_atomically
from detaudit.run.guard import guarded_env

GRACE_S = 3.0
POLL_S = 0.1  # how often a Watch looks at a running repeat
# What a repeat's interpreter runs first (`python -c`): drop the working directory python puts first on
# sys.path, then import detaudit, from the directory this process has it from when the path lacks it. So
# neither the script's directory (the child adds it for the script, run/ownimports.py keeps detaudit out
# of it) nor the working directory ever supply a module detaudit imports (a script named json.py, xxhash.py).
_BOOT = """import sys
if not getattr(sys.flags, "safe_path", False):
    del sys.path[0]
root = sys.argv.pop(1)
if root not in sys.path:  # this copy of detaudit, not another one further down the path
    sys.path.insert(0, root)
    import detaudit
    del sys.path[0]
from detaudit.run.guard import die_with_parent
die_with_parent()  # first: the repeat dies with detaudit (run/guard.py)
from detaudit.run.child import main
main(sys.argv[1:])
"""
# torchrun's launcher, started so that it dies with detaudit (and its ranks with it: run/guard.py)
TORCHRUN_BOOT = """import runpy, sys
root = sys.argv.pop(1)
sys.path.insert(0, root)
from detaudit.run.guard import die_with_parent
del sys.path[0]
die_with_parent()
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
"""
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def torchrun_launcher() -> list[str]:
    """How torchrun's launcher is started: as `python -m torch.distributed.run`, dying with detaudit."""
    return [sys.executable, "-c", TORCHRUN_BOOT, _ROOT]


def child_command(config_path: Path, script: str, script_args: Sequence[str],
                  python_flags: Sequence[str] = (), python: str | None = None) -> list[str]:
    """What one repeat (or one torchrun rank) runs: the child (detaudit/run/child.py) becoming `python SCRIPT`;
    `python`: another interpreter (`drift --b-python`), which still imports this detaudit (_BOOT puts _ROOT
    first), so it needs detaudit's own dependencies (numpy, xxhash) installed beside its torch."""
    return [python or sys.executable, *python_flags, "-c", _BOOT, _ROOT, str(config_path), script, *script_args]


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
    perturbation: dict[str, str] | None = None  # `run --perturb`: the settings it runs with (run/perturb_plan.py)

    @property
    def stop_file(self) -> Path | None:
        """Where a stop is requested while the repeat runs (`request_stop`), when it can be."""
        path = self.child_config.get("stop_file")
        return None if path is None else Path(path)

    @property
    def label(self) -> str:
        return self.trace.name.removesuffix(".trace")


def request_stop(plan: RepeatPlan, at_step: int, diverged_at_step: int) -> None:
    """Ask a running repeat to end after its `at_step`-th optimizer step, as --max-steps would
    (recorder/bounds.py reads the request at each step boundary); written whole, never half-read."""
    if plan.stop_file is not None:
        write_text_atomically(plan.stop_file, json.dumps({"at_step": at_step, "diverged_at_step": diverged_at_step}),
                              mode=0o600)


class Watch(Protocol):
    """Looks at a repeat while it runs (every POLL_S, and once more when it ended: `final`), from the
    thread that runs it; the audit's live comparison (compare/live.py). What it raises stops the audit."""

    def poll(self, plan: RepeatPlan, final: bool) -> None: ...

    def configure(self, plan: RepeatPlan) -> dict[str, Any]:
        """Child config entries for a repeat about to start, from what the repeats before it showed."""
        ...


def plan_repeats(
    out_dir: Path, repeats: int, devices: Sequence[str], granularity: str = "module",
    env: dict[str, str] | None = None, child_config: dict[str, Any] | None = None, prefix: str = "repeat",
    own_device: bool = False, stoppable: bool = False, first: int = 0,
) -> list[RepeatPlan]:
    """Repeats for every requested device, numbered in order (device by device) from `first`.

    Paths are absolute: the repeats run in the script's working directory, not ours. `own_device`:
    the script picks its device itself (`--device auto`), so a `cpu` label hides no GPU. `stoppable`:
    each repeat but the first can be asked to stop while it runs (`request_stop`).
    """
    out_dir = Path(out_dir).resolve()
    plans: list[RepeatPlan] = []
    for device in devices:
        for _ in range(repeats):
            i = first + len(plans)
            extra = dict(env or {})
            if device == "cpu" and not own_device:
                extra["CUDA_VISIBLE_DEVICES"] = ""  # a script that picks CUDA when present must see none
            config = {"repeat": i, "device": device, "granularity": granularity, **(child_config or {})}
            # names built whole: a prefix with a dot (`explain-hash-seed.2`) is no file suffix to replace
            stem = f"{prefix}-{i}"
            # every repeat watches for a stop file, the first too: repeats must do the same work, since a hook
            # installed in some only changes their allocations, and under the address-layout pin that alone
            # reorders a set of objects; and the first, the others' reference, is asked to stop once every other
            # repeat diverged from it while it still runs (-j: compare/live.py)
            if stoppable:
                config["stop_file"] = str(out_dir / f"{stem}.stop")
            plans.append(RepeatPlan(i, device, out_dir / f"{stem}.trace", out_dir / f"{stem}.stdout",
                                    out_dir / f"{stem}.stderr", extra, config))
    return plans


def _digest(fh: Any) -> str:
    """The digest of a capture, read back through detaudit's own descriptor (the file it created)."""
    h = hashlib.sha256()
    fh.seek(0)
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()[:16]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP reached detaudit: every repeat is stopped, then this propagates.

    `results` holds one entry per planned repeat once the launcher stopped them (interrupted ones
    flagged), `run_dir` the directory they wrote to: the CLI names both, so the partial run can
    still be reported and compared.
    """

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.results: list[RepeatResult] = []
        self.run_dir: Path | None = None


_ACTIVE: set[Launcher] = set()  # launchers with repeats running, for `hurry`


def hurry() -> None:
    """A further interrupt while repeats are being stopped: SIGKILL every repeat's group at once."""
    for launcher in list(_ACTIVE):
        launcher.kill_now()


class Launcher:
    """Runs planned repeats, `jobs` at a time; `stop()` (Ctrl-C) kills every live process group.

    Whatever way a repeat ends (by itself, timeout, interrupt), its whole process group is killed
    before the leader is reaped: nothing it started outlives it or overlaps the next repeat.
    """

    def __init__(self, script: Path | str, script_args: Sequence[str], timeout: float | None, jobs: int = 1,
                 cwd: Path | None = None, watch: Watch | None = None, python: str | None = None) -> None:
        """`script` as typed: the child's sys.argv[0] (`./-y.py` stays that, as under plain python);
        `watch`: looks at each repeat while it runs (and may ask it to stop); `python`: the interpreter
        (default: this one)."""
        check_script(Path(script))
        self.script = Path(script)
        self.script_arg = str(script)
        self.script_args = list(script_args)
        self.timeout = timeout
        self.jobs = max(1, jobs)
        self.cwd = cwd or Path.cwd()
        self.watch = watch
        self.python = python
        self._live: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.RLock()  # reentrant: a second Ctrl-C (kill_now) may land inside stop()
        self._stopping = False
        self._hurry = threading.Event()

    def _command(self, config_path: Path) -> list[str]:
        return child_command(config_path, self.script_arg, self.script_args, python=self.python)

    def run_one(self, plan: RepeatPlan) -> RepeatResult:
        return self.launch(plan, self.timeout)

    def launch(self, plan: RepeatPlan, timeout: float | None) -> RepeatResult:
        """Start the repeat's process, wait for it (stopping it after `timeout` seconds), and collect it."""
        config_path = plan.trace.with_name(plan.trace.name.removesuffix(".trace") + ".config.json")
        env = guarded_env({**os.environ, **plan.env})  # the repeat dies with detaudit (run/guard.py)
        started = time.perf_counter()
        timed_out = False
        if os.path.lexists(plan.trace):  # the child creates it exclusively; say why here, before it starts
            raise name_taken(plan.trace)
        learned = self.watch.configure(plan) if self.watch is not None else {}
        with open(create_private(config_path), "wb") as fh:
            fh.write(json.dumps({**plan.child_config, **learned, "trace": str(plan.trace)}).encode())
        try:
            with open(create_private(plan.stdout, readable=True), "w+b") as out, \
                    open(create_private(plan.stderr), "wb") as err:
                with self._lock:
                    if self._stopping:
                        raise KeyboardInterrupt
                    proc = subprocess.Popen(self._command(config_path), cwd=self.cwd, env=env, stdout=out,
                                            stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
                    self._live[plan.index] = proc
                watch = self.watch
                tick = None if watch is None else lambda: watch.poll(plan, False)
                try:
                    if not _wait_exit(proc, timeout, tick=tick):
                        timed_out = True
                        _signal_group(proc, signal.SIGTERM)  # the child keeps what it recorded, writes no footer
                        _wait_exit(proc, GRACE_S, self._hurry)
                finally:
                    _signal_group(proc, signal.SIGKILL)  # the group, before the leader is reaped: no survivor
                    code = proc.wait()
                    with self._lock:
                        self._live.pop(plan.index, None)
                if watch is not None:
                    watch.poll(plan, True)
                stdout_digest = _digest(out)
        finally:
            config_path.unlink(missing_ok=True)
            if plan.stop_file is not None:
                plan.stop_file.unlink(missing_ok=True)
        if not plan.trace.parent.is_dir():  # removed while the repeat ran (`rm -rf .detaudit`): nothing to read back
            raise output_error(plan.trace.parent, FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT)))
        interrupted = self._stopping and not timed_out
        return RepeatResult(
            index=plan.index, device=plan.device, exit_code=None if interrupted else code,
            duration_s=round(time.perf_counter() - started, 4), timed_out=timed_out,
            trace=plan.trace.name, stdout=plan.stdout.name, stderr=plan.stderr.name,
            stdout_digest=stdout_digest, interrupted=interrupted,
            error=read_error(plan.trace) if code else None,  # only a failed script leaves one
            perturbation=plan.perturbation,
        )

    def run(self, plans: Sequence[RepeatPlan],
            on_done: Callable[[RepeatResult], None] | None = None) -> list[RepeatResult]:
        """Run every plan; results come back in plan order. On an interrupt, stop every repeat and
        re-raise it (an `Interrupted` carries one result per plan)."""
        results: dict[int, RepeatResult] = {}
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        _ACTIVE.add(self)
        try:
            try:
                pending: set[Future[RepeatResult]] = {pool.submit(self.run_one, p) for p in plans}
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for future in done:
                        result = future.result()
                        results[result.index] = result
                        if on_done:
                            on_done(result)
                pool.shutdown(wait=True)
            except BaseException as exc:
                self.stop()
                pool.shutdown(wait=True, cancel_futures=True)
                if isinstance(exc, Interrupted):
                    exc.results = self._partial(plans, results, pending)
                raise
        finally:
            _ACTIVE.discard(self)
        return [results[p.index] for p in plans]

    @staticmethod
    def _partial(plans: Sequence[RepeatPlan], results: dict[int, RepeatResult],
                 pending: set[Future[RepeatResult]]) -> list[RepeatResult]:
        """One result per plan after an interrupt: finished repeats as they ended, the rest `interrupted`."""
        for future in pending:
            if future.done() and not future.cancelled() and future.exception() is None:
                result = future.result()
                results.setdefault(result.index, result)
        return [results.get(p.index) or RepeatResult(
            index=p.index, device=p.device, exit_code=None, duration_s=0.0, timed_out=False, trace=p.trace.name,
            stdout=p.stdout.name, stderr=p.stderr.name, stdout_digest="", interrupted=True,
            perturbation=p.perturbation) for p in plans]

    def stop(self) -> None:
        """SIGTERM every live group, give them GRACE_S together (less after `kill_now`), then SIGKILL."""
        with self._lock:
            self._stopping = True
            live = list(self._live.values())
        for proc in live:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for proc in live:
            _wait_exit(proc, max(0.0, deadline - time.monotonic()), self._hurry)
        self.kill_now()

    def kill_now(self) -> None:
        self._hurry.set()
        with self._lock:
            self._stopping = True
            live = list(self._live.values())
        for proc in live:
            _signal_group(proc, signal.SIGKILL)


def check_script(script: Path) -> None:
    """The script must be a readable regular file, read afresh by every repeat (a UsageError otherwise).

    A FIFO or a device (`/dev/zero`, a terminal) would block or never end before a repeat and its
    --timeout began, and a pipe can be read once only; standard input (`/dev/stdin`, `/proc/self/fd/0`)
    is detaudit's, and every repeat runs with it closed.
    """
    shown = os.path.abspath(script)
    if shown.startswith(("/dev/std", "/dev/fd/", "/proc/")):
        raise UsageError(f"script {script} is a stream of this process, not a file: every repeat reads the script "
                         "afresh, with standard input closed; save the script to a file and give that")
    try:
        st = os.stat(script)
    except FileNotFoundError:
        raise UsageError(f"script not found: {script}") from None
    except OSError as exc:
        raise UsageError(f"cannot open script {script}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        main = Path(script) / "__main__.py"
        hint = f"; python would run its __main__.py: give {main}" if main.is_file() else ""
        raise UsageError(f"script {script} is a directory; give the .py file to run{hint}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else \
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket or special file"
        raise UsageError(f"script {script} is {kind}, not a regular file: every repeat reads the script afresh "
                         "(a pipe gives its text once, a device may never end); save the script to a file and "
                         "give that")
    if not os.access(script, os.R_OK):
        raise UsageError(f"cannot open script {script}: permission denied")


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float | None, hurry: threading.Event | None = None,
               tick: Callable[[], None] | None = None) -> bool:
    """Wait until the repeat's leader exits, without reaping it (its pid keeps naming its group); `tick`
    is called every POLL_S meanwhile.

    True when it exited, False when `timeout` passed (or `hurry` was set) first.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    next_tick = time.monotonic() + POLL_S
    while True:
        if tick is not None and time.monotonic() >= next_tick:
            tick()
            next_tick = time.monotonic() + POLL_S
        if proc.returncode is not None:
            return True
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:  # reaped by another thread
            return True
        if (deadline is not None and time.monotonic() >= deadline) or (hurry is not None and hurry.is_set()):
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the repeat's process group, as long as its leader is not reaped (the group id is ours)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
