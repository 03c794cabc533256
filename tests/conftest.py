"""Shared fixtures: the test scripts folder and a helper that runs the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from detaudit.recorder import patch

SCRIPTS = Path(__file__).parent / "scripts"


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> CliResult:
    """Run `python -m detaudit ARGS` as a user would; load --json output if it was asked for."""
    full_env = {**os.environ, "COLUMNS": "120", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "detaudit", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    report = None
    if "--json" in args:
        path = cwd / args[args.index("--json") + 1]
        if path.is_file():
            report = json.loads(path.read_text())
    return CliResult(proc.returncode, proc.stdout, proc.stderr, report)


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
    """Fail a test that leaves torch, numpy.random, random, time, threading or os patched."""
    kept = len(patch.patched())
    before = _watched()
    yield
    left = [f"{getattr(p.owner, '__name__', p.owner)}.{p.name}" for p in patch.patched()[kept:] if p.in_place]
    patch.restore_all(kept)
    after = _watched()
    left += [name for name, value in before.items() if after.get(name) is not value]
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
