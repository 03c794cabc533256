"""Which devices the repeats run on: `cpu`, `cuda`, or `auto` (CPU, plus CUDA where present)."""

from __future__ import annotations

import functools
import glob
import shutil
import subprocess
import sys
from collections.abc import Sequence

from detaudit.errors import UsageError

_PROBE = "import torch, sys; sys.stdout.write('1' if torch.cuda.is_available() else '0')"


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """Ask a fresh interpreter (never import torch in detaudit's own process just for this)."""
    if not (glob.glob("/dev/nvidia[0-9]*") or shutil.which("nvidia-smi") or glob.glob("/dev/kfd")):
        return False
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "1"


def resolve_devices(requested: Sequence[str]) -> list[str]:
    """Expand `auto` and check that `cuda` exists; order kept, duplicates dropped."""
    resolved: list[str] = []
    for device in requested or ["auto"]:
        if device == "auto":
            wanted = ["cpu", "cuda"] if cuda_available() else ["cpu"]
        elif device == "cuda":
            if not cuda_available():
                raise UsageError("--device cuda: no CUDA device is available to torch on this machine")
            wanted = ["cuda"]
        else:
            wanted = [device]
        resolved.extend(d for d in wanted if d not in resolved)
    return resolved
