"""Sets whose iteration order changes from run to run, in scope where an op ran (op-level recording), and the set
an optimizer's Parameters came through (every granularity).

An op that receives the same values in another order (`torch.cat` of columns gathered from a set) shows where
the order arrived, not where it was made: the set was built and iterated lines before. Iteration order leaves
no record, but the set does: when an op first runs at a user line, the user's frames around it (the line's
own function and its callers) are searched for sets whose order varies between runs (strings and bytes, by
string hash randomization; objects and tensors hashed by their address), and for each the lines of its
function's compiled code that assign it, iterate it (`for x in s`, a comprehension) or otherwise read it.
Only names, sizes and element types are kept, never the elements. One search per user line, so the cost does
not grow with the steps; the cause detector links the event to the op with reordered inputs at that line.

An optimizer visits its Parameters in the order it was given them; given them through a set (tied weights
de-duplicated with `set(model.parameters())`), it steps them in the order of their addresses. At every
granularity, each optimizer's construction looks for that set: one holding its Parameters in scope, else a set
made on the constructor's line or on a line that assigned what it was given (the set itself is gone by then),
and writes a `set-order` event at the constructor's line whose sets are `Parameters hashed by identity`.
"""

from __future__ import annotations

import dis
import functools
import itertools
import sys
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

import torch

from detaudit.events import PARAMETERS_BY_IDENTITY, SetOrderEvent, SetOrigin
from detaudit.recorder.evidence.base import Evidence, never_fatal
from detaudit.recorder.location import display_path, user_frames
from detaudit.recorder.patch import wrap

MAX_FRAMES = 3  # the op's own function and two callers
MAX_SETS = 4
MAX_LINES = 4
_SAMPLED = 8  # elements looked at to tell what a set holds
_IDENTITY_HASHES = (object.__hash__, torch.Tensor.__hash__)  # by address: another order in every run
_STORES = frozenset({"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"})
_LOADS = frozenset({"LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF"})


def order_kind(value: Any) -> str | None:
    """What makes iterating `value` run-dependent: "str", "bytes", "tuple holding str" (string hashes),
    "objects hashed by identity" (addresses); None for a value that is no set of two or more such elements."""
    if type(value) not in (set, frozenset) or len(value) < 2:  # a subclass may keep its own order
        return None
    try:
        kinds = {kind for item in itertools.islice(value, _SAMPLED) if (kind := _element_kind(item)) is not None}
    except RuntimeError:  # another thread changed it meanwhile: not this op's order
        return None
    return " and ".join(sorted(kinds)) or None


def _element_kind(item: Any) -> str | None:
    if isinstance(item, str | bytes):
        return type(item).__name__
    if isinstance(item, tuple):
        return "tuple holding str" if any(isinstance(x, str | bytes) for x in item) else None
    return "objects hashed by identity" if type(item).__hash__ in _IDENTITY_HASHES else None


@functools.lru_cache(maxsize=512)
def _name_lines(code: CodeType) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """name -> (lines assigning it, lines iterating it, lines otherwise reading it) in `code`'s bytecode."""
    lines: dict[str, tuple[list[int], list[int], list[int]]] = {}
    instructions = list(dis.get_instructions(code))
    for ins, following in zip(instructions, [*instructions[1:], None], strict=True):
        line = ins.positions.lineno if ins.positions is not None else None
        if line is None or not isinstance(ins.argval, str):
            continue
        built, iterated, used = lines.setdefault(ins.argval, ([], [], []))
        if ins.opname in _STORES:
            built.append(line)
        elif ins.opname in _LOADS:
            (iterated if following is not None and following.opname == "GET_ITER" else used).append(line)
    return {name: (_unique(b), _unique(i), _unique(u)) for name, (b, i, u) in lines.items()}


