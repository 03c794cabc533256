"""The full-values side file: every element of a few chosen records, kept beside a trace (`a-0.trace` ->
`a-0.values`) when `detaudit drift` re-records a run to size a difference no sampled element shows
(docs/drift.md, docs/trace-format.md). Pickle-free, versioned, capped in bytes.

Layout: an 8-byte magic, then frames of `header length (u32 LE) | payload length (u32 LE) | header (JSON) |
payload`. The first frame's header is the file's head (`{"format": "detaudit-values", "version": 1,
"cap_bytes": N}`, no payload); each record's frame names it (step, kind, name, occurrence, rank) with its dtype and
shape, its payload the elements' raw little-endian bytes in C order (`skipped` says why a record's values are not
there: over the cap, a layout with no plain elements); the last frame's header is `{"end": N}`, N the record
frames before it. A file without that end, or with a frame cut short, is refused: it is no evidence.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from detaudit.codec import Codable, FileFormat
from detaudit.errors import TraceError
from detaudit.trace.reader import load_json, open_regular

VALUES_MAGIC = b"\x89DVALUE\n"
VALUES_FORMAT = FileFormat("detaudit-values", 1, "full-values file")
VALUES_SUFFIX = ".values"
FRAME = struct.Struct("<II")  # header length | payload length
MAX_HEADER = 1 << 16  # bytes of one frame's JSON header: a record's name and shape, never more
CAP_BYTES = 64 << 20  # the elements one run keeps, at most: a record beyond it is `skipped`
# the dtypes whose elements read as numbers here (numpy's names; bfloat16 is widened from its bits)
_NUMPY = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8", "int32": "<i4", "int16": "<i2",
          "int8": "i1", "uint8": "u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "bool": "?"}
SUPPORTED = frozenset({*_NUMPY, "bfloat16"})


@dataclass(frozen=True)
class ValuesKey(Codable):
    """Which record a frame holds: its logical identity (compare/identity.Identity's fields)."""

    step: int
    kind: str
    name: str
    occurrence: int = 0
    rank: int = 0


@dataclass(frozen=True)
class FrameHead(Codable):
    """A record frame's header: the record, its dtype and shape, and why its elements are not kept (else None)."""

    key: ValuesKey
    dtype: str
    shape: list[int]
    skipped: str | None = None


@dataclass(frozen=True)
class FullValues:
    """One record's elements as the side file keeps them (`data` None: `skipped` says why)."""

    head: FrameHead
    data: bytes | None

    def as_float64(self) -> np.ndarray | None:
        """The elements as float64, in C order (None: not kept, or a dtype this reader cannot widen)."""
        if self.data is None or self.head.dtype not in SUPPORTED:
            return None
        if self.head.dtype == "bfloat16":
            bits = np.frombuffer(self.data, dtype="<u2").astype(np.uint32) << 16
            return bits.view("<f4").astype(np.float64)
        return np.frombuffer(self.data, dtype=_NUMPY[self.head.dtype]).astype(np.float64)


def values_path(trace: Path) -> Path:
    """The side file of a trace: `a-0.trace` -> `a-0.values`, `b-0.rank-1.trace` -> `b-0.rank-1.values`."""
    return Path(trace).with_suffix(VALUES_SUFFIX)


def _frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return FRAME.pack(len(text), len(payload)) + text + payload


class ValuesWriter:
    """Writes one side file (created exclusively, private), each frame whole; `cap` bounds the bytes of elements."""

    def __init__(self, path: Path, cap: int = CAP_BYTES) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._fh: BinaryIO = os.fdopen(fd, "wb")
        self.cap = cap
        self.kept = 0  # bytes of elements written
        self.frames = 0
        self._fh.write(VALUES_MAGIC + _frame({**VALUES_FORMAT.stamp(), "cap_bytes": cap}))

    def add(self, key: ValuesKey, dtype: str, shape: list[int], data: bytes | None, skipped: str | None = None) -> None:
        """One record's elements (`data`), or why they are not kept (`skipped`); over the cap, that says so."""
        if data is not None and dtype not in SUPPORTED:
            data, skipped = None, f"its dtype {dtype} has no elements this reader widens to numbers"
        if data is not None and self.kept + len(data) > self.cap:
            size, data = len(data), None
            skipped = f"its {size} bytes of elements would exceed the side file's cap of {self.cap} bytes per run"
        head = FrameHead(key, dtype, list(shape), skipped if data is None else None)
        self._fh.write(_frame(head.to_dict(), data or b""))
        self._fh.flush()
        self.kept += len(data or b"")
        self.frames += 1

    def close(self) -> None:
        """The end frame: a file without it was cut short."""
        if self._fh.closed:
            return
        self._fh.write(_frame({"end": self.frames}))
        self._fh.close()


def read_values(path: Path) -> dict[ValuesKey, FullValues]:
    """A side file's records by key; a TraceError for anything but a whole file of this format and version."""
    with open_regular(path, "a full-values file") as fh:
        data = bytes(fh.read())
    where = str(path)
    if not data.startswith(VALUES_MAGIC):
        raise TraceError(f"{where}: not a detaudit full-values file (its first bytes are not the magic)")
    frames = _frames(data, len(VALUES_MAGIC), where)
    if not frames:
        raise TraceError(f"{where}: a full-values file without its head: cut short")
    VALUES_FORMAT.check(frames[0][0], where)
    *records, (end, _) = frames[1:] or [({}, b"")]
    if set(end) != {"end"} or end["end"] != len(records):
        raise TraceError(f"{where}: a full-values file without its end frame (cut short: the run did not finish "
                         "writing it), or whose end counts other frames than it holds")
    found: dict[ValuesKey, FullValues] = {}
    for header, payload in records:
        head = FrameHead.from_dict(header)
        if head.skipped is None and len(payload) != _nbytes(head):
            raise TraceError(f"{where}: the frame of step {head.key.step} {head.key.kind} {head.key.name} holds "
                             f"{len(payload)} bytes, its {head.dtype}{head.shape} needs {_nbytes(head)}")
        found[head.key] = FullValues(head, None if head.skipped is not None else payload)
    return found


def _nbytes(head: FrameHead) -> int | None:
    """The bytes a record's elements take (None: a dtype this reader does not know)."""
    if head.dtype not in SUPPORTED:
        return None
    width = 2 if head.dtype == "bfloat16" else np.dtype(_NUMPY[head.dtype]).itemsize
    return int(np.prod(head.shape, dtype=np.int64)) * width


def _frames(data: bytes, at: int, where: str) -> list[tuple[dict[str, Any], bytes]]:
    """Every frame from `at` on, whole: a frame cut short is refused."""
    frames = []
    while at < len(data):
        if at + FRAME.size > len(data):
            raise TraceError(f"{where}: a full-values frame cut short")
        size, length = FRAME.unpack_from(data, at)
        start = at + FRAME.size
        if size > MAX_HEADER or start + size + length > len(data):
            raise TraceError(f"{where}: a full-values frame cut short (or its header over {MAX_HEADER} bytes)")
        header = load_json(data[start:start + size], where)
        if not isinstance(header, dict):
            raise TraceError(f"{where}: a full-values frame whose header is no JSON object")
        frames.append((header, data[start + size:start + size + length]))
        at = start + size + length
    return frames
