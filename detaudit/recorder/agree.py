"""The ranks of a torchrun repeat agree on the step at which all of them stop (recorder/bounds.py).

The audit asks a divergent repeat to stop after step S (its stop file, compare/live.py). Every rank reads
that request at its own step boundaries, and a rank that read it a step later than another, or after
passing S, would stop apart from the others and leave them waiting in a collective. So the ranks agree
through the job's own store (the c10d store of the default process group: key-value requests, no
collective, nothing that changes what the script computes):

- a rank that first reads request S at its boundary b posts b (`S/seen/RANK`);
- the stop step is T = max(S, largest b posted + MARGIN), the same for every rank since posts never
  change; a rank passes any boundary below max(S, its own b + MARGIN) freely, as T cannot be lower;
- at that boundary it waits until every rank has posted, then records T (`S/at`, first writer wins) and
  stops when it reaches T.

Why the wait cannot deadlock: ranks that exchange a collective every step are at most one step apart.
A rank behind finishes its step without this rank (whose part of it is done) and posts at its next
boundary; a rank ahead by one has passed a boundary after the request appeared, so it has posted. A job
whose ranks drift further apart and still wait on each other can leave a rank waiting: after its
patience (at least PATIENCE_S) that rank writes `abandon` instead of T, and every rank then runs on to
its end, as with --run-to-end. A rank in no process group stops at S alone: it has no collective to hang in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

MARGIN = 2  # steps past the last rank's first sight of the request: ranks one step apart both posted by then
PATIENCE_S = 30.0  # the least a rank waits for the others' posts (more when steps are longer)
ABANDON = "abandon"

# (store, rank, world size) of the job, or None outside a process group
Join = Callable[[], "tuple[Any, int, int] | None"]


def job_store() -> tuple[Any, int, int] | None:
    """The default process group's store under a prefix of detaudit's own, with this rank and the world size."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed import distributed_c10d

    return dist.PrefixStore("detaudit-stop/", distributed_c10d._get_default_store()), dist.get_rank(), \
        dist.get_world_size()


@dataclass
class _Round:
    """One request (`requested`: its S) as this rank takes part in agreeing on it."""

    requested: int
    store: Any
    world: int
    seen: int  # the boundary at which this rank first read it
    at: int | None = None  # T once known
    abandoned: bool = False


class RankStop:
    """Decides at each step boundary of one rank whether the rank stops there (`stops`)."""

    def __init__(self, join: Join = job_store) -> None:
        self.join = join
        self.round: _Round | None = None
        self.longest_step_s = 0.0
        self._last: float | None = None

    def stops(self, step: int, requested: int) -> bool:
        """Whether this rank stops after `step`, request S = `requested` being in its stop file."""
        now = time.monotonic()
        if self._last is not None:
            self.longest_step_s = max(self.longest_step_s, now - self._last)
        self._last = now
        round_ = self.round
        if round_ is None or round_.requested != requested:
            joined = self.join()
            if joined is None:
                return step >= requested
            store, rank, world = joined
            store.set(f"{requested}/seen/{rank}", str(step))
            round_ = self.round = _Round(requested, store, world, step)
        if round_.abandoned:
            return False
        if round_.at is None:
            if step < max(requested, round_.seen + MARGIN):
                return False  # T is at least that
            self._agree(round_)
            self._last = time.monotonic()  # the wait is no step
            if round_.abandoned or round_.at is None:
                return False
        return step == round_.at  # T is never below the boundary the rank waited at

    def _agree(self, round_: _Round) -> None:
        """Wait for every rank's post, then take T, or abandon the round after PATIENCE_S."""
        store, s = round_.store, round_.requested
        keys = [f"{s}/seen/{r}" for r in range(round_.world)]
        patience = max(PATIENCE_S, 10 * self.longest_step_s)
        try:
            store.wait(keys, timedelta(seconds=patience))
            at = str(max(s, max(int(store.get(k)) for k in keys) + MARGIN))
        except (RuntimeError, ValueError):  # the wait ran out (DistStoreError), or a post is not a number
            at = ABANDON
        try:
            decided = store.compare_set(f"{s}/at", "", at).decode()
        except RuntimeError:  # the store went away: the job is ending anyway
            decided = ABANDON
        if decided == ABANDON:
            round_.abandoned = True
        else:
            round_.at = int(decided)
