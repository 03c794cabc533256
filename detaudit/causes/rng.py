"""Random-number causes: unseeded-torch-rng, unseeded-numpy-rng, unseeded-python-rng, varying-seed,
dataloader-workers.

A global RNG counts as seeded after any seeding call made for the script (its own or a helper's:
`seed_everything`, `set_seed`) until a state restore sets it back to a state that differs between
repeats (`torch.random.fork_rng`'s exit). RNG objects the script owns (`torch.Generator`,
`random.Random`, `SystemRandom`, NumPy `RandomState` and `default_rng`) are sources of their own,
named at the line that created or seeded them and the lines that drew from them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, RepeatEvidence, detects, finding
from detaudit.causes.order import hash_calls
from detaudit.causes.outside import outside_reads, outside_what
from detaudit.events import (
    DataLoaderEvent,
    DrawEvent,
    GeneratorEvent,
    RngRestoreEvent,
    SeedEvent,
    Short,
    StateEvent,
)
from detaudit.pin import Pin
from detaudit.results import Basis

NAMES = {"torch": "torch", "numpy": "NumPy", "python": "Python `random`"}
PINS = {"torch": Pin.TORCH_RNG, "numpy": Pin.NUMPY_RNG, "python": Pin.PYTHON_RNG}
SEED_CALL = {"torch": "torch.manual_seed(0)", "numpy": "np.random.seed(0)", "python": "random.seed(0)"}
# the constant-seed form of each seeding call or RNG object the recorder sees (recorder/evidence/generators.py):
# a call, or (starting with `.`) a method to call on that object; tests/causes/test_causes.py runs every one
CONSTANT_SEED = {
    "torch.manual_seed": "torch.manual_seed(0)", "torch.seed": "torch.manual_seed(0)",
    "torch.cuda.manual_seed": "torch.cuda.manual_seed(0)",
    "torch.cuda.manual_seed_all": "torch.cuda.manual_seed_all(0)",
    "np.random.seed": "np.random.seed(0)", "random.seed": "random.seed(0)",
    "np.random.default_rng": "np.random.default_rng(0)", "np.random.RandomState": "np.random.RandomState(0)",
    "RandomState.seed": ".seed(0)", "random.Random": "random.Random(0)", "Random.seed": ".seed(0)",
    "random.SystemRandom": "random.Random(0)", "Generator.seed": ".manual_seed(0)",
    "Generator.manual_seed": ".manual_seed(0)",
}
IMPORT_ONLY = 0.5  # an RNG only libraries drew from at their import: below BACKGROUND beside a likely cause
OBJECT = {"torch": "torch.Generator", "numpy": "NumPy generator", "python": "`random.Random`"}
DRAWS_ITS_SEED = ("torch.seed",)  # seeding calls that draw their seed from the OS and return it


def constant_seed(fn: str, loc: str) -> str:
    """The fix that seeds this call or object with a constant, at its line."""
    call = CONSTANT_SEED.get(fn, "")
    if fn == "random.SystemRandom":
        return f"use `{call}` instead of SystemRandom at {loc} (SystemRandom reads the operating system for every " \
               "draw and ignores any seed)"
    if fn == "Generator.seed":
        return f"call `{call}` on the Generator instead of `.seed()` at {loc}"
    if call.startswith("."):
        return f"seed it with a constant at {loc}: `{call}`"
    return f"seed with a constant at {loc}: `{call or fn + '(0)'}`"


def seeding_calls(rep: RepeatEvidence, lib: str, workers: bool = False) -> list[SeedEvent]:
    """The seeding calls of `lib` made for the script: in the main process its own and those of the helpers it
    calls (`seed_everything`, `set_seed`: library code seeding the global RNG is seeding, whoever writes the
    call), except the GPU seeding torch.manual_seed does inside itself; in DataLoader workers (`workers`) the
    script's own only (torch seeds every worker itself)."""
    if workers:
        return [e for e in rep.workers(SeedEvent) if e.get("lib") == lib and not e.get("library")]
    return [e for e in rep.of(SeedEvent) if e.get("lib") == lib and not (e.get("library") and e.get("state") is None)]


