"""Each knob as the code a user adds: a prelude at the top of the script, environment variables set before
the interpreter starts, or a change at one of the script's own lines; and the script as it reads with them
(a temporary copy beside it, never the script itself), and that change as a unified diff.

The knobs are `--explain`'s pins (pin.Pin, spelled as its names), applied the way a user would apply them,
not through detaudit's child-side pins: a seed the script sets itself stays the script's. Address
randomization (`address-layout`) has no such form and is not a knob. `torch.use_deterministic_algorithms`
is two knobs: its kernels (`deterministic`) and its fill of uninitialized memory (`zero-empty`).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import os
import re
import secrets
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from detaudit.errors import OutputError, UsageError, output_error
from detaudit.pin import Pin
from detaudit.run.guard import removed_if_we_die


@dataclass(frozen=True)
class KnobCode:
    """One knob as code: `imports` and `prelude` statements, `env` set before the interpreter starts."""

    prelude: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    note: str = ""


_FILL = "torch.utils.deterministic.fill_uninitialized_memory = {}"
DETERMINISTIC_ON = "torch.use_deterministic_algorithms(True)"
KNOBS: dict[Pin, KnobCode] = {
    Pin.TORCH_RNG: KnobCode(("torch.manual_seed(0)",), imports=("import torch",)),
    Pin.NUMPY_RNG: KnobCode(("numpy.random.seed(0)",), imports=("import numpy",)),
    Pin.PYTHON_RNG: KnobCode(("random.seed(0)",), imports=("import random",)),
    Pin.HASH_SEED: KnobCode(env={"PYTHONHASHSEED": "0"},
                            note="python reads PYTHONHASHSEED when it starts: a line in the script is too late"),
    Pin.DETERMINISTIC: KnobCode((DETERMINISTIC_ON, _FILL.format(False)), imports=("import torch",),
                                note="deterministic kernels without the fill of uninitialized memory"),
    Pin.ZERO_EMPTY: KnobCode((DETERMINISTIC_ON, _FILL.format(True)), imports=("import torch",),
                             note="torch fills uninitialized memory (NaN, the largest integer) only with "
                                  "deterministic algorithms on, so this turns on their kernels too; writing "
                                  "`torch.zeros` instead of `torch.empty` at the line the cause names needs neither"),
    Pin.ONE_THREAD: KnobCode(("torch.set_num_threads(1)",), {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
                             ("import torch",)),
    Pin.CUDNN: KnobCode(("torch.backends.cudnn.benchmark = False", "torch.backends.cudnn.deterministic = True"),
                        imports=("import torch",)),
    Pin.CUBLAS: KnobCode(env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
                         note="read when cuBLAS starts: set it in the environment, or at the very top of the "
                              "script before torch is imported"),
    Pin.TF32_OFF: KnobCode(("torch.backends.cuda.matmul.allow_tf32 = False", "torch.backends.cudnn.allow_tf32 = False",
                            "torch.set_float32_matmul_precision('highest')"), imports=("import torch",)),
    Pin.NCCL: KnobCode(env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_NVLS_ENABLE": "0"},
                       note="on every rank, before the process starts"),
}
CUDA_KNOBS = (Pin.CUDNN, Pin.CUBLAS, Pin.TF32_OFF)
PRELUDE_MARK = "# detaudit fix: {}"


def catalogue(devices: Sequence[str], distributed: bool) -> list[Pin]:
    """The knobs worth trying here: CUDA's only when a repeat ran on a GPU, NCCL's only under torchrun."""
    return [p for p in KNOBS if (p not in CUDA_KNOBS or "cuda" in devices) and (p != Pin.NCCL or distributed)]


@dataclass(frozen=True)
class Edit:
    """A change at one of the script's own lines (an RNG object created without a seed). `after`: the line as
    it should read; None when detaudit cannot write it (then `advice` says what to do). `applies`: the line is
    in the audited script, so the copy that verifies the fix gets it."""

    pin: Pin
    file: str
    line: int
    before: str
    after: str | None
    advice: str
    applies: bool


# RNG objects created without a seed, by the name the recorder gives their constructor: the call's last name
SEEDABLE = {"np.random.default_rng": "default_rng", "np.random.RandomState": "RandomState",
            "random.Random": "Random"}


def seed_edit(pin: Pin, fn: str, loc: str, advice: str, script: Path, cwd: Path) -> Edit:
    """The edit that gives the RNG object made by `fn()` at `loc` (`file:line`) a constant seed."""
    file, _, number = loc.rpartition(":")
    line = int(number) if number.isdigit() else 0
    path = Path(file) if os.path.isabs(file) else cwd / file
    applies = bool(file) and _same_file(path, script)
    try:
        lines = read_source(script).splitlines() if applies else []
    except (OSError, UnicodeDecodeError):
        lines, applies = [], False
    before = lines[line - 1] if 0 < line <= len(lines) else ""
    after = _seeded(before, SEEDABLE[fn]) if fn in SEEDABLE and before else None
    return Edit(pin, file or loc, line, before, after, advice, applies and after is not None)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _seeded(text: str, name: str) -> str | None:
    """`text` with its one call `...name()` given the seed 0; None unless there is exactly one such call."""
    calls = [m for m in re.finditer(rf"\b{re.escape(name)}\(\s*\)", text)]
    if len(calls) != 1:
        return None
    m = calls[0]
    return f"{text[:m.start()]}{name}(0){text[m.end():]}"


def prelude(knobs: Sequence[Pin], edits_only: Collection[Pin] = ()) -> list[str]:
    """The lines the knobs add at the top of the script: imports, then each statement once, in catalogue
    order. `deterministic` and `zero-empty` together keep one call, with the fill on. A knob in `edits_only`
    adds none: its line edits are all it needs (an RNG object created unseeded, the global RNG never drawn)."""
    chosen = [p for p in KNOBS if p in knobs and p not in edits_only]
    if not any(KNOBS[p].prelude for p in chosen):
        return []
    imports = list(dict.fromkeys(i for p in chosen for i in KNOBS[p].imports))
    statements = list(dict.fromkeys(s for p in chosen for s in KNOBS[p].prelude))
    if Pin.ZERO_EMPTY in chosen:
        statements = [s for s in statements if s != _FILL.format(False)]
    return [PRELUDE_MARK.format(", ".join(p.value for p in chosen if KNOBS[p].prelude)), *imports, *statements]


def environment(knobs: Sequence[Pin]) -> dict[str, str]:
    """The environment variables the knobs set before the interpreter starts."""
    return {k: v for p in KNOBS if p in knobs for k, v in KNOBS[p].env.items()}


def held_away(knobs: Sequence[Pin], held: Collection[str]) -> list[Pin]:
    """The knobs that are environment variables alone, each of which `--perturb` sets itself in every repeat
    (`held`, over any knob's value): no experiment could run them, so under that perturbation they cannot be
    verified."""
    return [p for p in knobs if KNOBS[p].env and not KNOBS[p].prelude and set(KNOBS[p].env) <= set(held)]


def insertion_line(source: str) -> int:
    """How many lines of `source` stay above the prelude: a module docstring and `from __future__` imports
    (python requires them first), else a `#!` line and an encoding declaration."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UsageError(f"the script does not parse ({exc.msg}, line {exc.lineno}): detaudit cannot add a "
                         "prelude to it") from None
    end = 0
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
            and isinstance(node.value.value, str)
        if docstring or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            end = node.end_lineno or node.lineno
        else:
            break
    if end:
        return end
    lines = source.splitlines()
    while end < min(2, len(lines)) and (lines[end].startswith("#!") or re.match(
            r"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+", lines[end])):
        end += 1
    return end


