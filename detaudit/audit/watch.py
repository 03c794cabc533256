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

from detaudit.audit.against import Reference, changes, first_difference, follow, load_reference
from detaudit.audit.pipeline import ended
from detaudit.compare.baseline_diff import EnvironmentChange
from detaudit.compare.live import Follower
from detaudit.errors import ExitCode, OutputError
from detaudit.results import RepeatResult
from detaudit.run.devices import resolve_devices
from detaudit.run.launcher import Interrupted, Launcher, RepeatPlan, check_script, plan_repeats, request_stop
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
    against: Path | None = None  # --against: a run directory or baseline the run is compared with


class ChangeJson(TypedDict):
    field: str
    reference: Any
    current: Any


class AgainstJson(TypedDict):
    reference: str
    agrees_to_step: int | None
    changes: list[ChangeJson]


@dataclass(frozen=True)
class Against:
    """The run compared with its reference: the last step that agreed, and what changed between the two."""

    reference: str
    agrees_to_step: int | None
    difference: Mismatch | None
    changes: tuple[EnvironmentChange, ...] = ()

    def to_json(self) -> AgainstJson:
        return {"reference": self.reference, "agrees_to_step": self.agrees_to_step,
                "changes": [{"field": c.field, "reference": c.baseline, "current": c.current} for c in self.changes]}


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
    stopped_at_step: int | None
    every: int
    on_mismatch: str
    against: AgainstJson | None


@dataclass(frozen=True)
class WatchReport:
    """The watched job: how it ended and what the replay found."""

    script: str
    run_dir: str
    settings: WatchSettings
    result: RepeatResult
    log: WatchLog
    against: Against | None = None

    @property
    def mismatches(self) -> tuple[Mismatch, ...]:
        """The replay's mismatches, then the first difference from the reference."""
        found = self.against.difference if self.against is not None else None
        return self.log.mismatches + ((found,) if found is not None else ())

    @property
    def verdict(self) -> Verdict:
        return "mismatch" if self.mismatches else "clean"

    @property
    def exit_code(self) -> int:
        """1 on a mismatch; else the job's own failure (a timeout, a script that failed), else 0."""
        if self.mismatches:
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
                "skipped_ops": dict(self.log.skipped_ops), "mismatches": [m.to_json() for m in self.mismatches],
                "stopped_before": None if stopped is None else stopped.before,
                "not_written": None if stopped is None else stopped.target,
                "stopped_at_step": stopped.step if stopped is not None else self.result.stopped_at_step,
                "every": self.settings.every, "on_mismatch": self.settings.on_mismatch,
                "against": None if self.against is None else self.against.to_json()}


class Relay:
    """Passes the job's output through while it runs and writes the status lines (launcher.Watch)."""

    def __init__(self, events: Path, settings: WatchSettings, status: Callable[[str], None],
                 stdout: BinaryIO, stderr: BinaryIO, follower: Follower | None = None) -> None:
        """`follower`: --against's live comparison of the run's trace with the reference's."""
        self.events = events
        self.follower = follower
        self.diverged_at: int | None = None
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
        if self.follower is not None and self.diverged_at is None:
            self._follow(plan)

    def _follow(self, plan: RepeatPlan) -> None:
        """Compare what both traces hold; at the first difference say so and, unless told to continue, ask the
        job to stop at its next step boundary."""
        follower = self.follower
        assert follower is not None
        follower.poll()
        if follower.diverged_at is None:
            return
        self.diverged_at = follower.diverged_at
        self.status(f"detaudit watch: differs from the reference at step {self.diverged_at}")
        if self.settings.on_mismatch == "stop":
            try:
                request_stop(plan, self.diverged_at, self.diverged_at)
            except OutputError:  # the run directory went away: the launcher says so when the job ends
                return

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
    reference = load_reference(settings.against) if settings.against is not None else None
    run_dir = new_run_dir(Path(script), out_dir)
    events = run_dir / EVENTS_FILE
    config = {"watch": {"events": str(events), "every": settings.every, "on_mismatch": settings.on_mismatch}}
    device = resolve_devices(["auto"])[0]
    plan = plan_repeats(run_dir, 1, [device], reference.granularity if reference is not None else "step",
                        child_config=config, prefix="watch", own_device=True, stoppable=reference is not None)[0]
    follower = follow(reference, plan.trace) if reference is not None else None
    relay = Relay(events, settings, status, sys.stdout.buffer, sys.stderr.buffer, follower)
    try:
        result = ended(Launcher(script, script_args, settings.timeout, watch=relay).run([plan])[0], run_dir)
    except Interrupted as exc:
        exc.run_dir = run_dir
        raise
    finally:
        if follower is not None:
            follower.close()
    against = None if reference is None else _against(reference, script, script_args, plan.trace, device,
                                                      follower)
    return WatchReport(script, str(run_dir), settings, result, read_watch_log(events), against)


def _against(reference: Reference, script: str, script_args: list[str], trace: Path, device: str,
             follower: Follower | None) -> Against:
    difference = first_difference(reference, trace)
    agreed = None if follower is None else follower.agrees_to
    return Against(str(reference.given), agreed, difference,
                   tuple(changes(reference, script, script_args, trace, device)))
