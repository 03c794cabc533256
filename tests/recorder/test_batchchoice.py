"""recorder/batchchoice.py: the greedy choice per row of a probed call's output, and the probes that change it."""

from __future__ import annotations

import torch

from detaudit.recorder.batchchoice import Choices, last_scores


def test_the_scores_are_each_rows_last_position() -> None:
    logits = torch.arange(24.0).reshape(2, 3, 4)
    found = last_scores(logits, 2, 0)
    assert found is not None
    assert torch.equal(found[1], logits[:, -1])


def test_an_output_without_a_dim_to_choose_over_has_no_scores() -> None:
    assert last_scores(torch.zeros(2, 3, dtype=torch.long), 2, 0) is None


def test_scores_are_read_along_the_batch_dim() -> None:
    logits = torch.arange(24.0).reshape(3, 2, 4)  # (time, batch, vocab)
    found = last_scores(logits, 2, 1)
    assert found is not None
    assert torch.equal(found[1], logits[-1])


def test_the_whole_batchs_choice_keeps_each_rows_argmax_and_top2() -> None:
    choices = Choices(torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.5]])[:, None, :], 2, 0)
    assert choices.whole is not None
    assert (choices.whole["ids"], choices.whole["top2"]) == ([1, 0], [[3.0, 1.0], [2.0, 1.5]])


def test_a_probe_whose_argmax_differs_for_a_row_is_a_flip_with_its_token() -> None:
    choices = Choices(torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.5]]).unsqueeze(1), 2, 0)
    choices.probe(torch.tensor([[[0.0, 3.0, 3.5]]]), "prefix", 1, torch.arange(1), torch.arange(1))
    assert choices.whole is not None
    assert choices.whole["flips"] == [{"subset": "prefix", "size": 1, "row": 0, "other": 2}]


def test_a_probe_that_keeps_every_argmax_has_no_flip() -> None:
    choices = Choices(torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.5]]).unsqueeze(1), 2, 0)
    choices.probe(torch.tensor([[2.0, 0.0, 1.4], [0.0, 3.0, 1.1]]).unsqueeze(1), "reversed", 2,
                  torch.tensor([1, 0]), torch.arange(2))
    assert choices.whole is not None
    assert choices.whole["flips"] == []


def test_a_tied_rows_choice_is_the_first_index_as_argmax_picks() -> None:
    scores = torch.zeros(1, 1, 8)
    scores[0, 0, 2] = scores[0, 0, 7] = 1.0  # topk puts index 7 first here (torch 2.13, CPU)
    choices = Choices(scores, 1, 0)
    assert choices.whole is not None
    assert choices.whole["ids"] == [2]


def test_a_row_without_two_finite_scores_keeps_no_top2() -> None:
    choices = Choices(torch.tensor([[[1.0, float("nan"), 0.0]], [[2.0, 1.0, 0.0]]]), 2, 0)
    assert choices.whole is not None
    assert choices.whole["top2"] == [None, [2.0, 1.0]]
