"""`detaudit watch`'s report: the settings it ran with and what it found, as values (audit/watch.py makes it;
cli/watch_command.py and report/watch_html.py render it; `--json` writes `to_json`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

from detaudit.compare.baseline_diff import EnvironmentChange
from detaudit.compare.match import not_results_text
from detaudit.errors import ExitCode
from detaudit.results import RepeatResult
from detaudit.run.watchlog import Mismatch, MismatchJson, WatchLog

OnMismatch = Literal["stop", "continue"]
Verdict = Literal["clean", "mismatch"]


@dataclass(frozen=True)
class Cadence:
    """How often the status line is written on standard error: every `every` steps, or seconds."""

    every: float
    unit: Literal["steps", "seconds"] = "steps"

    def __str__(self) -> str:
        return f"{self.every:g}s" if self.unit == "seconds" else f"{self.every:g}"


@dataclass(frozen=True)
class WatchSettings:
    """How the job is watched: every `every`-th optimizer step is replayed (step 0 first)."""

    every: int = 20
    on_mismatch: OnMismatch = "stop"
    # a job's log: a line a minute whatever a step costs (a step count would flood the log of a fast job)
    status_every: Cadence = Cadence(60.0, "seconds")
    timeout: float | None = None
    against: Path | None = None  # --against: a run directory or baseline the run is compared with
    nproc_per_node: int | None = None  # a torchrun job of this many ranks per node (run/distributed.py)
    torchrun_args: tuple[str, ...] = ()


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


class UncheckedSaveJson(TypedDict):
    step: int
    target: str


class WatchJson(TypedDict):
    verdict: Verdict
    script: str
    run_dir: str
    exit_code: int | None
    steps: int
    checked_steps: list[int]
    replayed_ops: int
    skipped_ops: dict[str, int]
    set_aside_outputs: dict[str, int]
    mismatches: list[MismatchJson]
    stopped_before: str | None
    not_written: str | None
    stopped_at_step: int | None
    every: int
    on_mismatch: str
    nproc_per_node: int | None
    against: AgainstJson | None
    unchecked_saves: list[UncheckedSaveJson]


@dataclass(frozen=True)
class WatchReport:
    """The watched job: how it ended and what the replay found."""

    script: str
    run_dir: str
    settings: WatchSettings
    result: RepeatResult
    log: WatchLog
    against: Against | None = None
    replica: Mismatch | None = None  # under torchrun: the first DDP replica that differed from the lowest rank's

    @property
    def mismatches(self) -> tuple[Mismatch, ...]:
        """The replay's mismatches, then the first difference from the reference, then the replicas'."""
        found = self.against.difference if self.against is not None else None
        return self.log.mismatches + tuple(m for m in (found, self.replica) if m is not None)

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

    @property
    def not_results(self) -> str | None:
        """The outputs replayed but not compared, by op (`3 workspace outputs of aten.mkldnn_rnn_layer.default`)."""
        return not_results_text(self.log.set_aside) or None

    @property
    def stop_sentence(self) -> str | None:
        """How the job was stopped, in words (every renderer says it so); None when it was not."""
        stopped = self.log.stopped
        if stopped is not None:
            target = f": {stopped.target} was not written" if stopped.target else ": the update was not applied"
            return f"stopped the job at step {stopped.step} before {stopped.before}{target}"
        if self.result.stopped_at_step is not None:
            why = "it differed from the reference" if self.replica is None else "its DDP replicas differed (every rank)"
            return f"stopped the job after step {self.result.stopped_at_step}: {why}"
        return None

    def to_json(self) -> WatchJson:
        stopped = self.log.stopped
        return {"verdict": self.verdict, "script": self.script, "run_dir": self.run_dir,
                "exit_code": self.result.exit_code, "steps": self.log.steps,
                "checked_steps": list(self.log.checked_steps), "replayed_ops": self.log.replayed_ops,
                "skipped_ops": dict(self.log.skipped_ops), "set_aside_outputs": dict(self.log.set_aside),
                "mismatches": [m.to_json() for m in self.mismatches],
                "stopped_before": None if stopped is None else stopped.before,
                "not_written": None if stopped is None else stopped.target,
                "stopped_at_step": stopped.step if stopped is not None else self.result.stopped_at_step,
                "every": self.settings.every, "on_mismatch": self.settings.on_mismatch,
                "nproc_per_node": self.settings.nproc_per_node,
                "against": None if self.against is None else self.against.to_json(),
                "unchecked_saves": [{"step": save.step, "target": save.target} for save in self.log.unchecked_saves]}
