"""Shared fixtures and helpers: the test scripts folder, the real CLI in a subprocess, the lanes.

Lanes: `python -m pytest -m "not slow"` is the fast lane. A test that starts an interpreter is
marked `process`, one whose outcome depends on a race (thread timing, hash collisions) `race`;
both are slow too (`pytest_collection_modifyitems` below), so "not slow" is the one spelling of
the fast lane and `-m process` / `-m race` pick those out.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from detaudit.recorder import patch

SCRIPTS = Path(__file__).parent / "scripts"


def pytest_configure(config: pytest.Config) -> None:
    """torch in the test process runs one intra-op thread. The in-process tests use small tensors, and
    on a shared 2-core machine two OpenMP threads wait for each other at every op (measured: a test of
    200 digests of a 100k-element tensor, 1.6 s on one thread, 24-31 s on two while the machine was
    loaded). Repeats, the child and every other interpreter a test starts keep torch's default."""
    import torch

    from detaudit.run.devices import cuda_available

    torch.set_num_threads(1)
    cuda_available()  # cached; its probe (an interpreter, on GPU machines only) runs here, not inside a fast test
    keep_bytecode(config)


def keep_bytecode(config: pytest.Config) -> None:
    """Bytecode is cached even where the environment says PYTHONDONTWRITEBYTECODE=1 (this project's machine
    image does): without it every pytest process rewrote and compiled all ~400 test modules at every run
    (about 13 s of CPU for each xdist worker, most of the fast lane's time) and every interpreter the suite
    starts compiled detaudit from source (0.3 s more for a repeat). Python reads a cached .pyc whatever that
    variable says, so the controller compiles detaudit/ once, and the pytest processes themselves write
    their rewritten test modules; the environment the repeats and scripts run in is left as it is."""
    sys.dont_write_bytecode = False
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist): once, before the workers
        import compileall

        compileall.compile_dir(str(Path(__file__).parent.parent / "detaudit"), quiet=1)


DURATIONS = Path(__file__).parent / "durations.json"  # seconds per slow test, from a full run: the order to start them
WRITE_DURATIONS = "DETAUDIT_WRITE_DURATIONS"  # set to 1: a full run rewrites DURATIONS from its own timings
UNTIMED_S = 5.0  # a slow test DURATIONS does not know yet (new since it was written) starts among the long ones


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every `process` or `race` test is `slow`: the fast lane runs in-process, luck-free tests only.

    The longest tests run first, the in-process ones last: pytest-xdist (`--dist load --maxschedchunk 1`)
    hands tests out one at a time in this order, so the run ends on short tests that even out the workers,
    not on a minute-long audit one worker started last while the other sat idle. How long a slow test takes
    comes from tests/durations.json (a full run's timings; a stale entry costs only order, never a result)."""
    for item in items:
        if (item.get_closest_marker("process") or item.get_closest_marker("race")) \
                and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}

    def expected_s(item: pytest.Item) -> float:
        if item.get_closest_marker("slow") is None:
            return 0.0
        return known.get(item.nodeid, UNTIMED_S)

    items.sort(key=expected_s, reverse=True)  # stable: equal estimates keep their collection order


_timings: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(WRITE_DURATIONS):  # in the controller too: xdist replays its workers' reports there
        _timings[report.nodeid] = _timings.get(report.nodeid, 0.0) + report.duration


def _is_interpreter(program: Any) -> bool:
    name = Path(os.fsdecode(program)).name
    return os.fsdecode(program) == sys.executable or name.startswith(("python", "torchrun"))


