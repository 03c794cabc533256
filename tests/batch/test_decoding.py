"""batch/decoding.py: probed calls' greedy choices tied to the script's decode steps -> first divergent tokens."""

from __future__ import annotations

from typing import Any

from batchcases import ROUNDING, call

from detaudit.batch.decoding import tie, tokens_at_size
from detaudit.batch.finding import analyse
from detaudit.compare.tokens import TokenStep

TOP2 = [[2.5, 2.4999998], [1.0, 0.5]]


def scored(index: int, ids: list[int], flips: list[dict[str, Any]] | None = None, top2: Any = None) -> Any:
    """A probed call of 2 rows whose output has scores: its argmax `ids` per row and the probes' flips."""
    return {**call(ROUNDING), "call": index, "rows": 2,
            "choice": {"output": "output", "ids": ids, "top2": top2 or TOP2, "flips": flips or []}}


def step(position: int, ids: tuple[int, ...], top2: Any = TOP2) -> TokenStep:
    pairs = None if top2 is None else tuple(None if p is None else tuple(p) for p in top2)
    return TokenStep(fn="Tensor.argmax", loc="decode.py:9", position=position, ids=ids, top2=pairs)  # type: ignore[arg-type]


def flip(row: int, other: int, size: int = 1) -> dict[str, Any]:
    return {"subset": "prefix", "size": size, "row": row, "other": other}


def test_a_step_that_chose_the_calls_argmax_with_its_scores_is_tied_to_it() -> None:
    pairs = tie([scored(0, [7, 3]), scored(1, [8, 4])], [step(0, (7, 3)), step(1, (8, 4))])
    assert [(c["call"], s.position) for c, s in pairs] == [(0, 0), (1, 1)]


def test_a_step_whose_scores_differ_from_the_calls_is_not_tied() -> None:
    assert tie([scored(0, [7, 3])], [step(0, (7, 3), [[2.5, 2.0], [1.0, 0.5]])]) == []


def test_a_sampled_step_is_never_tied() -> None:
    assert tie([scored(0, [7, 3])], [step(0, (7, 3), None)]) == []


def test_the_first_divergent_token_of_a_sequence_at_a_size_is_its_earliest_flip() -> None:
    calls = [scored(0, [7, 3]), scored(1, [8, 4], [flip(0, 9)]), scored(2, [5, 6], [flip(0, 1), flip(1, 2)])]
    tokens = tokens_at_size(calls, [step(0, (7, 3)), step(1, (8, 4)), step(2, (5, 6))])
    assert tokens is not None
    assert [(t.sequence, t.position, t.size, t.token, t.other) for t in tokens.first] == [(0, 1, 1, 8, 9),
                                                                                         (1, 2, 1, 6, 2)]


def test_a_divergent_tokens_margin_is_the_whole_batchs_top2_gap() -> None:
    tokens = tokens_at_size([scored(0, [7, 3], [flip(0, 9)])], [step(0, (7, 3))])
    assert tokens is not None
    assert tokens.earliest is not None
    assert tokens.earliest.margin == 2.5 - 2.4999998


def test_a_flip_in_a_call_no_step_chose_from_is_no_token() -> None:
    tokens = tokens_at_size([scored(0, [7, 3], [flip(0, 9)])], [step(0, (1, 3))])
    assert tokens is not None
    assert (tokens.first, tokens.tied, tokens.untied) == ((), 0, 1)


def test_a_script_that_decodes_nothing_has_no_token_answer() -> None:
    assert tokens_at_size([scored(0, [7, 3], [flip(0, 9)])], []) is None


def test_the_finding_reads_token_events_beside_the_probes() -> None:
    token = {"type": "token", "at": 0, "fn": "Tensor.argmax", "loc": "decode.py:9", "site": "decode.py:9", "n": 0,
             "rows": 2, "ids": [7, 3], "top2": TOP2}
    finding = analyse([scored(0, [7, 3], [flip(1, 2, size=1)]), token])
    assert finding.tokens is not None
    assert finding.tokens.earliest is not None
    assert (finding.tokens.earliest.sequence, finding.tokens.earliest.other) == (1, 2)


def test_a_row_without_finite_scores_in_both_still_ties_with_no_margin() -> None:
    top2 = [None, [1.0, 0.5]]
    tokens = tokens_at_size([scored(0, [7, 3], [flip(0, 9)], top2)], [step(0, (7, 3), top2)])
    assert tokens is not None
    assert [(t.sequence, t.margin) for t in tokens.first] == [(0, None)]
