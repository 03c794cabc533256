"""torch.compile causes: compiled-kernels (inductor's generated code accumulating in thread order,
or autotuning picking other kernels from run to run)."""

from __future__ import annotations

from typing import Any

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, detects, finding
from detaudit.events import CompileEvent
from detaudit.pin import Pin

TUNING = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning")
PARAM_KINDS = ("grad", "param", "optstate")


@detects(CauseId.COMPILED_KERNELS)
def compiled_kernels(ctx: Context) -> Finding | None:
    """A compiled model, run without deterministic algorithms: inductor's CPU and GPU kernels
    parallelise reductions and scatter-adds (an embedding's backward) with atomic adds."""
    events = ctx.ref.of(CompileEvent)
    if not events:
        return None
    inductor = events[-1].get("inductor") or {}
    if _deterministic(ctx, inductor):
        return None
    modules = sorted({str(e["module"]) for e in events if e.get("module")})
    rec = ctx.record
    inside = _in_compiled_code(ctx, modules)
    score = 0.8 if inside else 0.5
    where = f" on {', '.join(modules)}" if modules else ""
    lines = [f"torch.compile ran{where} (inductor backend) with deterministic algorithms off: its generated "
             "kernels may accumulate reductions and scatter-adds (an embedding's backward) in thread order"]
    tuned = [k for k in TUNING if inductor.get(k)]
    if tuned:
        score += 0.05
        lines.append(f"autotuning on ({', '.join(tuned)}): inductor times candidate kernels and keeps the fastest, "
                     "which can differ from run to run")
    env = {k: v for e in events for k, v in (e.get("env") or {}).items()}
    if env:
        lines.append("compile environment: " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    if inside and rec is not None and rec.kind in PARAM_KINDS:
        lines.append("the first divergence is in a parameter's gradient or update, which compiled backward kernels "
                     "produce")
    lines.append(f"first divergence: {ctx.where()}")
    fix = ("call `torch.use_deterministic_algorithms(True)` before the first compiled call: inductor then generates "
           "deterministic kernels")
    return finding("compiled-kernels", score, "compiled (inductor) kernels accumulate in an order that changes "
                   "from run to run", lines, fix, [Pin.DETERMINISTIC],
                   basis="direct" if inside else "circumstantial")


def _deterministic(ctx: Context, inductor: dict[str, Any]) -> bool:
    """Deterministic algorithms were on (torch's flag at the end or first step, or inductor's own config)."""
    flags = ctx.ref.flags_at("end") or ctx.ref.flags_at("first-step") or {}
    return bool(flags.get("deterministic_algorithms") or inductor.get("deterministic"))


def _in_compiled_code(ctx: Context, modules: list[str]) -> bool:
    """The first divergence is one compiled code makes: a parameter's gradient or update, or a compiled module's."""
    rec = ctx.record
    return rec is not None and (rec.kind in PARAM_KINDS or rec.module in modules or rec.name in modules)