def seeded_by(seed: SeedEvent) -> str:
    """`torch.manual_seed(42) at train.py:5`, with the helper's line when a library made the call."""
    return f"{seed['fn']}({seed.get('value')}) at {seed.get('loc')}{_via(seed)}"


def _via(seed: SeedEvent) -> str:
    return f" (through {_short_site(seed['by'])})" if seed.get("library") and seed.get("by") else ""


def _short_site(site: str) -> str:
    """A library line as its import path shows it: `.../site-packages/lightning/x.py:9` -> `lightning/x.py:9`."""
    for marker in ("site-packages/", "dist-packages/", "/lib/python"):
        if marker in site:
            tail = site.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python" and "/" in tail else tail
    return site


def _initial_digests_differ(ctx: Context, lib: str) -> bool:
    """The RNG's state in its first snapshot differs between repeats: nothing seeded it by then."""
    firsts = []
    for rep in ctx.involved:
        state = next((s["rng"][lib] for s in rep.states() if lib in s.get("rng", {})), None)
        if state is None:
            return False
        firsts.append(state.get("digest"))
    return ctx.differs(firsts)


def _undoing_restores(ctx: Context, lib: str) -> set[int]:
    """ids of the reference repeat's state restores after which the RNG's state differs between repeats:
    they set back a state from before any seeding (torch.random.fork_rng's exit), undoing the seeding."""
    undoing: set[int] = set()
    for restores in ctx.aligned(lambda r: [e for e in r.of(RngRestoreEvent) if e.get("lib") == lib]):
        if ctx.differs([e.get("state") for e in restores]):
            undoing.add(id(restores[0]))
    return undoing


@dataclass(frozen=True)
class Unseeded:
    """A sign that the global RNG was drawn from while not seeded, before the divergence."""

    at: int
    line: str
    draw: str = ""  # the drawing line, when this is a draw
    undone: str = ""  # a state restore that undid the seeding: its call and line
    importing: bool = False  # a draw made while a module was being imported


def unseeded_draws(ctx: Context, rep: RepeatEvidence, lib: str) -> list[Unseeded]:
    """Draws from the global RNG while it is not seeded, up to the divergence: before the first seeding
    call, or after a state restore undid the seeding (fork_rng)."""
    found: list[Unseeded] = []
    seeds = {id(e) for e in seeding_calls(rep, lib)}
    undoing = _undoing_restores(ctx, lib) if rep is ctx.ref else set()
    seeded: str | None = None  # what seeded the RNG last, while it stays seeded
    for e in rep.events:
        if not ctx.precedes(e):
            break
        if e["type"] == "seed" and id(e) in seeds:
            seed = e
            if seed.get("drawn_before") and seeded is None:
                found.append(Unseeded(seed.get("at", 0), f"the global {NAMES[lib]} RNG was drawn from before "
                                                         f"{seeded_by(seed)} seeded it"))
            seeded = seeded_by(seed)
        elif e["type"] == "rng-restore" and e.get("lib") == lib:
            restore = e
            if id(restore) not in undoing:  # the same state in every repeat (a checkpoint's RNG state)
                seeded = seeded or f"{restore['fn']} at {restore.get('loc')}"
            elif seeded is not None:
                found.append(Unseeded(restore.get("at", 0), f"{restore['fn']} at {restore.get('loc')} (by "
                                                             f"{_short_site(restore.get('by', '?'))}) set the global "
                                                             f"{NAMES[lib]} RNG back to a state that differs between "
                                                             f"repeats: the seeding by {seeded} was undone",
                                      undone=f"{restore['fn']} at {restore.get('loc')}"))
                seeded = None
        elif seeded is not None:
            continue
        elif e["type"] == "draw" and e.get("lib") == lib and e.get("generator") == "global":
            during = " while a module was being imported (a library's own draw)" if e.get("importing") else ""
            found.append(Unseeded(e.get("at", 0), f"{e['fn']} at {e.get('loc') or '?'} drew from the unseeded "
                                                  f"global {NAMES[lib]} RNG{during}", draw=e.get("loc") or "",
                                  importing=bool(e.get("importing"))))
        elif e["type"] == "state" and not found and _drawn(e, lib):
            found.append(Unseeded(e.get("at", 0), f"the global {NAMES[lib]} RNG state had changed by the "
                                                  f"{e['when']} snapshot (it was drawn from)"))
    return found


