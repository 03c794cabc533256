"""Order causes: python-hash-seed, object-order, concurrency.

Iteration order leaves no trace of its own. The evidence of its mechanism is values that arrive in another
order: op-level records that saw the divergent op's inputs hold the same values reordered, which is evidence
for the order family as a whole (an experiment says which source: a fixed PYTHONHASHSEED, a fixed address
layout). Without it, that hashes and addresses vary (true of nearly every run) is no evidence that an order
decided anything: the first two are then candidates not ruled out (basis `no-evidence`), and the script's own
`hash()` of a string whose value differed is an observation of a value that varies (circumstantial). The op
shows where the order arrived; the sets the recorder found in scope at its line (compare/set_origins.py) show
where it was made: the fix names the line that iterates them.
"""

from __future__ import annotations

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, detects, finding
from detaudit.compare.set_origins import RunOrderedSet
from detaudit.events import PARAMETERS_BY_IDENTITY, ConcurrencyEvent, HashCallEvent, HashEvent, SetOrderEvent
from detaudit.pin import Pin
from detaudit.results import Basis

COMPLETION_ORDER = ("concurrent.futures.as_completed", "multiprocessing.Pool.imap_unordered")


def _reordered(ctx: Context) -> bool:
    return ctx.op_with("input-order") is not None


def _op_line(ctx: Context, sets: list[RunOrderedSet] | None = None) -> list[str]:
    """The reordering op, and the run-ordered sets of the cause's kind in scope at its line."""
    found = ctx.op_with("input-order")
    if found is None:
        return []
    return [f"op-level records: {found.summary}", *(f"in scope at {found.record.location}: {s.text}; its "
                                                    f"iteration order changes from run to run" for s in sets or ())]


def _sets(ctx: Context, by_address: bool) -> list[RunOrderedSet]:
    """The sets in scope at the reordering op whose order follows addresses (`by_address`) or string hashes."""
    found = ctx.op_with("input-order")
    return [s for s in found.ordered_by if s.by_address == by_address] if found is not None else []


def _built(s: RunOrderedSet) -> str:
    return f" (built at {', '.join(s.built)})" if s.built else ""


ORDER_SCORE = {True: 0.75, False: 0.45}  # the same for both order causes: no record tells them apart
# records made in the optimizer's order of its parameters: at one index another parameter's is a reordering
PARAMETER_KINDS = ("grad", "param", "optstate")


def parameters_reordered(ctx: Context) -> str:
    """The first divergence is a reordering of parameters: at one index of one step, the reference recorded one
    parameter's gradient (or value, or optimizer state) and another repeat another's. The optimizer visits its
    parameters in the order it was given them, and Parameters hash by identity (their address): a set of them
    (de-duplicating tied weights with `set(model.parameters())`) or a dict keyed by them gives another order in
    each run. "" when the first divergence is no such reordering."""
    rec, div = ctx.record, ctx.divergence
    others = [(r.index, div.others[r.index]) for r in ctx.involved[1:] if r.index in div.others]
    if div.category != "structure" or rec is None or rec.kind not in PARAMETER_KINDS or not others:
        return ""
    repeat, other = others[0]
    if other.kind != rec.kind or other.step != rec.step or other.name == rec.name:
        return ""
    return (f"the first divergence is a reordering: at record #{div.index} (step {rec.step}) repeat "
            f"{ctx.ref.index} recorded {rec.kind} {rec.name!r} where repeat {repeat} recorded "
            f"{other.kind} {other.name!r}: the optimizer visits its parameters in another order in each run, and "
            "Parameters hash by identity (their memory address)")
def _parameters_through_a_set(ctx: Context) -> tuple[list[str], str]:
    """A first divergence that reorders parameters: its evidence lines, with the sets the optimizer's Parameters came
    through, and the fix, at the line that made the set where one was seen (([], "") without a reordering)."""
    reordered = parameters_reordered(ctx)
    if not reordered:
        return [], ""
    given = _parameter_sets(ctx)
    lines = [reordered] + [f"the optimizer built at {loc} was given its Parameters through a set, made at "
                           f"{', '.join(s.built)}" + (f" (`{s.name}`)" if s.name else "") +
                           ": it iterates them in the order of their addresses" for loc, s in given]
    at = f" at {given[0][1].built[0]}" if given else ""
    return lines, (f"give the optimizer its parameters in a fixed order{at}: de-duplicate tied Parameters with "
                   "`list(dict.fromkeys(model.parameters()))` (or `model.parameters()`, which already yields a tied "
                   "Parameter once) instead of a `set`" + ("" if given else _near(ctx)))


