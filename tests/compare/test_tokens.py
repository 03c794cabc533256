"""compare/tokens.py: distinct outputs among the repeats, and each sequence's first divergent token."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from detaudit.compare.tokens import TokenComparison, TokenDivergence, TokenStep, compare_tokens, read_tokens
from detaudit.errors import TraceError
from detaudit.trace import TraceWriter

tokens = st.lists(st.integers(0, 50), min_size=1, max_size=12)


def stream(rows: list[list[int]], top2: list[tuple[float, float]] | None = None) -> list[TokenStep]:
    """One site's steps: `rows[r][p]` is sequence r's token at position p; `top2[r]` row r's scores at every step."""
    return [TokenStep(fn="torch.argmax", loc="gen.py:9", position=p, ids=tuple(r[p] for r in rows),
                      top2=None if top2 is None else tuple(top2), at=10 * p)
            for p in range(len(rows[0]))]


def compared(streams: list[list[TokenStep]], repeats: list[int] | None = None) -> TokenComparison:
    found = compare_tokens(streams, repeats if repeats is not None else list(range(len(streams))))
    assert found is not None
    return found


@given(tokens, st.integers(2, 4))
def test_identical_streams_have_one_distinct_output_and_no_divergence(ids: list[int], repeats: int) -> None:
    found = compared([stream([ids])] * repeats)
    assert (found.distinct, found.divergences) == (1, ())


@given(tokens, st.data())
def test_the_first_divergence_is_the_first_position_where_the_streams_differ(ids: list[int],
                                                                             data: st.DataObject) -> None:
    other = data.draw(st.lists(st.integers(0, 50), min_size=len(ids), max_size=len(ids)).filter(lambda o: o != ids))
    found = compared([stream([ids]), stream([other])])
    assert [d.position for d in found.divergences] == [next(i for i, (a, b) in enumerate(zip(ids, other)) if a != b)]


def test_the_divergence_names_both_tokens_and_the_repeat_that_differs() -> None:
    found = compared([stream([[4, 5, 6]]), stream([[4, 5, 6]]), stream([[4, 8, 6]])])
    [d] = found.divergences
    assert (d.sequence, d.position, d.token, d.other, d.reference, d.repeat) == (0, 1, 5, 8, 0, 2)


def test_each_differing_sequence_of_the_batch_gets_its_own_first_divergence() -> None:
    found = compared([stream([[1, 2, 3], [7, 7, 7]]), stream([[1, 2, 9], [7, 0, 7]])])
    assert [(d.sequence, d.position) for d in found.divergences] == [(1, 1), (0, 2)]


def test_repeats_that_generated_the_same_tokens_count_as_one_output() -> None:
    found = compared([stream([[1, 2]]), stream([[1, 3]]), stream([[1, 2]])])
    assert (found.distinct, found.groups) == (2, ((0, 2), (1,)))


def test_the_margin_is_the_top_two_gap_of_the_reference_and_of_the_other_repeat() -> None:
    found = compared([stream([[1]], top2=[(2.5, 2.0)]), stream([[3]], top2=[(1.0, 0.75)])])
    assert (found.divergences[0].margin, found.divergences[0].other_margin) == (0.5, 0.25)


def test_a_sampled_token_has_no_margin() -> None:
    found = compared([stream([[1]]), stream([[3]])])
    assert found.divergences[0].margin is None


def test_a_sequence_that_ends_earlier_differs_where_it_has_no_token() -> None:
    found = compared([stream([[1, 2, 3]]), stream([[1, 2]])])
    assert [(d.position, d.token, d.other) for d in found.divergences] == [(2, 3, None)]


def test_no_repeat_that_decoded_is_no_comparison() -> None:
    assert compare_tokens([[], []], [0, 1]) is None


def test_the_repeats_are_named_by_their_own_numbers() -> None:
    found = compared([stream([[1]]), stream([[2]])], [3, 5])
    assert (found.divergences[0].reference, found.divergences[0].repeat) == (3, 5)


def divergence_at(at: int) -> TokenDivergence:
    return TokenDivergence(sequence=0, position=2, fn="torch.argmax", loc="gen.py:9", reference=0, repeat=1, token=1,
                           other=2, margin=None, other_margin=None, at=at)


@pytest.mark.parametrize(("record", "follows"), [(4, True), (7, False), (9, False), (None, False)])
def test_a_token_follows_a_divergent_record_only_when_the_record_came_before_the_choice(
        record: int | None, follows: bool) -> None:
    assert divergence_at(7).follows(record) is follows


def trace_with(tmp_path: Path, *events: dict[str, object]) -> Path:
    path = tmp_path / "repeat-0.trace"
    writer = TraceWriter(path, {"detaudit_trace": 2, "repeat": 0})
    for event in events:
        writer.event(event)
    writer.close({"records": 0})
    return path


def test_a_traces_token_events_read_back_as_steps(tmp_path: Path) -> None:
    path = trace_with(tmp_path, {"type": "token", "at": 7, "fn": "torch.topk", "loc": "g.py:3", "site": "g.py:3",
                                 "n": 0, "rows": 2, "ids": [4, 5], "top2": [[1.5, 1.0], None]})
    assert read_tokens(path) == [TokenStep(fn="torch.topk", loc="g.py:3", position=0, ids=(4, 5),
                                           top2=((1.5, 1.0), None), at=7, site="g.py:3")]


def test_a_token_event_without_its_ids_is_a_corrupt_trace(tmp_path: Path) -> None:
    path = trace_with(tmp_path, {"type": "token", "fn": "torch.topk", "loc": "g.py:3", "site": "g.py:3", "n": 0,
                                 "rows": 2, "top2": None})
    with pytest.raises(TraceError, match="lacks ids"):
        read_tokens(path)
