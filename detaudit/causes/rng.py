"""Random-number causes: unseeded-torch-rng, unseeded-numpy-rng, unseeded-python-rng, varying-seed,
dataloader-workers."""

from __future__ import annotations

import functools

from detaudit.causes.context import Context, Finding, RepeatEvidence, detects, finding
from detaudit.events import DataLoaderEvent, DrawEvent, GeneratorEvent, SeedEvent, StateEvent
from detaudit.pin import Pin
from detaudit.results import Basis

NAMES = {"torch": "torch", "numpy": "NumPy", "python": "Python `random`"}
PINS = {"torch": Pin.TORCH_RNG, "numpy": Pin.NUMPY_RNG, "python": Pin.PYTHON_RNG}
SEED_CALL = {"torch": "torch.manual_seed(0)", "numpy": "np.random.seed(0)", "python": "random.seed(0)"}


def user_seeds(rep: RepeatEvidence, lib: str, workers: bool = False) -> list[SeedEvent]:
    """The script's own seeding calls of `lib`, in the main process or (`workers`) in DataLoader workers."""
    seeds = rep.workers(SeedEvent) if workers else rep.of(SeedEvent)
    return [e for e in seeds if e.get("lib") == lib and not e.get("library")]


def _initial_digests_differ(ctx: Context, lib: str) -> bool:
    """The RNG's state in its first snapshot differs between repeats: nothing seeded it by then."""
    firsts = []
    for rep in ctx.involved:
        state = next((s["rng"][lib] for s in rep.states() if lib in s.get("rng", {})), None)
        if state is None:
            return False
        firsts.append(state.get("digest"))
    return ctx.differs(firsts)


def unseeded_draws(ctx: Context, rep: RepeatEvidence, lib: str) -> list[tuple[int, str]]:
    """(position, evidence line) for draws from the global RNG before any user seed, up to the divergence."""
    found: list[tuple[int, str]] = []
    for e in rep.events:
        if e["type"] == "seed" and e.get("lib") == lib and not e.get("library"):
            if e.get("drawn_before") and ctx.precedes(e):
                found.append((e.get("at", 0), f"the global {NAMES[lib]} RNG was drawn from before {e['fn']}"
                                              f"({e.get('value')}) at {e.get('loc')} seeded it"))
            break
        if not ctx.precedes(e):
            break
        if e["type"] == "draw" and e.get("lib") == lib and e.get("generator") == "global":
            found.append((e.get("at", 0), f"{e['fn']} at {e.get('loc') or '?'} drew from the unseeded global "
                                          f"{NAMES[lib]} RNG"))
        elif e["type"] == "state" and not found and _drawn(e, lib):
            found.append((e.get("at", 0), f"the global {NAMES[lib]} RNG state had changed by the {e['when']} "
                                          "snapshot (it was drawn from)"))
    return found


def _drawn(state: StateEvent, lib: str) -> bool:
    digest = state.get("rng", {}).get(lib)
    return bool(digest and digest.get("drawn"))


def _unseeded_generators(ctx: Context) -> list[tuple[int, str, str]]:
    found = []
    for gens in ctx.aligned(lambda r: [e for e in r.of(GeneratorEvent)
                                       if not e.get("seeded") and not e.get("library")]):
        g = gens[0]
        if ctx.precedes(g) and ctx.differs([x.get("state") for x in gens]):
            found.append((g.get("at", 0), f"{g['fn']}() at {g.get('loc')} created a Generator without a seed "
                                          f"(its initial state differed: "
                                          f"{ctx.pair_text([x.get('state') for x in gens])})", g.get("loc", "")))
    return found


def _score(ctx: Context, lib: str, first_at: int) -> float:
    rec = ctx.record
    data = rec is not None and rec.kind == "input"
    score = (0.85 if data else 0.9) if lib == "torch" else (0.9 if data else 0.75)
    if lib == "torch" and _random_op(ctx):
        score = 0.95
    return score + 0.02 / (1 + first_at)  # the source drawn from first explains the first divergence


def unseeded(ctx: Context, lib: str) -> Finding | None:
    draws = unseeded_draws(ctx, ctx.ref, lib) if _initial_digests_differ(ctx, lib) else []
    generators = _unseeded_generators(ctx) if lib == "numpy" else []
    if not draws and not generators:
        return None
    shown = draws if len(draws) <= 3 else draws[:2] + draws[-1:]  # the last draw is the nearest to the divergence
    lines = [line for _, line in shown] + [line for _, line, _ in generators[:3]]
    if not user_seeds(ctx.ref, lib) and draws:
        lines.append(f"no {NAMES[lib]} seeding call was seen before the divergence")
    lines.append(f"first divergence: {ctx.where()}")
    first_at = min([at for at, _ in draws] + [at for at, _, _ in generators])
    loc = next((line.split(" at ", 1)[1].split(" ", 1)[0] for _, line in draws if " at " in line), "")
    if generators and (not draws or generators[0][0] <= draws[0][0]):
        fix = f"give the Generator a seed: `np.random.default_rng(0)` at {generators[0][2]}"
    else:
        fix = f"call `{SEED_CALL[lib]}` at the start of the script" + (f", before {loc}" if loc else "")
        if any(e.get("fn") == "dropout" for e in ctx.ref.of(DrawEvent) if ctx.precedes(e)):
            fix += "; for inference, call `model.eval()` first (Dropout draws only in training mode)"
        loader = next((e for e in ctx.ref.of(DataLoaderEvent) if not e.get("generator")), None)
        if lib == "torch" and loader is not None:
            fix += (f"; or pass `generator=torch.Generator().manual_seed(0)` to the DataLoader at "
                    f"{loader.get('loc')}")
    what = "a Generator made without a seed" if generators and not draws else "its global RNG is never seeded"
    summary = f"{NAMES[lib]} randomness is not seeded ({what}), so it differs in every run"
    return finding(f"unseeded-{lib}-rng", _score(ctx, lib, first_at), summary, lines, fix, [PINS[lib]],
                   "op-records" if lib == "torch" and _random_op(ctx) else "direct")


