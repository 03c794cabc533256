"""The values that travel between stages: what a run produces and later stages consume.

A leaf (standard library and `pin` only), so the stages import data, not each other: a repeat's
result (`RepeatResult`, with the script's exception), the comparison tolerance, the first divergence
and the record it names (`Divergence`, `RecordInfo`, made by compare/ and read by the causes, the report
and the CLI), and a cause or experiment as the causes and explain stages hand them to the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any, Literal, get_args

from detaudit.pin import Pin

MAX_FRAMES = 20  # the innermost ones: the user's line is near the raise, never 20 calls further out
MAX_MESSAGE = 2000  # characters of the exception's message kept in the footer
MAX_TEXT = 240  # characters of a file name, function name or source line kept in the footer


@dataclass(frozen=True, slots=True)
class Frame:
    """One traceback frame; `user` is False for the standard library, installed packages and detaudit."""

    file: str  # relative to the script's working directory when inside it, else as python names it
    line: int | None
    function: str
    text: str | None  # the source line, stripped; None when the file cannot be read
    user: bool


@dataclass(frozen=True, slots=True)
class ScriptError:
    """The exception that ended a script (SystemExit with a non-zero status and KeyboardInterrupt included)."""

    type: str  # as python prints it: `RuntimeError`, `mypkg.errors.ConfigError`
    message: str  # str() of the exception, at most MAX_MESSAGE characters
    frames: tuple[Frame, ...]  # outermost first: the user's frames and the innermost frame, the last MAX_FRAMES
    omitted: int = 0  # frames left out (library frames between user frames, and beyond MAX_FRAMES)

    @property
    def innermost_user(self) -> Frame | None:
        return next((f for f in reversed(self.frames) if f.user), None)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "omitted": self.omitted,
                "frames": [{"file": f.file, "line": f.line, "function": f.function, "text": f.text, "user": f.user}
                           for f in self.frames]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScriptError:
        """From a footer's `exception` (schema-checked by the trace reader); bounds are enforced again,
        as a hand-made trace may hold anything."""
        frames = tuple(Frame(cut_text(f["file"], MAX_TEXT), f.get("line"), cut_text(f["function"], MAX_TEXT),
                             None if f.get("text") is None else cut_text(f["text"], MAX_TEXT), f["user"])
                       for f in data["frames"][-MAX_FRAMES:])
        omitted = int(data.get("omitted", 0)) + max(0, len(data["frames"]) - MAX_FRAMES)
        return cls(cut_text(data["type"], MAX_TEXT), cut_text(data["message"], MAX_MESSAGE), frames, omitted)


def cut_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


# -- reading (the report) -------------------------------------------------------------------------------


# what ended a repeat at a step boundary (recorder/bounds.py): a bound, or a stop requested once the live
# comparison had seen it diverge (compare/live.py)
StoppedBy = Literal["max-steps", "max-time", "divergence"]
# optimizer steps a repeat runs on after the step it diverged in, before it is stopped (unless --run-to-end):
# enough for the spread table to show how the difference grows
EXTRA_STEPS = 3


class Ending(Enum):
    """How a repeat ended, in one word: the first that applies, in this order."""

    TIMED_OUT = "timed out"  # --timeout ended it
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM or SIGHUP ended it
    STOPPED_AFTER_DIVERGING = "stopped after diverging"  # the live comparison stopped it at a step boundary
    STOPPED_AT_BOUND = "stopped at a bound"  # --max-steps / --max-time stopped it at a step boundary
    UNKNOWN = "unknown"  # a recording compared without its footer: its end was not recorded
    RECORDING_STOPPED = "recording stopped"  # the script ran on, but a detaudit hook failed and recorded no more
    COMPLETED = "completed"  # ended by itself with status 0
    FAILED = "failed"  # ended by itself with another status


@dataclass(frozen=True)
class RepeatResult:
    """How one repeat ended. Stored in run.json (`to_dict`) but for `error`, whose source is the trace footer."""

    index: int
    device: str
    exit_code: int | None  # None: unknown (a recording compared without its footer)
    duration_s: float | None  # None: not recorded (a baseline keeps no time)
    timed_out: bool
    trace: str
    stdout: str
    stderr: str
    stdout_digest: str
    interrupted: bool = False  # stopped by Ctrl-C/SIGTERM/SIGHUP before it ended by itself
    stopped_at_step: int | None = None  # stopped by --max-steps/--max-time, or after diverging, after this many steps
    recording_stopped: str | None = None  # a detaudit hook failed: recorded only up to there (why)
    rerun_alone: str | None = None  # re-run by itself after a parallel (-j) batch: why (run/sharing.py)
    # torchrun: every rank of this node ended by itself, then torchrun's agent waited at its exit barrier
    # for another node's agent until --timeout (that node's repeat failed): the ranks' outcome is the repeat's
    exit_barrier_waited: bool = False
    # torchrun across nodes: launches that failed in the rendezvous before any rank started, then retried
    rendezvous_retries: int = 0
    error: ScriptError | None = None  # the exception that ended the script, read from the trace footer
    stopped_by: StoppedBy | None = None  # what stopped it at `stopped_at_step`
    diverged_at_step: int | None = None  # stopped_by "divergence": the step it first differed in (live comparison)
    perturbation: dict[str, str] | None = None  # `run --perturb`: setting -> the value this repeat ran with

    @property
    def ending(self) -> Ending:
        """How this repeat ended (derived from the stored fields, so run.json is unchanged)."""
        if self.timed_out:
            return Ending.TIMED_OUT
        if self.interrupted:
            return Ending.INTERRUPTED
        if self.stopped_at_step is not None:
            return Ending.STOPPED_AFTER_DIVERGING if self.stopped_by == "divergence" else Ending.STOPPED_AT_BOUND
        if self.exit_code is None:
            return Ending.UNKNOWN
        if self.recording_stopped is not None:
            return Ending.RECORDING_STOPPED
        return Ending.COMPLETED if self.exit_code == 0 else Ending.FAILED

    @property
    def recorded_whole(self) -> bool:
        """It ended by itself and recorded all it ran: compared in full, not only up to where it stopped."""
        return self.ending in (Ending.COMPLETED, Ending.FAILED)

    @property
    def has_own_exit_status(self) -> bool:
        """Its exit status is the script's own (not a timeout's, an interrupt's, a bound's or unknown): comparable."""
        return self.ending in (Ending.COMPLETED, Ending.FAILED, Ending.RECORDING_STOPPED)

    @property
    def ended_with_error(self) -> bool:
        """It ended with a non-zero status that no timeout or step bound explains: its error is worth showing."""
        return self.exit_code not in (0, None) and not self.timed_out and self.stopped_at_step is None

    def to_dict(self) -> dict[str, Any]:
        """run.json's entry; `perturbation` only for a repeat of a `--perturb` run."""
        return {name: getattr(self, name) for name in _STORED if name != "perturbation" or self.perturbation}

    def ended_as(self, footer: Mapping[str, Any] | None) -> RepeatResult:
        """This result with what its trace's (schema-checked) footer says about an early end: stopped at a
        step boundary (`stopped_at_step`, by a bound or after diverging), or recording stopped because a
        hook failed (`recording_stopped`)."""
        footer = footer or {}
        step, why = footer.get("stopped_at_step"), footer.get("recording_stopped")
        by, diverged = footer.get("stopped_by"), footer.get("diverged_at_step")
        stopped = isinstance(step, int)
        return replace(self, stopped_at_step=step if stopped else None, recording_stopped=str(why) if why else None,
                       stopped_by=by if stopped and by in get_args(StoppedBy) else None,
                       diverged_at_step=diverged if by == "divergence" and isinstance(diverged, int) else None)

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> RepeatResult:
        """From a (schema-checked) run-file entry; keys this release does not store are ignored."""
        return cls(**{k: v for k, v in entry.items() if k in _STORED})


