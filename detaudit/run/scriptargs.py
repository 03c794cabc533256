"""Whose option is it: split `detaudit run ... SCRIPT ...` into detaudit's options and the script's argv.

Before SCRIPT every option is detaudit's. After it, an option detaudit does not know goes to the
script together with everything after it; an option detaudit knows is taken only when it is not
ambiguous: one spelled exactly as the script defines one too (found by a static scan of its
argparse/click definitions: a script's `-n/--num-workers` leaves detaudit's `--repeats` detaudit's)
or one given twice is refused, with the commands that say whose it is, each one `run` accepts.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from detaudit.errors import UsageError

MAX_SCAN_BYTES = 4 << 20  # a script larger than this is not scanned for its option definitions
_NUMBER = re.compile(r"-\d|-\.\d")
_DEFINERS = frozenset({"add_argument", "option"})  # argparse (and its groups); click.option / typer-style


@dataclass(frozen=True)
class OptionSpec:
    """One detaudit option: every spelling, whether it takes a value, whether it may be repeated."""

    names: frozenset[str]
    takes_value: bool
    multiple: bool = False

    @property
    def label(self) -> str:
        return "/".join(sorted(self.names, key=len))


@dataclass
class SplitArgs:
    """`ours`: detaudit's options in the order given; `script` None when no SCRIPT was given."""

    ours: list[str] = field(default_factory=list)
    script: str | None = None
    script_args: list[str] = field(default_factory=list)

    def for_parser(self) -> list[str]:
        """The arguments rebuilt so that a parser with SCRIPT and SCRIPT_ARGS... takes them as meant."""
        if self.script is None:
            return list(self.ours)
        return [*self.ours, self.script, "--", *self.script_args]


