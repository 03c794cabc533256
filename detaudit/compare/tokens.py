"""The repeats' generated tokens side by side: how many distinct outputs they produced, and where each sequence
first differs (docs/usage.md#token-answers).

A repeat's output is every sequence its decode sites produced: a sequence is one row of one site's batch, its
tokens the ids chosen for that row step after step (`token` events, recorder/evidence/tokens.py). The comparison
is a pure function of those steps (`compare_tokens`); `read_tokens` reads them from a trace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detaudit.errors import TraceError
from detaudit.trace import read_events

Pair = tuple[float, float]


@dataclass(frozen=True)
class TokenStep:
    """One decode step of one repeat: the token chosen for each sequence of the batch."""

    fn: str  # torch.argmax, torch.multinomial, ...
    loc: str  # the user's line that chose (or called the library that did)
    position: int  # the step's number at its call site
    ids: tuple[int, ...]
    top2: tuple[Pair | None, ...] | None = None  # each row's two largest scores (a choice by maximum)
    at: int = 0  # the record index at the choice
    site: str = ""  # the immediate caller (a library's decode loop: its own line)

    @property
    def key(self) -> tuple[str, str, str]:
        """The call site, as the repeats' streams are lined up by."""
        return self.fn, self.loc, self.site

    def margin(self, row: int) -> float | None:
        """By how much the chosen token won in `row`: its top-1 minus top-2 score (None: a sample, or not known)."""
        if self.top2 is None or row >= len(self.top2) or (pair := self.top2[row]) is None:
            return None
        return pair[0] - pair[1]


@dataclass(frozen=True)
class TokenDivergence:
    """Where one sequence first differs: the first repeat to differ from the reference there, and the two tokens."""

    sequence: int  # the row in its batch
    position: int  # the token's position (the step at its call site)
    fn: str
    loc: str
    reference: int  # the repeat compared against
    repeat: int  # the first repeat whose token differs there
    token: int | None  # the reference's token (None: its sequence had already ended)
    other: int | None  # the other repeat's
    margin: float | None  # the reference's top-1 minus top-2 score at that position (None: a sample)
    other_margin: float | None
    at: int  # the record index at the reference's choice

    def follows(self, record: int | None) -> bool:
        """The token was chosen after record `record` (the first divergent record) already differed, so that
        difference reached it; otherwise the choice itself is the first difference (a sample)."""
        return record is not None and record < self.at


@dataclass(frozen=True)
class TokenComparison:
    """How many distinct outputs the repeats generated, and each differing sequence's first divergent token."""

    repeats: int
    distinct: int
    sequences: int  # sequences compared (rows of every decode site)
    tokens: int  # the longest sequence's tokens
    groups: tuple[tuple[int, ...], ...]  # repeats that generated the same output, in order of their first repeat
    divergences: tuple[TokenDivergence, ...]  # one per differing sequence, in order of position

    @property
    def differ(self) -> bool:
        return self.distinct > 1

    def answer(self, among: str, name_of: Callable[[int], str], shown: int) -> str:
        """The answer in words, one line, as `run` and `drift` lead with it: `tokens: 2 distinct outputs among
        3 repeats; sequence 0 first differs at token 7: 1523 vs 88 in repeat 1 (margin 0.0031)`. `among`: what
        was compared (`3 repeats`, `A and B`); `name_of`: a repeat's name; `shown`: differing sequences named."""
        plural = "" if self.distinct == 1 else "s"
        text = f"tokens: {self.distinct} distinct output{plural} among {among}"
        if not self.divergences:
            return f"{text} ({self.sequences} sequence(s) of up to {self.tokens} tokens)"
        for d in self.divergences[:shown]:
            margin = d.margin if d.margin is not None else d.other_margin
            how = f"margin {margin:.3g}" if margin is not None else "sampled"
            text += (f"; sequence {d.sequence} first differs at token {d.position}: {_id(d.token)} vs "
                     f"{_id(d.other)} in {name_of(d.repeat)} ({how})")
        if len(self.divergences) > shown:
            text += f"; {len(self.divergences) - shown} more sequence(s) differ"
        return text

    @property
    def earliest(self) -> TokenDivergence:
        """The divergent token chosen first (by record index): the one a first divergent record is tied to."""
        return min(self.divergences, key=lambda x: x.at)