_STORED = tuple(f.name for f in fields(RepeatResult) if f.name != "error")


@dataclass(frozen=True)
class RepeatProgress:
    """Where a running repeat stands, as its trace shows it (compare/live.py, told to the progress display).

    `step`: optimizer steps it has completed; `agrees_to_step`: its records agree with its reference's up to
    and including this step (None: nothing compared yet, or it is the reference); `reference_steps`: the
    reference's length once it ended; `eta_s`: seconds left at the current rate, once that length is known.
    """

    repeat: int
    label: str  # the repeat's files' stem: `repeat-1`, `explain-hash-seed-0`
    step: int
    steps_per_s: float | None
    reference: int | None = None  # the repeat it is compared with (None: it is a reference)
    agrees_to_step: int | None = None
    diverged_at_step: int | None = None
    stopping_at_step: int | None = None  # a stop was requested after this step
    reference_steps: int | None = None
    eta_s: float | None = None
    against_baseline: bool = False  # compared with --baseline's trace instead of a repeat (the first repeat)


@dataclass(frozen=True)
class SelfCheck:
    """The `--self-check` negative control (run.json `self_check`): a one-ULP change injected at record
    `record` (in step `step`, named `name`) was seen at `detected_at` (None: not seen); or, with `not_run`,
    why it could not be made (no record could carry the change, or the control repeat ended otherwise
    than the reference): then it proves nothing and agreement is inconclusive."""

    record: int | None
    step: int | None
    name: str | None
    detected_at: int | None
    not_run: str = ""

    @property
    def passed(self) -> bool:
        return not self.not_run and self.record is not None and self.detected_at == self.record


@dataclass(frozen=True)
class Tolerance:
    atol: float = 1e-5
    rtol: float = 1.3e-6


