"""Randomness that repeats where it should differ, from one repeat's draw fingerprints (docs/causes.md).

Every other finding asks whether repeats agree; this one asks whether draws that should differ inside one run are
equal: the same draws in two DataLoader workers (a generator made in the main process and copied into each), in
every epoch (the script re-seeds at each epoch's start), at every step (a seeding inside the step loop, or an RNG
object re-created alike at each step: the same noise every step), on every
rank (repeated_across_ranks: the ranks' traces read together, DataLoader workers only), or for every sample of a
step. Equal generator states at one call site are the direct evidence (the same position of the same stream); equal
values alone are circumstantial and count only for draws of at least MIN_VALUES values, seen equal at least twice.
Draws under `torch.no_grad()` or `inference_mode` (evaluation, often seeded on purpose) are not judged;
`DETAUDIT_REPEATS_OK` silences sites. Reported beside the verdict, never as a cause of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from detaudit.causes.context import RepeatEvidence
from detaudit.events import Event, GeneratorEvent, RandomDrawEvent, SeedEvent, select

Across = Literal["workers", "ranks", "epochs", "steps", "samples"]
# the first found is named: samples seeded alike also repeat every step and epoch, and are the finer bug
ACROSS_ORDER: tuple[Across, ...] = ("workers", "ranks", "samples", "epochs", "steps")
MIN_VALUES = 8  # equal values alone count only for draws of at least this many values...
MIN_EQUAL = 2  # ... seen equal at least this many times
SILENCE_VARIABLE = "DETAUDIT_REPEATS_OK"
RNG_NAMES = {"torch": "torch's global RNG", "numpy": "NumPy's global RNG", "python": "Python's global `random`"}


@dataclass(frozen=True)
class RepeatedRandomness:
    """Draws at one call site that repeat across workers, ranks, epochs, steps or samples."""

    site: str  # the user's `file:line` that drew
    across: Across
    created_at: str | None  # where the repeated state was created or seeded (None: not seen)
    evidence: list[str]
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Draw:
    """One fingerprinted draw and the process it ran in."""

    event: RandomDrawEvent
    worker: int | None
    order: int  # its position among its process's events (main process or the workers' side file)

    @property
    def mark(self) -> str | None:
        """What makes two draws the same: the generator state (direct), else the values (circumstantial)."""
        e = self.event
        return e.get("state") or e.get("value")


def silenced_sites(environ: Mapping[str, str]) -> frozenset[str]:
    """The `file:line` sites the user silenced: `DETAUDIT_REPEATS_OK="train.py:31 train.py:40"` (commas too)."""
    return frozenset(s for s in environ.get(SILENCE_VARIABLE, "").replace(",", " ").split() if s)


def repeated_randomness(rep: RepeatEvidence, silenced: Iterable[str] = ()) -> list[RepeatedRandomness]:
    """The sites of one repeat (its main process and DataLoader workers) whose draws repeat, one finding each."""
    quiet = tuple(silenced)
    sites: dict[tuple[str, str, str], list[_Draw]] = {}
    for draw in _draws(rep):
        e = draw.event
        if e["grad"] and not e.get("evaluating") and e["loc"] and not any(_same_site(e["loc"], s) for s in quiet):
            sites.setdefault((e["loc"], e["site"], e["fn"]), []).append(draw)
    found: dict[str, RepeatedRandomness] = {}
    for (loc, _, _), group in sites.items():
        if loc in found:
            continue
        for across in ACROSS_ORDER:
            pairs = _FINDERS[across](group)
            if pairs and _convincing(pairs):
                found[loc] = _describe(rep, loc, _period(across, pairs), pairs)
                break
    return list(found.values())


def repeated_across_ranks(ranks: Sequence[RepeatEvidence], silenced: Iterable[str] = ()) -> list[RepeatedRandomness]:
    """torchrun: the data-side draws (in DataLoader workers: augmentation, per-sample noise) that repeat from rank
    to rank, one finding per site; `ranks`: one repeat's evidence of each rank.

    Torch seeds each worker from its rank's main-process RNG, so ranks seeded alike give their workers equal
    seeds and augment their different samples alike. Draws in the main process are not judged across ranks: a
    model built alike on every rank is what DDP needs (it broadcasts rank 0's parameters anyway), a
    DistributedSampler shuffles alike on every rank by design (each rank then takes its own share), and dropout
    masks shared by ranks seeded alike are the usual data-parallel setup, not a bug."""
    quiet = tuple(silenced)
    sites: dict[tuple[str, str, str], list[tuple[RepeatEvidence, _Draw]]] = {}
    for rep in ranks:
        for draw in _draws(rep):
            e = draw.event
            if draw.worker is not None and e.get("rank") is not None and e["loc"] \
                    and not any(_same_site(e["loc"], s) for s in quiet):
                sites.setdefault((e["loc"], e["site"], e["fn"]), []).append((rep, draw))
    found: dict[str, RepeatedRandomness] = {}
    for (loc, _, _), group in sites.items():
        pairs = _across_ranks([d for _, d in group])
        if loc not in found and pairs and _convincing(pairs):
            rep = next(r for r, d in group if d is pairs[0][0])  # the origin is looked up in the first draw's rank
            found[loc] = _describe(rep, loc, "ranks", pairs)
    return list(found.values())


def _draws(rep: RepeatEvidence) -> list[_Draw]:
    main = [_Draw(e, None, i) for i, e in _numbered(rep.events)]
    return main + [_Draw(e, e.get("worker"), i) for i, e in _numbered(rep.worker_events)]


def _numbered(events: list[Event]) -> list[tuple[int, RandomDrawEvent]]:
    """The draw events with their positions among all the process's events."""
    return [(i, select([e], RandomDrawEvent)[0]) for i, e in enumerate(events) if e.get("type") == "random-draw"]


def _same_site(loc: str, silenced: str) -> bool:
    return loc == silenced or loc.endswith("/" + silenced)


Pair = tuple[_Draw, _Draw]


def _equal_pairs(draws: Sequence[_Draw], key: Callable[[_Draw], Any], apart: Callable[[_Draw, _Draw], bool],
                 one_stream: Callable[[_Draw, _Draw], bool] | None = None) -> list[Pair]:
    """Pairs of draws that share `key` (the same slot) and the same mark while `apart` says they should differ, and
    that `one_stream` (default: `_one_generator`) counts as drawn from one stream of randomness."""
    same_stream = one_stream or _one_generator
    slots: dict[Any, list[_Draw]] = {}
    for d in draws:
        if d.mark is not None:
            slots.setdefault((key(d), d.mark), []).append(d)
    pairs: list[Pair] = []
    for same in slots.values():
        first = same[0]
        pairs.extend((first, other) for other in same[1:] if apart(first, other) and same_stream(first, other))
    return pairs


def _one_generator(a: _Draw, b: _Draw) -> bool:
    """Both drew from one generator: a global RNG, or one RNG object of the script (a copy of it in each worker).
    Two objects the script made alike (`default_rng(0)` at each call: a fixed projection, a seeded test-time
    augmentation, a fixed validation subset) repeat by design, and are not judged."""
    return a.event.get("obj") == b.event.get("obj")


def _recreated(a: _Draw, b: _Draw) -> bool:
    """One generator, or an RNG object the script re-creates alike inside the training step (a noise helper making
    `torch.Generator().manual_seed(42)` at each call): two of its objects drawn at consecutive optimizer steps,
    grad enabled (the caller judges only those). Objects made alike at setup, or once per epoch, stay by design."""
    return _one_generator(a, b) or ("obj" in a.event and "obj" in b.event
                                    and abs(a.event["step"] - b.event["step"]) == 1)


def _process(d: _Draw) -> tuple[int | None, int | None]:
    return d.event.get("rank"), d.worker


def _across_workers(draws: Sequence[_Draw]) -> list[Pair]:
    """Two workers' draws in one epoch from one state (a worker process restarts its draw count)."""
    return _equal_pairs([d for d in draws if d.worker is not None], lambda d: (d.event.get("rank"), d.event["epoch"]),
                        lambda a, b: a.worker != b.worker)


def _across_ranks(draws: Sequence[_Draw]) -> list[Pair]:
    return _equal_pairs(draws, lambda d: (d.worker, d.event["epoch"], d.event["n"]),
                        lambda a, b: a.event.get("rank") != b.event.get("rank"))


def _across_epochs(draws: Sequence[_Draw]) -> list[Pair]:
    """The same draw of a site (its index in the epoch) in two epochs, in one process."""
    return _equal_pairs(draws, lambda d: (_process(d), d.event["n"]), lambda a, b: a.event["epoch"] != b.event["epoch"])


def _across_steps(draws: Sequence[_Draw]) -> list[Pair]:
    """Draws of a site at two optimizer steps of one epoch, in one process."""
    return _equal_pairs([d for d in draws if d.event["step"] >= 0], lambda d: (_process(d), d.event["epoch"]),
                        lambda a, b: a.event["step"] != b.event["step"], _recreated)


def _across_samples(draws: Sequence[_Draw]) -> list[Pair]:
    """Several draws of a site in one step (one worker's batch) from one state: every sample drew alike."""
    return _equal_pairs(draws, lambda d: (_process(d), d.event["epoch"], d.event["step"]),
                        lambda a, b: a.event["n"] != b.event["n"])


def _period(across: Across, pairs: Sequence[Pair]) -> Across:
    """Draws that repeat every k > 1 steps of one epoch (no DataLoader marks the epochs): a seeding at the start
    of each pass over k steps, an epoch; every step alike is a seeding inside the step loop."""
    if across == "steps" and all(abs(b.event["step"] - a.event["step"]) > 1 for a, b in pairs):
        return "epochs"
    return across


_FINDERS: dict[Across, Callable[[Sequence[_Draw]], list[Pair]]] = {
    "workers": _across_workers, "ranks": _across_ranks, "epochs": _across_epochs, "steps": _across_steps,
    "samples": _across_samples}


def _direct(pair: Pair) -> bool:
    return all(d.event.get("state") is not None for d in pair)


def _convincing(pairs: Sequence[Pair]) -> bool:
    """Equal states are proof; equal values alone only for draws large enough not to collide by chance."""
    if any(_direct(p) for p in pairs):
        return True
    return len(pairs) >= MIN_EQUAL and all(a.event["size"] >= MIN_VALUES for a, _ in pairs)


def _describe(rep: RepeatEvidence, loc: str, across: Across, pairs: Sequence[Pair]) -> RepeatedRandomness:
    first, other = pairs[0]
    e = first.event
    origin = _origin(rep, first)
    if origin is None and across == "ranks" and first.worker is not None:
        origin = _main_torch_seed(rep)
    created_at = origin["loc"] if origin is not None else None
    direct = [p for p in pairs if _direct(p)]
    how = "from equal generator states (direct evidence)" if direct else \
        f"equal values alone ({e['size']} values each, {len(pairs)} times: too many to collide by chance)"
    what = f"{e['size']} value{'s' if e['size'] != 1 else ''}" if e["size"] else "values"
    lines = [f"{_between(across, first, other)} drew the same {what} at {loc} ({e['fn']}) {how}; "
             f"{len(pairs)} repeated draw{'s' if len(pairs) != 1 else ''} seen"]
    if origin is not None:
        lines.append(_origin_line(origin, across, first))
    if not _one_generator(first, other):
        lines.append(f"a new RNG object, seeded alike, drew at each of these steps (objects {e.get('obj')} and "
                     f"{other.event.get('obj')}): every step starts from the same state, so the same noise is added "
                     "at every step")
        return RepeatedRandomness(loc, across, created_at, lines, (
            f"make the generator once, before the training loop, instead of at every call"
            f"{' at ' + created_at if created_at else ''}, and keep drawing from that one (or derive its seed from "
            "the step: `seed + step`)"))
    return RepeatedRandomness(loc, across, created_at, lines, _fix(across, origin, e))


_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")  # draws.EPOCHS epochs are fingerprinted


def _nth(epoch: int) -> str:
    """An epoch as the recorder counts it (DataLoader iterations started: 1 for the first), named by its place, not
    by a number a script counting from 0 would read as another epoch: `first`."""
    return _ORDINALS[epoch - 1] if 1 <= epoch <= len(_ORDINALS) else f"{epoch}th"


def _in_epoch(epoch: int) -> str:
    return "before any DataLoader epoch" if epoch < 1 else f"in the {_nth(epoch)} epoch"


def _between(across: Across, a: _Draw, b: _Draw) -> str:
    ea, eb = a.event, b.event
    if across == "workers":
        return f"DataLoader workers {a.worker} and {b.worker} ({_in_epoch(ea['epoch'])})"
    if across == "ranks":
        worker = f" (DataLoader worker {a.worker} of each, {_in_epoch(ea['epoch'])})" if a.worker is not None else ""
        return f"ranks {ea.get('rank')} and {eb.get('rank')}{worker}"
    if across == "epochs" and ea["epoch"] == eb["epoch"]:
        return f"optimizer steps {ea['step']} and {eb['step']} (the same draw of two passes over the steps)"
    if across == "epochs":
        return f"the {_nth(ea['epoch'])} and {_nth(eb['epoch'])} epochs (the same draw of each)"
    if across == "steps":
        return f"optimizer steps {ea['step']} and {eb['step']}"
    return f"draws {ea['n']} and {eb['n']} of one " + ("batch" if a.worker is not None else f"step ({ea['step']})")


def _origin(rep: RepeatEvidence, draw: _Draw) -> GeneratorEvent | SeedEvent | None:
    """Where the draw's generator got its state: the script's RNG object's creation or last seeding, or the last
    seeding of a global RNG before the draw (in its worker, else in the main process)."""
    e = draw.event
    if "obj" in e:
        made = [g for g in rep.of(GeneratorEvent) + rep.workers(GeneratorEvent) if g.get("obj") == e["obj"]]
        return made[-1] if made else None
    if e["source"] != "global":
        return None
    if draw.worker is not None:  # a worker's own seeding (its worker_init_fn) before the draw
        seeds = [s for s in select(rep.worker_events[:draw.order], SeedEvent)
                 if s.get("worker") == draw.worker and s["lib"] == e["lib"]]
    else:
        seeds = [s for s in rep.of(SeedEvent) if s["lib"] == e["lib"] and int(s.get("at", 0)) <= int(e.get("at", 0))]
    return seeds[-1] if seeds else None


def _main_torch_seed(rep: RepeatEvidence) -> SeedEvent | None:
    """The main process's first seeding of torch's RNG: a worker not seeded by the script gets its seeds from
    that RNG (torch draws the workers' base seed from it), so ranks seeded there alike seed their workers alike."""
    seeds = [s for s in rep.of(SeedEvent) if s["lib"] == "torch"]
    return seeds[0] if seeds else None


def _origin_line(origin: GeneratorEvent | SeedEvent, across: Across, draw: _Draw) -> str:
    call = f"`{origin['fn']}({origin.get('value')!r})`" if origin.get("value") is not None else f"`{origin['fn']}`"
    if origin["type"] == "generator":
        copied = " in the main process was copied into each worker" \
            if across == "workers" and origin.get("worker") is None else ""
        return f"the RNG object made by {call} at {origin['loc']}{copied}"
    where = f" in worker {draw.worker}" if draw.worker is not None and origin.get("worker") is not None else ""
    if draw.worker is not None and origin.get("worker") is None:
        where = " in the main process, which seeds each DataLoader worker from it"
    return f"{RNG_NAMES.get(origin['lib'], origin['lib'])} was seeded by {call} at {origin['loc']}{where}"


def _fix(across: Across, origin: GeneratorEvent | SeedEvent | None, e: RandomDrawEvent) -> str:
    at = f" at {origin['loc']}" if origin is not None else ""
    if across == "workers":
        lib = origin["lib"] if origin is not None else e["lib"]
        make = {"numpy": "np.random.default_rng(torch.initial_seed() % 2**32)",
                "python": "random.Random(torch.initial_seed())"}.get(
            lib, "torch.Generator().manual_seed(torch.initial_seed())")
        return (f"give each worker its own generator: make it in a `worker_init_fn` (e.g. `dataset.rng = {make}`; "
                f"torch seeds every worker differently, anew each epoch) or derive its seed from "
                f"`torch.utils.data.get_worker_info()`, instead of the one made{at}")
    if across == "ranks" and e.get("worker") is not None:
        return (f"add the rank to the seed{at}: `seed + torch.distributed.get_rank()` (torch seeds each DataLoader "
                "worker from its rank's own RNG, so ranks seeded alike give their workers the same seeds)")
    if across == "ranks":
        return f"add the rank to the seed{at}: `seed + torch.distributed.get_rank()`"
    if across == "epochs" and origin is not None and origin.get("worker") is not None:
        return (f"seed the worker from `torch.initial_seed()` (torch draws it anew for each worker every epoch) "
                f"instead of a value that is the same every epoch{at}: DataLoader workers start anew each epoch")
    if across == "epochs":
        return (f"seed once before the epoch loop, not at each epoch{at}, or derive the seed from the epoch "
                "(`seed + epoch`)")
    if across == "steps":
        return (f"seed once before the step loop, not at each step{at}, or derive the seed from the step "
                "(`seed + step`)")
    return f"derive each sample's seed from its index (`seed + i`){at}, or seed once before drawing for all samples"
