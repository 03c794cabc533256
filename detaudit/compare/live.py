"""The live comparison: each repeat's trace is compared with its reference's while both are written, so
a repeat that diverged is stopped EXTRA_STEPS optimizer steps later instead of running to its end, and
the progress display knows where every repeat stands.

It only decides when to stop and what to show. The report's comparison is made afterwards from the
traces (traces.py), over exactly the records they hold, so a live decision never changes where the
divergence is found; a stopped repeat is compared as far as it was recorded, as one --max-steps
stopped (its exit status and later stdout are not compared, and the report says so).

A repeat's reference is the one the report compares it with (align.reference_pairs): the first
repeat on its device, bitwise, or repeat 0 within the tolerance. Repeats running one after another
find their reference whole; with -j both traces grow and the records both hold are compared. A
reference still running once every repeat compared with it has diverged is asked to stop too, at the
latest step asked of them or the next one it reaches: nothing later in it can be compared with anything,
and what the first divergence is compared over is already written (one plain run's time saved on a long
run that diverges early under -j; one after another, the reference has ended before the others start). A
repeat that goes on recording after its reference ended by itself (a longer run) has diverged too.
Only the records written whole are read (trace.GrowingTrace), and at most HELD records of a repeat
that runs ahead of its reference are held at a time.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detaudit.compare.align import Block, StringTable, reference_pairs
from detaudit.compare.saved_values import non_tensor
from detaudit.compare.traces import same_values
from detaudit.errors import OutputError, TraceError
from detaudit.results import EXTRA_STEPS, RepeatProgress, Tolerance
from detaudit.run.distributed import Layout
from detaudit.run.launcher import RepeatPlan, request_stop
from detaudit.trace import RECORD_DTYPE, EmptyTrace, GrowingTrace, Kind

HELD = 1 << 18  # records of a repeat held while its reference catches up (-j), at most
RATE_WINDOW_S = 10.0  # steps/s is measured over this much of the recent past

# how a reference that ended left its trace: these ends are no reason to call a longer repeat divergent
_CUT_SHORT = ("stopped_at_step", "recording_stopped", "recording_failed")


def _empty() -> np.ndarray:
    return np.empty(0, dtype=RECORD_DTYPE)


def _open(path: Path) -> GrowingTrace | None:
    """The trace once its header is written (None before)."""
    if not os.path.lexists(path):
        return None
    try:
        return GrowingTrace(path)
    except EmptyTrace:
        return None


@dataclass
class Follower:
    """One trace (one rank of a repeat) followed as it grows, compared with its reference's when it has one.

    `step`: the highest step index among its records so far; `agrees_to`: the step of the last record
    compared and found equal; `diverged_at`: the step of its first record that differs (value or
    structure) or that its reference never made.
    """

    path: Path
    reference: Path | None = None
    bitwise: bool = True
    tolerance: Tolerance = field(default_factory=Tolerance)
    trace: GrowingTrace | None = None
    ref: GrowingTrace | None = None
    step: int = 0
    agrees_to: int | None = None
    diverged_at: int | None = None
    # its first differing record is a parameter in both traces: the optimizer's update differs (oprules.update_differs)
    update_first: bool = False
    ref_last_step: int | None = None  # the reference's last record's step, once it ended
    skip_ops: bool = False  # an op-windowed repeat (LiveWatch.configure): its op records have no counterpart
    compared: int = 0
    _held: np.ndarray = field(default_factory=_empty)
    _ref_held: np.ndarray = field(default_factory=_empty)
    _table: StringTable = field(default_factory=StringTable)

    def poll(self) -> None:
        """Read what was written whole since the last poll and compare what both traces now hold."""
        if self.trace is None:
            self.trace = _open(self.path)
            if self.trace is None:
                return
        # far ahead of its reference: wait for it
        new = _empty() if len(self._held) >= HELD and self.diverged_at is None else self.trace.poll()
        if self.skip_ops and len(new):
            new = new[new["kind"] != Kind.OP]
        if len(new):
            self.step = max(self.step, int(new["step"].max()))
        if self.reference is None or self.diverged_at is not None:
            return
        if len(new):
            self._held = np.concatenate([self._held, new]) if len(self._held) else new
        if self.ref is None:
            self.ref = _open(self.reference)
            if self.ref is None:
                return
        wanted = len(self._held) - len(self._ref_held)
        if wanted > 0:
            more = self.ref.poll(wanted)
            if len(more):
                self._ref_held = np.concatenate([self._ref_held, more]) if len(self._ref_held) else more
        self._compare()
        self._after_reference_ended()

    def _compare(self) -> None:
        n = min(len(self._held), len(self._ref_held))
        if not n or self.ref is None or self.trace is None:
            return
        a, b = self._ref_held[:n], self._held[:n]
        block = Block(self.compared, [a, b], [self._table.mapping(0, self.ref.strings),
                                              self._table.mapping(1, self.trace.strings)])
        # a non-tensor saved value (a checkpoint's path) that differs stops nothing: the trace comparison
        # decides what it means once every tensor is recorded (saved_values.py)
        same = block.same_structure(0, 1) & (same_values(a, b, self.bitwise, self.tolerance) | non_tensor(b))
        bad = np.flatnonzero(~same)
        if len(bad):
            self.diverged_at = int(b[int(bad[0])]["step"])
            self.update_first = int(a[int(bad[0])]["kind"]) == int(b[int(bad[0])]["kind"]) == Kind.PARAM
            self.compared += int(bad[0])
            return
        self.compared += n
        self.agrees_to = int(a[n - 1]["step"])
        self._ref_held, self._held = self._ref_held[n:], self._held[n:]

    def _after_reference_ended(self) -> None:
        """The reference ended by itself with every record compared, and this trace holds more: a longer run."""
        ref = self.ref
        if ref is None or ref.footer is None or len(self._ref_held) or self.diverged_at is not None:
            return
        self.ref_last_step = self.agrees_to if self.ref_last_step is None else self.ref_last_step
        if len(self._held) and not any(ref.footer.get(key) for key in _CUT_SHORT):
            self.diverged_at = int(self._held[0]["step"])

    def close(self) -> None:
        for trace in (self.trace, self.ref):
            if trace is not None:
                trace.close()


@dataclass
class _Repeat:
    """A running repeat: its followers (one per rank), its rate, and the stop asked of it."""

    plan: RepeatPlan
    followers: list[Follower]
    reference: int | None
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    stopping_at: int | None = None
    against_baseline: bool = False  # followed against --baseline's trace: shown, never stopped (the others' reference)
    broken: bool = False  # a trace could not be read: followed no further, never stopped (the report says why)

    @property
    def step(self) -> int:
        return min(f.step for f in self.followers)

    @property
    def diverged_at(self) -> int | None:
        steps = [f.diverged_at for f in self.followers if f.diverged_at is not None]
        return min(steps) if steps else None

    def rate(self, now: float) -> float | None:
        """Steps per second over the last RATE_WINDOW_S."""
        self.samples.append((now, self.step))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW_S:
            self.samples.popleft()
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


class LiveWatch:
    """The launcher's Watch (run/launcher.py) over one batch of repeats: follows each while it runs, asks
    a divergent one to stop (when `stop` is set), and tells `on_progress` where each stands."""

    def __init__(self, plans: Sequence[RepeatPlan], tolerance: Tolerance, stop: bool = True,
                 layout: Layout | None = None,
                 on_progress: Callable[[RepeatProgress], None] | None = None,
                 baseline: tuple[Path, str] | None = None, narrow_ahead: bool = False) -> None:
        """`layout`: a torchrun run's, whose ranks here are followed (each against the same rank of the
        reference); a stop then asks every rank, through one file. `baseline`: --baseline's trace and device,
        which the first repeat of a single-process run is followed against (report/baseline.py compares them).
        `narrow_ahead`: once a repeat diverged, the repeats started after it record ops over the window of
        `auto`'s op-level re-run too (`configure`; `op_windowed` says which, and their window)."""
        self.tolerance = tolerance
        self.stop = stop
        first = (layout.node_rank or 0) * layout.nproc_per_node if layout is not None else 0
        self.ranks = list(range(first, first + layout.nproc_per_node)) if layout is not None else None
        self.on_progress = on_progress
        self.plans = {p.index: p for p in plans}
        self._pairs = {plans[rep].index: (plans[ref].index, bitwise)
                       for ref, rep, bitwise in reference_pairs([p.device for p in plans])}
        self.baseline = baseline if layout is None and plans else None
        self._first = plans[0].index if plans else None
        self._repeats: dict[int, _Repeat] = {}
        self._last_steps: dict[int, int] = {}  # repeat -> the last step its trace showed, once it ended
        self.narrow_ahead = narrow_ahead
        self.window: list[int] | None = None  # the op window of the first divergence seen
        self.op_windowed: dict[int, list[int]] = {}  # repeat -> the op window it was started with
        self._diverged: dict[int, tuple[int, int]] = {}  # repeat -> (diverged at, stop asked) once it diverged
        self._lock = threading.Lock()

    def configure(self, plan: RepeatPlan) -> dict[str, Any]:
        """A repeat that starts once another diverged at step S (and is no repeat's reference) records ops in
        steps S-1 and S as well, and runs on after them: the window `auto` re-runs at op granularity
        (audit/pipeline.py op_window), so its trace counts as one of that re-run's."""
        with self._lock:
            window = self.window
            if window is None or not self.narrow_ahead or plan.index in {ref for ref, _ in self._pairs.values()}:
                return {}
            self.op_windowed[plan.index] = window
        return {"granularity": "op", "op_window": window, "op_window_runs_on": True}

    def _files(self, plan: RepeatPlan) -> list[Path]:
        if self.ranks is None:
            return [plan.trace]
        return [plan.trace.with_name(Layout.rank_file(plan.trace.name, r)) for r in self.ranks]

    def _start(self, plan: RepeatPlan) -> _Repeat:
        """The repeat's followers (called with the lock held)."""
        ref, bitwise = self._pairs.get(plan.index, (None, True))
        if ref is None and self.baseline is not None and plan.index == self._first:
            trace, device = self.baseline
            return _Repeat(plan, [Follower(plan.trace, trace, device == plan.device, self.tolerance)], None,
                           against_baseline=True)
        mine = self._files(plan)
        theirs = self._files(self.plans[ref]) if ref is not None else [None] * len(mine)
        skip = plan.index in self.op_windowed
        followers = [Follower(path, other, bitwise, self.tolerance, skip_ops=skip) for path, other in zip(mine, theirs)]
        return _Repeat(plan, followers, ref)

    def poll(self, plan: RepeatPlan, final: bool) -> None:
        with self._lock:
            repeat = self._repeats.get(plan.index)
            if repeat is None:
                repeat = self._repeats[plan.index] = self._start(plan)
        if not repeat.broken:
            try:
                for follower in repeat.followers:
                    follower.poll()
            except (TraceError, OSError, ValueError):
                repeat.broken = True
        self._learn_window(repeat)  # at its end too: a short repeat may end before any poll saw it diverge
        self._note_divergence(repeat)
        self._maybe_stop_reference(repeat.reference)
        if final:  # a repeat re-run alone after a -j batch (run/sharing.py) is followed afresh
            for follower in repeat.followers:
                follower.close()
            with self._lock:
                self._last_steps[plan.index] = repeat.step
                self._repeats.pop(plan.index, None)
            return
        self._maybe_stop(repeat)
        if self.on_progress is not None:
            self.on_progress(self._progress(repeat))

    def _learn_window(self, repeat: _Repeat) -> None:
        """The first divergence from a reference seen gives the op window of repeats started later (configure)."""
        diverged = repeat.diverged_at
        # a parameter first to differ gets no op-level re-run (pipeline.op_window): nothing to record ahead for it
        update_first = any(f.update_first and f.diverged_at == diverged for f in repeat.followers)
        if diverged is not None and not repeat.against_baseline and not repeat.broken and not update_first:
            with self._lock:
                if self.window is None:
                    self.window = [max(0, diverged - 1), diverged]

    def _maybe_stop(self, repeat: _Repeat) -> None:
        diverged = repeat.diverged_at
        if not self.stop or repeat.broken or repeat.against_baseline or diverged is None \
                or repeat.stopping_at is not None:
            return
        at = diverged + 1 + EXTRA_STEPS  # a torchrun repeat's ranks agree on a step at or after it (recorder/agree.py)
        try:
            request_stop(repeat.plan, at, diverged)
        except OutputError:  # the run directory went away: the launcher says so when the repeat ends
            repeat.broken = True
            return
        repeat.stopping_at = at

    def _note_divergence(self, repeat: _Repeat) -> None:
        """A repeat that diverged from its reference no longer needs that reference's later records."""
        diverged = repeat.diverged_at
        if diverged is not None and repeat.reference is not None and not repeat.broken:
            with self._lock:
                self._diverged.setdefault(repeat.plan.index, (diverged, diverged + 1 + EXTRA_STEPS))

    def _maybe_stop_reference(self, index: int | None) -> None:
        """Stop a running reference once every repeat compared with it has diverged (the module docstring)."""
        with self._lock:
            ref = self._repeats.get(index) if index is not None else None
            if not self.stop or ref is None or ref.broken or ref.against_baseline or ref.reference is not None \
                    or ref.stopping_at is not None:
                return
            mine = [rep for rep, (r, _) in self._pairs.items() if r == index]
            if not mine or any(rep not in self._diverged for rep in mine):
                return
            at = max(self._diverged[rep][1] for rep in mine)
            first = min(self._diverged[rep][0] for rep in mine)
            ref.stopping_at = at
        try:
            request_stop(ref.plan, at, first)
        except OutputError:
            ref.broken = True

    def _progress(self, repeat: _Repeat) -> RepeatProgress:
        agreed = [f.agrees_to for f in repeat.followers]
        with self._lock:
            ref_steps = self._last_steps.get(repeat.reference) if repeat.reference is not None else None
        if ref_steps is None:
            ends = [f.ref_last_step for f in repeat.followers]
            ref_steps = None if None in ends else max(e for e in ends if e is not None)
        rate = repeat.rate(time.monotonic())
        target = repeat.stopping_at if repeat.stopping_at is not None else \
            ref_steps + 1 if ref_steps is not None else None
        eta = max(0.0, (target - repeat.step) / rate) if rate and target is not None else None
        return RepeatProgress(
            repeat=repeat.plan.index, label=repeat.plan.label, step=repeat.step, steps_per_s=rate,
            reference=repeat.reference, against_baseline=repeat.against_baseline,
            agrees_to_step=None if None in agreed else min(a for a in agreed if a is not None),
            diverged_at_step=repeat.diverged_at, stopping_at_step=repeat.stopping_at, reference_steps=ref_steps,
            eta_s=eta)
