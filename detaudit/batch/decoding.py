"""`detaudit batch` in tokens: the first token a decoded sequence would get differently in another batch.

A probed call whose output has scores to choose over (logits) carries the whole batch's greedy choice per row and
the rows whose argmax a probe changed (`choice` of a `batch-call` event, recorder/batchchoice.py). The script's own
decode steps are its `token` events (recorder/evidence/tokens.py). A call is *tied* to a step when the step chose,
for every recorded row, the call's argmax with the call's top-2 scores, bit for bit: the script chose from this
call's output. For a tied call, a flip at size K is the token that would first differ had that row been decoded in
a batch of K, given the same prefix (the prefix the whole batch decoded). Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from detaudit.batch_events import BatchChoice
from detaudit.compare.tokens import TokenStep
from detaudit.events import BatchCallEvent


@dataclass(frozen=True)
class TokenAtSize:
    """The first position at which one sequence's greedy token differs in a probe's batch from the whole batch's."""

    sequence: int  # the row in the decoded batch
    position: int  # the step's number at its decode site
    subset: str  # prefix, reversed, mixed
    size: int  # the probe's batch size
    token: int  # the token the script chose (in the whole batch)
    other: int  # the token the probe's batch gives
    margin: float | None  # the whole batch's top-1 minus top-2 score at that position (None: not finite)
    module: str  # the probed call that gave the scores
    call: int
    fn: str  # the choice's function and line
    loc: str


@dataclass(frozen=True)
class BatchTokens:
    """How the probed calls tie to the script's decode steps, and each sequence's first divergent token per size."""

    steps: int  # the script's decode steps (token events)
    tied: int  # probed calls the script chose from
    untied: int  # probed calls with scores that no decode step chose from
    first: tuple[TokenAtSize, ...]  # per (sequence, subset, size): the first position; by position, sequence, size

    @property
    def earliest(self) -> TokenAtSize | None:
        return self.first[0] if self.first else None


def _chose_from(step: TokenStep, choice: BatchChoice) -> bool:
    """The step chose, in every recorded row, the call's argmax with the call's top-2 scores."""
    if step.top2 is None or len(step.ids) != len(choice["ids"]):
        return False
    return list(step.ids) == choice["ids"] and all(
        (pair is None and mine is None) or (pair is not None and mine is not None and tuple(pair) == tuple(mine))
        for pair, mine in zip(step.top2, choice["top2"], strict=True))


def tie(calls: Sequence[BatchCallEvent], steps: Sequence[TokenStep]) -> list[tuple[BatchCallEvent, TokenStep]]:
    """Each decode step paired with the first probed call, after the site's previous pairing, it chose from."""
    scored = [c for c in calls if "choice" in c]
    after: dict[tuple[str, str, str], int] = {}
    pairs = []
    for step in sorted(steps, key=lambda s: (s.key, s.position)):
        start = after.get(step.key, 0)
        found = next((i for i in range(start, len(scored)) if _chose_from(step, scored[i]["choice"])), None)
        if found is not None:
            after[step.key] = found + 1
            pairs.append((scored[found], step))
    return pairs


def tokens_at_size(calls: Sequence[BatchCallEvent], steps: Sequence[TokenStep]) -> BatchTokens | None:
    """The first divergent token per (sequence, probe) over the tied calls; None when the script decoded nothing."""
    if not steps:
        return None
    pairs = tie(calls, steps)
    first: dict[tuple[tuple[str, str, str], int, str, int], TokenAtSize] = {}
    for call, step in pairs:
        choice = call["choice"]
        for flip in choice["flips"]:
            key = (step.key, flip["row"], flip["subset"], flip["size"])
            top = choice["top2"][flip["row"]]
            found = TokenAtSize(sequence=flip["row"], position=step.position, subset=flip["subset"], size=flip["size"],
                                token=choice["ids"][flip["row"]], other=flip["other"],
                                margin=None if top is None else top[0] - top[1],
                                module=call["module"], call=call["call"], fn=step.fn, loc=step.loc)
            if key not in first or found.position < first[key].position:
                first[key] = found
    tied = {(c["module"], c["call"]) for c, _ in pairs}
    scored = sum("choice" in c for c in calls)
    return BatchTokens(steps=len(steps), tied=len(tied), untied=scored - len(tied),
                       first=tuple(sorted(first.values(), key=lambda t: (t.position, t.sequence, t.size))))
