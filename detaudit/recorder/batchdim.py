"""`detaudit batch`: which dim of a probed call's tensor arguments holds its rows (docs/batch.md, "The batch").

The rule, in order of evidence (the first that answers decides):

1. `--batch-dim D`: the user's word, for every call;
2. the layers' own declaration: a layer that states where its batch is (`batch_first` of `nn.LSTM`, `nn.GRU`,
   `nn.RNN`, `nn.MultiheadAttention`, `nn.Transformer` and the transformer layers' attention; an RNN cell's
   input is (batch, features)), called inside the probed call, gives the batch's size. The call's batch dim
   is the dim of its first tensor argument that has that size. A sequence-first model (`batch_first=False`:
   input (seq, batch, feature)) is so probed along dim 1, and a model that transposes (batch, seq) token ids
   into a sequence-first encoder along dim 0. When two dims of that argument have the size (a sequence as long
   as the batch) or none has it, the batch cannot be told: the call is not probed (`batch-dim-unknown`);
3. otherwise dim 0, the convention PyTorch's batch-invariance harness also takes; the report says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

BatchDimSource = Literal["option", "declared", "convention"]


@dataclass(frozen=True)
class Declared:
    """A layer called inside a probed call that states where its batch is, and the batch size it saw."""

    layer: str  # `rnn (LSTM, batch_first=False)`
    size: int


@dataclass(frozen=True)
class BatchDim:
    """The batch dim of one call (None: it cannot be told), where that answer came from, and why, in words."""

    dim: int | None
    source: BatchDimSource
    detail: str
    size: int | None = None  # the batch's size where a layer declared it (None: the arguments' most common one)


def _first_input(args: Any) -> Any:
    return args[0] if isinstance(args, tuple) and args else None


def declared_batch(module: nn.Module, args: Any, name: str | None) -> Declared | None:
    """The batch size a layer declares for this call from its first argument (positional), or None: not such a
    layer, or an unbatched input."""
    first = _first_input(args)
    label = f"{name or type(module).__name__} ({type(module).__name__}"
    if isinstance(module, nn.RNNCellBase):
        if isinstance(first, torch.Tensor) and first.dim() == 2:
            return Declared(label + ": input (batch, features))", int(first.shape[0]))
        return None
    if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        batch_first = getattr(module.self_attn, "batch_first", None)
    elif isinstance(module, (nn.RNNBase, nn.MultiheadAttention, nn.Transformer)):
        batch_first = getattr(module, "batch_first", None)
    else:
        return None
    if not isinstance(batch_first, bool):
        return None
    label += f", batch_first={batch_first})"
    if isinstance(first, nn.utils.rnn.PackedSequence):
        return Declared(label, int(first.batch_sizes[0]))
    if isinstance(first, torch.Tensor) and first.dim() == 3:
        return Declared(label, int(first.shape[0 if batch_first else 1]))
    return None


def decide(shapes: Sequence[tuple[int, ...]], option: int | None, declared: Sequence[Declared]) -> BatchDim:
    """The batch dim of a call whose tensor arguments have `shapes` (in order), by the rule above."""
    if option is not None:
        return BatchDim(option, "option", f"dim {option}, as --batch-dim says")
    if not declared:
        return BatchDim(0, "convention", "dim 0: no layer in the call declares where its batch is, so the "
                                         "convention (PyTorch's harness takes it too); --batch-dim D for another")
    sizes = dict.fromkeys(d.size for d in declared)
    more = len(declared) - 1
    who = declared[0].layer + (f" and {more} other layer call{'s' if more > 1 else ''}" if more else "")
    declares = "declares" if not more else "declare"
    told = " or ".join(str(s) for s in sizes)
    first = next((shape for shape in shapes if any(s in sizes for s in shape)), None)
    if first is None:
        return BatchDim(None, "declared", f"{who} {declares} a batch of {told} rows, and no tensor argument has a "
                                          "dim of that size: which dim holds the rows cannot be told "
                                          "(--batch-dim D)")
    dims = [i for i, s in enumerate(first) if s in sizes]
    if len(dims) > 1:
        return BatchDim(None, "declared", f"{who} {declares} a batch of {told} rows, and dims "
                                          f"{', '.join(map(str, dims))} of the first argument {tuple(first)} all "
                                          "have that size: which holds the rows cannot be told (--batch-dim D)")
    return BatchDim(dims[0], "declared", f"dim {dims[0]}: {who} {declares} a batch of {told} rows", first[dims[0]])
