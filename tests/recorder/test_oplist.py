"""Parsing torch's nondeterministic-op list from its docstring, and matching calls and autograd nodes."""

from __future__ import annotations

import torch

from detaudit.recorder import oplist

DOC = """
    The following normally-nondeterministic operations will act
    deterministically when ``mode=True``:

        * :class:`torch.nn.Conv2d` when called on CUDA tensor
        * :func:`torch.Tensor.__getitem__` when attempting to differentiate a CPU tensor
          and the index is a list of tensors
        * :func:`torch.Tensor.index_put` with ``accumulate=True`` when called on a CPU
          tensor
        * :func:`torch.Tensor.scatter_reduce` when ``reduce='sum'`` or ``reduce='mean'`` and called on CUDA tensor
        * :func:`torch.bmm` when called on sparse-dense CUDA tensors

    The following normally-nondeterministic operations will throw a
    :class:`RuntimeError` when ``mode=True``:

        * :class:`torch.nn.MaxUnpool2d`
        * :func:`torch.Tensor.put_` when ``accumulate=False``

    A handful of CUDA operations are nondeterministic if the CUDA version is
    10.2 or greater...
"""


def test_parse_entries_with_wrapped_lines_and_both_lists() -> None:
    entries = {e.key: e for e in oplist.parse(DOC)}
    assert list(entries) == ["conv2d", "getitem", "indexput", "scatterreduce", "bmm", "maxunpool2d", "put"]
    assert entries["getitem"].backward
    assert entries["getitem"].devices == {"cpu"}
    assert "list of tensors" in entries["getitem"].text
    assert entries["indexput"].conditions == (("accumulate", "True"),)
    assert not entries["indexput"].raises
    assert entries["put"].raises
    assert entries["maxunpool2d"].devices == frozenset()


def test_applies_checks_device_grad_and_arguments() -> None:
    entries = {e.key: e for e in oplist.parse(DOC)}
    assert oplist.applies(entries["indexput"], "cpu", False, {"accumulate": "True"})
    assert not oplist.applies(entries["indexput"], "cpu", False, {"accumulate": "False"})
    assert not oplist.applies(entries["indexput"], "cuda", False, {"accumulate": "True"})
    assert not oplist.applies(entries["getitem"], "cpu", False, {})
    assert oplist.applies(entries["scatterreduce"], "cuda", False, {"reduce": "mean"})
    assert not oplist.applies(entries["scatterreduce"], "cuda", False, {"reduce": "prod"})


def test_node_names_map_to_docstring_keys() -> None:
    assert oplist.node_keys("IndexBackward0") == ("getitem",)
    assert oplist.node_keys("MaxPool3DWithIndicesBackward0") == ("maxpool3d",)
    assert oplist.node_keys("UpsampleBilinear2DBackward1") == ("interpolate",)
    assert "conv2d" in oplist.node_keys("ConvolutionBackward0")
    assert oplist.op_key("aten.index_put_.default") == oplist.op_key("torch.Tensor.index_put") == "indexput"


def test_the_running_torch_lists_the_cpu_index_put_family() -> None:
    keys = {e.key for e in oplist.parse(torch.use_deterministic_algorithms.__doc__ or "")}
    assert {"indexput", "put", "getitem", "indexadd", "scatteradd"} <= keys


def test_an_entry_for_sparse_inputs_applies_to_sparse_inputs_only() -> None:
    bmm = next(e for e in oplist.parse(DOC) if e.key == "bmm")
    assert bmm.conditions == (("layout", "sparse"),)
    assert oplist.applies(bmm, "cuda", True, {"layout": "sparse"})
    assert not oplist.applies(bmm, "cuda", True, {"layout": "strided"})


def test_only_the_image_form_of_nll_loss_stands_for_torchs_nllloss_entry() -> None:
    """cross_entropy over (N, C) logits (nanoGPT's, every classifier's) runs nll_loss, deterministic on CUDA."""
    assert oplist.node_keys("NllLossBackward0") == ()


def test_the_image_form_of_nll_loss_stands_for_torchs_nllloss_entry() -> None:
    assert oplist.node_keys("NllLoss2DBackward0") == ("nllloss",)


def test_a_convolution_key_names_its_dimensionality_and_transposition() -> None:
    assert (oplist.conv_key(2, False), oplist.conv_key(1, True)) == ("conv2d", "convtranspose1d")
