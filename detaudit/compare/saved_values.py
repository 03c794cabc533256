"""Saved values that are not tensors: torch.save's strings, bytes, None and Python numbers (recorder/objects.py).

A checkpoint holds a path beside its tensors (Lightning's `callbacks.ModelCheckpoint.best_model_path`,
`lightning_logs/version_N/checkpoints/...`), or a number (a global step read back from the checkpoint an
earlier run left). When a repeat took that value from what earlier repeats left (the next free `version_N`,
the step count it resumed from), the value differs while every tensor agrees: the repeats computed the same
and were told something else to save, as the stdout case (causes/carried.py judges the evidence). This module
says whether such values are all that differs: the traces compared again without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from detaudit.compare.traces import compare_traces
from detaudit.results import Divergence, Tolerance
from detaudit.trace import RECORD_DTYPE, Flag, Kind, RecordStream
from detaudit.trace.dtypes import OBJECT_CODES

_CODES = np.array(sorted(OBJECT_CODES.values()))
_NAMES = frozenset(OBJECT_CODES)
_PYTHON_VALUE = int(Flag.PYTHON_VALUE)
SCALAR_SHAPE = "scalar"  # the shape text of a 0-dim record: a Python number's (recorder/core.py `_shape_id`)


def is_non_tensor(dtype: str) -> bool:
    """A record's dtype name says it is a saved value that is no tensor (a string, bytes, None, a big int)."""
    return dtype in _NAMES


def non_tensor(records: np.ndarray) -> np.ndarray:
    """Which of `records` (RECORD_DTYPE rows) are saved values that are not tensors (Python numbers included)."""
    return (records["kind"] == Kind.SAVE) & (np.isin(records["dtype"], _CODES)
                                             | (records["flags"] & _PYTHON_VALUE).astype(bool))


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
    those values, the traces agree: every tensor and the records' structure are the same. A 0-dim saved record
    may be a Python number or a tensor (the flag tells, not the record's description): comparing again decides."""
    record = first.record if first is not None else None
    if first is None or first.category != "content" or record is None or record.kind != "save" \
            or (record.dtype not in _NAMES and record.shape != SCALAR_SHAPE):
        return False
    if not all(Path(t).is_file() for t in traces):
        return False
    again = compare_traces([_TensorsOnly(Path(t)) for t in traces], devices, tolerance, truncated=truncated)
    return again.first_divergence is None
