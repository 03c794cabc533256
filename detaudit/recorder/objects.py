"""torch.save's whole argument as trace leaves: the tensors in it, and a stable encoding of every other
value (NumPy arrays, Python numbers, strings, bytes, None), so an RNG state, a metric or a run id saved
beside the model is compared too (docs/trace-format.md, "Values that are not tensors").

The object tree is walked, never pickled: containers give the path (`rng.numpy[1]`, as module and
tensor records are named), leaves are tensors (recorded as tensors are) or `Encoded` values. A leaf
that cannot be encoded (an instance of an arbitrary class) is an `Unencodable`: the recorder lists it
as not observed, never skips it silently.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import struct
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
import xxhash

from detaudit.trace import N_SAMPLES
from detaudit.trace.dtypes import OBJECT_CODES

MAX_DEPTH = 32
MAX_LEAVES = 4096  # per torch.save call; the rest of the tree is listed as not observed
_INT64 = (-(1 << 63), (1 << 63) - 1)


class Encoded(NamedTuple):
    """A non-tensor leaf as a record keeps it."""

    dtype: int  # trace.dtypes.OBJECT_CODES
    digest: int
    samples: tuple[float, ...]


class Unencodable(NamedTuple):
    type_name: str  # `module.Qualname` of the value, or why it was not walked


class PythonNumber(NamedTuple):
    """A Python number saved beside tensors (a global step, a best score): recorded as the 0-dim tensor it
    converts to, with its values as samples, but flagged: a number read from what an earlier repeat left is
    judged as a saved path is, not as a tensor the script computed (compare/saved_values.py)."""

    tensor: torch.Tensor


Leaf = torch.Tensor | PythonNumber | Encoded | Unencodable


def _encoded(kind: str, data: bytes) -> Encoded:
    code = OBJECT_CODES[kind]
    return Encoded(code, xxhash.xxh3_64_intdigest(data, code), (float("nan"),) * N_SAMPLES)


def _type_name(value: Any) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _key(key: Any) -> str:
    """A mapping key as a path part; keys whose text would hold an address are named by their type."""
    if isinstance(key, str | int | float | bool | enum.Enum) or key is None:
        return str(key)
    if isinstance(key, tuple) and all(isinstance(k, str | int | float | bool) or k is None for k in key):
        return str(key)
    return f"<{_type_name(key)}>"


def _array(a: np.ndarray[Any, Any]) -> Leaf:
    """A NumPy array: as the tensor it converts to (same digest, samples and dtype as torch's); text and
    byte arrays by their bytes; object arrays are walked by the caller."""
    if a.dtype.kind in "US":
        return _encoded("str" if a.dtype.kind == "U" else "bytes", str(a.shape).encode() + a.tobytes())
    native = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("="), copy=False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only array: the tensor is only read
            return torch.from_numpy(native)
    except TypeError:  # a dtype torch lacks (datetime64, structured): by its bytes, named by its dtype
        return _encoded("bytes", str((a.dtype.str, a.shape)).encode() + native.tobytes())


def _scalar(value: Any) -> Leaf | None:
    """A Python number as the 0-dim tensor `torch.tensor(value)` holds, or a string, bytes or None."""
    if value is None:
        return _encoded("none", b"")
    if isinstance(value, bool):
        return PythonNumber(torch.tensor(value))
    if isinstance(value, int):
        if _INT64[0] <= value <= _INT64[1]:
            return PythonNumber(torch.tensor(value, dtype=torch.int64))
        return _encoded("int", str(value).encode())
    if isinstance(value, float):
        return PythonNumber(torch.tensor(value, dtype=torch.float64))
    if isinstance(value, complex):
        return PythonNumber(torch.tensor(value, dtype=torch.complex128))
    if isinstance(value, str):
        return _encoded("str", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes | bytearray | memoryview):
        return _encoded("bytes", bytes(value))
    if isinstance(value, np.generic):
        return _array(np.asarray(value))
    if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format | enum.Enum):
        return _encoded("str", f"{_type_name(value)}:{value}".encode())
    return None


def _numbers(items: list[Any] | tuple[Any, ...]) -> torch.Tensor | None:
    """A non-empty list of plain numbers of one type (Python's `random.getstate()[1]`: 625 ints) as one
    1-D tensor, instead of one record per number."""
    if len(items) < 2:
        return None
    first = type(items[0])
    if first not in (int, float) or any(type(x) is not first for x in items):
        return None
    if first is int and not all(_INT64[0] <= x <= _INT64[1] for x in items):
        return None
    return torch.tensor(items, dtype=torch.int64 if first is int else torch.float64)


def walk(value: Any, path: str) -> Iterator[tuple[str, Leaf]]:
    """(path, leaf) for everything in `value`, in a stable order; at most MAX_LEAVES of them."""
    for count, item in enumerate(_walk(value, path, 0), start=1):
        if count > MAX_LEAVES:
            yield path, Unencodable(f"values beyond the first {MAX_LEAVES}")
            return
        yield item


def _walk(value: Any, path: str, depth: int) -> Iterator[tuple[str, Leaf]]:
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    scalar = _scalar(value)
    if scalar is not None:
        yield path, scalar
        return
    if depth >= MAX_DEPTH:
        yield path, Unencodable(f"nested deeper than {MAX_DEPTH}")
        return
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "O":
            for i, item in enumerate(value.reshape(-1).tolist()):
                yield from _walk(item, f"{path}[{i}]", depth + 1)
        else:
            yield path, _array(value)
        return
    if isinstance(value, torch.nn.Module | torch.optim.Optimizer):
        value = value.state_dict()
    elif isinstance(value, argparse.Namespace | types.SimpleNamespace):
        value = vars(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(item, f"{path}.{_key(key)}", depth + 1)
    elif isinstance(value, list | tuple):
        numbers = _numbers(value)
        if numbers is not None:
            yield path, numbers
            return
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]", depth + 1)
    elif isinstance(value, set | frozenset):
        # iteration order follows string hashes (PYTHONHASHSEED): elements in the order of their encoding
        leaves = [leaf for item in value for _, leaf in _walk(item, path, depth + 1)]
        parts = [_leaf_bytes(leaf) for leaf in leaves if not isinstance(leaf, Unencodable)]
        if len(parts) < len(leaves):
            yield path, Unencodable(f"set of {_type_name(next(iter(value)))}")
            return
        yield path, _encoded("bytes", b"".join(sorted(parts)))
    else:
        yield path, Unencodable(_type_name(value))


def _leaf_bytes(leaf: Encoded | PythonNumber | torch.Tensor) -> bytes:
    if isinstance(leaf, PythonNumber):
        leaf = leaf.tensor
    if isinstance(leaf, torch.Tensor):
        from detaudit.recorder.fingerprint import fingerprint_cpu

        return struct.pack("<Q", fingerprint_cpu(leaf.detach().cpu())[0])
    return struct.pack("<BQ", leaf.dtype, leaf.digest)
