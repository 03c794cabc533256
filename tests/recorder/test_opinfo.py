"""recorder/opinfo.py: the tables and per-op facts the op recorder works from."""

from __future__ import annotations

import torch

from detaudit.recorder.opinfo import tensors_in


def test_the_tensors_of_a_nested_argument_come_in_order() -> None:
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert [t.item() for t in tensors_in([a, (b, 5, [c]), "x"])] == [0.0, 1.0, 2.0]
