"""wall-clock: a loop (or branch) driven by the wall clock, so the repeats run different steps."""

from __future__ import annotations

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, RepeatEvidence, detects, finding
from detaudit.events import ClockReadsEvent


def _reads(rep: RepeatEvidence) -> dict[tuple[str, str], int]:
    event = rep.first(ClockReadsEvent)
    sites = event.get("sites", []) if event is not None else []
    return {(str(s.get("loc")), str(s.get("fn"))): int(s.get("reads", 0)) for s in sites}


@detects(CauseId.WALL_CLOCK)
def wall_clock(ctx: Context) -> Finding | None:
    """The repeats recorded different things (another number of steps, other records), and the
    script read the clock a different number of times at some call site: its control flow followed time."""
    if ctx.divergence.category not in ("structure", "outcome") or len(ctx.involved) < 2:
        return None
    counts = [_reads(r) for r in ctx.involved]
    sites = sorted({k for c in counts for k in c})
    varying: list[tuple[tuple[str, str], list[int]]] = [
        (site, [c.get(site, 0) for c in counts]) for site in sites
        if ctx.differs([c.get(site, 0) for c in counts])]
    if not varying:
        return None
    # a loop's condition is read once more than anything inside the loop: most reads first
    varying.sort(key=lambda item: (-sum(item[1]), item[0]))
    structural = ctx.divergence.category == "structure" or ctx.record is not None
    (loc, fn), _ = varying[0]
    lines = [f"{f} at {where} was read {ctx.pair_text(n, lambda v: f'{v} times')}" for (where, f), n in varying[:4]]
    lines.append("the script's control flow depends on the wall clock: a loop bounded by elapsed time (or a branch "
                 "on it) runs a different number of steps in each repeat")
    lines.append(f"first divergence: {ctx.where()}")
    fix = (f"bound the loop by a step or epoch count instead of the time read at {loc}; to audit a long run, "
           "bound the repeats with `detaudit run --max-steps N` (or `--max-time SECONDS`, which compares only "
           "the steps every repeat completed)")
    return finding("wall-clock", 0.85 if structural else 0.6, "the script's control flow follows the wall clock, "
                   "so the repeats run different steps", lines, fix, basis="direct")