def _parameter_sets(ctx: Context) -> list[tuple[str, RunOrderedSet]]:
    """(the optimizer's line, the set) for each set an optimizer's Parameters came through before the divergence
    (recorder/evidence/set_order.py `install_optimizer`): where their order was made."""
    return [(e["loc"], RunOrderedSet.of_origin(s)) for e in ctx.ref.of(SetOrderEvent) if ctx.precedes(e)
            for s in e["sets"] if s["of"] == PARAMETERS_BY_IDENTITY]


HASH_CALL_SCORE = 0.55  # the script's own hash() of a string, whose value differed: above outside-value (0.52)


def _basis(ctx: Context, observed: bool = False) -> Basis:
    """op-records when values arrived reordered; else circumstantial for an observation of a value that varies,
    no-evidence (a candidate, not a cause) when only a setting says the source could vary."""
    return "op-records" if _reordered(ctx) else "circumstantial" if observed else "no-evidence"


def _near(ctx: Context) -> str:
    rec = ctx.record
    return f" (the first divergent record comes from {rec.location})" if rec is not None and rec.location else ""


def hash_calls(ctx: Context) -> list[tuple[str, str]]:
    """(line, evidence) of the script's own `hash()` of strings before the divergence whose values differ between
    the repeats (the first call per line): a value that changes with string hash randomization."""
    lines: list[tuple[str, str]] = []
    by_loc = [{e["loc"]: e for e in r.of(HashCallEvent) if ctx.precedes(e)} for r in ctx.involved]
    for loc, event in by_loc[0].items():
        values = [calls[loc]["value"] if loc in calls else None for calls in by_loc]
        if None not in values and ctx.differs(values):
            lines.append((loc, f"hash() of a {event['of']} at {loc} gave {ctx.pair_text(values)}: the value "
                                "changes with string hash randomization"))
    return lines


@detects(CauseId.PYTHON_HASH_SEED)
def python_hash_seed(ctx: Context) -> Finding | None:
    hashes = [r.first(HashEvent) for r in ctx.involved]
    if any(h is None for h in hashes):
        return None
    probes = [h["probe"] for h in hashes if h is not None]
    if not any(h.get("randomization") for h in hashes if h is not None) or not ctx.differs(probes):
        return None
    calls = hash_calls(ctx)
    lines = [text for _, text in calls[:3]]
    lines.append(f"PYTHONHASHSEED is not set and hash randomization is on: hash('detaudit-hash-probe') was "
                 f"{ctx.pair_text(probes)}")
    if not calls:
        lines.append("str and bytes hashes, and with them the iteration order of a set of strings, change from run "
                     "to run")
    sets = _sets(ctx, by_address=False)
    lines += _op_line(ctx, sets)
    lines.append(f"first divergence: {ctx.where()}")
    if calls:  # the evidence shows the use: the script's own hash() of a string, at its line
        loc = calls[0][0]
        fix = (f"a stable hash instead of `hash()` at {loc}: `zlib.crc32(text.encode())` (or hashlib); "
               "`PYTHONHASHSEED=0` in the environment also fixes it, but only where it is set")
        # named at its line, still circumstantial: nothing recorded shows the value reaching a tensor (as with
        # outside-value), so it ranks above the order guesses and below any cause with evidence of its own
        return finding("python-hash-seed", max(HASH_CALL_SCORE, ORDER_SCORE[_reordered(ctx)]),
                       f"hash() of a string at {loc} gives another value in every run (string hash randomization)",
                       lines, fix, [Pin.HASH_SEED], _basis(ctx, observed=True))
    in_order = (f"iterate `sorted({sets[0].name})` instead of the set at {sets[0].fix_at}{_built(sets[0])}" if sets
                else "iterate `sorted(...)` instead of the set (or build the dict from a sorted list)" + _near(ctx))
    fix = (in_order + "; where `hash(text)` itself is used (feature hashing, `hash(s) % buckets`), a stable hash "
           "instead: `zlib.crc32(s.encode())`; `PYTHONHASHSEED=0` in the environment also fixes both, but only where "
           "it is set")
    return finding("python-hash-seed", ORDER_SCORE[_reordered(ctx)], "string hash randomization changes an order "
                   "derived from a set or dict", lines, fix, [Pin.HASH_SEED], _basis(ctx))


