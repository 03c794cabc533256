"""What the detectors read: each repeat's evidence events, lined up with the first divergence.

Events come from the trace (`E` frames, each positioned at the record index it was written
before) and from the DataLoader workers' side file `<trace>.workers.jsonl`. An event "precedes"
the divergence when its position is at or before the first divergent record (every event does
for an outcome-only divergence).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from detaudit import schema
from detaudit.cause_table import CauseId
from detaudit.compare.oprules import OpFinding
from detaudit.compare.oprules import Verdict as OpVerdict
from detaudit.compare.perturb import PerturbationFinding
from detaudit.errors import TraceError
from detaudit.events import WORKERS_SUFFIX, Event, Flags, StateEvent, When, select
from detaudit.pin import Pin
from detaudit.results import Basis, Cause, Confidence, Divergence, RecordInfo, RepeatResult
from detaudit.trace import RecordStream, read_regular

LIKELY = 0.7  # a score at or above this is reported as "likely", below as "possible"


@dataclass
class Finding:
    """A detector's verdict: the Cause and how well it explains the first divergence (0..1) on its basis."""

    cause: Cause
    score: float


class Detector:
    """A cause detector (`Context -> Finding | None`) and the cause ids it may report, each declared in
    cause_table (an undeclared one is a ValueError at import): a detector reporting an id it did not register
    for is a bug caught at once (an AssertionError), never an undocumented id in a report."""

    def __init__(self, detect: Callable[[Context], Finding | None], cause_ids: tuple[CauseId, ...]) -> None:
        self.detect = detect
        self.cause_ids = tuple(CauseId(i) for i in cause_ids)
        functools.update_wrapper(self, detect)

    def __call__(self, ctx: Context) -> Finding | None:
        found = self.detect(ctx)
        if found is not None and found.cause.id not in self.cause_ids:
            raise AssertionError(f"detector {self.detect.__name__} reported cause {found.cause.id!r}, "
                                 f"which it does not declare ({', '.join(self.cause_ids)})")
        return found


def detects(*cause_ids: CauseId) -> Callable[[Callable[[Context], Finding | None]], Detector]:
    """Register a function as a detector of these cause ids (cause_table.CAUSES declares each)."""
    return lambda detect: Detector(detect, cause_ids)


def finding(cause_id: str, score: float, summary: str, evidence: list[str], fix: str,
            pins: Sequence[Pin] = (), basis: Basis = "circumstantial") -> Finding:
    """`basis`: op-records (the op-level re-run proved it), direct (evidence recorded before the
    divergence ties it to it), circumstantial (an observation of the source in this run, not tied to the
    divergence), no-evidence (nothing of its mechanism was seen: a candidate not ruled out, never a cause)."""
    confidence: Confidence = "likely" if score >= LIKELY and basis not in ("circumstantial", "no-evidence") \
        else "possible"
    return Finding(Cause(cause_id, confidence, summary, merged(evidence), fix, list(dict.fromkeys(pins)), basis),
                   score)


def merged(lines: Sequence[str]) -> list[str]:
    """Equal evidence lines once, with a count (a weight and its bias drawn by one init line)."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return [line if n == 1 else f"{line} ({n} times)" for line, n in counts.items()]


@dataclass
class RepeatEvidence:
    index: int
    device: str
    path: Path
    events: list[Event] = field(default_factory=list)  # main process, in the order written
    worker_events: list[Event] = field(default_factory=list)  # DataLoader workers (side file)
    script_args: list[str] | None = None  # the script's arguments as its trace header has them (argv[1:])

    def of(self, kind: type[E]) -> list[E]:
        """The main process's events of one kind: `rep.of(SeedEvent)`."""
        return select(self.events, kind)

    def first(self, kind: type[E]) -> E | None:
        return next(iter(self.of(kind)), None)

    def workers(self, kind: type[E]) -> list[E]:
        """The DataLoader workers' events of one kind."""
        return select(self.worker_events, kind)

    def states(self) -> list[StateEvent]:
        return self.of(StateEvent)

    def flags_at(self, when: When) -> Flags | None:
        return next((e.get("flags") for e in self.states() if e.get("when") == when and e.get("flags")), None)


E = TypeVar("E")


