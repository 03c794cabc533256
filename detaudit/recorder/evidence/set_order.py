"""Sets whose iteration order changes from run to run, in scope where an op ran (op-level recording only).

An op that receives the same values in another order (`torch.cat` of columns gathered from a set) shows where
the order arrived, not where it was made: the set was built and iterated lines before. Iteration order leaves
no record, but the set does: when an op first runs at a user line, the user's frames around it (the line's
own function and its callers) are searched for sets whose order varies between runs (strings and bytes, by
string hash randomization; objects and tensors hashed by their address), and for each the lines of its
function's compiled code that assign it, iterate it (`for x in s`, a comprehension) or otherwise read it.
Only names, sizes and element types are kept, never the elements. One search per user line, so the cost does
not grow with the steps; the cause detector links the event to the op with reordered inputs at that line.
"""

from __future__ import annotations

import dis
import functools
import itertools
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import Any

import torch

from detaudit.events import SetOrderEvent, SetOrigin
from detaudit.recorder.location import display_path, user_frames

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


def origins(frame: FrameType | None) -> list[SetOrigin]:
    """The run-ordered sets in scope of the user's frames from `frame` outward, each with its lines."""
    found: dict[int, SetOrigin] = {}
    for here in itertools.islice(user_frames(frame), MAX_FRAMES):
        code = here.f_code
        where = display_path(code.co_filename)
        for name, value in _candidates(here):
            kind = order_kind(value)
            if kind is None or id(value) in found:
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
