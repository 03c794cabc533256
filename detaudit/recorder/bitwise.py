"""Two executions' outputs compared bit for bit, and how far apart they are (`detaudit watch`'s replay,
recorder/replay.py): the bytes, so `-0.0` and `0.0` differ and equal NaNs agree; on the CPU with `memcmp`."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from detaudit.recorder.opinfo import tensors_in
from detaudit.recorder.scratch import results

INT_OF = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}  # integers of each element width
_NONE: frozenset[int] = frozenset()


# libc's memcmp through a prototype of detaudit's own (never the attributes of a ctypes object the script may
# share): comparing a CPU tensor's bytes so is several times faster than torch.equal
_memcmp = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ("memcmp", ctypes.CDLL(None)))


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two tensors of one shape and dtype hold the same bytes."""
    if x.is_cpu and y.is_cpu:
        if not (x.is_contiguous() and y.is_contiguous()):  # one layout for both: then their bytes compare
            x, y = x.detach().contiguous(), y.detach().contiguous()
        size = x.numel() * x.element_size()
        return size == 0 or _memcmp(x.data_ptr(), y.data_ptr(), size) == 0
    x, y = x.detach().reshape(-1).contiguous(), y.detach().reshape(-1).contiguous()
    wide = INT_OF.get(x.element_size(), torch.uint8)  # integers of the element's width: bytes, exactly
    return torch.equal(x.view(wide), y.view(wide))


def _comparable(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_nested and not t.is_quantized and not t.is_meta


def differs(a: Any, b: Any, aside: frozenset[int] = _NONE) -> tuple[float, int] | None:
    """(max |diff|, max ULP) over the outputs when any bit differs; None when they agree bit for bit. The outputs
    at positions `aside` are no results: not compared."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):  # most ops: one tensor out
        return _pair_differs(a, b)
    left, right = list(tensors_in(results(a, aside))), list(tensors_in(results(b, aside)))
    if len(left) != len(right):
        return (float("inf"), 0)
    found: tuple[float, int] | None = None
    for x, y in zip(left, right):
        hit = _pair_differs(x, y)
        if hit is not None:
            found = hit if found is None else (max(found[0], hit[0]), max(found[1], hit[1]))
    return found


def _pair_differs(x: torch.Tensor, y: torch.Tensor) -> tuple[float, int] | None:
    if not (_comparable(x) and _comparable(y)):
        return None
    if x.shape != y.shape or x.dtype != y.dtype:
        return (float("inf"), 0)
    if _same_bits(x, y):
        return None
    return distance(x, y)


def distance(x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    """Max |diff| and, for floating point, max ULP apart (integers: the difference itself)."""
    if x.dtype == torch.bool:
        return 1.0, 1
    if x.is_complex():
        x, y = torch.view_as_real(x), torch.view_as_real(y)
    wide_x, wide_y = x.detach().double(), y.detach().double()
    diff = float((wide_x - wide_y).abs().nan_to_num(nan=float("inf")).max())
    if not x.is_floating_point():
        return diff, int(diff)
    return diff, int((_ordered(x) - _ordered(y)).abs().max())


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Floats as integers in the order of their values, adjacent floats one apart (sign-magnitude made linear)."""
    bits = t.detach().contiguous().view(INT_OF[t.element_size()]).long()
    magnitude = bits & ((1 << (8 * t.element_size() - 1)) - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def agrees(first: Any, second: Any, third: Any, aside: frozenset[int]) -> str:
    """Which execution the third one reproduces bit for bit."""
    if differs(third, first, aside) is None:
        return "first"
    if differs(third, second, aside) is None:
        return "second"
    return "neither"
