"""`detaudit batch`: a repeat's probe events -> a BatchFinding (is a row's result independent of its batch?).

The probes ran inside the repeat (recorder/batchprobe.py) and left `batch-call`, `batch-skip` and
`batch-origin` events in its trace (docs/trace-format.md); this module only reads them: no torch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from detaudit.batch.decoding import BatchTokens, tokens_at_size
from detaudit.batch_events import BatchSpot, BatchSubset
from detaudit.compare.tokens import token_steps
from detaudit.events import BatchCallEvent, BatchOriginEvent, BatchSkipEvent, Event, TokenEvent, select

BatchVerdict = Literal["batch-invariant", "batch-variant", "inconclusive"]
# a difference above this share of the rows' largest magnitude (and 16 ULPs of the dtype's epsilon) is no
# rounding: rows read each other's data (a mask or padding bug), a correctness bug (docs/batch.md)
LARGE_RELATIVE = 1e-3
_EPS = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7,
        "complex64": 2.0 ** -23, "complex128": 2.0 ** -52}
NOT_COMPARABLE = ("batch-statistics", "dropout", "random")  # skip reasons that are the model's design
HARNESS_SKIPS = ("no-batch", "aggregate-output")  # what PyTorch's harness reports as pass_due_to_skip


def is_large(max_abs_diff: float, scale: float, dtype: str, structural: bool = False) -> bool:
    """Whether a difference is too large to be rounding: a value reduced over the batch or a shape that
    changes with it, or a difference above LARGE_RELATIVE (at least 16 epsilons of the dtype) of the
    rows' largest magnitude. Integer outputs that differ at all count as large."""
    if structural:
        return True
    if dtype not in _EPS:
        return max_abs_diff > 0
    threshold = max(LARGE_RELATIVE, 16 * _EPS[dtype]) * (scale if scale > 0 else 1.0)
    return max_abs_diff > threshold


@dataclass(frozen=True)
class SubsetResult:
    """Every probe of one kind and size across the probed calls: how many agreed, and the worst difference."""

    kind: str  # prefix, reversed, mixed
    size: int  # rows in the probe's batch (`mixed`, `reversed`: the whole batch's size)
    probes: int
    agreed: int
    rows_differ: int
    max_abs_diff: float
    max_ulp: int
    ladder: bool = False  # a size of PyTorch's harness (its halving ladder, or --sizes) for some call

    @property
    def agree(self) -> bool:
        return self.agreed == self.probes


@dataclass(frozen=True)
class LadderSize:
    """One size of PyTorch's harness's ladder across the probed calls that had it: how many, how many failed."""

    size: int
    calls: int
    failed: int

    @property
    def status(self) -> str:
        return "pass" if not self.failed else f"fail_batch_invariance_at_{self.size}"


@dataclass(frozen=True)
class Harness:
    """The finding in the terms of PyTorch's batch-invariance harness (its `--batch-invariant` mode): `pass`,
    `fail_batch_invariance_at_{size}` (the first failing size of the first failing call, in the ladder's order,
    largest first), `pass_due_to_skip` (no call had a batch to slice or a row result to compare), or
    `not_probed` (calls skipped for reasons the harness does not meet: it forces eval(), so no batch statistics)."""

    status: str
    sizes: tuple[LadderSize, ...]  # largest first
    reason: str | None = None  # why skipped, in words

@dataclass(frozen=True)
class Spot:
    """The first submodule or op whose rows differ while its inputs' rows agree (BatchSpot, typed)."""

    name: str
    module: str
    cls: str
    location: str
    max_abs_diff: float
    max_ulp: int
    scale: float
    dtype: str
    across_rows: bool
    shape_changed: bool

    @classmethod
    def of(cls, spot: BatchSpot | None) -> Spot | None:
        if spot is None:
            return None
        return cls(spot["name"], spot.get("module", ""), spot.get("cls", ""), spot.get("loc", ""),
                   spot.get("max_abs_diff", 0.0), spot.get("max_ulp", 0), spot.get("scale", 0.0),
                   spot.get("dtype", ""), spot.get("across_rows", False), spot.get("shape_changed", False))

    @property
    def large(self) -> bool:
        return is_large(self.max_abs_diff, self.scale, self.dtype, self.across_rows or self.shape_changed)


