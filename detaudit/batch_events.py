"""The parts of `detaudit batch`'s evidence events (events.py's BatchCallEvent, BatchSkipEvent,
BatchOriginEvent): a probe's result, the first module or op that differs, a greedy choice's flips.
Torch-free, like events.py, which they keep within its size (recorder/batchprobe.py; docs/batch.md).
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

SubsetKind = Literal["prefix", "reversed", "mixed"]
SkipReason = Literal["no-batch", "batch-dim-unknown", "aggregate-output", "batch-statistics", "dropout", "random",
                     "uncopyable", "side-effects", "probe-failed"]


class BatchSubset(TypedDict):
    """One probe of a call: its rows compared with the same rows of the whole batch."""

    subset: SubsetKind  # the first `size` rows; the batch reversed; half of it filled up with another call's rows
    size: int  # the probe's batch size
    rows_compared: int
    rows_differ: int  # rows with any differing bit
    max_abs_diff: float
    max_ulp: int
    scale: float  # the largest |value| of the compared rows (tells numerics from a leak)
    dtype: str
    nan_mismatch: bool  # a NaN in one evaluation where the other has a number
    across_rows: bool  # a value without rows (reduced over the batch) differs
    shape_changed: bool  # an output's other dims change with the batch
    ladder: NotRequired[bool]  # a size of PyTorch's harness (the halving ladder, or --sizes): its status counts


class BatchSpot(TypedDict):
    """The first module or op whose rows differ while its inputs' rows agree."""

    name: str  # the submodule's qualified name, or the op (`aten.addmm`)
    module: str  # the innermost submodule running it ("" for the probed module's own code)
    cls: str  # the submodule's class (modules only)
    loc: str  # the user's `file:line`
    max_abs_diff: float
    max_ulp: int
    scale: float
    dtype: str
    across_rows: bool
    shape_changed: bool


class BatchFlip(TypedDict):
    """A row whose greedy choice over the probed call's scores differs between a probe and the whole batch."""

    subset: SubsetKind
    size: int  # the probe's batch size
    row: int  # the row in the whole batch
    other: int  # the probe's argmax for it (the whole batch's is the choice's `ids[row]`)


class BatchChoice(TypedDict):
    """The greedy choice each row of a probed call would get from its output's last position: the whole batch's
    argmax and top-2 scores per row, and the rows whose argmax a probe changed (recorder/batchchoice.py)."""

    output: str  # the output tensor whose last position's scores were read, by path (`output`, `output[0]`)
    ids: list[int]  # the whole batch's argmax per row (the first MAX_ROWS rows)
    top2: list[list[float] | None]  # its two largest scores per row (None: not finite)
    flips: list[BatchFlip]
