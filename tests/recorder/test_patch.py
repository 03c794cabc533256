"""recorder/patch.py: one way to patch, restored exactly, invisible to TorchScript."""

from __future__ import annotations

import random
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from detaudit.recorder import patch


def counting(calls: list[str], tag: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(tag)
            return original(*args, **kwargs)

        return wrapper

    return make


def test_wraps_looks_like_the_original_and_restores_the_very_same_object() -> None:
    module = types.ModuleType("m")

    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    module.double = double  # type: ignore[attr-defined]
    calls: list[str] = []
    assert patch.wrap(module, "double", counting(calls, "w"))
    wrapped = module.double  # type: ignore[attr-defined]
    assert wrapped is not double
    assert wrapped(3) == 6
    assert calls == ["w"]
    assert (wrapped.__name__, wrapped.__doc__, wrapped.__wrapped__) == ("double", "Twice x.", double)
    [p] = patch.patched()
    patch.restore(p)
    assert module.double is double
    assert patch.patched() == []


def test_a_missing_attribute_is_not_patched() -> None:
    assert not patch.wrap(types.ModuleType("m"), "absent", counting([], "w"))
    assert patch.patched() == []


def test_an_inherited_method_is_deleted_again_not_shadowed() -> None:
    class Base:
        def run(self) -> str:
            return "base"

    class Child(Base):
        pass

    calls: list[str] = []
    patch.wrap(Child, "run", counting(calls, "w"))
    assert "run" in vars(Child)
    assert Child().run() == "base"
    assert calls == ["w"]
    patch.restore_all()
    assert "run" not in vars(Child)
    assert Child.run is Base.run


def test_layers_restore_newest_first_and_restoring_twice_is_harmless() -> None:
    module = types.ModuleType("m")
    module.f = lambda: "x"  # type: ignore[attr-defined]
    original = module.f  # type: ignore[attr-defined]
    calls: list[str] = []
    patch.wrap(module, "f", counting(calls, "inner"))
    patch.wrap(module, "f", counting(calls, "outer"))
    assert module.f() == "x"
    assert calls == ["outer", "inner"]
    first = patch.patched()[0]
    patch.restore(first)  # undoes the later layer too
    assert module.f is original
    assert patch.patched() == []
    patch.restore(first)
    patch.restore_all()
    assert module.f is original  # type: ignore[attr-defined]


def test_an_attribute_put_back_by_someone_else_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("m")
    module.f = lambda: 1  # type: ignore[attr-defined]
    original = module.f  # type: ignore[attr-defined]
    monkeypatch.setattr(module, "f", original)
    patch.wrap(module, "f", counting([], "w"))
    monkeypatch.undo()  # pytest puts the original back
    [p] = patch.patched()
    assert not p.in_place
    replacement = lambda: 2  # noqa: E731
    module.f = replacement  # type: ignore[attr-defined]
    patch.restore_all()
    assert module.f is replacement  # type: ignore[attr-defined]


def test_restore_all_since_keeps_older_patches() -> None:
    module = types.ModuleType("m")
    module.a = lambda: 1  # type: ignore[attr-defined]
    module.b = lambda: 2  # type: ignore[attr-defined]
    b = module.b  # type: ignore[attr-defined]
    patch.wrap(module, "a", counting([], "a"))
    kept = len(patch.patched())
    patch.wrap(module, "b", counting([], "b"))
    patch.restore_all(kept)
    assert module.b is b
    assert [p.name for p in patch.patched()] == ["a"]
    patch.restore_all()


def test_a_wrapped_torch_builtin_still_scripts_as_the_builtin_and_is_unregistered_after() -> None:
    from torch.jit import _builtins

    original = torch.add
    calls: list[str] = []
    patch.wrap(torch, "add", counting(calls, "w"))
    wrapper = torch.add
    assert _builtins._find_builtin(wrapper) == _builtins._find_builtin(original) is not None

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.add(x, 1)

    scripted = torch.jit.script(f)
    assert scripted(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert calls == []  # scripted code calls the aten op, not the Python wrapper
    assert torch.add(torch.zeros(1), 1).item() == 1.0
    assert calls == ["w"]
    patch.restore_all()
    assert torch.add is original
    assert _builtins._find_builtin(wrapper) is None


def test_a_wrapped_python_function_hands_torchscript_the_original() -> None:
    module = types.ModuleType("m")

    def helper(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    module.helper = helper  # type: ignore[attr-defined]
    patch.wrap(module, "helper", counting([], "w"))
    assert module.helper.__prepare_scriptable__() is helper  # type: ignore[attr-defined]
    patch.restore_all()


def test_the_guard_fixture_fails_a_test_that_leaves_something_patched(pytester: pytest.Pytester) -> None:
    """tests/conftest.py's autouse fixture, run on a test that forgets to restore (and one that does not)."""
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_leaky="""
        import random, threading
        from detaudit.recorder import patch

        def test_forgets():
            patch.wrap(random, "seed", lambda original: lambda *a: original(*a))

        def test_assigns():
            threading.Thread.start = lambda self: None

        def test_restores(monkeypatch):
            patch.wrap(random, "random", lambda original: lambda: original())
            patch.restore_all()
            monkeypatch.setattr(random, "shuffle", lambda x: None)
    """)
    original_start = threading.Thread.start
    try:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    finally:
        threading.Thread.start = original_start  # type: ignore[method-assign]
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(["*the test left patched: random.seed*", "*left patched: threading.Thread.start*"])
    assert random.seed.__module__ == "random"
    assert patch.patched() == []