def _random_op(ctx: Context) -> bool:
    """The op-level re-run saw a random op whose inputs matched and whose output differed."""
    return ctx.op_with("random-op") is not None


@detects("unseeded-torch-rng")
def unseeded_torch_rng(ctx: Context) -> Finding | None:
    return unseeded(ctx, "torch")


@detects("unseeded-numpy-rng")
def unseeded_numpy_rng(ctx: Context) -> Finding | None:
    return unseeded(ctx, "numpy")


@detects("unseeded-python-rng")
def unseeded_python_rng(ctx: Context) -> Finding | None:
    return unseeded(ctx, "python")


@detects("varying-seed")
def varying_seed(ctx: Context) -> Finding | None:
    lines: list[str] = []
    pins: list[Pin] = []
    first: SeedEvent | GeneratorEvent | None = None
    for lib in ("torch", "numpy", "python"):
        for calls in ctx.aligned(functools.partial(user_seeds, lib=lib)):
            values = [c.get("value") for c in calls]
            entropy = all(v is None for v in values)  # seeded from OS entropy: only the state can differ
            # the same value in every repeat is a seed that does not vary, whatever else does: never a cause
            if not (ctx.differs([c.get("state") for c in calls]) if entropy else ctx.differs(values)):
                continue
            c = calls[0]
            if entropy:
                lines.append(f"{c['fn']}() at {c.get('loc')} seeds from operating-system entropy: the state "
                             "differs in every repeat")
            else:
                lines.append(f"{c['fn']} at {c.get('loc')} received {ctx.pair_text(values)}")
            pins.append(PINS[lib])
            first = first if first is not None and first.get("at", 0) <= c.get("at", 0) else c
            break
    for gens in ctx.aligned(lambda r: [e for e in r.of(GeneratorEvent) if e.get("seeded") and not e.get("library")]):
        g = gens[0]
        if ctx.differs([x.get("value") for x in gens]):
            lines.append(f"{g['fn']} at {g.get('loc')} received {ctx.pair_text([x.get('value') for x in gens])}")
            pins.append(Pin.NUMPY_RNG)
            first = first if first is not None and first.get("at", 0) <= g.get("at", 0) else g
            break
    if first is None:
        return None
    lines.append(f"first divergence: {ctx.where()}")
    fn = first["fn"].removesuffix("_all")
    fix = (f"seed with a constant at {first.get('loc')}: `{fn}(0)`; when runs must differ on purpose, pass the seed "
           "in explicitly (an argument or config value) and log it")
    score = 0.95 if ctx.precedes(first) else 0.5
    basis: Basis = "op-records" if Pin.TORCH_RNG in pins and _random_op(ctx) else "direct" if ctx.precedes(first) \
        else "circumstantial"
    return finding("varying-seed", score, "a seed is set, but to a value that changes from run to run "
                   "(clock, pid or OS entropy)", lines, fix, pins, basis)


@detects("dataloader-workers")
def dataloader_workers(ctx: Context) -> Finding | None:
    loaders = [e for e in ctx.ref.of(DataLoaderEvent) if e.get("num_workers", 0) > 0 and ctx.precedes(e)]
    if not loaders:
        return None
    lines: list[str] = []
    pins: list[Pin] = []
    loc = ""
    for gens in ctx.aligned(lambda r: [e for e in r.workers(GeneratorEvent) if not e.get("library")]):
        g = gens[0]
        if ctx.differs([x.get("state") for x in gens]):
            seeded = "with a seed that changes per run" if g.get("seeded") else "without a seed"
            lines.append(f"inside DataLoader worker {g.get('worker')}, {g['fn']}() at {g.get('loc')} created a "
                         f"Generator {seeded}: torch seeds torch, `random` and np.random in each worker, not "
                         "Generators made there")
            pins.append(Pin.NUMPY_RNG)
            loc = loc or g.get("loc", "")
            break
    for lib in ("numpy", "python", "torch"):
        for calls in ctx.aligned(functools.partial(user_seeds, lib=lib, workers=True)):
            if ctx.differs([c.get("state") for c in calls]):
                c = calls[0]
                lines.append(f"inside DataLoader worker {c.get('worker')}, {c['fn']} at {c.get('loc')} set a seed "
                             "that differs between repeats")
                pins.append(PINS[lib])
                loc = loc or c.get("loc", "")
                break
    if not lines:
        return None
    loader = loaders[0]
    lines.insert(0, f"DataLoader at {loader.get('loc')} with num_workers={loader['num_workers']}, "
                    f"worker_init_fn={loader.get('worker_init_fn')}, generator "
                    f"{'given' if loader.get('generator') else 'not given'}")
    lines.append(f"first divergence: {ctx.where()}")
    rec = ctx.record
    score = 0.9 if rec is not None and rec.kind == "input" else 0.7
    fix = (f"derive worker randomness from torch's per-worker seed at {loc}: "
           "`np.random.default_rng(torch.initial_seed() % 2**32)` (or seed it in a `worker_init_fn`)")
    if not loader.get("generator"):  # torch's per-worker seeds come from it: unseeded, they vary too
        fix += f", and pass `generator=torch.Generator().manual_seed(0)` to the DataLoader at {loader.get('loc')}"
    return finding("dataloader-workers", score, "randomness inside DataLoader workers that torch's per-worker "
                   "seeding does not reach", lines, fix, pins, "direct")