@contextlib.contextmanager
def _interpreters_started() -> Iterator[list[str]]:
    """The command lines of the interpreters started inside the block."""
    started: list[str] = []
    execute = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def spy(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if argv and _is_interpreter(argv[0]):
            started.append(" ".join(map(os.fsdecode, argv))[:200])
        return execute(self, args, *rest, **kwargs)

    subprocess.Popen._execute_child = spy  # type: ignore[attr-defined]
    try:
        yield started
    finally:
        subprocess.Popen._execute_child = execute  # type: ignore[attr-defined]


def _in_process_only(item: pytest.Item) -> Generator[None, Any, Any]:
    """A fast-lane test (or its fixtures) that starts an interpreter fails, naming it: mark it `process`."""
    if item.get_closest_marker("slow"):
        return (yield)
    with _interpreters_started() as started:
        result = yield
    if started:
        pytest.fail(f"this test starts an interpreter ({started[0]}); mark it @pytest.mark.process (conftest.py)")
    return result


pytest_runtest_setup = pytest.hookimpl(wrapper=True)(_in_process_only)
pytest_runtest_call = pytest.hookimpl(wrapper=True)(_in_process_only)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class WarmServers:
    """This test process's warm interpreters (tests/warm/server.py), started on first use.

    Repeats forked from them skip python's, torch's and torch._dynamo's start (2.5 s of CPU each). The pool
    (tests/warm/pool.py) holds several servers of each variant, each with its own string hash seed, and sends
    the repeats side by side (and a job's ranks) to different ones, so that they differ in it as fresh
    interpreters do; every fork has an address layout of its own (server.scatter_heap). A test whose subject a
    fork could still change (what happens while torch imports, a repeat's own start) is marked
    `fresh_interpreters` and its repeats are real interpreters, as are all with DETAUDIT_TEST_FRESH=1.

    pytest-xdist's workers share one pool (starting one costs 20 s of CPU): the first to ask starts it, under a
    file lock, in a folder named after the session, and it ends with the controller, the workers' parent, which
    removes the folder (`pytest_sessionfinish`). A test process of its own (`-n 0`) has its own pool, stopped
    with its session, or ending with the process (end of file on the servers' stdin) when that is killed.
    """

    def __init__(self) -> None:
        self.path: str | None = None
        self.procs: list[subprocess.Popen[str]] = []  # the servers this process owns and stops
        self.shared: list[subprocess.Popen[str]] = []  # the servers it started for the workers, which outlive it

    def folder(self) -> str:
        """The folder of the servers' sockets, started on first use."""
        if self.path is None:
            import tempfile

            sys.path.insert(0, str(WARM))
            session = os.environ.get("PYTEST_XDIST_TESTRUNUID")
            if session is None:
                path = tempfile.mkdtemp(prefix="detaudit-warm-")  # short: a socket path has 107 bytes at most
                self.procs = self._start(path, owner=None)
            else:
                from filelock import FileLock

                path = shared_pool_folder(os.getppid(), session)
                with FileLock(path + ".lock"):
                    if not os.path.isfile(os.path.join(path, "ready")):
                        os.makedirs(path, exist_ok=True)
                        self.shared = self._start(path, owner=os.getppid())
                        Path(path, "ready").touch()
            self.path = path
        return self.path

    @staticmethod
    def _start(path: str, owner: int | None) -> list[subprocess.Popen[str]]:
        from pool import VARIANTS, socket_path

        procs = []
        for name, variant in VARIANTS.items():  # started together: their imports overlap
            for index in range(variant.count):
                socket = socket_path(path, name, index)
                with open(socket + ".log", "w") as log:  # one line per repeat: forked, or fresh and why
                    procs.append(subprocess.Popen(
                        [sys.executable, str(WARM / "server.py"), socket, *variant.args,
                         *(["--owner", str(owner)] if owner is not None else [])],
                        env={**os.environ, **variant.variables},
                        stdout=subprocess.PIPE, stderr=log,
                        stdin=subprocess.PIPE if owner is None else subprocess.DEVNULL, text=True,
                        start_new_session=True))
        for proc in procs:
            assert proc.stdout is not None, "warm server failed"
            assert proc.stdout.readline() == "ready\n", "warm server failed"
        return procs

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=30)
        if self.procs and self.path is not None:
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)


def shared_pool_folder(controller: int, session: str) -> str:
    """The xdist workers' shared pool: named after their controller (which removes it) and the session."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"detaudit-warm-{controller}-{session[:8]}")


WARM = Path(__file__).parent / "warm"
WARM_SERVERS = WarmServers()
FRESH_ONLY = bool(os.environ.get("DETAUDIT_TEST_FRESH"))
_fresh_test = False  # the running test is marked fresh_interpreters


def interpreters() -> str:
    """How the running test's repeats start: "warm" (forks of the warm server) or "fresh" (interpreters)."""
    return "fresh" if FRESH_ONLY or _fresh_test else "warm"


def start_allowing(warm_s: int, fresh_s: int) -> str:
    """A `--timeout` or `--max-time` (seconds, as the CLI takes it) that a repeat's start must fit in before the
    part the test is about: a fork of a warm server starts in well under a second, a real interpreter imports
    torch first (several seconds on a loaded machine). A test waits out its timeout whole: warm, it waits less."""
    return str(warm_s if interpreters() == "warm" else fresh_s)


@pytest.fixture(autouse=True)
def _interpreters_for_this_test(request: pytest.FixtureRequest) -> Iterator[None]:
    global _fresh_test
    _fresh_test = request.node.get_closest_marker("fresh_interpreters") is not None
    yield
    _fresh_test = False


def pytest_sessionfinish(session: pytest.Session) -> None:
    WARM_SERVERS.stop()
    if not hasattr(session.config, "workerinput"):  # the xdist controller (or a test process of its own)
        import glob
        import shutil

        for folder in glob.glob(shared_pool_folder(os.getpid(), "*")):  # its workers' pool (WarmServers)
            shutil.rmtree(folder, ignore_errors=True)
        for lock in glob.glob(shared_pool_folder(os.getpid(), "*.lock")):
            os.unlink(lock)
    if os.environ.get(WRITE_DURATIONS) and not hasattr(session.config, "workerinput") and _timings:
        slow = {node: round(seconds, 1) for node, seconds in sorted(_timings.items()) if seconds >= 1.0}
        DURATIONS.write_text(json.dumps(slow, indent=0, sort_keys=True) + "\n")


