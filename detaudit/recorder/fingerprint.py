"""Tensor fingerprints: a bitwise digest plus a few sampled values.

The digest answers "are these bits identical?"; the samples answer "by how much do they
differ?" without storing the tensor. CPU tensors are hashed in place (xxh3 over the raw
bytes, no copy when contiguous). Tensors on other devices are reduced on the device with an
order-independent integer sum, so only a few numbers cross to the host and the digest does
not depend on how the device schedules the reduction.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from detaudit.trace import N_SAMPLES
from detaudit.trace.dtypes import DTYPE_ORDER

# Looked up by name because older torch releases lack the unsigned and float8 types.
DTYPE_CODES: dict[torch.dtype, int] = {
    getattr(torch, name): code for code, name in enumerate(DTYPE_ORDER, start=1) if hasattr(torch, name)
}

# struct formats used to read one element as a float sample; None: no meaningful sample.
_SAMPLE_FORMATS: dict[torch.dtype, str] = {
    getattr(torch, name): fmt
    for name, fmt in (
        ("float32", "<f"), ("float64", "<d"), ("float16", "<e"), ("bfloat16", "<H"),
        ("complex64", "<f"), ("complex128", "<d"), ("bool", "<?"), ("uint8", "<B"),
        ("int8", "<b"), ("int16", "<h"), ("int32", "<i"), ("int64", "<q"),
        ("uint16", "<H"), ("uint32", "<I"), ("uint64", "<Q"),
    )
    if hasattr(torch, name)
}
_NAN = float("nan")
_NO_SAMPLES = (_NAN,) * N_SAMPLES


@dataclass(frozen=True)
class Fingerprint:
    """What a trace keeps of one tensor."""

    digest: int
    dtype: str
    shape: tuple[int, ...]
    samples: tuple[float, ...]


_meta_cache: dict[tuple[torch.dtype, torch.Size], int] = {}
# Both per-shape caches are emptied past this size: scripts with dynamic shapes (variable sequence
# lengths) would otherwise grow them for the whole run. Refilling costs a few microseconds per shape.
_SHAPE_CACHE_LIMIT = 4096


def meta_seed(dtype: torch.dtype, shape: torch.Size) -> int:
    """A 64-bit seed derived from dtype and shape, so equal bytes of another shape hash apart."""
    key = (dtype, shape)
    seed = _meta_cache.get(key)
    if seed is None:
        seed = xxhash.xxh3_64_intdigest(f"{dtype}{tuple(shape)}".encode())
        if len(_meta_cache) >= _SHAPE_CACHE_LIMIT:
            _meta_cache.clear()
        _meta_cache[key] = seed
    return seed


def _host_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the same logical contents (a copy only when needed).

    Detached first: a copy of a tensor that requires grad would add a node to the user's graph."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.layout != torch.strided:
        t = t.to_dense()
    if not t.is_contiguous():
        t = t.contiguous()
    return t


def _bf16_to_float(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits << 16))[0])


def _sample_reader(dtype: torch.dtype, numel: int) -> Callable[[Any], tuple[float, ...]]:
    """A function reading the 4 sampled elements of a contiguous buffer in one struct call.

    The elements at 0, 1/3, 2/3 and the end are read with one format that skips the bytes
    between them; tiny tensors repeat positions, so they go through an index map.
    """
    fmt = _SAMPLE_FORMATS.get(dtype)
    if fmt is None or numel == 0:
        return lambda buf: _NO_SAMPLES
    item = torch.empty(0, dtype=dtype).element_size()
    last = numel - 1
    positions = (0, last // 3, (2 * last) // 3, last)
    unique = sorted(set(positions))
    code, width = fmt[1], struct.calcsize(fmt)
    parts, cursor = ["<"], 0
    for p in unique:
        if p * item > cursor:
            parts.append(f"{p * item - cursor}x")
        parts.append(code)
        cursor = p * item + width
    unpack = struct.Struct("".join(parts)).unpack_from
    if len(unique) == N_SAMPLES and code in "fde":
        return unpack  # the common case: already a tuple of 4 floats
    index = tuple(unique.index(p) for p in positions)
    convert: Callable[[Any], float] = _bf16_to_float if dtype is torch.bfloat16 else float

    def read(buf: Any) -> tuple[float, ...]:
        values = unpack(buf)
        return tuple([convert(values[i]) for i in index])

    return read


# (dtype, shape) -> (seed, ctypes buffer type or None when empty, sample reader): everything about
# a tensor that does not depend on its contents, worked out once per dtype and shape.
_plans: dict[tuple[torch.dtype, torch.Size], tuple[int, Any, Callable[[Any], tuple[float, ...]]]] = {}


def _plan(t: torch.Tensor) -> tuple[int, Any, Callable[[Any], tuple[float, ...]]]:
    numel = t.numel()
    buffer_type = ctypes.c_char * t.nbytes if numel else None
    plan = (meta_seed(t.dtype, t.shape), buffer_type, _sample_reader(t.dtype, numel))
    if len(_plans) >= _SHAPE_CACHE_LIMIT:
        _plans.clear()
    _plans[(t.dtype, t.shape)] = plan
    return plan


def fingerprint_cpu(t: torch.Tensor) -> tuple[int, tuple[float, ...]]:
    """(digest, samples) of a CPU tensor; the hot path, so one cache lookup and no objects beyond
    the tuple (about 1.5 us for a small tensor)."""
    if not (t.is_contiguous() and t.layout == torch.strided) or t.is_conj() or t.is_neg():
        t = _host_bytes(t)
    plan = _plans.get((t.dtype, t.shape))
    if plan is None:
        plan = _plan(t)
    seed, buffer_type, read_samples = plan
    if buffer_type is None:
        return seed, _NO_SAMPLES
    buf = buffer_type.from_address(t.data_ptr())
    return xxhash.xxh3_64_intdigest(buf, seed), read_samples(buf)


class DeviceReducer:
    """Fingerprints tensors where they live, with one host transfer per batch.

    Each tensor's words are multiplied by fixed odd position weights (int32 arithmetic wraps)
    and summed in int64. Integer addition is associative, so the result is the same whatever
    order the device reduces in; position weights make swapped elements change the sum.
    """

    _MIX = (0x9E3779B1, 0x85EBCA77)

    def __init__(self) -> None:
        self._weights: dict[tuple[torch.device, int], torch.Tensor] = {}

    def _weights_for(self, device: torch.device, n: int, lane: int) -> torch.Tensor:
        key = (device, lane)
        w = self._weights.get(key)
        if w is None or w.numel() < n:
            size = max(n, 1024, 0 if w is None else 2 * w.numel())
            pos = torch.arange(size, dtype=torch.int64, device=device)
            mixed = (pos + lane + 1) * self._MIX[lane]
            mixed = (mixed ^ (mixed >> 15)) * 0x2C1B3C6D
            w = ((mixed ^ (mixed >> 12)) | 1).to(torch.int32)
            self._weights[key] = w
        return w[:n]

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """A device tensor of 2 + N_SAMPLES float64/int64 values; resolve with `finish`."""
        t = t.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        flat = t.contiguous().reshape(-1)
        if flat.stride(-1) != 1 or flat.storage_offset() * flat.element_size() % 4:
            # A one-element view keeps its stride; a slice may start mid-word: viewing the bytes as
            # int32 needs unit stride and 4-byte alignment.
            flat = flat.clone(memory_format=torch.contiguous_format)
        raw = flat.view(torch.uint8)
        words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw.to(torch.int32)
        n = words.numel()
        lanes = [
            (words * self._weights_for(t.device, n, 0)).sum(dtype=torch.int64),
            ((words ^ (words >> 13)) * self._weights_for(t.device, n, 1)).sum(dtype=torch.int64),
        ]
        numel = flat.numel()
        if numel and t.dtype in _SAMPLE_FORMATS:
            last = numel - 1
            # Python-int indexing makes views on the device: no host-to-device copy, no sync.
            picked = [flat[p] for p in (0, last // 3, (2 * last) // 3, last)]
            samples = torch.stack([p.real if p.is_complex() else p for p in picked]).to(torch.float64)
        else:
            samples = torch.full((N_SAMPLES,), _NAN, dtype=torch.float64, device=t.device)
        head = torch.stack(lanes).view(torch.float64)
        return torch.cat([head, samples])

    def digest_now(self, t: torch.Tensor) -> tuple[int, tuple[float, ...]]:
        """(digest, samples) of one tensor at once: its reduction and one transfer (a host sync)."""
        return self.finish(t.dtype, t.shape, self.reduce(t).cpu().tolist())

    @staticmethod
    def finish(dtype: torch.dtype, shape: torch.Size, reduced: list[float]) -> tuple[int, tuple[float, ...]]:
        """Host side: turn the transferred numbers into (digest, samples)."""
        lanes = struct.pack("<dd", reduced[0], reduced[1])
        return xxhash.xxh3_64_intdigest(lanes, meta_seed(dtype, shape)), tuple(reduced[2:])


def fingerprint(t: torch.Tensor) -> Fingerprint:
    """Fingerprint one tensor, on any device (the convenient, non-hot-path entry point)."""
    t = t.detach()
    if t.device.type == "cpu":
        digest, samples = fingerprint_cpu(t)
    elif t.device.type == "meta":
        digest, samples = meta_seed(t.dtype, t.shape), _NO_SAMPLES
    else:
        digest, samples = DeviceReducer().digest_now(t)
    return Fingerprint(digest, str(t.dtype).removeprefix("torch."), tuple(t.shape), samples)