def _drawn(state: StateEvent, lib: str) -> bool:
    digest = state.get("rng", {}).get(lib)
    return bool(digest and digest.get("drawn"))


@dataclass(frozen=True)
class OwnRng:
    """An RNG object the script owns whose state differs between repeats, with the draws from it."""

    event: GeneratorEvent  # the reference repeat's
    values: list[Short]  # the seed value in each involved repeat
    draws: list[DrawEvent]  # the first draw per call site before the divergence
    varying_value: bool  # given a seed value that differs between repeats (or drawn by `Generator.seed()`)

    @property
    def at(self) -> int:
        return int(self.event.get("at", 0))

    def lines(self, ctx: Context) -> list[str]:
        e = self.event
        if e.get("entropy"):
            made = f"{e['fn']}() at {e.get('loc')} reads the operating system for every draw (it cannot be seeded)"
        elif e["fn"] == "Generator.seed":
            made = (f"Generator.seed() at {e.get('loc')} seeded a torch.Generator from operating-system entropy "
                    f"({ctx.pair_text(self.values)})")
        elif self.varying_value:
            made = f"{e['fn']} at {e.get('loc')} seeded a {OBJECT[e['lib']]} with {ctx.pair_text(self.values)}"
        else:
            made = f"{e['fn']}() at {e.get('loc')} created a {OBJECT[e['lib']]} without a seed (its initial state " \
                   "differed between repeats)"
        drew = [f"{d['fn']} at {d.get('loc')} drew from it" for d in self.draws[:3]]
        return [made, *drew]


def own_rngs(ctx: Context, lib: str | None = None) -> list[OwnRng]:
    """The script's RNG objects (of `lib`) made or seeded before the divergence whose state differs between
    repeats; an object followed to its draws (`obj`) counts only when it was drawn from before the divergence."""
    found = []
    for gens in ctx.aligned(lambda r: [e for e in r.of(GeneratorEvent) if not e.get("library")]):
        g = gens[0]
        if (lib is not None and g["lib"] != lib) or not ctx.precedes(g):
            continue
        values = [x.get("value") for x in gens]
        varying = g.get("value") is not None and ctx.differs(values)
        if not (g.get("entropy") or varying or ctx.differs([x.get("state") for x in gens])):
            continue
        draws = [d for d in ctx.ref.of(DrawEvent) if "obj" in g and d.get("obj") == g["obj"] and ctx.precedes(d)]
        if "obj" in g and not draws:
            continue
        found.append(OwnRng(g, values, draws, varying))
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
    objects = [o for o in own_rngs(ctx, lib) if not o.varying_value]
    if not draws and not objects:
        return None
    undone = next((d for d in draws if d.undone), None)
    lines = _unseeded_lines(ctx, lib, draws, objects, undone)
    score = _score(ctx, lib, min([d.at for d in draws] + [o.at for o in objects]))
    if not objects and _only_imports_drew(draws):
        score = IMPORT_ONLY
        lines.append(f"only imported libraries drew from it, while being imported: nothing recorded shows the "
                     f"script's own computation using the {NAMES[lib]} RNG")
    lines.append(f"first divergence: {ctx.where()}")
    if objects and (not draws or objects[0].at <= draws[0].at):
        fix = constant_seed(objects[0].event["fn"], objects[0].event.get("loc", ""))
        what = f"{objects[0].event['fn']}() at {objects[0].event.get('loc')} is not seeded"
    else:
        fix = _global_seed_fix(ctx, lib, draws, undone)
        what = _global_unseeded_what(ctx, lib, undone)
    summary = f"{NAMES[lib]} randomness is not seeded ({what}), so it differs in every run"
    pins = [] if objects and all(o.event.get("entropy") for o in objects) and not draws else [PINS[lib]]
    return finding(f"unseeded-{lib}-rng", score, summary, lines, fix, pins,
                   "op-records" if lib == "torch" and _random_op(ctx) else "direct")


