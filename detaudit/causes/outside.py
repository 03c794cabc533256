"""outside-value: the script read a value from outside the program that differs in every run (the clock,
the pid, OS entropy, a uuid) before the divergence, and no recorded source explains it.

Nothing recorded shows the value reaching a tensor, so this is what is known rather than a verdict: the
reads, their lines, and the first divergent record. It ranks above the background guesses (hash seed,
object order) that used to fill this gap "by elimination", and below any cause with evidence of its own.
"""

from __future__ import annotations

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, detects, finding
from detaudit.compare.oprules import update_differs
from detaudit.events import ClockEvent, OutsideEvent, kind_of

SCORE = 0.52  # below BACKGROUND (listed only when nothing likely explains the divergence), above order guesses
WHAT = {"time": "the clock", "os.getpid": "the process id", "os.urandom": "operating-system entropy",
        "secrets": "operating-system entropy", "uuid": "a random or time-based uuid"}


def outside_what(fn: str) -> str:
    return next((text for prefix, text in WHAT.items() if fn.startswith(prefix)), "an outside value")


def outside_reads(ctx: Context) -> list[tuple[str, str]]:
    """(function, user line) of each read of the outside world before the divergence, in the order made."""
    kinds = {kind_of(ClockEvent), kind_of(OutsideEvent)}
    return [(str(e.get("fn")), str(e.get("loc"))) for e in ctx.ref.events if e["type"] in kinds and ctx.precedes(e)]


@detects(CauseId.OUTSIDE_VALUE)
def outside_value(ctx: Context) -> Finding | None:
    reads = outside_reads(ctx)
    if not reads:
        return None
    lines = [f"{fn} at {loc} read {outside_what(fn)}, which differs in every run" for fn, loc in reads[:4]]
    if len(reads) > 4:
        lines.append(f"and {len(reads) - 4} more such reads before the divergence")
    lines.append("no recorded source explains the divergence (the RNGs, hashing, kernels, threads); if one of "
                 "these values reaches a tensor (a learning rate, a seed, a size, a branch), it explains it")
    update = _update_differs(ctx)
    if update:
        lines.append(update)
    lines.append(f"first divergence: {ctx.where()}")
    fn, loc = reads[-1]
    fix = (f"keep values read from outside out of the computation, or read them once and pass them in as an "
           f"argument you log (the read nearest the divergence: {fn} at {loc})")
    return finding("outside-value", SCORE, "a value from outside the program (clock, pid, OS entropy, uuid) was "
                   "read before the divergence", lines, fix)


def _update_differs(ctx: Context) -> str:
    """A parameter is the first record to differ: every record before it agrees, its step's gradients and the
    parameters the step started from included, so the optimizer's update itself differs: one of its settings
    (a learning rate, a weight decay) is a number that differs between the repeats."""
    rec = ctx.record
    if rec is None or not update_differs(ctx.divergence):
        return ""
    return (f"the first record to differ is parameter {rec.name} as optimizer step {rec.step} left it, while every "
            "record before it agrees (that step's gradients and the parameters it started from): the update itself "
            "differs, as it does when a learning rate or another optimizer setting is computed from such a value")
