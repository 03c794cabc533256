"""Setting causes: flag-drift, flag-typo, collective-algorithm.

Flag events carry two places: `loc`, the user's line that led to the call, and `by`, the
immediate caller (a framework's own line when a library reset the flag).
"""

from __future__ import annotations

from collections import defaultdict

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, detects, finding
from detaudit.events import CollectiveEvent, EnvironmentEvent, FlagEvent, FlagTypoEvent
from detaudit.pin import Pin

# what each flag is called in words, and the --explain pin that holds it
FLAG_PINS = {"use_deterministic_algorithms": Pin.DETERMINISTIC, "cudnn.benchmark": Pin.CUDNN,
             "cudnn.deterministic": Pin.CUDNN, "cudnn.enabled": Pin.CUDNN, "cudnn.allow_tf32": Pin.TF32_OFF,
             "matmul.allow_tf32": Pin.TF32_OFF, "set_float32_matmul_precision": Pin.TF32_OFF}
# snapshot keys (evidence `flags`) whose change between the first forward and the end is a drift
SNAPSHOT_FLAGS = {"deterministic_algorithms": Pin.DETERMINISTIC, "deterministic_warn_only": Pin.DETERMINISTIC,
                  "cudnn.benchmark": Pin.CUDNN, "cudnn.deterministic": Pin.CUDNN, "matmul.allow_tf32": Pin.TF32_OFF,
                  "cudnn.allow_tf32": Pin.TF32_OFF, "float32_matmul_precision": Pin.TF32_OFF}
NCCL_VARIABLES = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE")


def flag_call(event: FlagEvent) -> str:
    """The call or assignment as the script would write it: `torch.backends.cudnn.benchmark = True`."""
    flag, value = event["flag"], event.get("value")
    if flag in ("use_deterministic_algorithms", "set_float32_matmul_precision"):
        return f"torch.{flag}({value})"
    prefix = "torch.backends.cuda." if flag.startswith("matmul.") else "torch.backends."
    return f"{prefix}{flag} = {value}"


def flag_site(event: FlagEvent | FlagTypoEvent) -> str:
    """The user's line, and the library line that set the flag when it was not the user's."""
    loc, by = event.get("loc") or "?", event.get("by") or ""
    return loc if not by or by == loc else f"{by} (reached from {loc})"


def _env(event: EnvironmentEvent | None) -> dict[str, str]:
    return (event.get("env") if event is not None else None) or {}


@detects(CauseId.FLAG_DRIFT)
def flag_drift(ctx: Context) -> Finding | None:
    """A determinism flag set once and changed later in the run: the later call decides what runs."""
    by_flag: dict[str, list[FlagEvent]] = defaultdict(list)
    for e in ctx.ref.of(FlagEvent):
        by_flag[e["flag"]].append(e)
    lines: list[str] = []
    pins: list[Pin] = []
    before = False
    last: FlagEvent | None = None
    for flag, events in by_flag.items():
        for a, b in zip(events, events[1:]):
            if a.get("value") != b.get("value"):
                lines.append(f"`{flag_call(a)}` at {flag_site(a)}, then `{flag_call(b)}` at {flag_site(b)}")
                pins.append(FLAG_PINS.get(flag, Pin.DETERMINISTIC))
                before = before or ctx.precedes(b)
                last = b if last is None or b.get("at", 0) <= last.get("at", 0) else last
    if not lines:  # set without a recorded call (a C extension, a setter not wrapped): the snapshots show it
        first, end = ctx.ref.flags_at("first-forward"), ctx.ref.flags_at("end")
        for key, pin in SNAPSHOT_FLAGS.items():
            if first is not None and end is not None and first.get(key) != end.get(key):
                lines.append(f"{key} was {first.get(key)!r} at the first forward and {end.get(key)!r} at the end")
                pins.append(pin)
    if not lines:
        return None
    lines.append(f"first divergence: {ctx.where()}")
    where = f" at {last.get('by') or last.get('loc')}" if last is not None else ""
    fix = (f"set the flag once, after the call that changes it{where} (a framework's own determinism option, "
           "such as a Trainer's `deterministic=True`, instead of setting torch's flag before it)")
    return finding("flag-drift", 0.75 if before else 0.5, "a determinism flag changes during the run: the setting "
                   "in force when the work runs is not the one the script set first", lines, fix, pins,
                   "direct" if before else "circumstantial")


@detects(CauseId.FLAG_TYPO)
def flag_typo(ctx: Context) -> Finding | None:
    """`torch.backends.cudnn.determinstic = True` is accepted silently: the flag it meant stays as it was."""
    typos = ctx.ref.of(FlagTypoEvent)
    if not typos:
        return None
    lines = [f"`{t['module']}.{t['name']} = {t.get('value')}` at {flag_site(t)} set an attribute torch never reads"
             + (f" (meant `{t['meant']}`?)" if t.get("meant") else "") for t in typos[:3]]
    lines.append(f"first divergence: {ctx.where()}")
    t = typos[0]
    meant = t.get("meant")
    fix = (f"spell it `{t['module']}.{meant}` at {t.get('loc')}" if meant
           else f"remove `{t['module']}.{t['name']}` at {t.get('loc')}: torch has no such flag")
    pin = FLAG_PINS.get(("matmul." if "matmul" in t["module"] else "cudnn.") + (meant or ""))
    return finding("flag-typo", 0.65 if any(ctx.precedes(x) for x in typos) else 0.5,
                   "a misspelt determinism flag: torch keeps the new attribute and ignores it", lines, fix,
                   [pin] if pin is not None else [], "direct")


@detects(CauseId.COLLECTIVE_ALGORITHM)
def collective_algorithm(ctx: Context) -> Finding | None:
    """NCCL picks its reduction algorithm and protocol by topology and size unless told: sums differ."""
    collectives = [e for e in ctx.ref.of(CollectiveEvent) if ctx.precedes(e)]
    backends = {e.get("backend") for e in collectives if e.get("backend")}
    if not collectives or not ({"nccl"} & backends or any(e.get("device") == "cuda" for e in collectives)):
        return None
    envs = [_env(r.first(EnvironmentEvent)) for r in ctx.involved]
    lines = []
    differ = False
    for key in NCCL_VARIABLES:
        values = [e.get(key) for e in envs]
        if ctx.differs(values):
            lines.append(f"{key}: {ctx.pair_text(values)}")
            differ = True
        elif values[0] is None:
            lines.append(f"{key} is not set: NCCL chooses per run, topology and message size")
    lines.insert(0, "collectives: " + ", ".join(f"{e['what']} at {e.get('loc')}" for e in collectives[:4]))
    lines.append(f"first divergence: {ctx.where()}")
    if not differ and all(e.get(k) is not None for e in envs for k in NCCL_VARIABLES[:2]):
        return None  # fixed and equal everywhere: not this
    fix = ("set `NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_NVLS_ENABLE=0` in the environment of every rank and every "
           "run (the same values on every machine)")
    return finding("collective-algorithm", 0.85 if differ else 0.6, "NCCL's reduction algorithm or protocol is "
                   "not fixed: collectives sum in another order", lines, fix, [Pin.NCCL],
                   "direct" if differ else "circumstantial")
