"""torch.compile: what detaudit's hooks and wrappers do when dynamo traces or runs compiled code.

Dynamo traces a compiled module's forward, and with it every global module hook and every
function detaudit wraps (`torch.randn`, `dropout`, listed ops) that the forward calls. Anything a
hook does there (a dict lookup on a module, `sys._getframe`, a trace write) would raise inside
tracing, insert a graph break or add guards that force recompiles, and so change what the script
computes (a graph break moves dropout from inductor's RNG to eager's). So every hook and wrapper
starts with `compiling()`: while dynamo traces, it is the constant True, the hook returns at once
and leaves nothing in the graph; in eager code it is one C call.

What holds under compile (docs/granularity.md): the compiled module's boundary (its input batch and
output, recorded eagerly around the compiled call: `torch.compile(model)` runs the root module's
hooks outside dynamo), gradients, parameters and optimizer state at each optimizer step, and
`torch.save`. Submodules inside a compiled region are not recorded; at op granularity the op
recorder sees eager code only (`OpRecorder.ignore_compile_internals`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from detaudit.events import CompileEvent

_compiler = getattr(torch, "compiler", None)
compiling: Callable[[], bool] = getattr(_compiler, "is_compiling", None) or (lambda: False)

WRAPPER_ATTR = "_orig_mod"
# inductor settings that decide whether compiled kernels are reproducible
INDUCTOR_FLAGS = ("deterministic", "max_autotune", "max_autotune_gemm", "max_autotune_pointwise",
                  "coordinate_descent_tuning", "fallback_random", "freezing", "cpp_wrapper")


def is_wrapper(module: torch.nn.Module) -> bool:
    """True for the `OptimizedModule` that `torch.compile(model)` returns: it only forwards to
    `model`, which is named and recorded as if it had not been compiled."""
    cls = type(module)
    return cls.__name__ == "OptimizedModule" and cls.__module__.startswith("torch._dynamo")


def plain_name(qual: str) -> str:
    """A qualified name without the `_orig_mod` hops compiled submodules add (`enc._orig_mod.fc` -> `enc.fc`)."""
    if WRAPPER_ATTR not in qual:
        return qual
    return ".".join(p for p in qual.split(".") if p != WRAPPER_ATTR)


def evidence() -> CompileEvent:
    """What decides compiled numerics: inductor's settings, the compile environment, frames compiled."""
    import sys

    dynamo = sys.modules.get("torch._dynamo.utils")
    config = sys.modules.get("torch._inductor.config")
    frames = 0
    counters = getattr(dynamo, "counters", None)
    if counters is not None:
        frames = int(counters.get("frames", {}).get("ok", 0))
    flags: dict[str, bool | int | float | str | None] = {}
    if config is not None:
        for name in INDUCTOR_FLAGS:
            value = getattr(config, name, None)
            if isinstance(value, (bool, int, float, str)) or value is None:
                flags[name] = value
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCH_COMPILE")) and not k.endswith("CACHE_DIR")}
    return CompileEvent(type="compile", frames=frames, inductor=flags, env=env)


def was_used() -> bool:
    """Whether dynamo compiled anything in this process (its modules load only when something is compiled)."""
    import sys

    dynamo = sys.modules.get("torch._dynamo.utils")
    counters = getattr(dynamo, "counters", None)
    return counters is not None and bool(counters.get("frames", {}).get("ok"))