@detects(CauseId.OBJECT_ORDER)
def object_order(ctx: Context) -> Finding | None:
    hashes = [r.first(HashEvent) for r in ctx.involved]
    if any(h is None for h in hashes) or all(h.get("aslr_disabled") for h in hashes if h is not None):
        return None
    hash_fixed = not ctx.differs([h["probe"] for h in hashes if h is not None])
    lines = ["address-space randomization is on: objects hashed by identity (the default `__hash__`) sit at "
             "other addresses in each run, so a set of them (or a dict keyed by them) iterates in another order; "
             "PYTHONHASHSEED does not change this"]
    if hash_fixed:
        lines.append("string hashing is fixed in these repeats (same hash probe), which rules out python-hash-seed")
    sets = _sets(ctx, by_address=True)
    lines += _op_line(ctx, sets)
    reordered, fix = _parameters_through_a_set(ctx)
    lines += reordered
    lines.append(f"first divergence: {ctx.where()}")
    # string hashes fixed rules out python-hash-seed; otherwise nothing recorded tells the two apart. Still a
    # guess: below outside-value (a read of a value that differs in every run, at the script's own line). Parameters
    # seen reordered are objects hashed by identity: the evidence points here
    score = ORDER_SCORE[_reordered(ctx) or bool(reordered)] + (0.05 if hash_fixed else 0.0)
    if reordered and not sets:
        return finding("object-order", score, "iteration over a set of objects hashed by identity (memory address)",
                       lines, fix, [Pin.ADDRESS_LAYOUT], "op-records" if _reordered(ctx) else "circumstantial")
    fix = (f"keep the objects of `{sets[0].name}` in a list, or iterate `sorted({sets[0].name}, key=...)` by a stable "
           f"attribute, at {sets[0].fix_at}{_built(sets[0])}" if sets else
           "keep these objects in a list, or iterate `sorted(objs, key=...)` by a stable attribute, instead of a set"
           + _near(ctx))
    return finding("object-order", score, "iteration over a set of objects hashed by identity (memory address)",
                   lines, fix, [Pin.ADDRESS_LAYOUT], _basis(ctx))


@detects(CauseId.CONCURRENCY)
def concurrency(ctx: Context) -> Finding | None:
    events = [e for e in ctx.ref.of(ConcurrencyEvent) if ctx.precedes(e)]
    if not events:
        return None
    completion = [e for e in events if e.get("what") in COMPLETION_ORDER]
    # values reordered at the divergent op: the order family's evidence, and completion order is this family's
    # member the script itself shows, so it leads the order guesses that only the reordering supports
    reordered = bool(completion) and _reordered(ctx)
    lines = [f"{e['what']} at {e.get('loc')}" + (f" (target {e['target']})" if e.get("target") else "")
             for e in (completion + [e for e in events if e not in completion])[:4]]
    if completion:
        lines.append("results are consumed in completion order, which depends on thread scheduling")
    lines += _op_line(ctx) if reordered else []
    lines.append(f"first divergence: {ctx.where()}")
    first = (completion or events)[0]
    fix = f"combine results in a fixed order at {first.get('loc')}: {_in_order(str(first.get('what')))}"
    basis: Basis = "op-records" if reordered else "direct" if completion else "circumstantial"
    return finding("concurrency", 0.9 if reordered else 0.85 if completion else 0.6, "user threads or processes "
                   "combine results in completion order", lines, fix, basis=basis)


def _in_order(what: str) -> str:
    """How to read results in submission order with the API the script used (a Pool has no executor.map)."""
    if what.startswith("multiprocessing"):
        return ("`pool.imap(...)` or `pool.map(...)` instead of `imap_unordered` (results in input order), and "
                "give each process its own output slot instead of a shared accumulator")
    if what == "threading.Thread.start":  # a plain Thread has no future to read in order
        return ("give each thread its own output slot (`results[i]` of a list made before the threads start), "
                "`join()` every thread, then combine the slots in index order; a shared accumulator, even under "
                "a `threading.Lock`, adds the results in whatever order the threads arrive")
    return ("keep the futures in a list and read `[f.result() for f in futures]` (or use `executor.map`), and "
            "give each thread its own output slot instead of a shared accumulator")