def _id(token: int | None) -> str:
    return "-" if token is None else str(token)


Sequences = dict[tuple[tuple[str, str, str], int], list[TokenStep]]


def compare_tokens(streams: Sequence[Sequence[TokenStep]], repeats: Sequence[int]) -> TokenComparison | None:
    """The repeats' token streams (`streams[i]` is repeat `repeats[i]`'s steps, in order) compared with the first
    one's; None when no repeat decoded."""
    if not any(streams):
        return None
    sequences = [_sequences(s) for s in streams]
    keys = list(dict.fromkeys(k for seqs in sequences for k in seqs))
    outputs = [tuple(tuple(_ids(seqs.get(k, []), k[1])) for k in keys) for seqs in sequences]
    groups: dict[tuple[tuple[int | None, ...], ...], list[int]] = {}
    for index, output in zip(repeats, outputs, strict=True):
        groups.setdefault(output, []).append(index)
    divergences = [d for k in keys if (d := _first_divergence(sequences, repeats, k)) is not None]
    return TokenComparison(repeats=len(streams), distinct=len(groups), sequences=len(keys),
                           tokens=max(len(seqs.get(k, [])) for seqs in sequences for k in keys),
                           groups=tuple(tuple(g) for g in groups.values()),
                           divergences=tuple(sorted(divergences, key=lambda d: (d.position, d.sequence))))


def _sequences(steps: Sequence[TokenStep]) -> Sequences:
    """Each (site, row)'s steps in order of position."""
    found: Sequences = {}
    for step in sorted(steps, key=lambda s: s.position):
        for row in range(len(step.ids)):
            found.setdefault((step.key, row), []).append(step)
    return found


def _ids(steps: list[TokenStep], row: int) -> list[int | None]:
    return [s.ids[row] for s in steps]


def _first_divergence(sequences: list[Sequences], repeats: Sequence[int],
                      key: tuple[tuple[str, str, str], int]) -> TokenDivergence | None:
    """Where the sequence `key` first differs between the reference (the first stream) and any other repeat."""
    row = key[1]
    mine = sequences[0].get(key, [])
    found: tuple[int, int] | None = None  # (position index, repeat's stream index)
    for other in range(1, len(sequences)):
        theirs = sequences[other].get(key, [])
        at = next((i for i in range(max(len(mine), len(theirs)))
                   if i >= len(mine) or i >= len(theirs) or mine[i].ids[row] != theirs[i].ids[row]), None)
        if at is not None and (found is None or at < found[0]):
            found = (at, other)
    if found is None:
        return None
    i, other = found
    theirs = sequences[other].get(key, [])
    ours = mine[i] if i < len(mine) else None
    their = theirs[i] if i < len(theirs) else None
    step = ours or their
    assert step is not None  # one of the two has a token at the position where they differ
    return TokenDivergence(
        sequence=row, position=step.position, fn=step.fn, loc=step.loc, reference=repeats[0], repeat=repeats[other],
        token=ours.ids[row] if ours else None, other=their.ids[row] if their else None,
        margin=ours.margin(row) if ours else None, other_margin=their.margin(row) if their else None,
        at=step.at)


_FIELDS = ("fn", "loc", "site", "n", "ids", "top2")


def read_tokens(trace: Path) -> list[TokenStep]:
    """A trace's decode steps (its `token` events, types checked by the reader); none when it has none."""
    found = read_events(trace, "token")
    for e in found:
        if missing := [k for k in _FIELDS if k not in e]:
            raise TraceError(f"{trace}: corrupt trace: a token event at record {e['at']} lacks "
                             f"{', '.join(missing)}; re-record it with `detaudit run`")
    return token_steps(found)


def token_steps(events: Sequence[Mapping[str, Any]]) -> list[TokenStep]:
    """`token` events (their fields present, as read_tokens checked) -> TokenSteps."""
    return [TokenStep(fn=e["fn"], loc=e["loc"], position=e["n"], ids=tuple(e["ids"]),
                      top2=None if e["top2"] is None else tuple(None if p is None else (p[0], p[1]) for p in e["top2"]),
                      at=e["at"], site=e["site"])
            for e in events]
