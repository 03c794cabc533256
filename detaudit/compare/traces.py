"""Find the first place where the repeats' traces differ, and how far the difference spreads.

Streaming: traces are walked in lockstep chunks (align.py), so memory stays bounded however long the run.
Each repeat is compared with a reference: bitwise with the first repeat on its own device,
and, for the first repeat on another device, within atol/rtol of repeat 0 (sampled values,
with max-abs and max-ULP figures).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from detaudit.compare.align import Aligner, Block, describe, reference_pairs
from detaudit.results import Divergence, Tolerance
from detaudit.trace import RECORD_DTYPE, EmptyTrace, Flag, Kind, RecordStream

# records compared by dtype and shape only: contents unread (meta, vmapped, unreadable tensors) or no result
SHAPE_ONLY = int(Flag.NO_DATA | Flag.NOT_RESULT)


@dataclass(frozen=True)
class StepSpread:
    step: int
    records: int
    differing: int
    max_abs_diff: float | None
    modules: dict[str, int] = field(default_factory=dict)  # module -> its differing records in this step


@dataclass(frozen=True)
class Comparison:
    """The repeats' traces side by side; the op behind a divergence is the next stage's (oprules.py)."""

    repeats: int
    records: list[int]
    complete: list[bool]
    first_divergence: Divergence | None
    records_compared: int = 0
    records_differing: int = 0
    records_shape_only: int = 0  # of records_compared: dtype and shape only (Flag.NO_DATA, Flag.NOT_RESULT)
    by_step: list[StepSpread] = field(default_factory=list)
    aligned_to_end: bool = True
    recording_failed: dict[int, str] = field(default_factory=dict)  # repeat -> why detaudit recorded nothing

    @property
    def divergent(self) -> bool:
        return self.first_divergence is not None


def _ordered_bits(values: np.ndarray, dtype: str) -> np.ndarray | None:
    """Map floats to integers whose difference counts ULPs (sign-magnitude to two's complement)."""
    if dtype == "float64":
        bits = values.astype(np.float64).view(np.int64)
    elif dtype in ("float32", "complex64"):
        bits = values.astype(np.float32).view(np.int32).astype(np.int64)
    elif dtype == "float16":
        bits = values.astype(np.float16).view(np.int16).astype(np.int64)
    elif dtype == "bfloat16":
        bits = (values.astype(np.float32).view(np.int32) >> 16).astype(np.int64)
    else:
        return None
    width = 64 if dtype == "float64" else 32 if dtype in ("float32", "complex64") else 16
    min_int = np.int64(-(1 << (width - 1))) if width < 64 else np.iinfo(np.int64).min
    return np.where(bits < 0, min_int - bits, bits)


def gaps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a-b| per sampled element: 0 where equal (NaN equals NaN, inf equals inf), inf for a NaN
    against a number, which no tolerance accepts."""
    with np.errstate(invalid="ignore"):
        gap = np.abs(a - b)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return np.where(same, 0.0, np.where(np.isnan(gap), np.inf, gap))


def nan_mismatch(a: np.ndarray, b: np.ndarray) -> bool:
    """A sampled element is NaN in one repeat and a number in the other."""
    return bool((np.isnan(a) != np.isnan(b)).any())


def sample_differences(a: np.ndarray, b: np.ndarray, dtype: str) -> tuple[float | None, int | None]:
    """(max |a-b|, max ULP distance) over sampled values; None where undefined or all equal NaN.

    A NaN against a number is an infinite difference with no ULP distance, never agreement.
    """
    both_nan = np.isnan(a) & np.isnan(b)
    if both_nan.all():
        return None, None
    max_abs = float(gaps(a, b).max())
    if nan_mismatch(a, b):
        return max_abs, None
    bits_a, bits_b = _ordered_bits(a, dtype), _ordered_bits(b, dtype)
    ulp = None
    if bits_a is not None and bits_b is not None:
        with np.errstate(over="ignore"):
            ulps = np.abs(bits_a - bits_b)
        ulp = int(np.where(both_nan, 0, ulps).max())
    return max_abs, ulp


def _within(a: np.ndarray, b: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Per record: all sampled values within tolerance (NaN equals NaN)."""
    close = np.isclose(a, b, atol=tol.atol, rtol=tol.rtol, equal_nan=True)
    return close.all(axis=1)


def same_values(a: np.ndarray, b: np.ndarray, bitwise: bool, tolerance: Tolerance) -> np.ndarray:
    """Per pair of records: the same digest, or (not bitwise) sampled values within the tolerance."""
    same = a["digest"] == b["digest"]
    return same if bitwise else same | _within(a["samples"], b["samples"], tolerance)


class MissingTrace(RecordStream):
    """A repeat that left no trace file (stopped before it could record): an empty, incomplete
    stream in memory, so reading a run directory never writes into it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.header: dict[str, Any] = {"never_started": True}
        self.strings: list[str] = [""]
        self.events: list[dict[str, Any]] = []
        self.footer: dict[str, Any] | None = None

    def take(self, n: int) -> np.ndarray:
        return np.empty(0, dtype=RECORD_DTYPE)

    def drain(self) -> None:
        return None


def open_stream(path: Path) -> RecordStream:
    """The trace at `path`, or an empty incomplete stand-in when the repeat wrote none."""
    path = Path(path)
    if not os.path.lexists(path):  # a link (even a dangling one) is refused by the reader, naming it
        return MissingTrace(path)
    try:
        return RecordStream(path)
    except EmptyTrace:
        return MissingTrace(path)


def compare_traces(
    paths: Sequence[Path | RecordStream], devices: Sequence[str] | None = None, tolerance: Tolerance | None = None,
    truncated: Sequence[bool] | None = None,
) -> Comparison:
    """Compare every repeat's trace; see the module docstring for what "differs" means.

    `truncated` marks repeats cut short from outside (timed out): one of them ending is no
    divergence, so only the records every repeat holds up to there are compared; the same holds
    for a trace without a footer. A missing trace counts as an empty, incomplete one. An open stream may
    stand for a path (compare/resumed_alignment.py's windows onto a trace).
    """
    streams = [p if isinstance(p, RecordStream) else open_stream(Path(p)) for p in paths]
    walk = _Walk(streams, list(devices) if devices is not None else ["same"] * len(paths),
                 tolerance or Tolerance(), list(truncated) if truncated is not None else [False] * len(paths))
    aligner = Aligner(streams)
    for block in aligner:
        walk.block(block, aligner.strings.texts)
    counts = aligner.finish()  # count what is left, for the per-repeat table
    return Comparison(
        repeats=len(streams), records=counts, complete=[s.footer is not None for s in streams],
        recording_failed={i: str(s.footer["recording_failed"]) for i, s in enumerate(streams)
                          if isinstance(s.footer, dict) and s.footer.get("recording_failed")},
        first_divergence=walk.first, records_compared=walk.compared, records_differing=walk.differing,
        records_shape_only=walk.shape_only,
        by_step=walk.by_step(), aligned_to_end=walk.aligned,
    )


class _Walk:
    """What the comparison has found so far, block by block: the first divergence, and the spread of the
    differing records by step and module (aligned records only)."""

    def __init__(self, streams: list[RecordStream], devices: list[str], tolerance: Tolerance,
                 cut: list[bool]) -> None:
        self.streams, self.tolerance, self.cut = streams, tolerance, cut
        self.pairs = reference_pairs(devices)
        self.first: Divergence | None = None
        self.spread: dict[int, list[Any]] = {}
        self.module_spread: dict[tuple[int, str], int] = {}  # (step, module) -> differing records
        self.compared = self.differing = self.shape_only = 0
        self.aligned = True

    def block(self, block: Block, texts: list[str]) -> None:
        """One lockstep block of every trace: its first divergence, its spread, a trace that ends in it."""
        was_aligned = self.aligned
        upto = self._first_in(block)
        # spread: per-step counts of records that differ in any pair (aligned records only, so the
        # figures do not depend on where chunks happen to end)
        if was_aligned:
            self._spread(block, upto, texts)
        self._ends_in(block)

    def _first_in(self, block: Block) -> int:
        """Update the first divergence from this block; the records before any structural divergence in it."""
        chunks, base, n = block.chunks, block.base, block.n
        upto = n
        for ref, rep, bitwise in self.pairs:
            a, b = chunks[ref][:n], chunks[rep][:n]
            same_value = same_values(a, b, bitwise, self.tolerance)
            bad_struct = np.flatnonzero(~block.same_structure(ref, rep))
            limit = int(bad_struct[0]) if len(bad_struct) else n
            upto = min(upto, limit)
            if len(bad_struct):
                self.aligned = False
                if self.first is None or base + limit < self.first.index:
                    self.first = _structure(self.streams, ref, rep, chunks, base, limit)
            if not self.aligned:
                same_value = same_value[:limit]
            bad_value = np.flatnonzero(~same_value[:limit])
            if len(bad_value):
                idx = int(bad_value[0])
                first = self.first
                if first is None or base + idx < first.index or (
                    base + idx == first.index and first.category == "content"
                ):
                    self.first = _content(self.streams, ref, rep, chunks, base, idx, bitwise, first)
        return upto

    def _spread(self, block: Block, upto: int, texts: list[str]) -> None:
        """Count the records of the block's aligned part that differ in any pair, by step and by module."""
        chunks, maps = block.chunks, block.maps
        any_diff = np.zeros(upto, dtype=bool)
        max_diff = np.zeros(upto)
        for ref, rep, bitwise in self.pairs:
            a, b = chunks[ref][:upto], chunks[rep][:upto]
            diff = a["digest"] != b["digest"]
            if not bitwise:
                diff &= ~_within(a["samples"], b["samples"], self.tolerance)
            any_diff |= diff
            gap = gaps(a["samples"], b["samples"]).max(axis=1)
            max_diff = np.maximum(max_diff, np.where(diff, gap, 0.0))
        steps = chunks[0]["step"][:upto]
        if any_diff.any():
            modules = maps[0][chunks[0]["module"][:upto][any_diff]]
            # records outside a module call (gradients, parameters, optimizer state) go by their name
            names = np.where(modules == 0, maps[0][chunks[0]["name"][:upto][any_diff]], 0)
            held = np.isin(chunks[0]["kind"][:upto][any_diff], _HELD_BY_A_MODULE)
            keys, hits = np.unique(np.stack([steps[any_diff].astype(np.int64), modules, names, held]), axis=1,
                                   return_counts=True)
            for step, module, name, parameter, hit in zip(*keys.tolist(), hits.tolist()):
                owner = texts[module] if module else owning_module(texts[name], bool(parameter))
                self.module_spread[(step, owner)] = self.module_spread.get((step, owner), 0) + hit
        for step, total, count, peak in _per_step(steps, any_diff, max_diff):
            entry = self.spread.setdefault(step, [0, 0, 0.0])
            entry[0] += total
            entry[1] += count
            entry[2] = max(entry[2], peak)
        self.compared += upto
        self.shape_only += int(np.count_nonzero(block.chunks[0][:upto]["flags"] & SHAPE_ONLY))
        self.differing += int(any_diff.sum())

    def _ends_in(self, block: Block) -> None:
        """A trace that ends in this block while others go on: a divergence, unless it was cut short from outside.

        A timed-out repeat stopping is no divergence: the common prefix is all there is to compare; nor is
        a recording that ends without a footer (killed, or its writes failed): it is compared as far as it goes.
        """
        chunks, n = block.chunks, block.n
        if n >= block.longest or any(self.cut[i] or self.streams[i].footer is None
                                     for i, c in enumerate(chunks) if len(c) == n):
            return
        if self.aligned:  # one trace ended while others go on: a structural or outcome difference
            short = [i for i, c in enumerate(chunks) if len(c) == n]
            long = [i for i, c in enumerate(chunks) if len(c) > n]
            if self.first is None or block.base + n < self.first.index:
                self.first = _ended_early(self.streams, short, long, chunks, block.base, n)
        self.aligned = False

    def by_step(self) -> list[StepSpread]:
        """The spread, one entry per step that had aligned records."""
        modules_by_step: dict[int, dict[str, int]] = {}
        for (number, module), count in sorted(self.module_spread.items()):
            modules_by_step.setdefault(number, {})[module] = count
        return [StepSpread(step, v[0], v[1], v[2] if v[1] else None, modules_by_step.get(step, {}))
                for step, v in sorted(self.spread.items())]


ELSEWHERE = "the sampled elements agree: the difference lies elsewhere in the tensor"  # its size unrecorded
ROOT_MODULE = "(root module)"  # the owner of a model's own parameters (`weight`: the model is an nn.Linear)
_HELD_BY_A_MODULE = [Kind.PARAM, Kind.GRAD, Kind.OPTSTATE]


def owning_module(name: str, parameter: bool = True) -> str:
    """The module a record outside any module call belongs to: `2` for the parameter `2.weight` and its
    `2.weight:momentum_buffer`; ROOT_MODULE for the root's own `weight`. A record that is no parameter's
    (a torch.save, a checkpoint) goes by its name less its last part, or its whole name."""
    qualified = name.split(":", 1)[0]
    if "." in qualified:
        return qualified.rsplit(".", 1)[0]
    return ROOT_MODULE if parameter else qualified


def _per_step(steps: np.ndarray, differs: np.ndarray, gaps: np.ndarray) -> list[tuple[int, int, int, float]]:
    """(step, records, differing, max gap) for each step in a chunk, in one pass (no loop over steps)."""
    if not len(steps):
        return []
    order = np.argsort(steps, kind="stable")
    ordered = steps[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    totals = np.diff(np.r_[starts, len(steps)])
    counts = np.add.reduceat(differs[order].astype(np.int64), starts)
    peaks = np.maximum.reduceat(gaps[order], starts)
    return list(zip(ordered[starts].tolist(), totals.tolist(), counts.tolist(), peaks.tolist()))


def _content(streams: list[RecordStream], ref: int, rep: int, chunks: list[np.ndarray], base: int, idx: int,
             bitwise: bool, previous: Divergence | None) -> Divergence:
    a, b = chunks[ref][idx], chunks[rep][idx]
    info = describe(streams[ref], a, base + idx)
    max_abs, ulp = sample_differences(a["samples"], b["samples"], info.dtype)
    repeats = [rep]
    if previous is not None and previous.index == base + idx and previous.category == "content":
        repeats = sorted(set(previous.repeats) | {rep})
        max_abs = _max_opt(previous.max_abs_diff, max_abs)
        ulp = _max_opt(previous.max_ulp_diff, ulp)
    detail = "bits differ" if bitwise else "outside tolerance"
    if nan_mismatch(a["samples"], b["samples"]):
        detail += " (a sampled element is NaN in one repeat and a number in the other)"
    elif max_abs == 0.0:
        detail += f" ({ELSEWHERE})"
        max_abs, ulp = None, None
    return Divergence(base + idx, "content", info, repeats, ref, max_abs, ulp, detail)


def _max_opt(x: Any, y: Any) -> Any:
    if x is None:
        return y
    if y is None:
        return x
    return max(x, y)


def _structure(streams: list[RecordStream], ref: int, rep: int, chunks: list[np.ndarray], base: int,
               idx: int) -> Divergence:
    info = describe(streams[ref], chunks[ref][idx], base + idx)
    other = describe(streams[rep], chunks[rep][idx], base + idx)
    if (info.kind, info.name) != (other.kind, other.name):
        detail = (f"repeat {ref} recorded {info.kind} {info.name!r} here, repeat {rep} recorded {other.kind} "
                  f"{other.name!r}")
    else:  # the same record on both sides: what differs is its step, shape or dtype
        differs = ", ".join(f"{what} {mine} in repeat {ref} and {theirs} in repeat {rep}" for what, mine, theirs in
                            (("step", info.step, other.step), ("shape", info.shape or "()", other.shape or "()"),
                             ("dtype", info.dtype, other.dtype)) if mine != theirs)
        detail = f"both repeats recorded {info.kind} {info.name!r} here, with {differs}"
    return Divergence(base + idx, "structure", info, [rep], ref, detail=detail, others={rep: other})


def _ended_early(streams: list[RecordStream], short: list[int], long: list[int], chunks: list[np.ndarray],
                 base: int, n: int) -> Divergence:
    info = describe(streams[long[0]], chunks[long[0]][n], base + n)
    detail = f"repeat(s) {', '.join(map(str, short))} stopped recording after {base + n} records"
    return Divergence(base + n, "structure", info, short, long[0], detail=detail)