def read_source(script: Path) -> str:
    """The script's text as it is on disk, its line endings kept (CRLF too): a patch's context lines must
    be the file's own bytes, or neither `patch` nor `git apply` finds them."""
    with open(script, encoding="utf-8", newline="") as fh:
        return fh.read()


def _ending(text: Sequence[str]) -> str:
    """The line ending the script uses (its first line's), so added lines match their neighbours."""
    first = text[0] if text else "\n"
    return "\r\n" if first.endswith("\r\n") else "\r" if first.endswith("\r") else "\n"


def rewrite(source: str, lines: Sequence[str], edits: Sequence[Edit]) -> str:
    """`source` with the prelude `lines` inserted (insertion_line) and the applicable edits made."""
    text = source.splitlines(keepends=True)
    newline = _ending(text)
    for edit in edits:
        if edit.applies and edit.after is not None and 0 < edit.line <= len(text):
            ending = text[edit.line - 1][len(text[edit.line - 1].rstrip("\r\n")):]
            text[edit.line - 1] = edit.after + ending
    at = insertion_line(source)
    if text and at and not text[at - 1].endswith(("\n", "\r")):
        text[at - 1] += newline
    return "".join([*text[:at], *(line + newline for line in lines), *text[at:]])


_NO_NEWLINE = "\\ No newline at end of file\n"


