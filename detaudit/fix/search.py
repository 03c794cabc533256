"""The search for a minimal set of knobs whose repeats agree (delta debugging over the knob catalogue).

Pure: the oracle (`agrees`) runs the experiments. It starts from the knobs the causes' evidence names,
or from every knob when those do not agree; if every knob still diverges, no knob controls the source.
It then removes knobs, the least suspected first and in halves while the set is large, until removing
any one of those left brings the divergence back: that last round's experiments are the proof of
minimality. Each set is tried once (a cache), and the oracle may stop the search (it answers None: the
budget cannot pay for the next experiment).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

Knobs = frozenset[str]
Oracle = Callable[[Knobs], "bool | None"]  # None: no further experiment can be paid for


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


def search(catalogue: Sequence[str], suspected: Sequence[str], agrees: Oracle) -> Search:
    """The minimal set of `catalogue`'s knobs whose repeats agree, `suspected` (ranked, strongest first) tried
    first; the empty set is known to diverge (the audit). Knobs are removed weakest-suspected first. Where the
    oracle answers None the search ends where it stands (not complete)."""
    tried = _Tried(agrees)
    everything = frozenset(catalogue)
    first = frozenset(k for k in suspected if k in everything)
    # weakest suspicion first: knobs no cause names, then the causes' knobs from the lowest ranked up
    order = [k for k in catalogue if k not in first] + [k for k in reversed(suspected) if k in first]
    suspects = tried.test(first) if first else False
    if suspects is None:
        return tried.found(None, complete=False)
    if suspects:
        return _shrink(tried, first, order, max(1, len(first) // 2) if first == everything else 1)
    every = tried.test(everything)
    if every is None:
        return tried.found(None, complete=False)
    if not every:
        return tried.found(None, complete=False, uncontrolled=True)
    return _shrink(tried, everything, order, max(1, len(everything) // 2))


class _Tried:
    """The sets tried so far and their answers: each set is asked once."""

    def __init__(self, agrees: Oracle) -> None:
        self.agrees = agrees
        self.known: dict[Knobs, bool] = {frozenset(): False}
        self.trials: list[Trial] = [Trial(frozenset(), False)]

    def test(self, knobs: Knobs) -> bool | None:
        if knobs not in self.known:
            answer = self.agrees(knobs)
            if answer is None:
                return None
            self.known[knobs] = answer
            self.trials.append(Trial(knobs, answer))
        return self.known[knobs]

    def found(self, minimal: Knobs | None, complete: bool, uncontrolled: bool = False) -> Search:
        return Search(tuple(self.trials), minimal, complete, uncontrolled)


def _shrink(tried: _Tried, current: Knobs, order: Sequence[str], chunk: int) -> Search:
    """Remove knobs from a set that agrees, `chunk` at a time (halving down to one), until no one can go."""
    while True:
        removed = False
        removable = [k for k in order if k in current]
        for start in range(0, len(removable), chunk):
            rest = current - frozenset(removable[start:start + chunk])
            agreed = tried.test(rest) if rest else False
            if agreed is None:
                return tried.found(current, complete=False)
            if agreed:
                current, removed = rest, True
        if chunk > 1:
            chunk //= 2
        elif not removed:
            return tried.found(current, complete=True)
