"""detaudit: find out whether a PyTorch script is deterministic, where it diverges, and why."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_active: Any = None


def checkpoint(name: str, obj: Any) -> None:
    """Record `obj` (a tensor, module, optimizer, NumPy array, Python value, or nested dict/list/tuple of
    them) under `name`.

    A no-op unless the script runs under `detaudit run`, so it can stay in production code. `name` is
    checked either way (a TypeError into the script), so the script behaves the same under plain python.
    """
    if not isinstance(name, str):
        raise TypeError(f"detaudit.checkpoint() name must be a str, not {type(name).__name__} ({name!r:.60})")
    if _active is not None:
        from detaudit.trace import Kind

        _active.record_object(Kind.CHECKPOINT, name, obj)


def _set_active_recorder(recorder: Any) -> None:
    global _active
    _active = recorder
