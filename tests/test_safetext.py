"""safetext.printable: terminal control characters from foreign text are shown, never sent."""

from __future__ import annotations

from detaudit.safetext import printable


def test_control_characters_are_escaped_and_ordinary_text_is_kept() -> None:
    hostile = "loss\x1b]52;c;ZXZpbA==\x07 \x9b31m \x7f"
    assert printable(hostile) == "loss\\x1b]52;c;ZXZpbA==\\x07 \\x9b31m \\x7f"
    assert printable("tab\there\nnext line: ünïcode ✓") == "tab\there\nnext line: ünïcode ✓"
