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


@pytest.fixture
def scripts() -> Path:
    return SCRIPTS


pytest_plugins = ["pytester"]  # the pytest plugin's tests run pytest itself
