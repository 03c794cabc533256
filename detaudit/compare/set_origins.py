"""The sets that ordered an op's reordered inputs: the op-level traces' `set-order` events at the op's line.

An op that received the same values in another order (verdict `input-order`) is where the order arrived; the
recorder noted, at that line, the sets in scope whose iteration order changes between runs, with the lines
that build and iterate them (recorder/evidence/set_order.py). Those lines are where the fix goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from detaudit.events import SetOrigin
from detaudit.trace import read_events


@dataclass(frozen=True)
class RunOrderedSet:
    """A set in scope at the op's line whose iteration order changes from run to run (never its elements)."""

    name: str
    of: str  # "str", "bytes", "tuple holding str", "objects hashed by identity"
    size: int
    built: list[str]  # `file:line`s assigning it
    iterated: list[str]  # ... iterating it
    used: list[str]  # ... reading it otherwise

    @classmethod
    def of_origin(cls, s: SetOrigin) -> RunOrderedSet:
        """From a `set-order` event's entry."""
        return cls(name=s["name"], of=s["of"], size=s["size"], built=list(s.get("built", [])),
                   iterated=list(s.get("iterated", [])), used=list(s.get("used", [])))

    @property
    def text(self) -> str:
        """`the set `columns` (5 str), built at train.py:7, iterated at train.py:9`."""
        parts = [f"the set `{self.name}` ({self.size} {self.of})"]
        for verb, lines in (("built", self.built), ("iterated", self.iterated), ("used", self.used)):
            if lines:
                parts.append(f"{verb} at {', '.join(lines)}")
        return ", ".join(parts)

    @property
    def by_address(self) -> bool:
        """Its order follows addresses (objects hashed by identity), not string hashes."""
        return "identity" in self.of

    @property
    def fix_at(self) -> str:
        """Where iterating it in a fixed order goes: where it is iterated, else read, else built."""
        return (self.iterated or self.used or self.built or ["?"])[0]


def sets_at(traces: Sequence[Path], location: str) -> list[RunOrderedSet]:
    """The run-ordered sets the first trace that has any recorded in scope at the op line `location`."""
    for trace in traces:
        found = [RunOrderedSet.of_origin(s) for e in read_events(trace, "set-order") if e.get("loc") == location
                 for s in e["sets"]]
        if found:
            return found
    return []
