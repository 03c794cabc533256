"""The package's own bookkeeping: the version written once, and docstrings that name modules that exist."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import detaudit

PACKAGE = Path(detaudit.__file__).parent
ROOT = PACKAGE.parent
# `.py` names docstrings use that are not detaudit's modules: a user's script, other packages' files, a
# temporary file's pattern, what a command line looks like
NOT_OURS = {"train.py", "script.py", "json.py", "xxhash.py", "./-y.py", ".NAME.detaudit-fix-XXXX.py",
            ".../site-packages/lightning/x.py", "lightning/x.py", "models/direct_url.py",
            "timm/layers/classifier.py", "torch/nn/modules/linear.py"}


def test_the_version_is_written_once_in_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "detaudit.__version__"}


def named_modules() -> dict[str, set[str]]:
    """Every `name.py` a docstring in the package names -> the files whose docstrings name it."""
    named: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                for name in re.findall(r"[\w./-]*\w\.py\b", ast.get_docstring(node) or ""):
                    named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return named


def exists(name: str) -> bool:
    """`report/model.py`, `model.py` and `detaudit/report/model.py` name detaudit/report/model.py;
    `tests/...` names a file of the tests."""
    if name.startswith("tests/"):
        return (ROOT / name).is_file()
    inside = name.removeprefix("detaudit/")
    return any(p.relative_to(PACKAGE).as_posix() == inside or p.as_posix().endswith("/" + inside)
               for p in PACKAGE.rglob("*.py"))


def test_every_module_a_docstring_names_exists() -> None:
    missing = {name: sorted(where) for name, where in named_modules().items() if name not in NOT_OURS
               and not exists(name)}
    assert missing == {}