def python_command(args: list[str]) -> list[str]:
    """`python ARGS`, started as the running test's repeats start (`interpreters()`): warm, a fork of a server
    that imported torch and torch._dynamo (`python SCRIPT`: a `plain` one, tests/warm/pool.py)."""
    if interpreters() == "warm":
        folder = WARM_SERVERS.folder()
        from pool import through_client  # importable once the servers started (folder())

        return through_client(folder, [sys.executable, *args])
    return [sys.executable, *args]


def detaudit_command() -> list[str]:
    """`python -m detaudit`, as the running test's repeats start (`interpreters()`)."""
    if interpreters() == "warm":  # itself forked from the `cli` server (tests/warm/pool.py)
        return python_command([str(WARM / "cli.py"), WARM_SERVERS.folder()])
    return [sys.executable, "-m", "detaudit"]


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> CliResult:
    """Run `python -m detaudit ARGS` as a user would; load --json output if it was asked for."""
    full_env = {**os.environ, "COLUMNS": "120", **(env or {})}
    proc = subprocess.run([*detaudit_command(), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    report = None
    if "--json" in args:
        path = cwd / args[args.index("--json") + 1]
        if path.is_file():
            report = json.loads(path.read_text())
    return CliResult(proc.returncode, proc.stdout, proc.stderr, report)


def diverges_within(attempts: int, audit: Callable[[int], CliResult], divergent_exit: int = 1) -> CliResult:
    """For a race: run `audit(attempt)` up to `attempts` times and return the first divergent result.

    A race shows only when the repeats' timing lets it (both cores free, a hash collision), so one
    agreeing audit proves nothing; an audit that fails otherwise (a crash, a usage error) stops at
    once. Fails listing every attempt's exit code when none diverged. `audit` must use a fresh run
    directory per attempt (e.g. `--out run-{attempt}`).
    """
    seen: list[str] = []
    for attempt in range(attempts):
        result = audit(attempt)
        if result.returncode == divergent_exit:
            return result
        seen.append(f"attempt {attempt}: exit {result.returncode}")
        if result.returncode != 0:  # not a lost race: report it as it is
            break
    pytest.fail(f"no divergence within {attempts} audits ({'; '.join(seen)}); last output:\n{result.output}")


# Globals detaudit's wrappers replace, watched by identity around every test in case one is patched
# some other way than recorder/patch.py (whose registry is checked too). Owners not imported yet are skipped.
WATCHED = {
    "random": ("seed", "random", "shuffle"), "time": ("time", "perf_counter", "monotonic"),
    "threading": ("Thread.start",), "os": ("_exit", "execv", "execve"),
    "numpy.random": ("seed", "default_rng", "random", "rand"),
    "concurrent.futures": ("ThreadPoolExecutor.submit", "as_completed"),
    # not torch.manual_seed: importing torch._dynamo (torch.compile) replaces it for good
    "torch": ("randn", "rand", "empty", "save", "set_num_threads",
              "use_deterministic_algorithms", "Tensor.uniform_", "Tensor.index_add_", "autograd.backward",
              "utils.data.DataLoader.__init__", "optim.Optimizer.__init__", "nn.functional.dropout"),
}


def _watched() -> dict[str, Any]:
    found = {}
    for module, names in WATCHED.items():
        owner = sys.modules.get(module)
        if owner is None:
            continue
        for name in names:
            value: Any = owner
            for part in name.split("."):
                value = getattr(value, part, None)
            found[f"{module}.{name}"] = value
    return found


@pytest.fixture(autouse=True)
def _nothing_left_patched() -> Any:
    """Fail a test that leaves torch, numpy.random, random, time, threading or os patched, or torch's
    deterministic-algorithms flag changed (restored first, so no later test inherits it)."""
    kept = len(patch.patched())
    before = _watched()
    torch = sys.modules.get("torch")
    flags = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) \
        if torch is not None else (False, False)
    yield
    left = [f"{getattr(p.owner, '__name__', p.owner)}.{p.name}" for p in patch.patched()[kept:] if p.in_place]
    patch.restore_all(kept)
    after = _watched()
    left += [name for name, value in before.items() if after.get(name) is not value]
    torch = sys.modules.get("torch")
    if torch is not None and torch.are_deterministic_algorithms_enabled() != flags[0]:
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])  # the next test must not inherit it
        left.append("torch.use_deterministic_algorithms")
    if left:
        pytest.fail(f"the test left patched: {', '.join(left)} (restore it: patch.restore_all, monkeypatch)")


@pytest.fixture
def evidence() -> Any:
    """An in-process evidence recorder and its event sink (tests/evidence_sink.py), restored after the test."""
    from evidence_sink import recording

    with recording() as found:
        yield found


@pytest.fixture
def scripts() -> Path:
    return SCRIPTS


pytest_plugins = ["pytester"]  # the pytest plugin's tests run pytest itself


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The session's shared scenario audits (tests/audits.py): each runs once, whichever test asks first."""
    from audits import Cache, cache_root

    return Cache(cache_root(tmp_path_factory.getbasetemp()))


def run_in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> CliResult:
    """The same entry point as the console script, without paying a new interpreter (for error paths)."""
    from detaudit.cli.commands import main

    code: object = 0
    try:
        main(args)
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return CliResult(code if isinstance(code, int) else 1, captured.out, captured.err, None)

