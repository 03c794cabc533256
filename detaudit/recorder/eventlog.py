"""`detaudit watch`'s events file as the job writes it: a header with its format and version, then one JSON line
per event, appended (run/watchlog.py reads it back; docs/watch.md)."""

from __future__ import annotations

import json
import os
from typing import Any

from detaudit.records import WATCH_EVENTS


class EventLog:
    """The events file, appended to one JSON line at a time (never through `open`: the evidence of the files a
    script reads must not see detaudit's own)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if os.fstat(self.fd).st_size == 0:  # the header leads: the reader checks format and version first
            self.write({"event": "header", **WATCH_EVENTS.stamp()})

    def write(self, event: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(event) + "\n").encode())
