"""recorder/batchorigin.py: which watched ops' results reach a probed module's output (Flow)."""

from __future__ import annotations

import torch

from detaudit.recorder.batchorigin import Flow


def test_a_value_kept_aside_for_logging_does_not_reach_the_output() -> None:
    flow = Flow()
    x = torch.ones(3)
    h = x * 2
    flow.op((x,), h)  # op 0: the row's computation
    kept = h.mean()
    flow.op((h,), kept)  # op 1: a statistic the forward keeps aside
    out = h + 1
    flow.op((h,), out)  # op 2: the output
    assert flow.reaching(out) == {0, 2}


def test_a_value_turned_into_a_python_number_counts_as_reaching() -> None:
    flow = Flow()
    x = torch.ones(3)
    flow.op((x,), True)  # op 0: a comparison whose bool steers the forward
    out = x + 1
    flow.op((x,), out)  # op 1
    assert flow.reaching(out) == {0, 1}
