"""recorder/audithook.py: one audit hook per topic, relaying to the listener installed last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from detaudit.recorder.audithook import AuditRelay


class Seen:
    def __init__(self) -> None:
        self.paths: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        self.paths.append(str(args[0]))


def test_only_the_listener_installed_last_hears_the_events(tmp_path: Path) -> None:
    relay: AuditRelay[Seen] = AuditRelay(frozenset({"open"}), "stopped")
    first, last = relay.install(Seen()), relay.install(Seen())
    (tmp_path / "a.txt").write_text("x")
    relay.listener = None  # the hook stays for the process: it passes nothing on after the test
    assert (first.paths, any(p.endswith("a.txt") for p in last.paths)) == ([], True)


def test_a_failing_listener_stops_its_topic_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    class Broken(Seen):
        def audit(self, event: str, args: tuple[Any, ...]) -> None:
            raise RuntimeError("boom")

    relay: AuditRelay[Broken] = AuditRelay(frozenset({"open"}), "stopped the topic")
    relay.install(Broken())
    (tmp_path / "b.txt").write_text("x")  # the open itself succeeds
    assert (relay.listener, "stopped the topic: RuntimeError: boom" in capsys.readouterr().err) == (None, True)
