"""detaudit's import structure, read statically with `ast` (fast: no module is imported).

Every `import` counts, at the top of a module or lazily inside a function; those under
`if TYPE_CHECKING:` do not (they never run), except in the check that type annotations follow the
layers too. Checks: no import cycles, the stage layers hold (import-linter, pyproject.toml),
every module is imported by a test file of the fast lane (`-m "not slow"`), and (marked process)
each module imports first, alone, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import detaudit

PACKAGE = Path(detaudit.__file__).parent
ROOT = PACKAGE.parent
TESTS = Path(__file__).parent
LANE_MARKS = {"slow", "process", "race"}  # what takes a test out of the fast lane (conftest.py)


@dataclass(frozen=True)
class Edge:
    """One import of a detaudit module by another."""

    source: str
    target: str
    line: int
    lazy: bool  # inside a function: runs when called, not at import

    def __str__(self) -> str:
        path = MODULES[self.source].relative_to(ROOT)
        return f"{self.source} -> {self.target} ({path}:{self.line}{', lazy' if self.lazy else ''})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def _imports(tree: ast.AST, package: str, type_checking: bool = False) -> Iterator[tuple[str, int, bool]]:
    """(detaudit module, line, lazy) for each import in `tree`; `package`: the importing module's package;
    `type_checking`: count the imports under `if TYPE_CHECKING:` too."""
    skipped = set() if type_checking else _type_checking_only(tree)
    functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    lazy = {id(n) for f in functions for stmt in f.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # `from pkg import sub` imports the module pkg.sub; `from pkg import name` needs pkg itself
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            while name and name not in MODULES:  # `import detaudit.x.y` where y is a name: its module
                name = name.rpartition(".")[0]
            if name:
                yield name, node.lineno, id(node) in lazy


def _package_of(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def import_graph(type_checking: bool = False) -> dict[str, list[Edge]]:
    graph: dict[str, list[Edge]] = {}
    for name, path in MODULES.items():
        tree = parsed(path)
        edges = {}
        for target, line, lazy in _imports(tree, _package_of(name), type_checking):
            if target != name and (target not in edges or edges[target].lazy and not lazy):
                edges[target] = Edge(name, target, line, lazy)
        graph[name] = sorted(edges.values(), key=lambda e: e.target)
    return graph


def strongly_connected(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that import each other in a loop (size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for edge in graph[node]:
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


@functools.cache
def graph() -> dict[str, list[Edge]]:
    """detaudit's import graph, built by the first test that reads it rather than while collecting (every xdist
    worker collects this file; parsing the package took a few seconds of each one's start)."""
    return import_graph()


def test_the_analysis_sees_top_level_lazy_and_relative_imports_and_skips_type_checking() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "from detaudit import trace, __version__\n"
                     "from . import schema\n"
                     "if TYPE_CHECKING:\n    from detaudit.report.model import Report\n"
                     "def f():\n    import detaudit.causes.rng\n    from detaudit.audit.pipeline import run_audit\n")
    found = set(_imports(tree, "detaudit"))
    assert found == {("detaudit.trace", 2, False), ("detaudit", 2, False), ("detaudit.schema", 3, False),
                     ("detaudit.causes.rng", 7, True), ("detaudit.audit.pipeline", 8, True)}


def test_a_cycle_is_found_with_the_imports_that_make_it() -> None:
    graph = {"a": [Edge("a", "b", 1, False)], "b": [Edge("b", "c", 1, True)], "c": [Edge("c", "a", 1, False)],
             "d": [Edge("d", "a", 1, False)]}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    groups = strongly_connected(graph())
    described = []
    for group in groups:
        inside = [str(e) for m in group for e in graph()[m] if e.target in group]
        described.append(f"cycle among {', '.join(group)}:\n    " + "\n    ".join(inside))
    assert not groups, "\n".join(described)


