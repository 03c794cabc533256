"""Which devices the repeats run on: `cpu`, `cuda`, or `auto` (the script's own choice).

`auto` changes nothing: the script runs where it would under `python`, and the repeats are only
labelled (`cuda` where torch sees a GPU, else `cpu`) and compared bit for bit. Naming devices
(`--device cpu --device cuda`) compares across devices, CPU repeats seeing no GPU.
"""

from __future__ import annotations

import functools
import glob
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

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


def own_device(requested: Sequence[str]) -> bool:
    """True when no device was named: the script keeps its own device choice (`auto`)."""
    return all(d == "auto" for d in requested)


def resolve_devices(requested: Sequence[str]) -> list[str]:
    """Device labels: `auto` becomes the label of the script's own choice, `cuda` must exist;
    order kept, duplicates dropped."""
    resolved: list[str] = []
    for device in requested or ["auto"]:
        if device == "auto":
            device = "cuda" if cuda_available() else "cpu"
        elif device == "cuda" and not cuda_available():
            raise UsageError("--device cuda: no CUDA device is available to torch on this machine")
        if device not in resolved:
            resolved.append(device)
    return resolved


def oversubscription(jobs: int, devices: Sequence[str], env: Mapping[str, str], cores: int | None) -> str | None:
    """A warning when `--jobs` would run more CPU threads than there are cores, else None.

    Each CPU repeat's torch uses one thread per core unless OMP_NUM_THREADS says otherwise, so
    parallel repeats of a CPU-bound script compete for the same cores and finish later than
    sequential ones (and their timings get noisier). GPU repeats leave the cores mostly idle.
    """
    if jobs < 2 or "cpu" not in devices or not cores:
        return None
    try:
        threads = max(1, int(env.get("OMP_NUM_THREADS", "")))
        per = f"OMP_NUM_THREADS={threads}"
    except ValueError:
        threads, per = cores, "by default torch uses one thread per core"
    if jobs * threads <= cores:
        return None
    return (f"--jobs {jobs} runs {jobs} repeats at once on {cores} CPU cores, and each repeat's torch uses "
            f"{threads} thread(s) ({per}): a CPU-bound script will run slower than with --jobs 1. detaudit does "
            f"not lower the script's thread count (that would change its numerics); use --jobs 1, or set "
            f"OMP_NUM_THREADS so that jobs × threads ≤ cores.")
