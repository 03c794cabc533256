"""recorder/batchknob.py: the installed torch's batch-invariance setting."""

from __future__ import annotations

import sys

from detaudit.recorder.batchknob import KNOB, batch_invariant_knob


def test_torch_2_13_has_inductors_batch_invariant_setting_found_without_importing_it() -> None:
    loaded = "torch._inductor.config" in sys.modules
    assert batch_invariant_knob() == KNOB
    assert ("torch._inductor.config" in sys.modules) == loaded
