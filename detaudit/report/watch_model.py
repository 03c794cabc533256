"""`detaudit watch`'s report: the settings it ran with and what it found, as values (audit/watch.py makes it;
cli/watch_command.py and report/watch_html.py render it; `--json` writes `to_json`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

from detaudit.codec import FileFormat
from detaudit.compare.baseline_diff import EnvironmentChange
from detaudit.compare.match import not_results_text
from detaudit.errors import ExitCode
from detaudit.results import Ending, RepeatResult
from detaudit.run.files import write_output
from detaudit.run.watchlog import Mismatch, MismatchJson, WatchLog

WATCH = FileFormat("detaudit-watch", 1, "watch report")
OnMismatch = Literal["stop", "continue"]
# clean: every replayed op agreed, an optimizer step's ops were among them, and the job completed; unchecked: it
# completed without a mismatch, but no optimizer step was replayed (nothing of the training checked);
# script-failed / timeout: no mismatch, but the job failed or timed out (its unrun steps were never checked);
# inconclusive: it ended some other way (its recording stopped, it was interrupted)
Verdict = Literal["clean", "mismatch", "unchecked", "script-failed", "timeout", "inconclusive"]
_BY_ENDING: dict[Ending, Verdict] = {Ending.COMPLETED: "clean", Ending.FAILED: "script-failed",
                                     Ending.TIMED_OUT: "timeout"}
# said on the console when the job shows it, and in the report (recorder/steprule.py)
BACKWARD_STEPS = "steps: each backward() (no optimizer was made before the first backward)"
_EXIT: dict[Verdict, ExitCode] = {"clean": ExitCode.DETERMINISTIC, "mismatch": ExitCode.DIVERGENT,
                                  "unchecked": ExitCode.INCONCLUSIVE, "script-failed": ExitCode.SCRIPT_FAILED,
                                  "timeout": ExitCode.TIMEOUT, "inconclusive": ExitCode.INCONCLUSIVE}


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
    format: str  # WATCH: `detaudit-watch`
    version: int
    verdict: Verdict
    exit_code: int  # what the command exited with (the verdict's code)
    script_exit_code: int | None  # the job's own exit status (None: unknown)
    script: str
    run_dir: str
    steps: int
    step_boundary: str | None  # what ended the steps: "optimizer.step", "backward", or null (no step ended)
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
    training_thread: str | None
    compiled_not_checked: list[str]  # what ran compiled, its kernels never replayed (empty: nothing compiled)


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
    compiled: tuple[str, ...] = ()  # what ran compiled (the trace's compile evidence): its kernels are not replayed

    @property
    def compiled_sentence(self) -> str | None:
        """What the replay could not check because it ran compiled, in words (every renderer says it so)."""
        if not self.compiled:
            return None
        return (f"compiled regions ran unreplayed ({', '.join(self.compiled)}): the replay re-executes eager ops "
                "only, so their kernels were not checked; `detaudit run` compares what they compute across runs")

    @property
    def mismatches(self) -> tuple[Mismatch, ...]:
        """The replay's mismatches, then the first difference from the reference, then the replicas'."""
        found = self.against.difference if self.against is not None else None
        return self.log.mismatches + tuple(m for m in (found, self.replica) if m is not None)

    @property
    def verdict(self) -> Verdict:
        """A mismatch whatever the job did after it; else how the job ended (RepeatResult.ending): `clean` only for
        a job that completed with an optimizer step's ops replayed (`unchecked` without one), as steps that never
        ran, or ran unreplayed, were never checked."""
        if self.mismatches:
            return "mismatch"
        ended = _BY_ENDING.get(self.result.ending, "inconclusive")
        return "unchecked" if ended == "clean" and not self.log.training_checked else ended

    @property
    def unchecked_sentence(self) -> str | None:
        """Why the verdict is `unchecked`, in words (every renderer says it so); None otherwise."""
        if self.verdict != "unchecked":
            return None
        thread = self.log.training_thread
        trained = f"the training ran on thread {thread!r}" if thread else "the script computed nothing watched"
        what = f"only {self.log.replayed_ops} ops of other threads" if self.log.replayed_ops else "no op"
        step = "step" if self.log.boundary == "backward" else "optimizer step"
        return f"no {step} was checked: {trained}, and {what} were replayed (docs/watch.md)"

    @property
    def exit_code(self) -> ExitCode:
        """The verdict's code: 0 clean, 1 mismatch, 3 script failed, 5 timed out, 6 unchecked or inconclusive."""
        return _EXIT[self.verdict]

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
            if stopped.kept:
                target += f" ({stopped.kept})"
            if stopped.before == "update":
                return f"stopped the job at step {stopped.step} when its backward() returned{target}"
            return f"stopped the job at step {stopped.step} before {stopped.before}{target}"
        if self.result.stopped_at_step is not None:
            why = "it differed from the reference" if self.replica is None else "its DDP replicas differed (every rank)"
            return f"stopped the job after step {self.result.stopped_at_step}: {why}"
        return None

    def to_json(self) -> WatchJson:
        stopped = self.log.stopped
        return {"format": WATCH.name, "version": WATCH.version, "verdict": self.verdict,
                "exit_code": int(self.exit_code), "script_exit_code": self.result.exit_code,
                "script": self.script, "run_dir": self.run_dir, "steps": self.log.steps,
                "step_boundary": self.log.step_boundary,
                "checked_steps": list(self.log.checked_steps), "replayed_ops": self.log.replayed_ops,
                "skipped_ops": dict(self.log.skipped_ops), "set_aside_outputs": dict(self.log.set_aside),
                "mismatches": [m.to_json() for m in self.mismatches],
                "stopped_before": None if stopped is None else stopped.before,
                "not_written": None if stopped is None else stopped.target,
                "stopped_at_step": stopped.step if stopped is not None else self.result.stopped_at_step,
                "every": self.settings.every, "on_mismatch": self.settings.on_mismatch,
                "nproc_per_node": self.settings.nproc_per_node,
                "against": None if self.against is None else self.against.to_json(),
                "unchecked_saves": [{"step": save.step, "target": save.target} for save in self.log.unchecked_saves],
                "training_thread": self.log.training_thread, "compiled_not_checked": list(self.compiled)}


def read_watch_json(data: Any, where: str) -> WatchJson:
    """A watch.json read back (a CI step that gates on a kept report, a dashboard): its format and version checked
    first, then every field against `WatchJson`, so a foreign file, a newer release's or an edited one is refused
    by name instead of read wrong."""
    return WATCH.read(WatchJson, data, where)


def write_watch_json(report: WatchReport, path: Path) -> None:
    """`--json PATH`: the report's JSON (docs/watch.md)."""
    write_output(path, json.dumps(report.to_json(), indent=2) + "\n")
