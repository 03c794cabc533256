"""A trace with its op records left out: what the same repeat would have written recording modules only.

Under `--granularity auto`, a repeat started once an earlier one has diverged records ops over the window
too (audit/pipeline.py), so that the op-level re-run needs fewer interpreters of its own. Its trace then
serves twice: whole, as one of the op-level re-run's traces, and without its op records, as the module-level
repeat it is (compared with the others record by record, so it must hold exactly their kinds of records).

Frames are copied as they are, strings included (a string only op records name is never looked up);
record frames lose their OP rows, each evidence event's position (`at`, the index of the next record)
and the footer's record count are renumbered to the records kept. A trace cut short (no footer) stays so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from detaudit.trace.format import FRAME_HEAD, MAGIC, RECORD_DTYPE, Kind
from detaudit.trace.reader import _fail, _frames


def strip_ops(src: Path, dst: Path, header: dict[str, Any]) -> None:
    """Write `dst` (created exclusively, private) as `src` without its OP records, its header updated by
    `header` (the granularity it now has). Raises TraceError on a trace it cannot read, OSError on `dst`."""
    dropped: list[int] = []  # the index in `src` of each OP record left out (ops are recorded in a window only)
    seen = 0  # records of `src` read so far
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:  # frame by frame: a long run's trace is never held whole
        fh.write(MAGIC)
        for tag, payload in _frames(src):
            if tag == b"H":
                payload = json.dumps({**json.loads(payload), **header}).encode()
            elif tag == b"R":
                if len(payload) % RECORD_DTYPE.itemsize:
                    raise _fail(src, "corrupt trace: record frame of the wrong size")
                rows = np.frombuffer(payload, dtype=RECORD_DTYPE)
                ops = rows["kind"] == Kind.OP
                if ops.any():
                    dropped.extend((seen + np.flatnonzero(ops)).tolist())
                    payload = rows[~ops].tobytes()
                seen += len(rows)
                if not payload:
                    continue
            elif tag in (b"E", b"F") and dropped:
                body = json.loads(payload)
                if tag == b"E" and isinstance(body.get("at"), int):  # dropped records before it no longer count
                    body["at"] -= int(np.searchsorted(np.asarray(dropped, dtype=np.int64), body["at"]))
                if tag == b"F" and isinstance(body.get("records"), int):
                    body["records"] -= len(dropped)
                payload = json.dumps(body).encode()
            fh.write(FRAME_HEAD.pack(tag, len(payload)) + payload)
