"""The values that travel between stages: what a run produces and later stages consume.

A leaf (standard library and `pin` only), so the stages import data, not each other: a repeat's
result (`RepeatResult`, with the script's exception), the comparison tolerance, and a cause or
experiment as the causes and explain stages hand them to the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

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


@dataclass(frozen=True)
class RepeatResult:
    """How one repeat ended. Stored in run.json (`to_dict`) but for `error`, whose source is the trace footer."""

    index: int
    device: str
    exit_code: int | None  # None: unknown (a recording compared without its footer)
    duration_s: float
    timed_out: bool
    trace: str
    stdout: str
    stderr: str
    stdout_digest: str
    interrupted: bool = False  # stopped by Ctrl-C/SIGTERM/SIGHUP before it ended by itself
    stopped_at_step: int | None = None  # stopped by --max-steps/--max-time after this many steps
    recording_stopped: str | None = None  # a detaudit hook failed: recorded only up to there (why)
    rerun_alone: str | None = None  # re-run by itself after a parallel (-j) batch: why (run/sharing.py)
    # torchrun: every rank of this node ended by itself, then torchrun's agent waited at its exit barrier
    # for another node's agent until --timeout (that node's repeat failed): the ranks' outcome is the repeat's
    exit_barrier_waited: bool = False
    # torchrun across nodes: launches that failed in the rendezvous before any rank started, then retried
    rendezvous_retries: int = 0
    error: ScriptError | None = None  # the exception that ended the script, read from the trace footer

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _STORED}

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> RepeatResult:
        """From a (schema-checked) run-file entry; keys this release does not store are ignored."""
        return cls(**{k: v for k, v in entry.items() if k in _STORED})


_STORED = tuple(f.name for f in fields(RepeatResult) if f.name != "error")


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
Basis = Literal["experiment", "op-records", "direct", "circumstantial"]
BASES: tuple[Basis, ...] = ("experiment", "op-records", "direct", "circumstantial")
# ruled-out: its own experiment left the repeats diverging; not-needed: another experiment made them agree
# without pinning its source (both listed below the others)
Confidence = Literal["confirmed", "likely", "possible", "not-needed", "ruled-out"]
# `timeout`: a repeat timed out before any divergence; `inconclusive`: agreement that proves nothing
Verdict = Literal["deterministic", "divergent", "failed", "timeout", "inconclusive"]
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
class Experiment:
    """One `--explain` re-run with a source pinned (`pin`: a Pin, a `+`-joined set of them, or `all`)."""

    pin: str
    description: str
    verdict: ExperimentVerdict
    first_divergence_index: int | None
    note: str = ""