def unified_diff(name: str, source: str, changed: str) -> str:
    """The change as a unified diff (`patch -p1` and `git apply` take it): each line with its own ending (a
    CRLF file's lines keep their CR), and a last line without one marked as both tools expect. A name with a
    space ends in a tab on the `---`/`+++` lines, as git writes it: `patch` reads a name up to the first
    space otherwise (a tab ends it for both tools)."""
    out: list[str] = []
    end = "\t" if " " in name else ""
    for line in difflib.unified_diff(source.splitlines(keepends=True), changed.splitlines(keepends=True),
                                     f"a/{name}", f"b/{name}"):
        if len(out) < 2:  # the `---` and `+++` lines
            out.append(line[:-1] + end + "\n")
        else:
            out.append(line if line.endswith("\n") else f"{line}\n{_NO_NEWLINE}")
    return "".join(out)


class PatchMismatch(Exception):
    """A hunk's context or removed lines are not the file's lines where the hunk says (`patch` would reject it)."""


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_patch(source: str, patch: str) -> str:
    """`patch` (one file's unified diff) applied to `source` by the rules `patch -p1` and `git apply` follow
    without fuzz: every context and removed line must be the file's line, byte for byte (a CR included), at
    the line the hunk names; a line followed by the no-newline marker ends without one."""
    old = source.splitlines(keepends=True)
    rows = patch.splitlines(keepends=True)
    out: list[str] = []
    at = 0  # lines of `old` consumed
    i = next((n for n, row in enumerate(rows) if row.startswith("@@")), len(rows))
    while i < len(rows):
        head = _HUNK.match(rows[i])
        if head is None:
            raise PatchMismatch(f"not a hunk header: {rows[i]!r}")
        start = int(head.group(1)) - (0 if head.group(2) == "0" else 1)
        out.extend(old[at:start])
        at = start
        i += 1
        while i < len(rows) and not rows[i].startswith("@@"):
            row, i = rows[i], i + 1
            if i < len(rows) and rows[i] == _NO_NEWLINE:
                row, i = row[:-1], i + 1
            tag, line = row[:1], row[1:]
            if tag in (" ", "-"):
                if at >= len(old) or old[at] != line:
                    raise PatchMismatch(f"line {at + 1} is {old[at] if at < len(old) else None!r}, the patch "
                                        f"expects {line!r}")
                at += 1
            if tag in (" ", "+"):
                out.append(line)
    return "".join([*out, *old[at:]])


def patched(name: str, source: str, changed: str) -> str:
    """`changed` as its patch makes it: the unified diff applied to `source` (`apply_patch`). What runs in an
    experiment is what the written patch gives, so "verified as written" holds for the patch itself."""
    result = apply_patch(source, unified_diff(name, source, changed))
    if result != changed:
        raise PatchMismatch(f"the patch for {name} does not reproduce the changed script")
    return result


@contextlib.contextmanager
def temporary_copy(script: Path, text: str) -> Iterator[Path]:
    """`text` as a new file beside the script (`.NAME.detaudit-fix-XXXX.py`), removed on leaving.

    Beside the script's real file, so python's `sys.path[0]` (the directory it resolves the script into)
    and `Path(__file__).parent` are the script's own, and relative imports and data paths behave as they
    do for it; only `__file__`'s last part differs. Created exclusively, never through a link: nothing
    already there is written, the script least of all.
    """
    real = Path(os.path.realpath(script))
    path = real.parent / f".{real.stem}.detaudit-fix-{secrets.token_hex(4)}.py"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise OutputError(f"{output_error(path, exc)}; `detaudit fix` runs the changed script as a copy beside "
                          "it (the same directory, so imports and relative paths behave the same): that "
                          "directory must be writable") from None
    try:
        with removed_if_we_die(path):  # even should detaudit be killed (run/guard.py)
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
            yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