def _unique(lines: list[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(lines))[:MAX_LINES]


def _candidates(frame: FrameType) -> Iterator[tuple[str, Any]]:
    """The frame's locals, and the globals its code reads (a module-level set used inside a function)."""
    yield from list(frame.f_locals.items())
    if frame.f_code.co_name != "<module>":
        for name in frame.f_code.co_names:
            if name in frame.f_globals and name not in frame.f_locals:
                yield name, frame.f_globals[name]


def origins(frame: FrameType | None, keep: Callable[[Any], bool] = lambda value: True) -> list[SetOrigin]:
    """The run-ordered sets in scope of the user's frames from `frame` outward (those `keep` keeps), each with its
    lines."""
    found: dict[int, SetOrigin] = {}
    for here in itertools.islice(user_frames(frame), MAX_FRAMES):
        code = here.f_code
        where = display_path(code.co_filename)
        for name, value in _candidates(here):
            kind = order_kind(value)
            if kind is None or id(value) in found or not keep(value):
                continue
            built, iterated, used = _name_lines(code).get(name, ((), (), ()))
            found[id(value)] = SetOrigin(name=name, of=kind, size=len(value),
                                         built=[f"{where}:{n}" for n in built],
                                         iterated=[f"{where}:{n}" for n in iterated],
                                         used=[f"{where}:{n}" for n in used])
            if len(found) >= MAX_SETS:
                return list(found.values())
    return list(found.values())


def event(loc: str, frame: FrameType | None) -> SetOrderEvent | None:
    """The `set-order` event of the op line `loc`, or None when no such set is in scope."""
    sets = origins(frame)
    return SetOrderEvent(type="set-order", loc=loc, sets=sets) if sets else None


_SET_CALLS = frozenset({"set", "frozenset"})


@functools.lru_cache(maxsize=512)
def _set_lines(code: CodeType) -> frozenset[int]:
    """The lines of `code` that make a set: `set(...)`, `frozenset(...)`, a set display or comprehension."""
    lines = set()
    for ins in dis.get_instructions(code):
        line = ins.positions.lineno if ins.positions is not None else None
        if line is not None and (ins.opname in ("BUILD_SET", "SET_ADD", "SET_UPDATE")
                                 or (ins.opname in _LOADS and ins.argval in _SET_CALLS)
                                 or (isinstance(ins.argval, CodeType) and ins.argval.co_name == "<setcomp>")):
            lines.add(line)
    return frozenset(lines)


def _made_from_a_set(frame: FrameType, given: Any, size: int) -> SetOrigin | None:
    """The optimizer's constructor line, or a line that assigned the name it was given (`params = list(set(...))`),
    where it makes a set: the set is gone, its order is what the optimizer was given."""
    code = frame.f_code
    names = [name for name, value in frame.f_locals.items() if value is given]
    lines = [frame.f_lineno, *(n for name in names for n in _name_lines(code).get(name, ((), (), ()))[0])]
    made = [n for n in dict.fromkeys(lines) if n in _set_lines(code)][:MAX_LINES]
    if not made:
        return None
    where = display_path(code.co_filename)
    return SetOrigin(name=names[0] if names else "", of=PARAMETERS_BY_IDENTITY, size=size,
                     built=[f"{where}:{n}" for n in made], iterated=[], used=[])


def parameter_sets(frame: FrameType | None, given: Any, params: list[Any]) -> list[SetOrigin]:
    """Where an optimizer's Parameters came through a set (their order is their addresses'): a set of them in scope
    at its constructor's line, else a set made on that line or on the line that built what it was given."""
    held = {id(p) for p in params}
    sets = origins(frame, lambda value: any(id(x) in held for x in itertools.islice(value, _SAMPLED)))
    if sets:
        return [SetOrigin(**{**s, "of": PARAMETERS_BY_IDENTITY}) for s in sets]
    here = next(user_frames(frame), None)
    made = _made_from_a_set(here, given, len(held)) if here is not None else None
    return [made] if made is not None else []


def install_optimizer(ev: Evidence, optimizer_cls: type) -> None:
    """At each optimizer's construction: the sets its Parameters came through, as a `set-order` event at its line."""
    def make(original: Callable[..., None]) -> Callable[..., None]:
        def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            original(optimizer, *args, **kwargs)
            caller = sys._getframe(1)
            with never_fatal():
                owned = [p for group in optimizer.param_groups for p in group["params"]]
                given = args[0] if args else kwargs.get("params")
                sets = parameter_sets(caller, given, owned) if len(owned) > 1 else []
                if sets:
                    ev.emit(SetOrderEvent(type="set-order", loc=ev.where(caller), sets=sets))

        return init

    wrap(optimizer_cls, "__init__", make)
