"""recorder/batchdim.py: which dim of a probed call's arguments holds its rows."""

from __future__ import annotations

import torch
from torch import nn

from detaudit.recorder.batchdim import Declared, decide, declared_batch

_LSTM = Declared("rnn (LSTM, batch_first=False)", 16)


def test_the_option_decides_whatever_the_layers_declare() -> None:
    assert decide([(12, 16, 8)], 2, [_LSTM]).dim == 2


def test_a_declared_batch_is_the_dim_of_the_first_argument_with_its_size() -> None:
    dim = decide([(12, 16, 8)], None, [_LSTM])
    assert (dim.dim, dim.source) == (1, "declared")


def test_a_declared_batch_keeps_its_size_for_the_arguments_beside_it() -> None:
    assert decide([(12, 16, 8), (12, 12), (16, 12)], None, [_LSTM]).size == 16


def test_token_ids_transposed_into_a_sequence_first_layer_keep_their_batch_at_dim_0() -> None:
    assert decide([(16, 12)], None, [_LSTM]).dim == 0


def test_a_sequence_as_long_as_the_batch_cannot_be_told_from_it() -> None:
    dim = decide([(16, 16, 8)], None, [_LSTM])
    assert dim.dim is None
    assert "dims 0, 1" in dim.detail


def test_a_declared_batch_no_argument_has_cannot_be_placed() -> None:
    assert decide([(12, 5, 8)], None, [_LSTM]).dim is None


def test_without_a_declaration_dim_0_is_the_convention() -> None:
    dim = decide([(12, 16, 8)], None, [])
    assert (dim.dim, dim.source) == (0, "convention")


def test_rnn_and_attention_layers_declare_their_batch_by_batch_first() -> None:
    x = torch.zeros(12, 16, 8)
    assert declared_batch(nn.LSTM(8, 4), (x,), "rnn") == Declared("rnn (LSTM, batch_first=False)", 16)
    assert declared_batch(nn.GRU(8, 4, batch_first=True), (x,), None) == Declared("GRU (GRU, batch_first=True)", 12)
    assert declared_batch(nn.MultiheadAttention(8, 2), (x, x, x), "attn").size == 16  # type: ignore[union-attr]
    layer = nn.TransformerEncoderLayer(8, 2, batch_first=True)
    assert declared_batch(layer, (x,), "layer").size == 12  # type: ignore[union-attr]


def test_an_rnn_cell_declares_a_batch_of_its_inputs_rows_and_other_layers_nothing() -> None:
    assert declared_batch(nn.GRUCell(8, 4), (torch.zeros(5, 8),), "cell").size == 5  # type: ignore[union-attr]
    assert declared_batch(nn.LSTM(8, 4), (torch.zeros(12, 8),), "rnn") is None  # unbatched
    assert declared_batch(nn.Linear(8, 4), (torch.zeros(12, 8),), "fc") is None

