"""batch_events.py: the parts of `detaudit batch`'s evidence events, which the events in events.py are built from."""

from __future__ import annotations

from typing import NotRequired, get_args, get_type_hints

from detaudit.batch_events import BatchChoice, BatchSubset, SkipReason
from detaudit.events import BatchCallEvent, BatchSkipEvent


def test_a_probed_call_holds_its_probes_and_its_greedy_choice() -> None:
    hints = get_type_hints(BatchCallEvent, include_extras=True)
    assert (hints["subsets"], hints["choice"]) == (list[BatchSubset], NotRequired[BatchChoice])


def test_a_skipped_call_says_why_with_one_of_the_listed_reasons() -> None:
    assert get_args(get_type_hints(BatchSkipEvent)["why"]) == get_args(SkipReason)