def script_options(script: Path) -> set[str]:
    """Option strings the script itself defines (`add_argument("-d", "--device")`, `click.option(...)`).

    A cheap static scan: unreadable or unparsable scripts define nothing as far as this knows. Only a
    regular file is read, and at most MAX_SCAN_BYTES of it: `/dev/zero` would never end, a FIFO
    would block before any repeat (and its --timeout) started; the launcher refuses both.
    """
    try:
        fd = os.open(script, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens without a writer
    except OSError:
        return set()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return set()
        data = os.read(fd, MAX_SCAN_BYTES + 1)
        if len(data) > MAX_SCAN_BYTES:
            return set()
        tree = ast.parse(data)
    except (OSError, SyntaxError, ValueError):
        return set()
    finally:
        os.close(fd)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name not in _DEFINERS:
            continue
        for arg in node.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                found.add(arg.value.split("/")[0])  # click's "--flag/--no-flag"
    return found


def _later(rest: Sequence[str], lookup: dict[str, OptionSpec]) -> tuple[list[str], list[str]]:
    """The arguments after an ambiguous option, split as `split_run_args` would: detaudit's options (with their
    values), and the script's (its positionals, and everything from its first own option or a `--` on)."""
    ours: list[str] = []
    theirs: list[str] = []
    j = 0
    while j < len(rest):
        arg = rest[j]
        if arg == "--":
            return ours, [*theirs, *rest[j + 1:]]
        if not arg.startswith("-") or arg == "-" or _NUMBER.match(arg):
            theirs.append(arg)
            j += 1
            continue
        name, attached = _option_name(arg, lookup)
        spec = lookup.get(name)
        if spec is None:
            return ours, [*theirs, *rest[j:]]
        width = 2 if spec.takes_value and not attached else 1
        ours.extend(rest[j:j + width])
        j += width
    return ours, theirs


def _option_name(arg: str, lookup: dict[str, OptionSpec]) -> tuple[str, bool]:
    """(the option's name, whether its value is attached: `--x=1`, `-n5`)."""
    if arg.startswith("--"):
        name, eq, _ = arg.partition("=")
        return name, bool(eq)
    if len(arg) > 2 and arg[:2] in lookup and lookup[arg[:2]].takes_value:
        return arg[:2], True
    return arg, False


def split_run_args(args: Sequence[str], specs: Sequence[OptionSpec],
                   defined_by: Callable[[str], set[str]], prog: str = "detaudit run") -> SplitArgs:
    """Split `run`'s arguments (see the module docstring); raises UsageError on an ambiguous option.

    `defined_by(script)`: the option strings SCRIPT defines itself.
    """
    lookup = {name: spec for spec in specs for name in spec.names}
    split = SplitArgs()
    given = _Given()
    i = 0
    while i < len(args):
        arg = args[i]
        is_option = arg.startswith("-") and arg not in ("-", "--") and not _NUMBER.match(arg)
        if split.script is None and not is_option:
            if arg == "--":  # `run [options] -- SCRIPT ARGS...`
                split.ours.extend(args[i:])
                return split
            split.script = arg
            given.defined = defined_by(arg)
            i += 1
            continue
        if split.script is not None and arg == "--":
            split.script_args.extend(args[i + 1:])
            break
        if split.script is not None and not is_option:
            split.script_args.append(arg)
            i += 1
            continue
        name, attached = _option_name(arg, lookup)
        spec = lookup.get(name)
        if spec is None:
            if split.script is None:
                split.ours.append(arg)  # before SCRIPT: detaudit's to reject ("no such option")
                i += 1
                continue
            split.script_args.extend(args[i:])  # the script's option, and everything after it
            break
        if spec.takes_value and not attached and i + 1 == len(args):
            raise UsageError(f"{arg} needs a value")
        width = 2 if spec.takes_value and not attached else 1
        _take_option(prog, split, given, args, i, width, spec, name, lookup)
        i += width
    return split


@dataclass
class _Given:
    """detaudit's options given so far, as written, before and after SCRIPT; and the options SCRIPT defines."""

    defined: set[str] = field(default_factory=set)
    before: dict[OptionSpec, str] = field(default_factory=dict)
    after: dict[OptionSpec, str] = field(default_factory=dict)


def _take_option(prog: str, split: SplitArgs, given: _Given, args: Sequence[str], i: int, width: int,
                 spec: OptionSpec, name: str, lookup: dict[str, OptionSpec]) -> None:
    """Take detaudit's option `args[i:i + width]`, spelled `name`; raise UsageError when the script defines that
    spelling too (another spelling of the same option is no clash: the script's parser would not take it) or
    it is given twice (before SCRIPT, or once before or after it and again after it)."""
    written = " ".join(args[i:i + width])
    if split.script is not None:
        # given twice first: then the detaudit spelling is to give it once, not to move it before SCRIPT
        earlier = given.before.get(spec) or (given.after.get(spec) if not spec.multiple else None)
        if earlier is not None:
            raise UsageError(_ambiguous(prog, split, args, i, width, lookup,
                                        f"{spec.label} is given twice ({earlier}, then {written} after "
                                        f"{split.script})", twice=True))
        if name in given.defined:
            raise UsageError(_ambiguous(prog, split, args, i, width, lookup,
                                        f"{written} is an option of both detaudit and {split.script} "
                                        f"(its own argument parser defines {name})"))
        given.after[spec] = written
    elif spec in given.before and not spec.multiple:
        raise UsageError(f"{spec.label} is given twice ({given.before[spec]}, then {written}); give it once")
    else:
        given.before[spec] = written
    split.ours.extend(args[i:i + width])


def _ambiguous(prog: str, split: SplitArgs, args: Sequence[str], i: int, width: int,
               lookup: dict[str, OptionSpec], why: str, twice: bool = False) -> str:
    """The refusal, with both spellings: the option to the script (after `--`), or to detaudit (before SCRIPT).

    Only the option in question moves after the `--`, with the script's arguments (those read before it and
    those after it, as the split would read them): detaudit's options after it stay before the `--`, and a `--`
    the user wrote later goes (it said just that), so the script is handed neither."""
    assert split.script is not None
    ours, theirs = _later(args[i + width:], lookup)
    to_script = shlex.join([*prog.split(), *split.ours, split.script, *ours, "--", *split.script_args,
                            *args[i:i + width], *theirs])
    if twice:
        return (f"{why}, so detaudit will not guess whose the second is. If it is the script's, put it after "
                f"`--`: `{to_script}`. If it is detaudit's, give it once.")
    to_us = shlex.join([*prog.split(), *split.ours, *args[i:i + width], split.script, *split.script_args,
                        *args[i + width:]])
    return (f"{why}, so detaudit will not guess whose it is. For the script, put it after `--`: `{to_script}`. "
            f"For detaudit, put it before the script: `{to_us}`.")
