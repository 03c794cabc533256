"""What `detaudit watch`'s step replay left in its events file (recorder/replay.py), read back into types.

One JSON object per line, appended by the running job: `step` (a step ended: whether it was checked, how many
ops were replayed and skipped, and why), `mismatch` (an op's second execution disagreed with its first),
`stopped` (the job was stopped before a torch.save, an optimizer.step or, where each backward() ends a step,
the update after it), `boundary` (each backward() ends a step: the script made no optimizer), `unchecked_save`
(a torch.save went ahead before the parent's checks had caught up, recorder/save_gate.py) and `end` (the script
ended); `stopped` and `end` also close the step that was running, with its counts. The first line is a header with
the file's format and version (`detaudit-watch-events`, 1: records.py), checked before any event. The last line may
have been cut short by a kill while the job wrote it: it is ignored; any other line that is not JSON makes the file
corrupt.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, cast

from detaudit.errors import TraceError
from detaudit.recorder.steprule import Boundary
from detaudit.records import WATCH_EVENTS

Agreement = Literal["first", "second", "neither"]
Check = Literal["replay", "against", "replica"]
# `update`: whatever the script does after a backward() that ends a step (recorder/steprule.py), by hand
StoppedBefore = Literal["torch.save", "optimizer.step", "update"]


class MismatchJson(TypedDict):
    step: int
    check: str
    op: str
    module: str | None
    location: str | None
    backward_of: str | None
    max_abs_diff: float
    max_ulp: int
    third_agrees_with: str | None
    rank: int | None


@dataclass(frozen=True)
class Mismatch:
    """One op whose replay disagreed with what the script computed (`check` "replay"), the first record
    that differs from the reference's (`check` "against": no third execution, `op` is the record's name), or
    the first DDP-replicated parameter on which a rank differs from the lowest rank (`check` "replica": `op`
    is the parameter, `rank` the first differing rank). `rank`: where it happened, under torchrun."""

    step: int
    op: str
    module: str | None
    location: str | None  # the user's file:line
    backward_of: str | None  # the autograd node, for an op of the backward pass
    max_abs_diff: float
    max_ulp: int
    third_agrees_with: Agreement | None
    check: Check = "replay"
    rank: int | None = None

    def to_json(self) -> MismatchJson:
        return {"step": self.step, "check": self.check, "op": self.op, "module": self.module, "location": self.location,
                "backward_of": self.backward_of, "max_abs_diff": self.max_abs_diff, "max_ulp": self.max_ulp,
                "third_agrees_with": self.third_agrees_with, "rank": self.rank}

    @classmethod
    def from_json(cls, data: dict[str, Any], rank: int | None = None) -> Mismatch:
        """An events file's or a report's entry; `rank`: the rank whose events file it came from."""
        third = str(data.get("third_agrees_with"))
        check = cast(Check, data["check"] if data.get("check") in ("against", "replica") else "replay")
        given = data.get("rank", rank)
        return cls(int(data["step"]), str(data["op"]), _text(data.get("module")), _text(data.get("location")),
                   _text(data.get("backward_of")), float(data["max_abs_diff"]), int(data["max_ulp"]),
                   None if check != "replay" else cast(Agreement, third if third in ("first", "second") else "neither"),
                   check, None if given is None else int(given))

    @property
    def verdict(self) -> str:
        """What the third execution says, in words."""
        if self.check == "against":
            return "differs from the reference's record"
        if self.check == "replica":
            return "this rank's DDP replica differs from the lowest rank's"
        if self.third_agrees_with == "first":
            return "the second execution disagrees with the first; a third agrees with the first"
        if self.third_agrees_with == "second":
            return "the second execution disagrees with the first; a third agrees with the second (the script's " \
                   "own result was the odd one out)"
        return "the second execution disagrees with the first; a third agrees with neither"


@dataclass(frozen=True)
class Stopped:
    """The job was stopped before `before` ran (`target`: the file a torch.save was about to write)."""

    before: StoppedBefore
    step: int
    target: str | None
    kept: str | None = None  # what became of the file a stopped torch.save was given a handle of, in words

    @property
    def before_text(self) -> str:
        return before_text(self.before)


def before_text(before: str) -> str:
    """What a stop kept from running, in words (`update`: the script's own, after the backward() that ended a step)."""
    return "the update after backward()" if before == "update" else before


@dataclass(frozen=True)
class UncheckedSave:
    """A torch.save that waited its whole patience for the parent's checks and then wrote `target` at `step`."""

    step: int
    target: str


@dataclass(frozen=True)
class WatchLog:
    """Everything the events file says, in order of the steps."""

    steps: int = 0  # steps completed (optimizer steps, or backward() calls: `step_boundary`)
    checked_steps: tuple[int, ...] = ()
    replayed_ops: int = 0
    skipped_ops: dict[str, int] = field(default_factory=dict)
    mismatches: tuple[Mismatch, ...] = ()
    stopped: Stopped | None = None
    ended: bool = False  # the script ran to its end (an `end` event)
    unchecked_saves: tuple[UncheckedSave, ...] = ()
    training_thread: str | None = None  # the name of the thread that stepped the optimizer
    # op -> its outputs replayed but not compared: the workspace or reserve it keeps for its backward, no result
    set_aside: dict[str, int] = field(default_factory=dict)
    # what ended the steps: said by a `boundary` event when it is each backward() (recorder/steprule.py)
    boundary: Boundary | None = None

    @property
    def step_boundary(self) -> Boundary | None:
        """What ended the steps: each backward(), optimizer steps, or nothing (no step ended: one window)."""
        return self.boundary or ("optimizer.step" if self.steps else None)

    @property
    def checked_count(self) -> int:
        """The completed optimizer steps checked: never more than `steps` (the ops after the last optimizer step,
        or of a step a stop cut short, form no step of their own: `checked_tail`)."""
        return sum(1 for step in self.checked_steps if step < self.steps)

    @property
    def checked_tail(self) -> bool:
        """Whether the ops after the last completed optimizer step were checked (for a script with no optimizer
        step: the whole run)."""
        return any(step >= self.steps for step in self.checked_steps)

    @property
    def checked_phrase(self) -> str:
        """`3 checked`, never more than the steps; the ops after the last step said apart (`3 checked and the ops
        after the last`); a run with no optimizer step is one window (`the whole run checked`)."""
        if self.steps == 0:
            return "the whole run checked" if self.checked_tail else "none checked"
        return f"{self.checked_count} checked" + (" and the ops after the last" if self.checked_tail else "")

    @property
    def training_checked(self) -> bool:
        """Whether some optimizer step's ops were replayed (on the thread that ran the step); a script with no
        optimizer step: whether any of its ops were."""
        return any(step < self.steps for step in self.checked_steps) or (self.steps == 0 and bool(self.checked_steps))


def _add_counts(total: dict[str, int], counts: Any) -> None:
    """Add `counts` (reason or op -> count) into `total`."""
    for key, count in dict(counts).items():
        total[str(key)] = total.get(str(key), 0) + int(count)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _events(path: Path) -> Iterator[dict[str, Any]]:
    """The file's events after its header; a TraceError for a foreign, newer or corrupt file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for number, line in enumerate(data.split(b"\n")[:-1], 1):  # after the last newline: a line cut short, or none
        try:
            event = json.loads(line)
        except ValueError:
            raise TraceError(f"{path}: line {number} is not JSON: the {WATCH_EVENTS.what} is corrupt") from None
        if number == 1:
            WATCH_EVENTS.check(event, str(path))
        elif isinstance(event, dict) and isinstance(event.get("event"), str):
            yield event


def read_watch_log(path: Path, rank: int | None = None) -> WatchLog:
    """The events file as a WatchLog (an absent file: the job never imported torch, nothing was watched);
    `rank`: the torchrun rank that wrote it."""
    steps, replayed, ended = 0, 0, False
    checked: list[int] = []
    skipped: dict[str, int] = {}
    aside: dict[str, int] = {}
    mismatches: list[Mismatch] = []
    stopped: Stopped | None = None
    unchecked: list[UncheckedSave] = []
    thread: str | None = None
    boundary: Boundary | None = None
    for event in _events(path):
        kind = event["event"]
        try:
            if kind in ("step", "end", "stopped"):
                step = int(event["step"])
                replayed += int(event.get("replayed", 0))
                _add_counts(skipped, event.get("skipped", {}))
                _add_counts(aside, event.get("set_aside", {}))
                if event.get("checked") and event.get("replayed"):
                    checked.append(step)  # replayed: a window opened on another thread replays none of its ops
                steps = max(steps, step + 1) if kind == "step" else max(steps, step)
                ended = ended or kind == "end"
            thread = _text(event["thread"]) if kind == "step" and event.get("thread") is not None else thread
            if kind == "mismatch":
                mismatches.append(Mismatch.from_json(event, rank))
            elif kind == "boundary" and event.get("boundary") == "backward":
                boundary = "backward"
            elif kind == "stopped" and event.get("before") in ("torch.save", "optimizer.step", "update"):
                stopped = Stopped(event["before"], int(event["step"]), _text(event.get("target")),
                                  _text(event.get("kept")))
            elif kind == "unchecked_save":
                unchecked.append(UncheckedSave(int(event["step"]), str(event["target"])))
        except (KeyError, TypeError, ValueError):
            continue  # not an event this version wrote
    return WatchLog(steps, tuple(checked), replayed, skipped, tuple(mismatches), stopped, ended, tuple(unchecked),
                    thread, aside, boundary)


def merged(logs: Sequence[WatchLog]) -> WatchLog:
    """The ranks' logs as one: the steps every rank completed, the steps any rank checked, every rank's
    replayed ops and mismatches (by step, then rank), the first stop, ended when every rank did, every rank's
    unchecked saves."""
    if len(logs) == 1:
        return logs[0]
    skipped: dict[str, int] = {}
    aside: dict[str, int] = {}
    for log in logs:
        _add_counts(skipped, log.skipped_ops)
        _add_counts(aside, log.set_aside)
    stops = sorted((log.stopped for log in logs if log.stopped is not None), key=lambda s: s.step)
    return WatchLog(min((log.steps for log in logs), default=0),
                    tuple(sorted({step for log in logs for step in log.checked_steps})),
                    sum(log.replayed_ops for log in logs), skipped,
                    tuple(sorted((m for log in logs for m in log.mismatches), key=lambda m: (m.step, m.rank or 0))),
                    stops[0] if stops else None, bool(logs) and all(log.ended for log in logs),
                    tuple(save for log in logs for save in log.unchecked_saves),
                    next((log.training_thread for log in logs if log.training_thread), None), aside,
                    next(filter(None, map(operator.attrgetter("boundary"), logs)), None))