def load(path: Path, index: int, device: str) -> RepeatEvidence:
    """A repeat's events; a missing or unreadable trace gives none (compare already reported it)."""
    rep = RepeatEvidence(index, device, Path(path))
    try:
        stream = RecordStream(Path(path))
        stream.drain()
        rep.events = [cast(Event, e) for e in stream.events if isinstance(e, dict)]  # types checked by the stream
        argv = stream.header.get("argv")
        rep.script_args = [str(a) for a in argv[1:]] if isinstance(argv, list) and argv else None
    except (TraceError, OSError):
        return rep
    side = Path(str(path) + WORKERS_SUFFIX)
    if os.path.lexists(side):  # a link planted there is refused by its reader, naming it
        # a file of the run directory: regular (no FIFO, no symlink out of it), size-capped, events typed
        text = read_regular(side, "worker evidence file", MAX_SIDE_BYTES).decode(errors="replace")
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a worker killed mid-write leaves a partial last line
            if isinstance(event, dict):
                rep.worker_events.append(cast(Event, schema.check(event, schema.EVENT, f"{side}: worker event")))
    # workers append to the side file as they are scheduled: one worker's events together, in its own
    # order, so the k-th event of a kind means the same thing in every repeat
    rep.worker_events.sort(key=_worker)
    return rep


def _worker(event: Event) -> tuple[int, str]:
    """A worker's events in its own order; events from before torch named the worker (its own seeding
    of the worker's RNGs) interleave by scheduling, so those are put in a canonical order instead."""
    worker = event.get("worker")
    if isinstance(worker, int):
        return worker, ""
    return -1, json.dumps(event, sort_keys=True, default=str)


MAX_SIDE_BYTES = 16 << 20


class Context:
    """The divergence plus every repeat's evidence, with the comparisons detectors need."""

    def __init__(self, divergence: Divergence, repeats: list[RepeatEvidence],
                 op_finding: OpFinding | None = None, perturbation: PerturbationFinding | None = None) -> None:
        self.divergence = divergence
        self.op_finding = op_finding  # the op behind the divergence, when ops were recorded (oprules.py)
        self.perturbation = perturbation  # `run --perturb`: what each setting varied on purpose changed
        self.repeats = repeats
        self.limit = divergence.index if divergence.index >= 0 else math.inf
        by_index = {r.index: r for r in repeats}
        self.ref = by_index.get(divergence.reference, repeats[0])
        self.involved = [self.ref] + [by_index[i] for i in divergence.repeats if i in by_index and i != self.ref.index]

    def op_with(self, verdict: OpVerdict) -> OpFinding | None:
        """The op behind the divergence when the op-level records gave it this verdict."""
        found = self.op_finding
        return found if found is not None and found.verdict == verdict else None

    @property
    def record(self) -> RecordInfo | None:
        return self.divergence.record

    def precedes(self, event: Event) -> bool:
        return int(event.get("at", 0)) <= self.limit

    def where(self) -> str:
        """Where the divergence surfaced, in words, for evidence lines."""
        return where(self.divergence)

    def aligned(self, pick: Callable[[RepeatEvidence], list[E]]) -> Iterator[list[E]]:
        """The k-th picked event of every involved repeat, for each k all of them have."""
        lists = [pick(r) for r in self.involved]
        for k in range(min(len(x) for x in lists) if lists else 0):
            yield [x[k] for x in lists]

    def differs(self, values: Sequence[Any]) -> bool:
        return len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1

    def pair_text(self, values: Sequence[Any], fmt: Any = str) -> str:
        """`x in repeat 0, y in repeat 2` for the involved repeats."""
        return ", ".join(f"{fmt(v)} in repeat {r.index}" for v, r in zip(values, self.involved))


def where(divergence: Divergence) -> str:
    """Where a divergence surfaced, in words, for evidence lines."""
    rec = divergence.record
    if rec is None:
        return divergence.detail or "the script's output"
    what = f"{rec.kind} {rec.name}" + (f" of {rec.module}" if rec.module and rec.module != rec.name else "")
    step = f" at step {rec.step}" if rec.step >= 0 else ""
    loc = f" ({rec.location})" if rec.location else ""
    index = f"record #{rec.index}, " if rec.index >= 0 else ""  # a stdout line or exit status is no record
    return f"{index}{what}{step}{loc}"


def build(divergence: Divergence, traces: Sequence[Path], runs: Sequence[RepeatResult],
          op_finding: OpFinding | None = None, perturbation: PerturbationFinding | None = None) -> Context:
    repeats = [load(path, run.index, run.device) for path, run in zip(traces, runs)]
    return Context(divergence, repeats, op_finding, perturbation)