def test_the_stage_contracts_hold(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """pyproject.toml's import-linter contracts (the stages' layers, torch only in the recorder, independent
    siblings), in-process so the fast lane catches an upward import before CI's `lint-imports` does."""
    from importlinter.cli import lint_imports

    monkeypatch.chdir(ROOT)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0, capsys.readouterr().out


def _marks(decorators: list[ast.expr]) -> set[str]:
    """The `pytest.mark.X` names among decorators (or a pytestmark value)."""
    found = set()
    for d in decorators:
        for node in ast.walk(d):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
                found.add(node.attr)
    return found


def fast_test_imports(path: Path) -> set[str]:
    """detaudit modules a test file imports at the top or inside its fast tests, if it has any fast test."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    file_marks = _marks([n.value for n in tree.body if isinstance(n, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)])
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    fast = [t for t in tests if not (file_marks | _marks(t.decorator_list)) & LANE_MARKS]
    if not fast:
        return set()
    top = ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
    found = {m for m, _, _ in _imports(top, "tests")}
    for test in fast:
        found |= {m for m, _, _ in _imports(ast.Module(body=test.body, type_ignores=[]), "tests")}
    return found


# modules no test imports by design, with the test that covers them instead
NOT_IMPORTED = {
    "detaudit.__main__": "`python -m detaudit`: calls cli.main, which the fast CLI tests call in-process",
    "detaudit.demo.train_demo": "a script shipped as data, run by `detaudit demo` (test_e2e_output, slow)",
}


def test_every_module_is_imported_by_a_fast_test_file() -> None:
    """Coverage by import: each module of detaudit/ is imported by a test file with at least one test in
    the fast lane, at the top of that file or inside such a test, or is run by its package's __init__
    (causes/__init__.py runs every detector). Static, so it cannot tell an import a fast test never
    calls into; with coverage.py installed, `coverage run -m pytest -m "not slow"` + `coverage report`
    gives line coverage."""
    covered: set[str] = set()
    for path in sorted(p for p in TESTS.rglob("test_*.py") if "gpu" not in p.relative_to(TESTS).parts):
        covered |= fast_test_imports(path)
    # a package's own modules that its __init__ imports at the top and runs (causes/ runs every detector)
    while True:
        more = {e.target for m in covered if MODULES[m].name == "__init__.py" for e in graph()[m]
                if not e.lazy and e.target.startswith(m + ".")} - covered
        if not more:
            break
        covered |= more
    docstring_only = {m for m, path in MODULES.items() if path.name == "__init__.py" and not graph()[m]
                      and len(parsed(path).body) == 1}  # a stage package's docstring, nothing to run
    missing = sorted(set(MODULES) - covered - set(NOT_IMPORTED) - docstring_only - {"detaudit"})
    assert not missing, f"no fast test file imports: {missing}"
    assert set(NOT_IMPORTED) <= set(MODULES), "NOT_IMPORTED names a module that is gone"


# Modules that need a package detaudit does not depend on, imported only where it is installed (and checked
# here only then): the Triton kernels (CUDA builds of torch ship triton; devicehash falls back without it).
OPTIONAL = {"detaudit.recorder.lanes_triton": "triton"}

IMPORT_EACH = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "detaudit" or m.startswith("detaudit.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
"""


@pytest.mark.process
def test_each_module_imports_first_and_alone_in_a_fresh_interpreter() -> None:
    """What the static checks cannot see: a module that fails when it is the first one imported (a
    partly initialised module in a cycle). One interpreter, detaudit's modules dropped between imports."""
    names = sorted(set(MODULES) - {"detaudit.__main__", "detaudit.demo.train_demo"}  # these run on import
                   - {m for m, package in OPTIONAL.items() if importlib.util.find_spec(package) is None})
    proc = subprocess.run([sys.executable, "-c", IMPORT_EACH, *names], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not proc.stdout.strip(), proc.stdout + proc.stderr