# How strong the proof of a cause is, strongest first: it decides the ranking before the score does
# (docs/causes.md#ranking). `no-evidence`: nothing of its mechanism was seen in this run; not a cause, a candidate
# that is not ruled out (Report.not_ruled_out), with the experiment that would rule it in or out
Basis = Literal["experiment", "op-records", "direct", "circumstantial", "no-evidence"]
BASES: tuple[Basis, ...] = ("experiment", "op-records", "direct", "circumstantial", "no-evidence")
# ruled-out: its own experiment left the repeats diverging; not-needed: another experiment made them agree
# without pinning its source (both listed below the others)
Confidence = Literal["confirmed", "likely", "possible", "not-needed", "ruled-out"]
# `timeout`: a repeat timed out before any divergence; `inconclusive`: agreement that proves nothing;
# `repeated-randomness`: repeats that agree, with draws that repeat, under --fail-on-repeated-randomness
Verdict = Literal["deterministic", "divergent", "failed", "timeout", "inconclusive", "repeated-randomness"]
ExperimentVerdict = Literal["deterministic", "divergent", "failed", "skipped"]
# A rank's part in a torchrun divergence (ranks.py): where it was born, or where a collective carried it
Role = Literal["origin", "receiver"]


@dataclass(frozen=True)
class Cause:
    """One explanation of the divergence (ids: docs/causes.md)."""

    id: str
    confidence: Confidence
    summary: str
    evidence: list[str]
    fix: str
    pins: list[Pin] = field(default_factory=list)  # the `--explain` pins that test it (docs/causes.md)
    basis: Basis = "circumstantial"  # what it rests on: an experiment, op-level records, direct evidence, or less
    separating_pin: Pin | None = None  # a toss-up with another cause: the one experiment that tells them apart


@dataclass(frozen=True)
class Latent:
    """A setting or op that is deterministic where the audit ran (the CPU) and is not on CUDA: the same script
    on a GPU would not reproduce itself, or this run. Reported beside the verdict, never as a cause of it."""

    id: str  # the cause it would be on CUDA: cudnn-benchmark, tf32, nondeterministic-op
    summary: str
    evidence: list[str]
    fix: str


@dataclass(frozen=True)
class Experiment:
    """One `--explain` re-run with a source pinned (`pin`: a Pin, a `+`-joined set of them, or `all`)."""

    pin: str
    description: str
    verdict: ExperimentVerdict
    first_divergence_index: int | None
    note: str = ""


# how stdout is compared (docs/stdout.md)
StdoutMode = Literal["strict", "masked", "ignore"]


# `stdout`: an outcome divergence's stand-in record (audit.outcome_divergence); `?`: a kind this release
# does not know
RecordKind = Literal["output", "grad", "param", "optstate", "save", "checkpoint", "op", "input", "buffer", "stdout",
                     "?"]
Phase = Literal["forward", "backward"]


@dataclass(frozen=True)
class RecordInfo:
    """A record described in words (strings resolved)."""

    index: int
    kind: RecordKind
    name: str
    module: str
    location: str
    step: int
    shape: str
    dtype: str
    op: str  # op records: the aten overload (`aten.index_put_.default`); "" otherwise
    backward: bool
    node: str = ""  # backward op records: the autograd node that ran the op (`IndexBackward0`)
    random: bool = False  # op records: the op draws from an RNG

    @property
    def phase(self) -> Phase | None:
        return ("backward" if self.backward else "forward") if self.op else None


@dataclass(frozen=True)
class StdoutDifference:
    """The first stdout line where some repeat differs from the reference repeat.

    `lines` maps a repeat to its text of that line as printed (None: its output had ended), invalid
    UTF-8 shown as `\\x..` escapes; line numbers count from 1. `field`: the key or table column under
    which the first repeat listed in `lines` after the reference differs (`'v_num'`, `column val_acc`),
    when the line names one.
    """

    line: int
    mode: StdoutMode
    reference: int
    lines: dict[int, str | None]
    field: str | None = None

    @property
    def repeats(self) -> list[int]:
        return [i for i in self.lines if i != self.reference]


# content: a value differs; structure: the repeats recorded different things (or one stopped early);
# outcome: exit status or stdout differs (audit folds a structural difference into it when both happen)
Category = Literal["content", "structure", "outcome"]


@dataclass(frozen=True)
class Divergence:
    """The first place where some repeat differs from its reference (`audit.analyse` makes an amended copy
    when the outcome or the recordings' ends add to the detail)."""

    index: int
    category: Category
    record: RecordInfo | None
    repeats: list[int]
    reference: int
    max_abs_diff: float | None = None
    max_ulp_diff: int | None = None
    detail: str = ""
    others: dict[int, RecordInfo] = field(default_factory=dict)  # structure: what the other repeats had
    stdout: StdoutDifference | None = None  # outcome: the first stdout line that differs (detaudit/compare/stdout.py)