def _only_imports_drew(draws: list[Unseeded]) -> bool:
    """Only libraries drew, at their import: the RNG's state changed, and nothing shows the script using it."""
    return bool(draws) and all(d.importing for d in draws if d.draw) and any(d.draw for d in draws)


def _unseeded_lines(ctx: Context, lib: str, draws: list[Unseeded], objects: list[OwnRng],
                    undone: Unseeded | None) -> list[str]:
    """The evidence lines of an unseeded RNG, before the closing `first divergence` line."""
    # the last draw is the nearest to the divergence; a seeding undone is always said
    shown = draws if len(draws) <= 3 else [*draws[:2], *([undone] if undone and undone not in draws[:2] else []),
                                           draws[-1]]
    lines = [d.line for d in shown]
    for o in objects[:3]:
        lines += o.lines(ctx)
    if not seeding_calls(ctx.ref, lib) and draws:
        lines.append(f"no {NAMES[lib]} seeding call was seen before the divergence (the script's own or a helper's)")
    if any(o.event.get("entropy") for o in objects):
        lines.append(f"the {PINS[lib].value} experiment cannot reach SystemRandom")
    return lines


def _global_seed_fix(ctx: Context, lib: str, draws: list[Unseeded], undone: Unseeded | None) -> str:
    """The fix for a global RNG drawn from unseeded: where to seed it, and what else keeps it from drawing."""
    loc = next((d.draw for d in draws if d.draw), "")
    before = f", before {loc}" if loc else ""
    if undone is not None:
        fix = (f"seed outside the block whose exit restores the RNG state ({undone.undone}), "
               f"or call `{SEED_CALL[lib]}` again after it" + before)
    else:
        fix = f"call `{SEED_CALL[lib]}` at the start of the script" + before
    if _inference_dropout(ctx):
        fix = "call `model.eval()` before inference (its Dropout draws only in training mode); " + fix
    # only a loader that draws (a random sampler: shuffle=True) is worth a generator; `shuffle=False` draws nothing
    loader = next((e for e in ctx.ref.of(DataLoaderEvent) if not e.get("generator")
                   and "Random" in str(e.get("sampler"))), None)
    if lib == "torch" and loader is not None:
        fix += f"; or pass `generator=torch.Generator().manual_seed(0)` to the DataLoader at {loader.get('loc')}"
    return fix


def _global_unseeded_what(ctx: Context, lib: str, undone: Unseeded | None) -> str:
    """Why the global RNG counts as unseeded, for the summary."""
    if undone:
        return "its seeding is undone before it is drawn from"
    seeds = seeding_calls(ctx.ref, lib)
    return f"it is drawn from before it is seeded at {seeds[0].get('loc')}" if seeds \
        else "its global RNG is never seeded"


def _inference_dropout(ctx: Context) -> bool:
    """An nn.Dropout module drew in training mode before the divergence in a run that never stepped an
    optimizer: an inference script that forgot `model.eval()` (explicit `F.dropout(training=True)`, MC
    dropout, is on purpose; a training run drops out on purpose)."""
    trained = any(s.get("when") == "first-step" for s in ctx.ref.states())
    return not trained and any(e.get("fn") == "dropout" and e.get("library") for e in ctx.ref.of(DrawEvent)
                               if ctx.precedes(e))


def _random_op(ctx: Context) -> bool:
    """The op-level re-run saw a random op whose inputs matched and whose output differed."""
    return ctx.op_with("random-op") is not None


@detects(CauseId.UNSEEDED_TORCH_RNG)
def unseeded_torch_rng(ctx: Context) -> Finding | None:
    return unseeded(ctx, "torch")


@detects(CauseId.UNSEEDED_NUMPY_RNG)
def unseeded_numpy_rng(ctx: Context) -> Finding | None:
    return unseeded(ctx, "numpy")


