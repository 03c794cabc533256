"""A resumed run against the uninterrupted one: which reference step it starts at, and the two compared from there.

The resumed run's records of its step i are compared with the reference's records of step S + i, where S is the
reference step whose parameters (after S optimizer steps) equal those the resumed run holds before its first
step (the `initial-params` event). Both traces are read through `Window`s: the reference from step S on, the
resumed run with its steps renumbered to the reference's, and neither with `torch.save` records (the two runs
save where each chooses; what was saved is the checkpoint evidence's). The comparison itself is
compare/traces.py's, so every figure `run` reports (first divergence, spread by step) holds here too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from detaudit.compare.traces import Comparison, compare_traces, open_stream
from detaudit.events import InitialParamsEvent
from detaudit.trace import RECORD_DTYPE, Kind, RecordStream, read_events

Digests = dict[str, str]  # parameter name -> record digest, 16 hex digits


class Window(RecordStream):
    """A trace seen from step `start` on and from record `after` on, its steps moved by `shift`, without its SAVE
    records and without the OPTSTATE records it opens with: an LR scheduler's or GradScaler's step after the
    optimizer's is counted in the next step, so the reference's step S opens with the tail of step S - 1, which a
    resumed run never repeats (its own opening scheduler record, made when the scheduler is built before the
    checkpoint is loaded, holds state the load then replaces)."""

    def __init__(self, inner: RecordStream, start: int = 0, shift: int = 0, after: int = 0) -> None:
        self.inner = inner
        self.start = start
        self.shift = shift
        self.after = after
        self.path = inner.path
        self._read = 0  # records taken from the inner stream
        self._opened = False  # a record past the opening OPTSTATE ones was kept
        # the inner stream's tables, which it grows in place as it is read; its footer once it is read to the end
        self.header, self.strings, self.events = inner.header, inner.strings, inner.events
        self.footer = inner.footer

    def take(self, n: int) -> np.ndarray:
        kept: list[np.ndarray] = []
        have = 0
        while have < n:
            chunk = self.inner.take(n - have)
            self.footer = self.inner.footer
            if not len(chunk):
                break
            index = np.arange(self._read, self._read + len(chunk))
            self._read += len(chunk)
            chunk = chunk[(chunk["kind"] != Kind.SAVE) & (chunk["step"] >= self.start) & (index >= self.after)]
            if not self._opened and len(chunk):
                body = np.flatnonzero(chunk["kind"] != Kind.OPTSTATE)
                self._opened = bool(len(body))
                chunk = chunk[body[0]:] if len(body) else chunk[:0]
            if self.shift:
                chunk = chunk.copy()
                chunk["step"] += self.shift
            kept.append(chunk)
            have += len(chunk)
        if not kept:
            return np.empty(0, dtype=RECORD_DTYPE)
        return kept[0] if len(kept) == 1 else np.concatenate(kept)

    def drain(self) -> None:
        self.inner.drain()
        self.footer = self.inner.footer

    def check_strings(self, records: np.ndarray) -> None:
        self.inner.check_strings(records)


@dataclass(frozen=True)
class Steps:
    """What one trace holds step by step, for the alignment and the causes: the parameters before the first
    step and after each one, and the digest of each step's first input batch."""

    initial: Digests | None  # before the first optimizer step (None: no initial-params event)
    after: dict[int, Digests] = field(default_factory=dict)  # S -> the parameters after S optimizer steps
    inputs: dict[int, str] = field(default_factory=dict)  # step -> its first INPUT record's digest

    def at(self, steps: int) -> Digests | None:
        """The parameters after `steps` optimizer steps."""
        return self.initial if steps == 0 else self.after.get(steps)


def read_steps(path: Path) -> Steps:
    """A trace's parameters and first batches by step (one pass over its records)."""
    initial = read_events(path, "initial-params")
    first: InitialParamsEvent | None = initial[0] if initial else None  # type: ignore[assignment]
    after: dict[int, Digests] = {}
    inputs: dict[int, str] = {}
    stream = open_stream(path)
    for chunk in stream.chunks():
        stream.check_strings(chunk)
        for row in chunk[(chunk["kind"] == Kind.PARAM) | (chunk["kind"] == Kind.INPUT)]:
            step, digest = int(row["step"]), f"{int(row['digest']):016x}"
            if row["kind"] == Kind.PARAM:
                after.setdefault(step + 1, {})[stream.strings[row["name"]]] = digest
            else:
                inputs.setdefault(step, digest)
    return Steps(dict(zip(first["params"], first["digests"])) if first else None, after, inputs)


@dataclass(frozen=True)
class Alignment:
    """Where the resumed run starts in the reference's numbering (`step`), or why no step fits (`step` None)."""

    step: int | None
    matches: list[int]  # every reference step whose parameters equal the resumed run's starting ones
    differing: list[str] = field(default_factory=list)  # no fit: parameters that differ at the expected step
    expected: int | None = None  # no fit: the step the checkpoint was saved at, compared with
    fresh: bool = False  # the resumed run starts from the reference's initial weights (nothing restored)


def align(reference: Steps, resumed: Steps, saved: Collection[int], expected: int | None) -> Alignment:
    """The reference step the resumed run starts at. `saved`: the steps checkpoints were saved after; a match
    at step 0 counts only if one was saved there (else the resumed run merely starts as a fresh run does).
    `expected`: the step of the checkpoint it should start from (the interrupted run's last), compared with
    when no step fits."""
    start = resumed.initial
    if start is None:
        return Alignment(None, [])
    candidates = ([0] if reference.initial == start else []) + sorted(s for s, p in reference.after.items()
                                                                      if p == start)
    matches = [s for s in candidates if s or 0 in saved]
    if matches:
        preferred = [s for s in matches if s in saved]
        return Alignment((preferred or matches)[-1], matches)
    target = reference.at(expected) if expected is not None else None
    differing = sorted(name for name in set(start) | set(target or {})
                       if target is None or start.get(name) != target.get(name))
    return Alignment(None, [], differing, expected, fresh=bool(candidates))


def compare_resumed(reference: Path, resumed: Path, start: int, loaded_at: int,
                    truncated: Sequence[bool]) -> Comparison:
    """The resumed run's steps against the reference's from step `start` on (steps in the reference's numbering);
    the resumed run's records from its checkpoint load (record index `loaded_at`) on: what it did before, it did
    to objects the load then replaced. `truncated`: which of the two was cut short by a bound (its end is no
    divergence)."""
    return compare_traces([Window(open_stream(reference), start=start),
                           Window(open_stream(resumed), shift=start, after=loaded_at)],
                          ["same", "same"], truncated=list(truncated))
