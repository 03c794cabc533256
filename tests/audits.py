"""Scenario audits run once per test session and shared by every test that reads them.

An audit (`detaudit run OPTIONS --out run --json run.json --sarif run.sarif SCRIPT -- SCRIPT_ARGS` in an
environment) is what most end-to-end tests start with, and each costs a few interpreters that import torch. Several
tests read the same audit (the cause matrix row of a script and the e2e tests of that script), so
the audit runs once, in a cache folder keyed by everything that can change its outcome (options,
script, its arguments, environment, attempt), and every reader gets the same `Done`. A follow-up
command on a finished run (`explain`) runs once too, on its own copy of the run directory.

The cache lives in the session's base temporary folder, shared by pytest-xdist workers: the first
worker to ask runs the audit under a file lock, the others wait for it and read. A shared run is
read-only to its readers; a test that writes into one (corrupts a trace, runs `explain`) works on
`copy_to(tmp_path)`. tests/test_audits.py counts the interpreters the cache starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import SCRIPTS, CliResult, interpreters, run_cli
from filelock import FileLock

# the run directory, the --json report and the --sarif one, inside the audit's folder
RUN, REPORT, SARIF = "run", "run.json", "run.sarif"
# the cause matrix's options for a script (tests/e2e/test_cause_matrix.py); its e2e tests read the same run
DIVERGENT = ("-n", "2")
DETERMINISTIC = ("-n", "2", "--explain")  # a deterministic script: --explain must run no experiment
SAVED = "cli-result.json"  # what the CLI returned, written last: a folder without it is unfinished


@dataclass(frozen=True)
class Audit:
    """One `detaudit run` of a scenario script; equal audits are one run."""

    script: str  # a file in tests/scripts
    options: tuple[str, ...] = DIVERGENT  # detaudit's options, given before the script
    script_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    attempt: int = 0  # a race: each attempt is a run of its own

    def command(self) -> list[str]:
        args = ["run", *self.options, "--out", RUN, "--json", REPORT, "--sarif", SARIF, str(SCRIPTS / self.script)]
        return args + (["--", *self.script_args] if self.script_args else [])

    def with_env(self, env: Mapping[str, str]) -> Audit:
        return Audit(self.script, self.options, self.script_args, tuple(sorted(env.items())), self.attempt)

    def retry(self, attempt: int) -> Audit:
        return Audit(self.script, self.options, self.script_args, self.env, attempt)


@dataclass(frozen=True)
class Done:
    """A finished command of the cache: what the CLI returned, and the folder it ran in."""

    result: CliResult
    cwd: Path

    @property
    def run_dir(self) -> Path:
        return self.cwd / RUN

    @property
    def report(self) -> dict[str, Any]:
        assert self.result.report is not None, self.result.output
        return self.result.report

    def copy_to(self, folder: Path) -> Path:
        """A private copy of this folder's run directory (and the files the script wrote there), to write into."""
        shutil.copytree(self.cwd, folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns(SAVED))
        return folder / RUN


def _key(parts: Any) -> str:
    """Also keyed by how the repeats start: a test of fresh interpreters never reads a warm run."""
    return hashlib.sha256(json.dumps([parts, interpreters()], sort_keys=True).encode()).hexdigest()[:16]


class Cache:
    """The session's shared audits, in `root` (one folder per command, named by its key)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(audit: Audit) -> str:
        return _key(["run", audit.command(), audit.env, audit.attempt])

    def run(self, audit: Audit) -> Done:
        return self._once(self.key(audit), audit.command(), dict(audit.env), None)

    def then(self, done: Done, args: Sequence[str], env: Mapping[str, str] | None = None) -> Done:
        """`detaudit ARGS` (run in a copy of `done`'s folder, where `run` names its run directory), once."""
        json_out = list(args)[list(args).index("--json") + 1] if "--json" in args else None
        assert json_out != REPORT, "a follow-up's --json must not overwrite the audit's report"
        return self._once(_key(["then", done.cwd.name, list(args), sorted((env or {}).items())]), list(args),
                          dict(env or {}), done)

    def _once(self, key: str, args: list[str], env: dict[str, str], parent: Done | None) -> Done:
        folder = self.root / key
        saved = folder / SAVED
        with FileLock(str(self.root / f"{key}.lock")):
            if not saved.is_file():
                if folder.exists():  # an earlier attempt ended in an exception (a timeout): start afresh
                    shutil.rmtree(folder)
                if parent is not None:
                    parent.copy_to(folder)
                else:
                    folder.mkdir()
                result = run_cli(args, cwd=folder, env=env)
                saved.write_text(json.dumps({"returncode": result.returncode, "stdout": result.stdout,
                                             "stderr": result.stderr, "report": result.report}))
            stored = json.loads(saved.read_text())
        return Done(CliResult(stored["returncode"], stored["stdout"], stored["stderr"], stored["report"]), folder)


def cache_root(basetemp: Path) -> Path:
    """Under xdist each worker has its own base folder inside the session's: the cache goes in the latter."""
    return (basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp) / "shared-audits"
