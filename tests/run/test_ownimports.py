"""run/ownimports.py: who imports (read off the stack) and where detaudit's own imports are found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from detaudit.run.ownimports import OwnImports


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """An interpreter path and a script directory that both hold a module named `shared`."""
    dirs = {name: tmp_path / name for name in ("site", "script", "detaudit")}
    for folder in dirs.values():
        folder.mkdir()
    (dirs["site"] / "shared.py").write_text("")
    (dirs["script"] / "shared.py").write_text("")
    (dirs["script"] / "only_here.py").write_text("")
    return dirs


def _call_from(filename: Path, name: str, finder: OwnImports, module: str, path: Any = None) -> Any:
    """finder.find_spec called from a function `name` whose code lives in `filename`."""
    namespace: dict[str, Any] = {}
    exec(compile(f"def {name}(finder, module, path):\n    return finder.find_spec(module, path)\n",
                 str(filename), "exec"), namespace)
    return namespace[name](finder, module, path)


def _finder(layout: dict[str, Path], stop_at: tuple[Any, ...] = ()) -> OwnImports:
    return OwnImports([str(layout["site"])], [str(layout["detaudit"])], [str(layout["script"])], stop_at)


def test_detaudits_import_is_found_on_the_interpreters_path_never_in_the_scripts_directory(
        layout: dict[str, Path]) -> None:
    spec = _call_from(layout["detaudit"] / "trace.py", "flush", _finder(layout), "shared")
    assert spec is not None
    assert spec.origin == str(layout["site"] / "shared.py")
    # found nowhere on the interpreter's path: left to python (an optional import), not refused
    assert _call_from(layout["detaudit"] / "trace.py", "flush", _finder(layout), "only_here") is None


def test_the_scripts_imports_and_submodules_are_left_to_python(layout: dict[str, Path]) -> None:
    finder = _finder(layout)
    assert _call_from(layout["script"] / "train.py", "main", finder, "shared") is None
    assert _call_from(layout["detaudit"] / "trace.py", "flush", finder, "shared.sub", path=["x"]) is None
    assert finder.find_spec("shared", None) is None  # from here: neither detaudit's nor the script's code: python's


def test_import_hooks_are_machinery_and_the_childs_runner_ends_the_search(layout: dict[str, Path]) -> None:
    # child.py's _AfterImport.find_spec asks every finder: that frame is not the importer
    assert _call_from(layout["detaudit"] / "child.py", "find_spec", _finder(layout), "shared") is None
    namespace: dict[str, Any] = {}
    exec(compile("def run_script(call):\n    return call()\n", str(layout["detaudit"] / "child.py"), "exec"),
         namespace)
    runner = namespace["run_script"]
    finder = _finder(layout, stop_at=(runner.__code__,))
    # the script's code, wherever it lives (here: this test file), runs inside the child's runner: its
    # imports are python's, though a detaudit frame (the runner) is further down the stack
    assert runner(lambda: finder.find_spec("shared", None)) is None
    assert runner(lambda: _finder(layout).find_spec("shared", None)) is not None  # without stop_at: detaudit's
    assert runner(lambda: _call_from(layout["detaudit"] / "hooks.py", "hook", finder, "shared")) is not None