@detects(CauseId.UNSEEDED_PYTHON_RNG)
def unseeded_python_rng(ctx: Context) -> Finding | None:
    return unseeded(ctx, "python")


@detects(CauseId.VARYING_SEED)
def varying_seed(ctx: Context) -> Finding | None:
    lines: list[str] = []
    pins: list[Pin] = []
    first: SeedEvent | GeneratorEvent | None = None
    for lib in ("torch", "numpy", "python"):
        for calls in ctx.aligned(functools.partial(seeding_calls, lib=lib)):
            values = [c.get("value") for c in calls]
            entropy = all(v is None for v in values)  # seeded from OS entropy: only the state can differ
            # the same value in every repeat is a seed that does not vary, whatever else does: never a cause
            if not (ctx.differs([c.get("state") for c in calls]) if entropy else ctx.differs(values)):
                continue
            c = calls[0]
            via = _via(c)
            if entropy:
                lines.append(f"{c['fn']}() at {c.get('loc')}{via} seeds from operating-system entropy: the state "
                             "differs in every repeat")
            elif c["fn"] in DRAWS_ITS_SEED:  # `torch.seed()` seeds from the OS and returns what it drew
                lines.append(f"{c['fn']}() at {c.get('loc')}{via} seeded from operating-system entropy and returned "
                             f"{ctx.pair_text(values)}")
            else:
                lines.append(f"{c['fn']} at {c.get('loc')}{via} received {ctx.pair_text(values)}")
            pins.append(PINS[lib])
            first = first if first is not None and first.get("at", 0) <= c.get("at", 0) else c
            break
    for own in [o for o in own_rngs(ctx) if o.varying_value][:3]:  # each RNG object seeded from the outside world
        lines += own.lines(ctx)
        pins.append(PINS[own.event["lib"]])
        first = first if first is not None and first.get("at", 0) <= own.at else own.event
    if first is None:
        return None
    read, came_from = _seed_source(ctx, first)
    lines += came_from
    lines.append(f"first divergence: {ctx.where()}")
    fix = (f"{constant_seed(first['fn'], first.get('loc', ''))}; when runs must differ on purpose, pass the seed "
           "in explicitly (an argument or config value) and log it")
    score = 0.95 if ctx.precedes(first) else 0.5
    basis: Basis = "op-records" if Pin.TORCH_RNG in pins and _random_op(ctx) else "direct" if ctx.precedes(first) \
        else "circumstantial"
    return finding("varying-seed", score, _seed_summary(first, read), lines, fix, pins, basis)


def _seed_source(ctx: Context, first: SeedEvent | GeneratorEvent) -> tuple[str | None, list[str]]:
    """Where the seed came from, when the evidence shows it: a read of the outside world at the seeding line (the
    function read), or the script's own hash() of a string (that hashing is randomized at all is no evidence a seed
    came from it); with their evidence lines."""
    read = next((fn for fn, loc in outside_reads(ctx) if loc == first.get("loc")), None)
    lines = [f"{read} at {first.get('loc')} read {outside_what(read)} on the line that seeds"] if read else []
    return read, lines + [f"{text} (a seed derived from it changes with it)" for _, text in hash_calls(ctx)[:2]]


def _seed_summary(first: SeedEvent | GeneratorEvent, read: str | None) -> str:
    """What was seeded, where, and from what when the evidence shows it: `this torch.Generator is seeded from the
    process id at train.py:6, so its seed differs in every run`."""
    what = f"this {OBJECT[first['lib']]} is seeded" if first["type"] == "generator" \
        else f"the global {NAMES[first['lib']]} RNG is seeded"
    source = outside_what(read) if read is not None else "operating-system entropy" \
        if first["fn"] in ("Generator.seed", *DRAWS_ITS_SEED) or first.get("value") is None else ""
    where = f"from {source} at {first.get('loc')}" if source else f"at {first.get('loc')} with a value that changes"
    return f"{what} {where}, so its seed differs in every run"


@detects(CauseId.DATALOADER_WORKERS)
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
        for calls in ctx.aligned(functools.partial(seeding_calls, lib=lib, workers=True)):
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
