"""`detaudit batch`: the installed torch's own batch-invariance setting, if it has one, for the fix to name.

torch 2.13 has one, for compiled code only: `torch._inductor.config.batch_invariant` (environment
`TORCHINDUCTOR_BATCH_INVARIANT=1`) makes Inductor's generated persistent reductions keep one blocking whatever
the batch size (and implies Inductor's deterministic mode). No eager kernel (aten's matmuls and reductions on
CPU or CUDA) has a batch-invariant mode; `torch.use_deterministic_algorithms` makes runs repeat at one shape,
which is another property.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

KNOB = "torch._inductor.config.batch_invariant"
_DEFINED = re.compile(r"^batch_invariant\s*[:=]", re.MULTILINE)


def batch_invariant_knob() -> str | None:
    """KNOB when the installed torch defines it, else None. Read from Inductor's config source unless it is loaded
    already: importing it costs seconds, and a probe must not import what the script did not."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        return KNOB if hasattr(config, "batch_invariant") else None
    source = Path(torch.__file__).parent / "_inductor" / "config.py"
    try:
        return KNOB if _DEFINED.search(source.read_text(encoding="utf-8")) else None
    except OSError:
        return None
