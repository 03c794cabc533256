"""What each knob costs on this script, measured so that the machine's load cannot make the cost.

The repeats with a knob and without it run in **pairs, interleaved** (fix/trials.py `KnobTrials.timed_pairs`:
without, with; then with, without; ...), so a pair's two runs see the same moment of a shared machine, and a
cost is read pair by pair: each pair's relative change, their median the cost, their lowest and highest the
spread. Step time is **CPU time per optimizer step** (footer `step_cpu_times`: the process's CPU seconds, all
its threads, which load barely moves; each repeat's median over its steps, the first left out: it holds the
script's setup), whole-run time the pair's wall times. A cost counts only when every pair moved the same way
(the spread excludes zero), MIN_PAIRS pairs at least, and the median change is MIN_CHANGE or more: otherwise the
knob costs nothing within the spread, and is said to.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_CHANGE = 0.10
MIN_PAIRS = 3  # pairs that all moved one way by chance: 1 time in 4 with 3, the MIN_CHANGE floor besides
PAIRS = 3  # the paired runs a knob's cost is measured with


@dataclass(frozen=True)
class Sample:
    """One repeat's timing: the median CPU seconds of its optimizer steps (None: fewer than two steps), and its
    wall seconds (None: not measured)."""

    step_cpu_s: float | None
    run_s: float | None

    @classmethod
    def of(cls, step_cpu_times: Sequence[float], run_s: float | None) -> Sample:
        steps = list(step_cpu_times[1:])
        return cls(statistics.median(steps) if steps else None, run_s)


@dataclass(frozen=True)
class Figure:
    """One measure with the knob and without it over paired runs: the medians of each side, the median of the
    pairs' relative changes and their spread (lowest, highest), and whether it stands out of that spread.
    `with_s`/`without_s` None: not measured."""

    with_s: float | None
    without_s: float | None
    measurable: bool
    change: float | None = None  # the median pair's relative change (+0.12: 12% slower with the knob)
    low: float | None = None
    high: float | None = None
    pairs: int = 0

    @property
    def spread(self) -> str:
        """`-3% … +2% over 3 pairs`: the pairs' lowest and highest change ("" when not measured)."""
        if self.low is None or self.high is None:
            return ""
        return f"{self.low:+.0%} … {self.high:+.0%} over {self.pairs} pair{'s' if self.pairs != 1 else ''}"

    def text(self, what: str) -> str:
        if self.change is None:
            return f"{what}: not measured"
        if not self.measurable:
            return f"{what}: costs nothing within the spread ({self.change:+.0%}; {self.spread})"
        return f"{self.change:+.0%} {what} ({self.spread})"


@dataclass(frozen=True)
class KnobCost:
    step: Figure
    run: Figure

    @property
    def summary(self) -> str:
        if not self.step.measurable and not self.run.measurable:
            measured = [f"{what} {f.change:+.0%}: {f.spread}" for f, what in
                        ((self.step, "CPU per step"), (self.run, "whole run")) if f.change is not None]
            return "costs nothing within the spread" + (f" ({'; '.join(measured)})" if measured else "")
        return "; ".join(f.text(what) for f, what in ((self.step, "CPU per step"), (self.run, "whole run"))
                         if f.measurable)


def paired(with_knob: Sequence[float | None], without: Sequence[float | None]) -> Figure:
    """Samples with the knob and without it, the i-th of each side run back to back (a pair)."""
    pairs = [(a, b) for a, b in zip(with_knob, without) if a is not None and b is not None and b > 0]
    if not pairs:
        return Figure(None, None, False)
    changes = [a / b - 1 for a, b in pairs]
    change, low, high = statistics.median(changes), min(changes), max(changes)
    apart = len(pairs) >= MIN_PAIRS and (low > 0 or high < 0)
    return Figure(statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
                  apart and abs(change) >= MIN_CHANGE, change, low, high, len(pairs))


def cost(with_knob: Sequence[Sample], without: Sequence[Sample]) -> KnobCost:
    """The knob's cost from paired repeats: CPU per step, and the whole run's wall time."""
    return KnobCost(paired([s.step_cpu_s for s in with_knob], [s.step_cpu_s for s in without]),
                    paired([s.run_s for s in with_knob], [s.run_s for s in without]))