@dataclass(frozen=True)
class FirstVariant:
    """The first probed call whose rows depend on the batch, and where inside it that starts."""

    call_module: str  # the probed module (`Net`)
    call: int
    rows: int  # its batch size
    location: str  # where the script called it
    differ: tuple[str, ...]  # the probes whose rows differ (`1`, `7`, `reversed`, `mixed`)
    agree: tuple[str, ...]
    max_abs_diff: float  # over the call's probes
    max_ulp: int
    scale: float
    dtype: str
    large: bool  # too large to be rounding (is_large)
    structural: bool  # a value reduced over the batch, or a shape that changes with it
    module: Spot | None  # the first submodule (None: the probed module's own code, or not searched)
    op: Spot | None
    searched_size: int | None  # the probe the origin search re-ran
    note: str | None
    knob: str | None = None  # the installed torch's batch-invariance setting (recorder/batchknob.py), if any

    @property
    def sizes_text(self) -> str:
        """`batch 1 and 7 differ from 256; 32, 128 and reversed agree`."""
        def words(items: tuple[str, ...]) -> str:
            return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

        text = f"batch {words(self.differ)} {'differs' if len(self.differ) == 1 else 'differ'} from {self.rows}"
        return text + (f"; {words(self.agree)} {'agrees' if len(self.agree) == 1 else 'agree'}" if self.agree else "")


@dataclass(frozen=True)
class BatchDimUse:
    """Probed calls whose rows were taken along one dim, and where that dim came from (recorder/batchdim.py)."""

    dim: int
    source: str  # option (--batch-dim), declared (a layer's batch_first), convention (dim 0)
    detail: str  # the first such call's reason, in words
    calls: int


@dataclass(frozen=True)
class BatchFinding:
    """What the probes of one repeat found."""

    verdict: BatchVerdict
    probed_calls: int
    variant_calls: int
    not_reproduced: int  # calls whose whole batch, re-evaluated, did not give the call's own output
    subsets: tuple[SubsetResult, ...]
    skipped: dict[str, int]  # why -> calls (SkipReason)
    skip_details: dict[str, str]  # why -> the first such call's detail, with its module
    first_variant: FirstVariant | None
    batch_dims: tuple[BatchDimUse, ...] = ()
    harness: Harness = Harness("not_probed", ())
    not_compared: dict[str, int] = field(default_factory=dict)  # an output left out (aggregate) -> calls
    train_mode_calls: int = 0  # probed calls whose module was in train mode (the harness probes in eval())
    tokens: BatchTokens | None = None  # the script decoded: its sequences' first divergent tokens per probe

    @property
    def not_comparable(self) -> int:
        return sum(n for why, n in self.skipped.items() if why in NOT_COMPARABLE)


def _label(subset: BatchSubset) -> str:
    return str(subset["size"]) if subset["subset"] == "prefix" else subset["subset"]


def analyse(events: list[Event]) -> BatchFinding:
    """The probe events of one repeat, in order -> the finding."""
    calls = select(events, BatchCallEvent)
    skips = select(events, BatchSkipEvent)
    origins = select(events, BatchOriginEvent)
    grouped: dict[tuple[str, int], list[BatchSubset]] = {}
    for call in calls:
        for subset in call["subsets"]:
            grouped.setdefault((subset["subset"], subset["size"]), []).append(subset)
    order = {"prefix": 0, "reversed": 1, "mixed": 2}
    ordered = sorted(grouped.items(), key=lambda kv: (order.get(kv[0][0], 3), kv[0][1]))
    subsets = tuple(SubsetResult(kind, size, len(found), sum(not _differs(s) for s in found),
                                 sum(s["rows_differ"] for s in found), max(s.get("max_abs_diff", 0.0) for s in found),
                                 max(s.get("max_ulp", 0) for s in found), any(_rung(s) for s in found))
                    for (kind, size), found in ordered)
    variant = [c for c in calls if any(_differs(s) for s in c["subsets"])]
    first = _first_variant(variant[0], origins) if variant else None
    skipped = Counter(str(s["why"]) for s in skips)
    details: dict[str, str] = {}
    for skip in skips:
        details.setdefault(skip["why"], f"{skip['module']} call {skip['call']}: {skip['detail']}")
    verdict: BatchVerdict = "batch-variant" if variant else "batch-invariant" if calls else "inconclusive"
    not_compared = Counter(path for c in calls for path in c.get("not_compared", []))
    return BatchFinding(verdict, len(calls), len(variant), sum(not c["reproduced"] for c in calls), subsets,
                        dict(skipped), details, first, _batch_dims(calls), _harness(calls, skips),
                        dict(not_compared), sum(bool(c.get("training")) for c in calls),
                        tokens_at_size(calls, token_steps(select(events, TokenEvent))))


