"""Collective cause: collective-algorithm for a torchrun rank that received the difference (docs/distributed.md).

NCCL runs with an unpinned algorithm are flags.collective_algorithm's (same id); this detector covers
the rest: any backend, from the rank's role and DDP's reducer settings.

A rank whose first difference is a gradient DDP (or the script) all-reduced, while everything it
computed locally before matched, received the difference through the collective. When no rank
is an origin (ranks.py reports such a receiver only then), the reduction itself is the suspect:
its summation order is set by the backend's algorithm (NCCL's ring or tree, its protocol and
channel count; DDP's bucket layout) and floating-point sums depend on that order.
"""

from __future__ import annotations

from typing import Any

from detaudit.cause_table import CauseId
from detaudit.causes import flags
from detaudit.causes.context import LIKELY, Context, Finding, detects, finding
from detaudit.errors import TraceError
from detaudit.events import CollectiveEvent, DdpEvent
from detaudit.trace import RecordStream

FED = ("grad", "param", "optstate")


def _collective_env(ctx: Context) -> list[dict[str, Any]]:
    envs = []
    for r in ctx.involved:
        try:
            header = RecordStream(r.path).header
        except (TraceError, OSError):
            return []
        dist = header.get("distributed") if isinstance(header, dict) else None
        envs.append(dist.get("collective_env", {}) if isinstance(dist, dict) else {})
    return envs


@detects(CauseId.COLLECTIVE_ALGORITHM)
def collective_algorithm(ctx: Context) -> Finding | None:
    rec = ctx.record
    if rec is None or rec.kind not in FED or ctx.divergence.category != "content":
        return None
    reducers: list[DdpEvent | CollectiveEvent] = [
        *ctx.ref.of(DdpEvent), *[e for e in ctx.ref.of(CollectiveEvent) if e.get("what") != "init_process_group"]]
    reducers = [e for e in reducers if ctx.precedes(e)]
    if not reducers or flags.collective_algorithm(ctx) is not None:
        return None  # NCCL's unpinned algorithm has its own detector, under the same id
    lines = []
    for e in reducers:
        if e["type"] == "ddp":
            settings = ", ".join(f"{k}={e.get(k)}" for k in ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph",
                                                              "find_unused_parameters") if e.get(k) is not None)
            lines.append(f"DistributedDataParallel at {e.get('loc') or '?'} all-reduces the gradients of "
                         f"{len(e.get('params', []))} parameters over {e.get('backend') or '?'} ({settings})")
        else:
            lines.append(f"dist.{e.get('what')} at {e.get('loc') or '?'}" + (f" on {e['device']}" if e.get("device")
                                                                              else ""))
    envs = _collective_env(ctx)
    env_differs = bool(envs) and ctx.differs(envs)
    if env_differs:
        lines.append(f"collective settings differ between repeats: {ctx.pair_text(envs)}")
    elif envs and envs[0]:
        lines.append(f"collective settings (the same in every repeat): {envs[0]}")
    lines.append(f"everything this rank computed before it matched; first divergence: {ctx.where()}")
    score = LIKELY + 0.1 if env_differs else 0.5
    fix = ("pin the reduction order: the same NCCL_ALGO/NCCL_PROTO (e.g. NCCL_ALGO=Ring) and the same world size, "
           "bucket_cap_mb and rank-to-device layout in every run; or reduce in float64")
    return finding("collective-algorithm", score, "the all-reduce that combined the ranks' gradients may sum them "
                   "in a different order from run to run", lines, fix, (),
                   "direct" if env_differs else "circumstantial")
