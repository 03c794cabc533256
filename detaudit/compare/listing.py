"""A trace as `detaudit show` prints it: header, records named in words, evidence events, footer.

The front end renders; this reads (streaming, bounded memory), so the CLI never opens a trace itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detaudit.compare.align import Aligner, describe
from detaudit.run import distributed
from detaudit.trace import RecordStream


@dataclass(frozen=True)
class ListedRecord:
    """One record as a row: where it is, what it is, its digest, the user's line behind it."""

    index: int
    step: int
    kind: str
    name: str  # an op record: the op, its pass and module; else the record's name
    tensor: str  # dtype[shape]
    digest: str  # 16 hex digits
    location: str


class TraceListing:
    """One trace file, read as it is listed: `header` first, `records()` once, then `events` and `footer`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stream = RecordStream(path.resolve())  # a link the user names is theirs to follow
        self.header: dict[str, Any] = dict(self._stream.header)

    def records(self) -> Iterator[ListedRecord]:
        """Every record in order, a lockstep walk of one trace (strings checked, bounded memory)."""
        aligner = Aligner([self._stream], chunk=4096)
        total = 0
        for block in aligner:
            for row in block.chunks[0]:
                info = describe(self._stream, row, total)
                name = (f"{info.op} ({info.node or 'bwd'})" if info.backward else f"{info.op} (fwd)") \
                    + (f" in {info.module}" if info.module else "") if info.op else info.name
                yield ListedRecord(total, info.step, info.kind, name, f"{info.dtype}[{info.shape}]",
                                   f"{int(row['digest']):016x}", info.location)
                total += 1
        aligner.finish()

    @property
    def events(self) -> list[Any]:
        """The evidence events (complete once `records()` has been read to its end)."""
        return list(self._stream.events)

    @property
    def footer(self) -> dict[str, Any] | None:
        """The footer; None when the trace has none (still being written, or its repeat died)."""
        return self._stream.footer

    def why_no_footer(self) -> str:
        """A trace without a footer: still being written (its repeat is running), or its repeat never finished."""
        pid = self.header.get("pid")
        if isinstance(pid, int) and pid > 0 and distributed.runs_our_child(pid, self.path.resolve().parent):
            return (f"yet: the repeat (pid {pid}) is still running and writing this trace; shown as far as it was "
                    "written")
        return "(the repeat was killed or crashed hard)"
