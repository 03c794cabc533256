"""Op outputs that are no results: the workspace or reserve a kernel hands to its own backward.

Some kernels return, beside their results, memory they keep for their backward: oneDNN's LSTM
(`aten.mkldnn_rnn_layer`'s fourth output, a uint8 workspace), cuDNN's and MIOpen's RNNs and batch norm (a
reserve), the fused RNN cells. Nothing promises that every byte of it is written: oneDNN leaves parts of its
workspace as the allocator found them, so two runs of a deterministic script hold other bytes there. Such an
output is set aside: recorded by dtype and shape only (ops.py), skipped by watch's replay (replay.py) and by
batch's origin search (batchprobe.py). If it ever reaches a result, that result differs, and that is what is
reported.

The rule comes from torch itself, not from a list of names: output N of an op is no result when the op's
derivative formula (`derivatives.yaml`, shipped with torch as `torchgen/packaged/autograd/derivatives.yaml`)
passes it to an argument that the called backward op's schema names a workspace or a reserve (`workspace`,
`reserve`, `reserveSpace`, `reservedSpace`: `mkldnn_rnn_layer_backward(..., Tensor workspace)`). The same
arguments of those backward ops count by dtype and shape only in their input digest. Saved statistics
(`native_batch_norm`'s mean and inverse std) and dropout masks are passed to arguments named for what they are,
and stay results. A torch without the file sets nothing aside.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

# an argument name that says "scratch memory for the backward": workspace, reserve, reserveSpace, reservedSpace
_SCRATCH_ARGUMENT = re.compile(r"(?:^|_)(?:workspace|reserved?(?:_?space)?)$", re.IGNORECASE)
_ENTRY = re.compile(r"^- name:\s+([\w.]+)\(.*\) -> (.*)$")
# a function call in a formula (`at::` optional); a method call (`result3.clone()`) is no op's schema
_CALL = re.compile(r"(?<![\w.:])(?:at::)?(\w+)\(")
_WORD = re.compile(r"\b\w+\b")
_PUNCTUATION = re.compile(r"[()\[\]{},]")
_RESULT = re.compile(r"result(\d*)")

# `arguments(name)`: the argument names of each overload of the aten op `name` (none: no such op)
Arguments = Callable[[str], Sequence[Sequence[str]]]


def is_scratch_argument(name: str) -> bool:
    """Whether a schema's argument name says it is a workspace or a reserve."""
    return _SCRATCH_ARGUMENT.search(name) is not None


def parse(text: str, arguments: Arguments) -> dict[str, frozenset[int]]:
    """Each op of a `derivatives.yaml` text with outputs that are no results -> their positions.

    The op is keyed as the file names it (`mkldnn_rnn_layer`, `foo.Tensor`); an output is named in a formula as
    `result`, `resultN` or by its declared name (`buffer`). An entry's formulas are read as one text: a formula
    may wrap onto further lines, or sit under a `dispatch:` key."""
    found: dict[str, frozenset[int]] = {}
    for head, body in _entries(text):
        entry = _ENTRY.match(head)
        if entry is not None:
            positions = _scratch_results(body, _return_names(entry.group(2)), arguments)
            if positions:
                found[entry.group(1)] = frozenset(positions)
    return found


def _entries(text: str) -> list[tuple[str, str]]:
    """(the `- name:` line, the rest of its entry on one line) for each entry, comments left out."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("- name:"):
            entries.append((line, []))
        elif entries and not line.lstrip().startswith("#"):
            entries[-1][1].append(line.strip())
    return [(head, " ".join(body)) for head, body in entries]


def _return_names(returns: str) -> list[str]:
    """`(Tensor output, Tensor buffer)` -> ['output', 'buffer']; unnamed returns as ''."""
    return [words[-1] if len(words) > 1 else "" for words in (r.split() for r in returns.strip("()").split(","))]


def _scratch_results(formula: str, returns: list[str], arguments: Arguments) -> set[int]:
    """The outputs a formula passes to an argument named as scratch memory."""
    found: set[int] = set()
    for call in _CALL.finditer(formula):
        passed = [_results_in(expression, returns) for expression in _arguments_of(formula, call.end())]
        if not any(passed):  # no output passed to this call: no schema to look up
            continue
        for names in arguments(call.group(1).removesuffix("_symint")):
            for name, results in zip(names, passed):
                if is_scratch_argument(name):
                    found |= results
    return found


def _arguments_of(formula: str, start: int) -> list[str]:
    """The top-level, comma-separated arguments of the call whose '(' ends just before `start`."""
    parts: list[str] = []
    depth, begin = 0, start
    for mark in _PUNCTUATION.finditer(formula, start):
        char = mark.group()
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                parts.append(formula[begin:mark.start()])
                break
            depth -= 1
        elif depth == 0:  # a comma between two arguments
            parts.append(formula[begin:mark.start()])
            begin = mark.end()
    return parts


def _results_in(expression: str, returns: list[str]) -> set[int]:
    """The op's outputs an argument expression names (`retain_variables ? result3.clone() : result3` -> {3})."""
    found = set()
    for word in _WORD.findall(expression):
        numbered = _RESULT.fullmatch(word)
        if numbered is not None:
            found.add(int(numbered.group(1) or 0))
        elif word in returns:
            found.add(returns.index(word))
    return found


@functools.cache
def _aten_arguments(name: str) -> list[list[str]]:
    return [[a.name for a in schema.arguments] for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}")]


@functools.cache
def _table() -> dict[str, frozenset[int]]:
    """The running torch's table (read once, some 40 ms; empty when torch ships no derivatives.yaml, or one this
    cannot read: the script runs on whatever happens here)."""
    try:
        spec = importlib.util.find_spec("torchgen")
        if spec is None or spec.origin is None:
            return {}
        path = os.path.join(os.path.dirname(spec.origin), "packaged", "autograd", "derivatives.yaml")
        with open(path, encoding="utf-8") as f:
            return parse(f.read(), _aten_arguments)
    except Exception:
        return {}


def scratch_outputs(func: Any) -> frozenset[int]:
    """The positions of an aten OpOverload's outputs that are no results (mostly none)."""
    if func.namespace != "aten" or len(func._schema.returns) < 2:
        return frozenset()
    packet = func.overloadpacket.__name__
    overload = func._overloadname
    return _table().get(packet if overload == "default" else f"{packet}.{overload}", frozenset())


def tensor_indices(out: Any, positions: frozenset[int]) -> frozenset[int]:
    """The indices, among the tensors of an op's result in order (ops.tensors_in), of the outputs at `positions`."""
    if not positions or not isinstance(out, (tuple, list)):
        return frozenset()
    found: set[int] = set()
    index = 0
    for position, value in enumerate(out):
        count = _count(value)
        if position in positions:
            found.update(range(index, index + count))
        index += count
    return frozenset(found)


def results(out: Any, positions: frozenset[int]) -> Any:
    """An op's result with the outputs at `positions` (no results) replaced by None; `out` itself when none is."""
    if not positions or not isinstance(out, tuple):
        return out
    return tuple(None if i in positions else value for i, value in enumerate(out))


def _count(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, (tuple, list)):
        return sum(_count(item) for item in value)
    return 0
