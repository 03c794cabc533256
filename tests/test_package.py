"""The package's own bookkeeping: the version written once, and docstrings that name modules that exist."""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from collections.abc import Callable, Mapping
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


# The size caps: a function's McCabe complexity and lines, a module's lines. recorder/ (the hot path, some of it
# kept flat for speed) has a complexity cap of its own. What exceeds a cap is listed with its size when listed: a
# listed one may shrink but never grow, and leaves the list once within the caps; nothing new joins it.
MAX_COMPLEXITY = 20
MAX_COMPLEXITY_RECORDER = 25
MAX_LINES = 80
MAX_MODULE_LINES = 500
# `module.py:Class.function` -> (complexity, lines)
FUNCTIONS_OVER_THE_CAPS = {
    "audit/pipeline.py:compare_recorded": (25, 62),
    "audit/ranks.py:analyse_nodes": (22, 41),
    "batch/finding.py:analyse": (21, 27),
    "causes/__init__.py:rank": (25, 26),
    "causes/collective.py:collective_algorithm": (24, 32),
    "causes/confirm.py:_isolated": (22, 26),
    "causes/device.py:cudnn_benchmark": (21, 25),
    "causes/device.py:thread_count": (22, 29),
    "causes/flags.py:collective_algorithm": (21, 25),
    "causes/perturbed_settings.py:_detector.perturbed": (22, 28),
    "causes/rng.py:unseeded_draws": (24, 38),
    "causes/rng.py:unseeded": (21, 23),
    "causes/rng.py:varying_seed": (22, 39),
    "causes/rng.py:dataloader_workers": (22, 41),
    "cli/fix.py:_render_fix": (23, 37),
    "cli/render.py:runs_table": (21, 21),
    "cli/render.py:causes_block": (23, 31),
    "compare/oprules.py:find_op_source": (22, 47),
    "compare/oprules.py:_finding": (21, 32),
    "compare/outcome.py:outcome_divergence": (23, 29),
    "compare/perturb.py:compare_perturbed": (22, 30),
    "drift/drift_check.py:run_drift": (25, 56),
    "explain/runner.py:experiment_verdict": (22, 36),
    "fix/trials.py:run_fix": (24, 57),
    "report/junit.py:to_junit": (22, 58),
    "report/model.py:Report.inconclusive_reason": (23, 40),
}
# `module.py` -> (lines,)
MODULES_OVER_THE_CAP = {
    "audit/pipeline.py": (514,),
    "cli/commands.py": (507,),
    "cli/render.py": (695,),
    "events.py": (588,),
    "explain/runner.py": (505,),
    "recorder/batchprobe.py": (568,),
    "recorder/core.py": (550,),
    "recorder/devicehash.py": (691,),
    "recorder/replay.py": (510,),
    "report/model.py": (526,),
}


def complexity(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """McCabe complexity as radon (`radon cc`) counts it: 1, plus 1 per if, conditional expression, loop (and its
    `else`), comprehension `for` and its ifs, except clause and try `else`, assert, match case but the catch-all,
    and each extra operand of and/or. Nested functions and classes are counted on their own, not here."""
    total = 1
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.If, ast.IfExp, ast.Assert)):
            total += 1
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            total += 1 + bool(node.orelse)
        elif isinstance(node, ast.Try):
            total += len(node.handlers) + bool(node.orelse)
        elif isinstance(node, ast.BoolOp):
            total += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            total += 1 + len(node.ifs)
        elif isinstance(node, ast.Match):
            total += sum(not (isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None) for c in node.cases)
        todo.extend(ast.iter_child_nodes(node))
    return total


def test_the_complexity_counter_counts_as_radon_does() -> None:
    tree = ast.parse("def f(xs, a, b):\n"
                     "    if a and b or not xs:\n"  # if: 1, and/or: 2
                     "        return [x for x in xs if x if x > 1]\n"  # comprehension and two ifs: 3
                     "    for x in xs:\n"  # for and its else: 2
                     "        assert x, 'x'\n"  # 1
                     "    else:\n"
                     "        pass\n"
                     "    try:\n"
                     "        y = 1 if a else 2\n"  # conditional expression: 1
                     "    except ValueError:\n"  # two handlers and else: 3
                     "        y = 3\n"
                     "    except KeyError:\n"
                     "        y = 4\n"
                     "    else:\n"
                     "        y = 5\n"
                     "    match y:\n"  # two cases but the catch-all: 2
                     "        case 1: pass\n"
                     "        case 2: pass\n"
                     "        case _: pass\n"
                     "    def inner():\n"  # counted on its own
                     "        if a: pass\n"
                     "    with open(xs):\n"  # not a branch
                     "        return y\n")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    assert complexity(function) == 1 + 3 + 3 + 2 + 1 + 1 + 3 + 2


