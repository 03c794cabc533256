"""The numerics-relevant environment of a repeat, read from torch when the script ends.

Stored in the trace footer (`environment`) so a baseline can say what changed since it was
recorded ("torch 2.12 -> 2.13, 4 -> 2 threads") next to a divergence. Read at the end, not at
import: the script may change threads or flags after importing torch. Never initialises CUDA.
"""

from __future__ import annotations

import os
from typing import Any

ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED",
            "CUDA_VISIBLE_DEVICES")


def torch_environment(torch: Any) -> dict[str, Any]:
    """torch's version, build, threads and determinism flags, plus the environment variables that steer them."""
    cuda_used = torch.cuda.is_initialized()
    env: dict[str, Any] = {
        "torch": str(torch.__version__),
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "gpu": torch.cuda.get_device_name(torch.cuda.current_device()) if cuda_used else None,
    }
    for name in ENV_VARS:
        env[f"env {name}"] = os.environ.get(name)
    return env
