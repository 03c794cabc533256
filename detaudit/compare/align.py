"""Walk N traces record by record in lockstep, and name records in words.

Shared by `compare` (first divergence, spread), `oprules` (the op behind it), `show` and
`read_trace` (one trace is a lockstep of one). Traces are read in chunks of `CHUNK` records, so
memory stays bounded however long the run; each trace's string ids are mapped onto one shared id
space (`StringTable`), so records of different traces compare by id with numpy. The walk stops
after the first chunk where a trace ran out: past it the traces no longer line up.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from detaudit.results import RecordInfo, RecordKind
from detaudit.trace import Flag, Kind, RecordStream
from detaudit.trace.dtypes import DTYPE_NAMES

CHUNK = 1 << 16  # records per trace per step of the walk
STRUCT_FIELDS = ("kind", "dtype", "step")  # compared as stored
STRING_FIELDS = ("name", "shape")  # compared by text (ids differ between traces)

_KIND_NAMES: dict[int, RecordKind] = {
    Kind.OUTPUT: "output", Kind.GRAD: "grad", Kind.PARAM: "param", Kind.OPTSTATE: "optstate", Kind.SAVE: "save",
    Kind.CHECKPOINT: "checkpoint", Kind.OP: "op", Kind.INPUT: "input", Kind.BUFFER: "buffer",
}
assert set(_KIND_NAMES) == set(Kind) and all(n == Kind(k).name.lower() for k, n in _KIND_NAMES.items())


def describe(stream: RecordStream, row: Any, index: int) -> RecordInfo:
    """Record `row` of `stream` (a RECORD_DTYPE row), found at `index`, in words."""
    s = stream.strings
    code = int(row["kind"])
    is_op = code == Kind.OP
    flags = int(row["flags"])
    return RecordInfo(
        index=index, kind=_KIND_NAMES.get(code, "?"), name=s[row["name"]], module=s[row["module"]],
        location=s[row["loc"]], step=int(row["step"]), shape=s[row["shape"]],
        dtype=DTYPE_NAMES.get(int(row["dtype"]), "?"), op=s[row["name"]] if is_op else "",
        backward=bool(flags & Flag.BACKWARD), random=bool(flags & Flag.RANDOM),
        node=s[row["aux"]] if is_op and flags & Flag.BACKWARD else "",  # a forward op's aux: its inputs' makers
    )


class StringTable:
    """Maps each trace's local string ids onto one shared id space (grown as the traces' tables grow)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {"": 0}
        self.texts: list[str] = [""]
        self._maps: dict[int, np.ndarray] = {}

    def mapping(self, key: int, strings: list[str]) -> np.ndarray:
        """Local id -> shared id for trace `key`, whose table is now `strings`."""
        current = self._maps.get(key, np.zeros(0, dtype=np.int64))
        if len(current) < len(strings):
            extra = []
            for text in strings[len(current):]:
                gid = self.ids.get(text)
                if gid is None:
                    gid = len(self.texts)
                    self.ids[text] = gid
                    self.texts.append(text)
                extra.append(gid)
            current = np.concatenate([current, np.asarray(extra, dtype=np.int64)])
            self._maps[key] = current
        return current


Pair = tuple[int, int, bool]  # (reference, repeat, bitwise)


def reference_pairs(devices: Sequence[str]) -> list[Pair]:
    """(reference, repeat, bitwise) pairs: same-device repeats bitwise, device leaders by tolerance."""
    leaders: dict[str, int] = {}
    pairs = []
    for i, device in enumerate(devices):
        if device not in leaders:
            leaders[device] = i
            if i:
                pairs.append((0, i, False))
        else:
            pairs.append((leaders[device], i, True))
    return pairs


@dataclass(frozen=True)
class Block:
    """One step of the walk: each trace's next chunk, all starting at record `base`."""

    base: int
    chunks: list[np.ndarray]
    maps: list[np.ndarray]  # each trace's local -> shared string ids (StringTable.mapping)

    @property
    def n(self) -> int:
        """Records every trace holds in this block (they line up by index)."""
        return min(len(c) for c in self.chunks)

    @property
    def longest(self) -> int:
        return max(len(c) for c in self.chunks)

    def same_structure(self, ref: int, rep: int) -> np.ndarray:
        """Per aligned record: traces `ref` and `rep` recorded the same thing (kind, dtype, step, name, shape)."""
        n = self.n
        a, b = self.chunks[ref][:n], self.chunks[rep][:n]
        same = np.ones(n, dtype=bool)
        for f in STRUCT_FIELDS:
            same &= a[f] == b[f]
        for f in STRING_FIELDS:
            same &= self.maps[ref][a[f]] == self.maps[rep][b[f]]
        return same


class Aligner:
    """Iterate `Block`s over `streams` in lockstep; `counts` says how many records each trace gave so far.

    Every chunk's string ids are checked against its trace's table (a corrupt trace is refused). The walk
    ends after a block shorter than the chunk size (a trace ran out); `finish` then reads every trace to
    its end, counting what was left, so footers and events are known.
    """

    def __init__(self, streams: Sequence[RecordStream], chunk: int | None = None) -> None:
        self.streams = list(streams)
        self.chunk = chunk or CHUNK
        self.counts = [0] * len(self.streams)
        self.strings = StringTable()

    def _take(self, i: int) -> np.ndarray:
        chunk = self.streams[i].take(self.chunk)
        self.streams[i].check_strings(chunk)
        self.counts[i] += len(chunk)
        return chunk

    def __iter__(self) -> Iterator[Block]:
        base = 0
        while True:
            chunks = [self._take(i) for i in range(len(self.streams))]
            block = Block(base, chunks, [self.strings.mapping(i, s.strings) for i, s in enumerate(self.streams)])
            if block.longest == 0:
                return
            yield block
            if block.n < block.longest or block.n < self.chunk:
                return
            base += block.n

    def finish(self) -> list[int]:
        """Read every trace to its end (counting records and checking their strings); the counts."""
        for i in range(len(self.streams)):
            while len(self._take(i)):
                pass
            self.streams[i].drain()
        return self.counts
