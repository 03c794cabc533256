"""What each knob costs on this script: step time (the median over the optimizer steps the recorder timed,
footer `step_times`) and whole-run time, with the minimal set against the same set less that knob.

A difference counts only when the two sets' samples do not overlap at all (every step, or every whole run,
of one slower than every one of the other, MIN_SAMPLES of each at least) and their medians differ by
MIN_CHANGE or more: on a shared machine a few percent is noise, and "no measurable cost" is the honest
answer then. The first step of each repeat is left out: it is timed from the recorder's start, so it holds
the script's setup (building the model, loading data).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_CHANGE = 0.10
MIN_SAMPLES = 3  # per side: two against two fall apart by chance one time in three


@dataclass(frozen=True)
class Timing:
    """One set of knobs' repeats: the seconds of every step but each repeat's first, and of each whole run."""

    step_s: tuple[float, ...]
    run_s: tuple[float, ...]

    @classmethod
    def of(cls, step_times: Sequence[Sequence[float]], run_s: Sequence[float]) -> Timing:
        return cls(tuple(t for steps in step_times for t in steps[1:]), tuple(run_s))


@dataclass(frozen=True)
class Figure:
    """One measure with the knob and without it: the medians, and whether they differ beyond the noise.
    `with_s`/`without_s` None: not measured (fewer than two steps in a repeat)."""

    with_s: float | None
    without_s: float | None
    measurable: bool

    @property
    def change(self) -> float | None:
        """The relative change the knob makes (+0.12: 12% slower)."""
        if self.with_s is None or not self.without_s:
            return None
        return self.with_s / self.without_s - 1

    def text(self, what: str) -> str:
        change = self.change
        if change is None:
            return f"{what}: not measured"
        if not self.measurable:
            return f"{what}: no measurable cost ({change:+.0%}, within the repeats' spread)"
        return f"{change:+.0%} {what}"


@dataclass(frozen=True)
class KnobCost:
    step: Figure
    run: Figure

    @property
    def summary(self) -> str:
        if not self.step.measurable and not self.run.measurable:
            return "no measurable cost"
        return "; ".join(f.text(what) for f, what in ((self.step, "step time"), (self.run, "whole run"))
                         if f.measurable)


def figure(a: Sequence[float], b: Sequence[float]) -> Figure:
    """Samples with the knob (`a`) against samples without it (`b`)."""
    if not a or not b:
        return Figure(None, None, False)
    apart = min(len(a), len(b)) >= MIN_SAMPLES and (min(a) > max(b) or max(a) < min(b))
    with_s, without_s = statistics.median(a), statistics.median(b)
    return Figure(with_s, without_s, apart and abs(with_s / without_s - 1) >= MIN_CHANGE if without_s else False)


def cost(with_knob: Timing, without: Timing) -> KnobCost:
    """The knob's cost: the minimal set's timing against the set less the knob."""
    return KnobCost(figure(with_knob.step_s, without.step_s), figure(with_knob.run_s, without.run_s))
