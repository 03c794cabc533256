"""The knob search (detaudit/fix/search.py) against fake oracles: a minimal set, the proof of it, few trials."""

from __future__ import annotations

from collections.abc import Callable, Collection

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detaudit.fix.search import Knobs, search

CATALOGUE = ["torch-rng", "numpy-rng", "python-rng", "hash-seed", "deterministic", "zero-empty", "one-thread"]


def needs(*groups: Collection[str]) -> Callable[[Knobs], bool]:
    """An oracle: the repeats agree when, for each group, at least one of its knobs is set (a source two knobs
    each control is a group of two)."""
    return lambda knobs: all(set(g) & knobs for g in groups)


def counting(oracle: Callable[[Knobs], bool],
             budget: int | None = None) -> tuple[Callable[[Knobs], bool | None], list[Knobs]]:
    asked: list[Knobs] = []

    def ask(knobs: Knobs) -> bool | None:
        if budget is not None and len(asked) >= budget:
            return None  # the budget cannot pay for it
        asked.append(knobs)
        return oracle(knobs)

    return ask, asked


def test_two_suspected_sources_cost_three_experiments_and_each_knob_is_shown_needed() -> None:
    ask, asked = counting(needs(["torch-rng"], ["numpy-rng"]))
    found = search(CATALOGUE, ["torch-rng", "numpy-rng"], ask)
    assert found.minimal == {"torch-rng", "numpy-rng"}
    assert found.complete
    assert not found.uncontrolled
    assert asked[0] == {"torch-rng", "numpy-rng"}
    assert len(asked) == 3
    for knob in ("torch-rng", "numpy-rng"):
        proof = found.without(knob)
        assert proof is not None
        assert not proof.agrees
        assert proof.knobs == found.minimal - {knob}


def test_a_source_no_cause_named_is_found_from_every_knob_at_once() -> None:
    ask, asked = counting(needs(["one-thread"]))
    found = search(CATALOGUE, ["torch-rng"], ask)
    assert found.minimal == {"one-thread"}
    assert found.complete
    assert asked[:2] == [frozenset({"torch-rng"}), frozenset(CATALOGUE)]
    assert len(asked) < 2 ** len(CATALOGUE)
    assert len(asked) <= 2 + 2 * len(CATALOGUE)
    assert found.without("one-thread") is not None  # the empty set: the audit's own repeats


def test_a_suspect_that_is_not_needed_is_removed() -> None:
    found = search(CATALOGUE, ["hash-seed", "numpy-rng"], needs(["numpy-rng"]))
    assert found.minimal == {"numpy-rng"}
    assert found.complete


def test_every_knob_at_once_still_diverging_is_uncontrolled() -> None:
    ask, asked = counting(lambda knobs: False)
    found = search(CATALOGUE, ["torch-rng"], ask)
    assert found.uncontrolled
    assert found.minimal is None
    assert not found.complete
    assert asked == [frozenset({"torch-rng"}), frozenset(CATALOGUE)]


def test_the_budget_ends_the_search_where_it_stands() -> None:
    ask, asked = counting(needs(["torch-rng"], ["one-thread"]), budget=2)
    found = search(CATALOGUE, ["torch-rng"], ask)
    assert len(asked) == 2
    assert not found.complete
    assert found.minimal == frozenset(CATALOGUE)
    nothing, _ = counting(needs(["torch-rng"]), budget=0)
    assert search(CATALOGUE, ["torch-rng"], nothing).minimal is None


def test_overlapping_knobs_end_in_one_of_them() -> None:
    """Either of two knobs controls the source (the kernels and one thread, for a reduction): the result keeps
    one, and removing it diverges."""
    found = search(CATALOGUE, [], needs(["deterministic", "one-thread"]))
    assert found.minimal is not None
    assert len(found.minimal) == 1
    assert found.complete


@given(st.lists(st.sets(st.sampled_from(CATALOGUE), min_size=1, max_size=2), min_size=1, max_size=3),
       st.lists(st.sampled_from(CATALOGUE), unique=True, max_size=3))
def test_the_result_agrees_and_loses_agreement_without_any_one_knob(groups: list[set[str]],
                                                                     suspected: list[str]) -> None:
    oracle = needs(*groups)
    found = search(CATALOGUE, suspected, oracle)
    assert found.complete
    assert found.minimal is not None
    assert oracle(found.minimal)
    for knob in found.minimal:
        assert not oracle(found.minimal - {knob})
        proof = found.without(knob)
        assert proof is not None
        assert not proof.agrees


@pytest.mark.parametrize("suspected", [[], ["torch-rng", "numpy-rng"]])
def test_no_set_is_tried_twice(suspected: list[str]) -> None:
    ask, asked = counting(needs(["torch-rng"], ["numpy-rng"]))
    search(CATALOGUE, suspected, ask)
    assert len(asked) == len(set(asked))
