"""`detaudit watch`: a torch.save waits for the watching parent's checks to catch up with the step it saves.

The checks the parent makes (the DDP replica comparison under torchrun, `--against`'s live comparison) read the
traces as they are written, a poll or more behind the job. Without a wait, a checkpoint derived from a step the
parent has yet to compare could be written before the parent's stop arrives. So before a torch.save the job reads
the handshake file the parent keeps in the run directory (audit/watch.py's Relay, written whole by rename):
`{"checked_to": S, "mismatch_at": M}`, every step up to S compared, and the first difference at M (or null). The
save waits until S has reached the last step that ended, or a mismatch is known (then the job stops before the
save). Only torch.save waits: an optimizer.step() waiting for the parent would slow every step.

The wait is bounded: after `patience` seconds (the parent's choice, in the child config) the save proceeds, and
an `unchecked_save` event says the check had not caught up (a parent that fell that far behind must not hang a
multi-day job, nor end a healthy one).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from enum import Enum

POLL_S = 0.02  # how often the handshake file is read while a save waits


class Gate(Enum):
    """What the wait found."""

    CHECKED = "checked"  # every step that ended was compared, and agreed
    MISMATCH = "mismatch"  # the parent found a difference: the save must not happen
    TIMED_OUT = "timed out"  # the parent had not caught up within the patience: the save proceeds


def read_handshake(path: str) -> tuple[int, int | None] | None:
    """(checked_to, mismatch_at) from the parent's file; None while it is absent or not the parent's."""
    try:  # os.open, not open(): the evidence of files the script reads must not see detaudit's own
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
        mismatch = data["mismatch_at"]
        return int(data["checked_to"]), None if mismatch is None else int(mismatch)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def await_check(path: str, ended: int, patience: float, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> Gate:
    """Wait until the parent compared every step up to `ended` (the last step that ended: -1 before the first),
    or found a mismatch, or `patience` seconds passed."""
    deadline = clock() + patience
    while True:
        found = read_handshake(path)
        if found is not None and found[1] is not None:
            return Gate.MISMATCH
        if found is not None and found[0] >= ended:
            return Gate.CHECKED
        if clock() >= deadline:
            return Gate.TIMED_OUT
        sleep(POLL_S)
