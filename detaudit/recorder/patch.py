"""The one way detaudit patches a function of another module or class: `wrap(owner, name, make)`.

Every recorder wrapper (evidence, pins, the test fault injector, hooks, bounds, distributed, the
child's import hook) goes through here, so they all behave the same under `torch.jit.script` and
all can be undone: each patch is kept in a registry (`patched()`), `restore` puts back exactly what
was there (an inherited attribute is deleted again rather than shadowed), and the tests' autouse
fixture fails a test that leaves anything patched.

TorchScript resolves a function a scripted body calls by identity: a torch builtin through its
builtin table (keyed by id, filled at `import torch`), a Python function by compiling its source.
The wrapper is registered as the same builtin, or hands TorchScript the original to compile
(`__prepare_scriptable__`), so `torch.jit.script` compiles exactly as under plain python.

A leaf module: nothing from detaudit is imported here.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True, eq=False)
class Patch:
    """One attribute replaced by `wrap`: what was stored there before (`_MISSING`: it was inherited)."""

    owner: Any
    name: str
    stored: Any
    wrapper: Callable[..., Any]
    builtin: bool  # the wrapper was registered in TorchScript's builtin table

    @property
    def in_place(self) -> bool:
        """The wrapper is still what the owner holds (not undone by other means, e.g. pytest's monkeypatch)."""
        return _stored(self.owner, self.name) is self.wrapper


_patches: list[Patch] = []


def _stored(owner: Any, name: str) -> Any:
    """The attribute as the owner itself stores it (a staticmethod object, say), or _MISSING if inherited."""
    try:
        return vars(owner).get(name, _MISSING)
    except TypeError:  # no __dict__ (slots): getattr is all there is
        return getattr(owner, name, _MISSING)


def wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace `owner.name` by `make(original)`, made to look like the original (functools.wraps) and
    invisible to TorchScript. Returns False, patching nothing, when `owner` has no such attribute.
    A class is replaced by a subclass `make` returns (its metaclass keeps `isinstance` true for the
    original's instances: recorder/evidence/generators.py)."""
    original = getattr(owner, name, None)
    if original is None:
        return False
    builtins: Any = sys.modules.get("torch.jit._builtins")
    op = builtins._find_builtin(original) if builtins is not None else None
    wrapper = make(original)
    if isinstance(original, type) and inspect.ismodule(owner):
        # a recording subclass, named where it now lives, so pickle (which checks that a class is found
        # under its own name: torch.Generator's __reduce__ names `torch.Generator`) finds it there
        wrapper.__module__, wrapper.__name__, wrapper.__qualname__ = owner.__name__, name, name
        wrapper.__doc__ = original.__doc__
    else:
        functools.update_wrapper(wrapper, original)
    stored = _stored(owner, name)
    setattr(owner, name, wrapper)
    if op is not None:
        builtins._register_builtin(wrapper, op)
    elif inspect.isfunction(original):
        wrapper.__prepare_scriptable__ = lambda: original  # type: ignore[attr-defined]
    _patches.append(Patch(owner, name, stored, wrapper, op is not None))
    return True


def patched() -> list[Patch]:
    """What is patched now, oldest first."""
    return list(_patches)


def restore(patch: Patch) -> None:
    """Undo `patch` and every patch made after it, newest first; a patch already undone is ignored, and
    so is an attribute that no longer holds its wrapper."""
    if patch not in _patches:
        return
    while patch in _patches:
        _undo(_patches.pop())


def restore_all(since: int = 0) -> None:
    """Undo every patch made after the first `since`, newest first."""
    while len(_patches) > since:
        _undo(_patches.pop())


def _undo(patch: Patch) -> None:
    if not patch.in_place:
        pass  # put back (or replaced) by someone else: leave what is there
    elif patch.stored is _MISSING:
        delattr(patch.owner, patch.name)
    else:
        setattr(patch.owner, patch.name, patch.stored)
    if patch.builtin:
        # the builtin table is keyed by id: a freed wrapper's id could be reused by another function
        table: Any = sys.modules["torch.jit._builtins"]._get_builtin_table()
        table.pop(id(patch.wrapper), None)
