"""One sys audit hook per topic and process, relaying events to the listener installed last.

An audit hook cannot be removed, so each topic (the files the script writes, the files watch keeps) adds one hook
once and passes on the events it wants to whichever listener was installed last. A listener's exception would fail
the script's own `open`: a failure stops that topic instead, with one line on standard error.
"""

from __future__ import annotations

import sys
from typing import Any, Generic, Protocol, TypeVar


class Listener(Protocol):
    def audit(self, event: str, args: tuple[Any, ...]) -> None: ...


L = TypeVar("L", bound=Listener)


class AuditRelay(Generic[L]):
    """The hook of one topic: `events` passed to the listener `install`ed last; `stopped` starts the line said
    when a listener fails (the exception follows it)."""

    def __init__(self, events: frozenset[str], stopped: str) -> None:
        self.events = events
        self.stopped = stopped
        self.listener: L | None = None
        self._hooked = False

    def install(self, listener: L) -> L:
        self.listener = listener
        if not self._hooked:
            sys.addaudithook(self._audit)
            self._hooked = True
        return listener

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        listener = self.listener
        if listener is not None and event in self.events:
            try:
                listener.audit(event, args)
            except Exception as exc:
                self.listener = None
                print(f"{self.stopped}: {type(exc).__name__}: {exc}", file=sys.stderr)
