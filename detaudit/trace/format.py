"""The trace format shared by the writer and the reader: magic, versions, frame head, the record's
packed layout (RECORD_DTYPE, Record) and what its kind and flags mean (docs/trace-format.md)."""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import numpy as np

MAGIC = b"\x89DTRACE\n"
FORMAT_NAME = "detaudit-trace"
FORMAT_VERSION = 2  # 2: BUFFER records, and torch.save's non-tensor values as SAVE records
N_SAMPLES = 4


def sample_positions(numel: int) -> tuple[int, ...]:
    """Where a tensor's N_SAMPLES sampled elements sit in its C-order elements (numel > 0): the first, at 1/3, at
    2/3 and the last (a tiny tensor repeats positions)."""
    last = numel - 1
    return (0, last // 3, (2 * last) // 3, last)


FRAME_HEAD = struct.Struct("<cI")  # tag (1 byte) | payload length (u32 LE)
FRAME_TAGS = b"HSREF"  # header, strings, records, evidence event, footer
# What a trace may hold: the reader refuses more (it bounds compare's memory), so the writer stops before it
MAX_FRAME = 1 << 30  # bytes in one frame's payload
MAX_STRINGS = 1 << 20  # distinct strings (names, locations, shapes)
MAX_EVENTS = 1 << 19  # evidence events (capped at the source, once per call site, save seeding calls)

RECORD_DTYPE = np.dtype(
    [
        ("kind", "u1"), ("dtype", "u1"), ("flags", "u1"), ("reserved", "u1"),
        ("name", "<u4"), ("module", "<u4"), ("loc", "<u4"), ("step", "<u4"),
        ("shape", "<u4"), ("aux", "<u4"),
        ("digest", "<u8"), ("in_ordered", "<u8"), ("in_unordered", "<u8"),
        ("samples", "<f8", (N_SAMPLES,)),
    ]
)


class Record(NamedTuple):
    """One record, field for field as RECORD_DTYPE stores it (readers get RECORD_DTYPE rows: the same names).

    The writer takes any tuple in this order: the recorder builds plain tuples, because building a NamedTuple
    costs about 0.33 µs more per record (0.40 µs against 0.07 µs), some 13% of recording a small tensor (2.5 µs).
    """

    kind: int  # Kind
    dtype: int  # fingerprint.DTYPE_CODES
    flags: int  # Flag
    reserved: int
    name: int  # string ids, here and below up to aux
    module: int
    loc: int
    step: int  # optimizer steps completed before the record
    shape: int
    aux: int  # op records: the autograd node that ran a backward op
    digest: int
    in_ordered: int  # op records: digest of the inputs in order (0: unknown)
    in_unordered: int  # ... and as a multiset (same inputs, another order)
    samples: tuple[float, ...]  # N_SAMPLES sampled values


assert Record._fields == RECORD_DTYPE.names  # one field order for writer and readers


class Kind(enum.IntEnum):
    """What a record fingerprints. Values are stored in traces: never renumber."""

    OUTPUT = 1      # a module's forward output
    GRAD = 2        # a parameter's gradient, just before optimizer.step
    PARAM = 3       # a parameter, just after optimizer.step
    OPTSTATE = 4    # an optimizer state tensor, just after optimizer.step
    SAVE = 5        # a tensor passed to torch.save
    CHECKPOINT = 6  # a tensor passed to detaudit.checkpoint
    OP = 7          # an aten op's output (op granularity)
    INPUT = 8       # an input to a root module's forward (the data the model was given)
    BUFFER = 9      # a module's registered buffer (running statistics, EMA shadow, step counter): after each
    #                 optimizer.step; before any step (inference), after a root forward that changed it


# the OP record name of a tensor a DataLoader yielded (`[i]` appended for its i-th): no aten op, the link from a batch
# to the draws that chose its indices (recorder/loader_batches.py)
LOADER_BATCH = "DataLoader.__next__"


class Flag(enum.IntFlag):
    BACKWARD = 1    # OP record produced during the backward pass
    DEVICE = 2      # digest computed on an accelerator (not comparable bitwise with CPU digests)
    RANDOM = 4      # OP record of an op that draws from an RNG
    NO_DATA = 8     # no contents could be read (meta tensor, unsupported layout)
    UNINIT = 16     # OP record of an op that read memory nothing had written (torch.empty and kin)
    THREAD = 32     # recorded on a thread other than the main one: written in canonical order (TraceWriter.sync)
    PYTHON_VALUE = 64  # SAVE record of a Python number (int, float, bool, complex) saved beside the tensors: kept
    #                    as the 0-dim tensor it converts to, but no tensor of the script's (compare/saved_values.py)
    NOT_RESULT = 128  # OP record of an output that is no result: the workspace or reserve an op keeps for its backward,
    #                   whose bytes the kernel need not define (recorder/scratch.py); dtype and shape only
