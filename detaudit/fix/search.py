"""The search for a minimal set of knobs whose repeats agree (delta debugging over the knob catalogue).

Pure: the oracle (`agrees`) runs the experiments. It starts from the knobs the causes' evidence names,
or from every knob when those do not agree; if every knob still diverges, no knob controls the source.
It then removes knobs, the least suspected first and in halves while the set is large, until removing
any one of those left brings the divergence back: that last round's experiments are the proof of
minimality. Each set is tried once (a cache), and the oracle may stop the search (`OverBudget`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Knobs = frozenset[str]


class OverBudget(Exception):
    """The oracle cannot afford the next experiment: the search ends where it stands."""


@dataclass(frozen=True)
class Trial:
    """One set of knobs tried, and whether its repeats agreed."""

    knobs: Knobs
    agrees: bool


@dataclass(frozen=True)
class Search:
    """What the search found. `minimal`: the set it ended with (None: no set agreed); `complete`: every
    knob of `minimal` was shown necessary (False: the budget ran out first, or no set agreed);
    `uncontrolled`: every knob at once still diverged."""

    trials: tuple[Trial, ...]
    minimal: Knobs | None
    complete: bool
    uncontrolled: bool = False

    def without(self, knob: str) -> Trial | None:
        """The experiment that shows `knob` necessary: the minimal set less it (the empty set: the audit)."""
        if self.minimal is None:
            return None
        rest = self.minimal - {knob}
        return next((t for t in self.trials if t.knobs == rest), None)


def search(catalogue: Sequence[str], suspected: Sequence[str], agrees: Callable[[Knobs], bool]) -> Search:
    """The minimal set of `catalogue`'s knobs whose repeats agree, `suspected` (ranked, strongest first) tried
    first; the empty set is known to diverge (the audit). Knobs are removed weakest-suspected first."""
    known: dict[Knobs, bool] = {frozenset(): False}
    trials: list[Trial] = [Trial(frozenset(), False)]

    def test(knobs: Knobs) -> bool:
        if knobs not in known:
            known[knobs] = agrees(knobs)
            trials.append(Trial(knobs, known[knobs]))
        return known[knobs]

    everything = frozenset(catalogue)
    first = frozenset(k for k in suspected if k in everything)
    # weakest suspicion first: knobs no cause names, then the causes' knobs from the lowest ranked up
    order = [k for k in catalogue if k not in first] + [k for k in reversed(suspected) if k in first]
    current: Knobs | None = None
    try:
        if first and test(first):
            current = first
        elif test(everything):
            current = everything
        else:
            return Search(tuple(trials), None, complete=False, uncontrolled=True)
        chunk = max(1, len(current) // 2) if current == everything else 1
        while True:
            removed = False
            removable = [k for k in order if k in current]
            for start in range(0, len(removable), chunk):
                part = frozenset(removable[start:start + chunk])
                rest = current - part
                if rest and test(rest):
                    current, removed = rest, True
            if chunk > 1:
                chunk //= 2
            elif not removed:
                return Search(tuple(trials), current, complete=True)
    except OverBudget:
        return Search(tuple(trials), current, complete=False)
