"""recorder/agree.py: the ranks of a torchrun repeat stop at one step, whenever each reads the request."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch.distributed as dist

from detaudit.recorder import agree
from detaudit.recorder.agree import MARGIN, RankStop


def ranks(world: int) -> tuple[Any, list[RankStop]]:
    store = dist.HashStore()
    return store, [RankStop(lambda r=r: (store, r, world)) for r in range(world)]  # type: ignore[misc]


def lockstep(stops: list[RankStop], requested: int, sees_from: list[int], steps: int = 100) -> list[int | None]:
    """Ranks as threads that meet at a barrier every step (a collective), rank r reading the request from
    step sees_from[r] on: the step each stopped after (None: ran to the end)."""
    barrier = threading.Barrier(len(stops), timeout=5)
    stopped: list[int | None] = [None] * len(stops)

    def rank(r: int) -> None:
        for step in range(1, steps + 1):
            barrier.wait()  # the step's collective
            if step >= sees_from[r] and stops[r].stops(step, requested):
                stopped[r] = step  # a rank that did not stop too waits in vain at the next step
                return

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(stops))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stopped


@pytest.mark.parametrize("sees_from", [[5, 5], [5, 6], [6, 5], [20, 21], [3, 3, 4, 4]])
def test_ranks_in_lockstep_stop_at_one_step_whenever_each_read_the_request(sees_from: list[int]) -> None:
    requested = 10
    _, stops = ranks(len(sees_from))
    stopped = lockstep(stops, requested, sees_from)
    assert len(set(stopped)) == 1, stopped
    assert stopped[0] is not None, stopped
    assert stopped[0] == max(requested, max(sees_from) + MARGIN)


def test_a_rank_that_never_posts_makes_the_others_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agree, "PATIENCE_S", 0.2)
    store, [first, _] = ranks(2)  # the second rank never reads the request
    assert [first.stops(step, 4) for step in range(1, 10)] == [False] * 9
    assert store.get("4/at") == b"abandon"
    assert first.round is not None
    assert first.round.abandoned


def test_a_new_request_is_a_new_round() -> None:
    store, [only] = ranks(1)
    only.round = agree._Round(3, store, 1, seen=1, abandoned=True)
    assert not only.stops(5, 3)
    assert [only.stops(step, 8) for step in (6, 7, 8)] == [False, False, True]


def test_outside_a_process_group_a_rank_stops_at_the_request_alone() -> None:
    alone = RankStop(lambda: None)
    assert [alone.stops(step, 3) for step in (1, 2, 3)] == [False, False, True]