def function_cap(name: str) -> tuple[int, int]:
    """(complexity, lines) that the function `module.py:name` stays within unless listed."""
    return MAX_COMPLEXITY_RECORDER if name.startswith("recorder/") else MAX_COMPLEXITY, MAX_LINES


@functools.cache
def measured_functions() -> dict[str, tuple[int, int]]:
    """`module.py:Class.function` (a nested one `outer.inner`) -> (complexity, lines), for every function and
    method of the package (parsed once)."""
    found: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[prefix + child.name] = (complexity(child), (child.end_lineno or child.lineno) - child.lineno + 1)
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    for path in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), f"{path.relative_to(PACKAGE).as_posix()}:")
    return found


def measured_modules() -> dict[str, tuple[int]]:
    """`module.py` -> (lines,)."""
    return {path.relative_to(PACKAGE).as_posix(): (len(path.read_text(encoding="utf-8").splitlines()),)
            for path in sorted(PACKAGE.rglob("*.py"))}


def breaches(measured: Mapping[str, tuple[int, ...]], listed: Mapping[str, tuple[int, ...]],
             cap: Callable[[str], tuple[int, ...]]) -> list[str]:
    """What breaks the caps: an unlisted name over its cap on any count, a listed one grown past its listed size
    on any count, a listed one now within its cap (to be dropped from the list), a listed name that is gone."""
    found = []
    for name, size in measured.items():
        limit, allowed = cap(name), listed.get(name)
        over = any(n > most for n, most in zip(size, limit, strict=True))
        if allowed is None and over:
            found.append(f"{name} {size} is over the cap {limit}")
        elif allowed is not None and any(n > most for n, most in zip(size, allowed, strict=True)):
            found.append(f"{name} {size} grew past its listed {allowed}")
        elif allowed is not None and not over:
            found.append(f"{name} {size} is within the cap {limit} now: drop it from the list")
    found.extend(f"{name} is listed but gone: drop it from the list" for name in listed if name not in measured)
    return found


def test_the_caps_refuse_a_new_offender_a_grown_one_one_within_its_cap_and_one_gone() -> None:
    listed = {"a.py:grown": (30, 10), "a.py:kept": (30, 10), "a.py:shrunk": (24, 10), "a.py:within": (22, 10),
              "a.py:gone": (30, 10)}
    measured = {"a.py:grown": (30, 11), "a.py:kept": (30, 10), "a.py:shrunk": (23, 10), "a.py:within": (20, 10),
                "a.py:new": (21, 5), "a.py:small": (20, 80)}
    assert breaches(measured, listed, lambda name: (20, 80)) == [
        "a.py:grown (30, 11) grew past its listed (30, 10)",
        "a.py:within (20, 10) is within the cap (20, 80) now: drop it from the list",
        "a.py:new (21, 5) is over the cap (20, 80)",
        "a.py:gone is listed but gone: drop it from the list"]


def test_the_recorder_has_a_complexity_cap_of_its_own() -> None:
    assert (function_cap("recorder/ops.py:f"), function_cap("cli/render.py:f")) == ((25, 80), (20, 80))


def test_no_function_breaks_the_caps() -> None:
    assert breaches(measured_functions(), FUNCTIONS_OVER_THE_CAPS, function_cap) == []


def test_no_module_breaks_the_cap() -> None:
    assert breaches(measured_modules(), MODULES_OVER_THE_CAP, lambda name: (MAX_MODULE_LINES,)) == []

# how a repeat ended, decided from its raw fields instead of RepeatResult.ending (results.py): a status compared
# with 0, or a timed_out/interrupted flag read off a result
RAW_ENDING = re.compile(r"exit_code\s*(==|!=)\s*0\b|exit_code\s+(not\s+)?in\s*\(0, None\)"
                        r"|\b(r|result|run|first|ref|n\.results\[i\])\.(timed_out|interrupted)\b")
# the sites not yet read through `ending` (issue 43 item 4, in progress): the launchers that set the fields
# (run/), run.json's and report.json's writers, and readers whose rule is the exit status itself (all_failed)
RAW_ENDING_LEFT = {"report/model.py": 3, "report/html.py": 1, "pytest_plugin.py": 1, "audit/resume_check.py": 2,
                   "audit/ranks.py": 8, "audit/analysis.py": 1, "compare/outcome.py": 1, "cli/render.py": 2,
                   "cli/session.py": 2, "run/distributed.py": 4, "batch/auditing.py": 1}


def test_no_new_module_decides_how_a_repeat_ended_from_its_raw_fields() -> None:
    found = {str(path.relative_to(PACKAGE)): len(RAW_ENDING.findall(path.read_text()))
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "results.py"}
    assert {name: n for name, n in found.items() if n} == RAW_ENDING_LEFT
