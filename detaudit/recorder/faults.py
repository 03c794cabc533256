"""Test-only fault injector: make one op behave like a nondeterministic CUDA kernel on a CPU machine.

Enabled only by the environment variable DETAUDIT_TEST_FAULT (JSON); nothing else reads it. The
end-to-end tests use it to exercise the CUDA-only detectors (cudnn-benchmark, cublas-workspace,
tf32, nondeterministic CUDA ops) where no GPU exists. It changes two things, both honestly
labelled as simulated in the evidence:

- evidence reports the device as `device` (e.g. "cuda") for ops, modules and graphs;
- the op `op` (a dotted path under torch) is perturbed while the real flag condition `when` holds,
  read at call time: "nondeterministic" (deterministic algorithms off), "cudnn-benchmark"
  (torch.backends.cudnn.benchmark on), "cublas" (CUBLAS_WORKSPACE_CONFIG not :4096:8 / :16:8) give
  a tiny per-call random change like atomics in another order; "tf32" (TF32 allowed) rounds the
  output to TF32 precision, deterministically, as a TF32 GPU would differ from the CPU.
  Pinning the condition away (--explain) removes the fault, as it would remove the real one.

Example: DETAUDIT_TEST_FAULT='{"op": "torch.nn.functional.conv2d", "when": "cudnn-benchmark"}'
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from detaudit.recorder.patch import wrap

ENV = "DETAUDIT_TEST_FAULT"


def _holds(when: str, torch: Any) -> bool:
    if when == "nondeterministic":
        return not torch.are_deterministic_algorithms_enabled()
    if when == "cudnn-benchmark":
        return bool(torch.backends.cudnn.benchmark)
    if when == "cublas":
        return os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8")
    if when == "tf32":
        return bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
    raise ValueError(f"{ENV}: unknown condition {when!r}")


def _jitter() -> float:
    return 1.0 + (1 + int.from_bytes(os.urandom(2), "little")) * 2.0 ** -22


def _tf32(torch: Any, t: Any) -> Any:
    bits = t.detach().contiguous().view(torch.int32)
    rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return t + (rounded - t.detach())


def install(evidence: Any, torch: Any) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    try:
        fault = json.loads(spec)
    except ValueError:
        print(f"detaudit: ignoring {ENV}: not valid JSON", file=sys.stderr)
        return
    evidence.device_as = fault.get("device", "cuda")
    owner_path, name = fault["op"].rsplit(".", 1)
    owner: Any = torch
    for part in owner_path.split(".")[1:]:
        owner = getattr(owner, part)
    when = fault["when"]

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(*args: Any, **kwargs: Any) -> Any:
            if not _holds(when, torch):
                return original(*args, **kwargs)
            if name.endswith("_"):  # in place: perturb the last tensor operand, out of place
                i = max(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
                args = (*args[:i], args[i] * _jitter(), *args[i + 1:])
                return original(*args, **kwargs)
            out = original(*args, **kwargs)
            return _tf32(torch, out) if when == "tf32" else out * _jitter()

        return faulty

    if not wrap(owner, name, make):
        raise AttributeError(f"{ENV}: torch has no {fault['op']}")
