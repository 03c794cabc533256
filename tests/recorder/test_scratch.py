"""Op outputs that are no results (detaudit/recorder/scratch.py): the rule read from derivative formulas."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence

import pytest
import torch

from detaudit.recorder import scratch
from detaudit.recorder.scratch import is_scratch_argument, parse, results, scratch_outputs, tensor_indices

# backward ops as a schema would name their arguments
SCHEMAS = {
    "rnn_layer_backward": [["input", "output", "grad_output", "workspace"]],
    "norm_backward": [["grad", "input", "save_mean", "save_invstd", "reserveSpace"]],
    "dropout_backward": [["grad", "mask", "scale"]],
    "sigmoid_backward": [["grad", "self", "buffer"]],
}


def arguments(name: str) -> Sequence[Sequence[str]]:
    return SCHEMAS.get(name, [])


DERIVATIVES = """\
- name: rnn_layer(Tensor input, Tensor weight, bool train) -> (Tensor, Tensor, Tensor)
  output_differentiability: [True, True, False]
  input, weight: "GradMode::is_enabled() ? differentiable_backward(input, result0, result2) : rnn_layer_backward(input,
    result0, grads[0], retain_variables ? result2.clone() : result2)"

- name: norm(Tensor input, float eps) -> (Tensor, Tensor, Tensor, Tensor)
  dispatch:
    Default:
      input: norm_backward(grad, input, result1, result2, result3)

- name: dropout(Tensor input, float p) -> (Tensor, Tensor)
  input: dropout_backward(grad, result1, 1. / (1. - p))

- name: sigmoid_forward.out(Tensor self) -> (Tensor output, Tensor buffer)
  self: sigmoid_backward(grad, self, buffer)
"""


def test_an_output_passed_as_a_workspace_or_reserve_is_no_result_and_saved_statistics_and_masks_are() -> None:
    assert parse(DERIVATIVES, arguments) == {"rnn_layer": frozenset({2}), "norm": frozenset({3})}


@pytest.mark.parametrize("name", ["workspace", "reserve", "reserveSpace", "reservedSpace", "reserve_space",
                                  "cudnn_workspace"])
def test_names_of_scratch_memory_are_scratch_arguments(name: str) -> None:
    assert is_scratch_argument(name)


@pytest.mark.parametrize("name", ["save_mean", "save_invstd", "mask", "buffer", "momentum_buffer_list", "input",
                                  "reserved_bits", "workspaces_used"])
def test_names_of_values_are_not(name: str) -> None:
    assert not is_scratch_argument(name)


def test_the_running_torch_sets_aside_onednns_lstm_workspace_and_cudnns_reserves() -> None:
    aten = torch.ops.aten
    assert [scratch_outputs(op) for op in (aten.mkldnn_rnn_layer.default, aten._cudnn_rnn.default,
                                           aten.cudnn_batch_norm.default)] == [frozenset({3})] * 3


def test_the_running_torch_keeps_batch_norms_statistics_dropout_masks_and_pooling_indices_as_results() -> None:
    aten = torch.ops.aten
    ops = (aten.native_batch_norm.default, aten._fused_dropout.default, aten.native_dropout.default,
           aten.max_pool2d_with_indices.default, aten.mm.default)
    assert [scratch_outputs(op) for op in ops] == [frozenset()] * len(ops)


def test_positions_become_indices_among_the_results_tensors() -> None:
    t = torch.zeros(1)
    assert tensor_indices((t, [t, t], None, t), frozenset({3})) == frozenset({3})
    assert tensor_indices((t, [t, t], t), frozenset({1})) == frozenset({1, 2})


def test_a_result_without_its_scratch_outputs_keeps_the_others_in_place() -> None:
    a, b = torch.zeros(1), torch.ones(1)
    assert results((a, b), frozenset({1})) == (a, None)
    assert results(a, frozenset({1})) is a


@pytest.fixture
def fresh_table() -> Iterator[None]:
    scratch._table.cache_clear()
    yield
    scratch._table.cache_clear()


def test_a_torch_whose_formulas_cannot_be_read_sets_nothing_aside_and_never_fails(
        fresh_table: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str) -> None:
        raise ValueError(name)

    monkeypatch.setattr(importlib.util, "find_spec", broken)
    assert scratch_outputs(torch.ops.aten.mkldnn_rnn_layer.default) == frozenset()
