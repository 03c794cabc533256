"""Text from traces and run files made elsewhere, made safe to print on a terminal.

A foreign trace can hold any string: escape sequences in a name could retitle the terminal,
write the clipboard (OSC 52) or hide text. Control characters (C0 but tab/newline, DEL, C1)
are shown as `\\xNN` escapes instead.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every terminal control character replaced by its `\\xNN` escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
