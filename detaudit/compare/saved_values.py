"""Saved values that are not tensors: torch.save's strings, bytes and None (recorder/objects.py).

A checkpoint holds a path beside its tensors (Lightning's `callbacks.ModelCheckpoint.best_model_path`,
`lightning_logs/version_N/checkpoints/...`). When a repeat chose that path from what earlier repeats left
(the next free `version_N`), the path differs while every tensor agrees: the repeats computed the same and
were told another place to save it, as the stdout case (causes/carried.py judges the evidence). This
module says whether such values are all that differs: the traces compared again without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from detaudit.compare.traces import compare_traces
from detaudit.results import Divergence, Tolerance
from detaudit.trace import RECORD_DTYPE, Kind, RecordStream
from detaudit.trace.dtypes import OBJECT_CODES

_CODES = np.array(sorted(OBJECT_CODES.values()))
_NAMES = frozenset(OBJECT_CODES)


def non_tensor(records: np.ndarray) -> np.ndarray:
    """Which of `records` (RECORD_DTYPE rows) are saved values that are not tensors."""
    return (records["kind"] == Kind.SAVE) & np.isin(records["dtype"], _CODES)


class _TensorsOnly(RecordStream):
    """A trace read without its non-tensor saved values (the string table and events are the same)."""

    def take(self, n: int) -> np.ndarray:
        kept: list[np.ndarray] = []
        count = 0
        while count < n:
            chunk = super().take(n - count)
            if not len(chunk):
                break
            chunk = chunk[~non_tensor(chunk)]
            kept.append(chunk)
            count += len(chunk)
        return np.concatenate(kept) if kept else np.empty(0, dtype=RECORD_DTYPE)


def only_non_tensor_values_differ(first: Divergence | None, traces: Sequence[Path], devices: Sequence[str],
                                  tolerance: Tolerance | None, truncated: Sequence[bool]) -> bool:
    """True when `first` (the traces' first divergence) is a non-tensor saved value and, compared again without
    those values, the traces agree: every tensor and the records' structure are the same."""
    record = first.record if first is not None else None
    if first is None or first.category != "content" or record is None or record.kind != "save" \
            or record.dtype not in _NAMES:
        return False
    if not all(Path(t).is_file() for t in traces):
        return False
    again = compare_traces([_TensorsOnly(Path(t)) for t in traces], devices, tolerance, truncated=truncated)
    return again.first_divergence is None
