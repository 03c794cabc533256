"""`detaudit watch`: run the script once, with its checked steps replayed in the process (recorder/replay.py).

The job is one repeat of `run` at step granularity with a `watch` entry in its child config. While it runs,
its standard output is passed through to ours byte for byte and its standard error to ours (a job's log:
detaudit's own lines go to standard error only), and a one-line status is written every `status_every` steps
and at each mismatch. The report is built from the events file the job appended to (run/watchlog.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, TypedDict

from detaudit.errors import ExitCode
from detaudit.results import RepeatResult
from detaudit.run.launcher import Interrupted, Launcher, RepeatPlan, check_script, plan_repeats
from detaudit.run.rundir import new_run_dir
from detaudit.run.watchlog import Mismatch, MismatchJson, WatchLog, read_watch_log

EVENTS_FILE = "watch-events.jsonl"
OnMismatch = Literal["stop", "continue"]
Verdict = Literal["clean", "mismatch"]


@dataclass(frozen=True)
class WatchSettings:
    """How the job is watched: every `every`-th optimizer step is replayed (step 0 first)."""

    every: int = 20
    on_mismatch: OnMismatch = "stop"
    status_every: int = 100  # steps between two status lines on standard error
    timeout: float | None = None


class WatchJson(TypedDict):
    verdict: Verdict
    script: str
    run_dir: str
    exit_code: int | None
    steps: int
    checked_steps: list[int]
    replayed_ops: int
    skipped_ops: dict[str, int]
    mismatches: list[MismatchJson]
    stopped_before: str | None
    not_written: str | None
    every: int
    on_mismatch: str


@dataclass(frozen=True)
class WatchReport:
    """The watched job: how it ended and what the replay found."""

    script: str
    run_dir: str
    settings: WatchSettings
    result: RepeatResult
    log: WatchLog

    @property
    def verdict(self) -> Verdict:
        return "mismatch" if self.log.mismatches else "clean"

    @property
    def exit_code(self) -> int:
        """1 on a mismatch; else the job's own failure (a timeout, a script that failed), else 0."""
        if self.log.mismatches:
            return ExitCode.DIVERGENT
        if self.result.timed_out:
            return ExitCode.TIMEOUT
        if self.result.exit_code not in (0, None):
            return ExitCode.SCRIPT_FAILED
        return ExitCode.DETERMINISTIC

    def to_json(self) -> WatchJson:
        stopped = self.log.stopped
        return {"verdict": self.verdict, "script": self.script, "run_dir": self.run_dir,
                "exit_code": self.result.exit_code, "steps": self.log.steps,
                "checked_steps": list(self.log.checked_steps), "replayed_ops": self.log.replayed_ops,
                "skipped_ops": dict(self.log.skipped_ops), "mismatches": [m.to_json() for m in self.log.mismatches],
                "stopped_before": None if stopped is None else stopped.before,
                "not_written": None if stopped is None else stopped.target,
                "every": self.settings.every, "on_mismatch": self.settings.on_mismatch}


class Relay:
    """Passes the job's output through while it runs and writes the status lines (launcher.Watch)."""

    def __init__(self, events: Path, settings: WatchSettings, status: Callable[[str], None],
                 stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.events = events
        self.settings = settings
        self.status = status
        self.sinks = {"stdout": stdout, "stderr": stderr}
        self.offsets = {"stdout": 0, "stderr": 0, "events": 0}
        self.checked = 0
        self.mismatches = 0

    def configure(self, plan: RepeatPlan) -> dict[str, Any]:
        return {}

    def poll(self, plan: RepeatPlan, final: bool) -> None:
        self._pass_on("stdout", plan.stdout)
        self._pass_on("stderr", plan.stderr)
        for event in self._new_events():
            self._on_event(event)

    def _read_new(self, name: str, path: Path, whole_lines: bool) -> bytes:
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets[name])
                data = fh.read()
        except FileNotFoundError:
            return b""
        if whole_lines:
            data = data[:data.rfind(b"\n") + 1]
        self.offsets[name] += len(data)
        return data

    def _pass_on(self, name: str, path: Path) -> None:
        data = self._read_new(name, path, whole_lines=False)
        if data:
            self.sinks[name].write(data)
            self.sinks[name].flush()

    def _new_events(self) -> list[dict[str, Any]]:
        import json

        events = []
        for line in self._read_new("events", self.events, whole_lines=True).splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "step":
            self.checked += bool(event.get("checked"))
            step = int(event.get("step", 0))
            if (step + 1) % self.settings.status_every == 0:
                self.status(f"detaudit watch: step {step + 1}, {self.checked} checked, {self.mismatches} "
                            f"mismatch{'es' if self.mismatches != 1 else ''}")
        elif kind == "mismatch":
            self.mismatches += 1
            found = Mismatch.from_json(event)
            self.status(f"detaudit watch: MISMATCH at step {found.step}: {found.op} at {found.location or '?'} "
                        f"(max |diff| {found.max_abs_diff:.3g}, {found.max_ulp} ULP)")
        elif kind == "stopped":
            self.status(f"detaudit watch: stopped the job before {event.get('before')}")


def run_watch(script: str, script_args: list[str], out_dir: Path | None, settings: WatchSettings,
              status: Callable[[str], None]) -> WatchReport:
    """Run the script once under watch and report; `status` takes the lines for standard error."""
    check_script(Path(script))
    run_dir = new_run_dir(Path(script), out_dir)
    events = run_dir / EVENTS_FILE
    config = {"watch": {"events": str(events), "every": settings.every, "on_mismatch": settings.on_mismatch}}
    plan = plan_repeats(run_dir, 1, ["auto"], "step", child_config=config, prefix="watch", own_device=True)[0]
    relay = Relay(events, settings, status, sys.stdout.buffer, sys.stderr.buffer)
    try:
        result = Launcher(script, script_args, settings.timeout, watch=relay).run([plan])[0]
    except Interrupted as exc:
        exc.run_dir = run_dir
        raise
    return WatchReport(script, str(run_dir), settings, result, read_watch_log(events))
