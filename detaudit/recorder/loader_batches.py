"""A DataLoader's batches as op records, linked to the draws that chose their indices (op windows only).

A batch is built from indices the sampler drew (RandomSampler: a seed from the global RNG, then `randint` or
`randperm` from a private Generator), but the indices reach the Dataset as Python ints and its items come back
as new tensors: no op links the batch to the draws, so the walk back from a divergent model input (oprules.py)
stopped at the collating `stack` and the order rule named some other random op of the step (a weight
initialisation). Each tensor a DataLoader yields is therefore recorded as one `DataLoader.__next__` op record
(`[i]` for its i-th tensor), whose makers are the ops run while its indices were drawn (the iterator's
`_next_index` call for that batch; a multi-process loader draws a few batches ahead, so they are queued) and
the op that collated it, where one ran in this process. Its inputs are the indices and the tensor itself: it
is never a source, only the link to one, and where no recorded op made the difference the walk ends there,
at the line that took the batch, which is where it entered torch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import xxhash

from detaudit.recorder.core import iter_tensors
from detaudit.recorder.evidence.base import never_fatal
from detaudit.recorder.patch import wrap
from detaudit.trace import LOADER_BATCH

if TYPE_CHECKING:
    from detaudit.recorder.ops import OpRecorder

MAX_MAKERS = 8  # of the ops run while a batch's indices were drawn, the last ones (the draws come last)
MAX_TENSORS = 16  # tensors of one batch recorded
_DRAWN = "_detaudit_drawn"  # the iterator's queue: per batch drawn ahead, (indices' digest, its draws' records)

Drawn = tuple[int, list[int]]


def install(ops: OpRecorder) -> None:
    """Wrap the DataLoader iterators' index draw and `__next__` (torch.utils.data is imported with torch)."""
    from torch.utils.data import dataloader

    wrap(dataloader._BaseDataLoaderIter, "_next_index", lambda original: _drawing(ops, original))
    wrap(dataloader._BaseDataLoaderIter, "__next__", lambda original: _yielding(ops, original))


def _drawing(ops: OpRecorder, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def _next_index(self: Any) -> Any:
        start = ops.rec.next_index
        indices = original(self)  # StopIteration: nothing drawn, nothing queued
        queue = self.__dict__.setdefault(_DRAWN, collections.deque())
        drawn = list(range(start, ops.rec.next_index))[-MAX_MAKERS:] if ops.active else []
        queue.append((xxhash.xxh3_64_intdigest(repr(indices).encode()), drawn))  # one entry per batch, in order
        return indices

    return _next_index


def _yielding(ops: OpRecorder, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def __next__(self: Any) -> Any:
        batch = original(self)
        queue = self.__dict__.get(_DRAWN)
        drawn: Drawn = queue.popleft() if queue else (0, [])
        if ops.active and not ops.rec.internal:
            with never_fatal():
                _record(ops, batch, drawn)
        return batch

    return __next__


def _record(ops: OpRecorder, batch: Any, drawn: Drawn) -> None:
    """One op record per tensor of the batch (the first MAX_TENSORS), at the user's line that took it."""
    rec = ops.rec
    loc = rec.location_id(2)
    indices, makers = drawn
    for i, (_, t) in enumerate(iter_tensors(batch, "")):
        if i >= MAX_TENSORS:
            return
        if t.is_meta:
            continue
        digest = rec.digest_now(t)[0]
        inputs = xxhash.xxh3_64_intdigest(f"{indices},{digest}".encode()) or 1
        name = rec.intern(LOADER_BATCH if i == 0 else f"{LOADER_BATCH}[{i}]")
        ops.record_made(name, t, loc, makers, (inputs, inputs))