def _rung(subset: BatchSubset) -> bool:
    return subset.get("ladder", subset["subset"] == "prefix")  # traces before the field: every prefix was one


def _harness(calls: list[BatchCallEvent], skips: list[BatchSkipEvent]) -> Harness:
    """The harness's status and its sizes' (docs/batch.md, "PyTorch's harness")."""
    sizes: dict[int, list[bool]] = {}
    status = None
    for c in calls:
        rungs = sorted((s for s in c["subsets"] if _rung(s)), key=lambda s: -s["size"])
        for s in rungs:
            sizes.setdefault(s["size"], []).append(_differs(s))
        failing = next((s["size"] for s in rungs if _differs(s)), None)
        if status is None and failing is not None:
            status = f"fail_batch_invariance_at_{failing}"
    ladder = tuple(LadderSize(k, len(f), sum(f)) for k, f in sorted(sizes.items(), reverse=True))
    if calls:
        return Harness(status or "pass", ladder)
    harness_skips = [s for s in skips if s["why"] in HARNESS_SKIPS]
    if harness_skips:
        first = harness_skips[0]
        return Harness("pass_due_to_skip", ladder, f"{first['module']} call {first['call']} ({first['why']}): "
                                                   f"{first['detail']}")
    return Harness("not_probed", ladder, "no call was probed" + (f" ({skips[0]['why']}: {skips[0]['detail']})"
                                                               if skips else ""))


def _batch_dims(calls: list[BatchCallEvent]) -> tuple[BatchDimUse, ...]:
    """The dims the probed calls' rows were taken along, with their source, in the order first met."""
    used: dict[tuple[int, str], tuple[str, int]] = {}
    for c in calls:
        key = (c["batch_dim"], c.get("batch_dim_from", "option"))
        detail, n = used.get(key, (c.get("batch_dim_detail", ""), 0))
        used[key] = (detail, n + 1)
    return tuple(BatchDimUse(dim, source, detail, n) for (dim, source), (detail, n) in used.items())


def _differs(subset: BatchSubset) -> bool:
    return bool(subset["rows_differ"] or subset.get("across_rows") or subset.get("shape_changed"))


def _first_variant(call: BatchCallEvent, origins: list[BatchOriginEvent]) -> FirstVariant:
    subsets = call["subsets"]
    worst = max(subsets, key=lambda s: s.get("max_abs_diff", 0.0))
    structural = any(s.get("across_rows") or s.get("shape_changed") for s in subsets)
    origin = next((o for o in origins if o["module"] == call["module"] and o["call"] == call["call"]), None)
    return FirstVariant(
        call_module=call["module"], call=call["call"], rows=call["rows"], location=call.get("loc", ""),
        differ=tuple(_label(s) for s in subsets if _differs(s)), agree=tuple(_label(s) for s in subsets
                                                                             if not _differs(s)),
        max_abs_diff=worst.get("max_abs_diff", 0.0), max_ulp=max(s.get("max_ulp", 0) for s in subsets),
        scale=worst.get("scale", 0.0), dtype=worst.get("dtype", ""),
        large=structural or is_large(worst.get("max_abs_diff", 0.0), worst.get("scale", 0.0), worst.get("dtype", "")),
        structural=structural,
        module=Spot.of(origin["first_module"]) if origin else None,
        op=Spot.of(origin["first_op"]) if origin else None,
        searched_size=origin["size"] if origin else None, note=origin["note"] if origin else None,
        knob=origin.get("knob") if origin else None)
