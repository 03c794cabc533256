"""The greedy token each row of a probed call would get, in the whole batch and in each probe.

A decode loop chooses its next token from the model's output at the last position (`logits[:, -1].argmax(-1)`).
For a probed call whose output has such scores (the first floating output tensor with the batch's rows along the
batch dim and a last dim of at least two entries beside it), the whole batch's argmax and top-2 per row are kept,
and each probe's argmax for the same rows is compared with them: a row whose argmax differs is a token that
would have been chosen differently had that row been in the probe's batch, given the same prefix. Whether the
script's choice was made from these scores is decided by the reader (batch/decoding.py), against the script's own
`token` events (recorder/evidence/tokens.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from detaudit.batch_events import BatchChoice, BatchFlip, SubsetKind
from detaudit.recorder.core import iter_tensors

MAX_ROWS = 256  # rows whose choice is kept per call (as the token events keep)
MAX_FLIPS = 64  # flips kept per call


def last_scores(value: Any, n: int, d: int) -> tuple[str, torch.Tensor] | None:
    """(path, an (n, vocab) float tensor): each row's scores at the last position of the first floating output
    tensor with `n` rows along `d` and a last dim of two or more other than `d`; None when there is none."""
    for path, t in iter_tensors(value, "output"):
        if t.is_floating_point() and t.dim() >= 2 and d < t.dim() - 1 and t.shape[d] == n and t.shape[-1] >= 2:
            return path, t.detach().movedim(d, 0).reshape(n, -1, t.shape[-1])[:, -1, :]
    return None


def choice(path: str, scores: torch.Tensor) -> BatchChoice:
    """The whole batch's choice per row (its first MAX_ROWS rows), with no flips yet: argmax's (on a tie, the first
    index, as the script's argmax picks; topk may pick another), and the two largest scores (None where not finite,
as the token events keep them)."""
    kept = scores[:MAX_ROWS]
    top = torch.topk(kept.float(), 2, dim=-1).values.tolist()
    return BatchChoice(output=path, ids=torch.argmax(kept, dim=-1).tolist(), flips=[],
                       top2=[[a, b] if math.isfinite(a) and math.isfinite(b) else None for a, b in top])


def flips(whole: BatchChoice, vocab: int, scores: torch.Tensor | None, ref: torch.Tensor, got: torch.Tensor,
          kind: SubsetKind, size: int) -> list[BatchFlip]:
    """The rows (`ref` in the whole batch, `got` in the probe's `scores`) whose argmax the probe changed; a probe
    without such scores over the same `vocab` (its output changed shape) changes none that can be told."""
    if scores is None or scores.shape[-1] != vocab:
        return []
    kept = ref < len(whole["ids"])
    rows, theirs = ref[kept].tolist(), torch.argmax(scores[got[kept]], dim=-1).tolist()
    return [BatchFlip(subset=kind, size=size, row=r, other=o) for r, o in zip(rows, theirs, strict=True)
            if o != whole["ids"][r]]


class Choices:
    """One probed call's choices: the whole batch's (None when its output has no scores to choose over), and the
    flips its probes found."""

    def __init__(self, control: Any, n: int, d: int) -> None:
        self.d = d
        scored = last_scores(control, n, d)
        self.vocab = 0 if scored is None else scored[1].shape[-1]
        self.whole: BatchChoice | None = None if scored is None else choice(*scored)

    def probe(self, got: Any, kind: SubsetKind, size: int, ref: torch.Tensor, mine: torch.Tensor) -> None:
        """A probe whose rows differ: its flips, up to MAX_FLIPS for the call."""
        if self.whole is None or len(self.whole["flips"]) >= MAX_FLIPS:
            return
        theirs = last_scores(got, size, self.d)
        found = flips(self.whole, self.vocab, None if theirs is None else theirs[1], ref, mine, kind, size)
        self.whole["flips"] += found[:MAX_FLIPS - len(self.whole["flips"])]
