"""recorder/evidence/tokens.py: a decode loop's choices recorded once they are fed back, nothing otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from evidence_sink import Sink
from torch import nn

from detaudit.recorder.evidence import generators, tokens
from detaudit.recorder.evidence.base import Evidence


@pytest.fixture
def watched(evidence: tuple[Evidence, Sink]) -> Iterator[tuple[tokens.Tokens, Sink]]:
    ev, sink = evidence
    found = tokens.install(ev, torch)
    try:
        yield found, sink
    finally:
        if found.hook is not None:
            found.hook.remove()


class Lm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.out = nn.Linear(8, 11)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids)[:, -1])


def lm() -> Lm:
    model = Lm()
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        nn.init.normal_(p, generator=gen)
    return model


def greedy(model: nn.Module, steps: int, sink: Sink | None = None) -> list[torch.Tensor]:
    """`model(ids)` on the whole sequence so far, the argmax appended (no cache)."""
    ids, chosen = torch.tensor([[1, 2], [3, 4], [5, 6]]), []
    with torch.no_grad():
        for step in range(steps):
            if sink is not None:
                sink.next_index = 100 + step  # type: ignore[attr-defined]  # the Recorder's next record index
            nxt = model(ids).argmax(dim=-1, keepdim=True)
            chosen.append(nxt)
            ids = torch.cat([ids, nxt], dim=1)
    return chosen


def test_each_fed_back_choice_is_a_token_event_with_its_ids_in_order(watched: Any) -> None:
    _, sink = watched
    chosen = greedy(lm(), 5)
    assert [e["ids"] for e in sink.of("token")] == [c.reshape(-1).tolist() for c in chosen]


def test_a_token_event_numbers_the_choice_at_its_site(watched: Any) -> None:
    _, sink = watched
    greedy(lm(), 5)
    assert [e["n"] for e in sink.of("token")] == [0, 1, 2, 3, 4]


def test_a_token_event_is_placed_at_the_record_index_of_its_choice_not_of_its_writing(watched: Any) -> None:
    # The important thing: the first choices are written only once the site is known to decode, later
    _, sink = watched
    greedy(lm(), 4, sink)
    assert [e["at"] for e in sink.of("token")] == [100, 101, 102, 103]


def test_a_choice_by_maximum_keeps_each_rows_two_largest_scores(watched: Any) -> None:
    _, sink = watched
    model = lm()
    greedy(model, 3)
    first = sink.of("token")[0]
    with torch.no_grad():
        top = model(torch.tensor([[1, 2], [3, 4], [5, 6]])).topk(2, dim=-1).values.tolist()
    assert first["top2"] == top


def test_a_sampled_choice_fed_back_one_token_at_a_time_is_recorded_without_scores(watched: Any) -> None:
    _, sink = watched
    model, ids = lm(), torch.tensor([[1], [2]])
    with torch.no_grad():
        for _ in range(4):
            ids = torch.multinomial(torch.softmax(model(ids), dim=-1), 1)
    assert [(e["fn"], e["rows"], e["top2"]) for e in sink.of("token")] == [("torch.multinomial", 2, None)] * 4


def test_topk_of_one_is_a_choice_and_its_indices_are_the_ids(watched: Any) -> None:
    _, sink = watched
    model, ids = lm(), torch.tensor([[1], [2]])
    seen = []
    with torch.no_grad():
        for _ in range(3):
            ids = torch.topk(model(ids), 1).indices
            seen.append(ids.reshape(-1).tolist())
    assert [e["ids"] for e in sink.of("token")] == seen


def test_an_argmax_that_is_never_fed_back_records_nothing(watched: Any) -> None:
    # an accuracy's argmax in a training loop: integer ids of one per row, at one line, step after step
    _, sink = watched
    model = nn.Linear(4, 3)
    for _ in range(tokens.CANDIDATE_CHOICES + 3):
        model(torch.randn(5, 4)).argmax(dim=-1)
    assert sink.of("token") == []


def test_a_site_that_is_never_fed_back_is_dropped_and_its_module_hook_removed(watched: Any) -> None:
    found, _ = watched
    model = nn.Linear(4, 3)
    for _ in range(tokens.CANDIDATE_CHOICES + 1):
        model(torch.randn(5, 4)).argmax(dim=-1)
    assert found.hook is None


def test_a_decoding_site_no_longer_needs_the_module_hook(watched: Any) -> None:
    found, _ = watched
    greedy(lm(), 4)
    assert found.hook is None


def test_choices_other_than_one_index_per_row_install_nothing(watched: Any) -> None:
    found, _ = watched
    scores = torch.randn(4, 6)
    scores.argmax()  # one index for the whole tensor
    scores.topk(3)  # three per row
    torch.multinomial(torch.ones(4, 6), 2)
    assert found.hook is None


def test_draw_evidence_keeps_each_multinomial_call_site_of_its_own(watched: Any) -> None:
    # The important thing: the draws' wrapper stands outside this one (the order evidence/__init__.py installs
    # them in), so the call site it keys draws by is the script's line, not a line of detaudit's wrapper
    found, sink = watched
    generators.install_torch(found.ev, torch)
    probs = torch.ones(2, 5)
    torch.multinomial(probs, 1)
    torch.multinomial(probs, 1)
    assert len(sink.of("draw")) == 2


def test_a_choice_under_the_draws_wrapper_is_placed_at_the_scripts_line(watched: Any) -> None:
    found, sink = watched
    generators.install_torch(found.ev, torch)
    model, ids = lm(), torch.tensor([[1], [2]])
    with torch.no_grad():
        for _ in range(3):
            ids = torch.multinomial(torch.softmax(model(ids), dim=-1), 1)
    assert {Path(e["site"].split(":")[0]).name for e in sink.of("token")} == {"test_evidence_tokens.py"}


def test_an_empty_integer_input_is_no_feed_and_no_error(watched: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _, sink = watched
    embed = nn.Embedding(5, 2)
    for _ in range(3):
        torch.multinomial(torch.ones(2, 5), 1)
        embed(torch.zeros(2, 0, dtype=torch.long))
    assert (sink.of("token"), capsys.readouterr().err) == ([], "")
