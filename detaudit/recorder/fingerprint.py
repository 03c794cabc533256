"""Tensor fingerprints: a bitwise digest plus a few sampled values.

The digest answers "are these bits identical?"; the samples answer "by how much do they
differ?" without storing the tensor. CPU tensors are hashed in place (xxh3 over the raw
bytes, no copy when contiguous); the tensors recorded at every optimizer step are hashed the same way,
with their per-tensor work done once per run (recorder/boundary.py). Tensors on other devices are reduced on the device
(devicehash.py) with an order-independent integer sum, so only a few numbers cross to the host and the
digest does not depend on how the device schedules the reduction.

A tensor that is not one plain strided buffer (sparse COO/CSR/CSC/BSR/BSC, jagged or strided
nested, quantized) is fingerprinted through its `Parts`: the plain tensors torch keeps it in
(values, indices, offsets, quantization scales), each hashed as above, under a seed naming the
layout, so equal values in another layout never share a digest. Nothing is densified (a sparse
gradient of a large embedding would not fit). Meta tensors have no contents: dtype and shape only.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import xxhash

from detaudit.trace import N_SAMPLES
from detaudit.trace.dtypes import DTYPE_ORDER
from detaudit.trace.format import sample_positions

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
    shape: tuple[int | str, ...]  # a nested tensor's ragged dimensions are "j"
    samples: tuple[float, ...]


@dataclass(frozen=True)
class Parts:
    """A tensor that is not one plain strided buffer, as the plain tensors holding its contents."""

    seed: int  # layout, dtype, logical shape and scalar parameters (a quantization scale)
    tensors: tuple[torch.Tensor, ...]
    # the parts from this index on hold the elements (the first gives the samples, --self-check's change
    # goes into the first non-empty one); None: no part holds values (quantized: integers)
    values: int | None


_meta_cache: dict[tuple[torch.dtype, tuple[int | str, ...]], int] = {}
# Both per-shape caches are emptied past this size: scripts with dynamic shapes (variable sequence
# lengths) would otherwise grow them for the whole run. Refilling costs a few microseconds per shape.
_SHAPE_CACHE_LIMIT = 4096


def meta_seed(dtype: torch.dtype, shape: tuple[int | str, ...]) -> int:
    """A 64-bit seed derived from dtype and shape, so equal bytes of another shape hash apart."""
    key = (dtype, shape)
    seed = _meta_cache.get(key)
    if seed is None:
        seed = xxhash.xxh3_64_intdigest(f"{dtype}{tuple(shape)}".encode())
        if len(_meta_cache) >= _SHAPE_CACHE_LIMIT:
            _meta_cache.clear()
        _meta_cache[key] = seed
    return seed


def is_plain(t: torch.Tensor) -> bool:
    """One strided buffer holds all of the tensor's contents (the common case)."""
    return t.layout == torch.strided and not t.is_nested and not t.is_quantized


def logical_shape(t: torch.Tensor) -> tuple[int | str, ...]:
    """The shape, with each ragged dimension of a nested tensor as "j" (torch numbers them j1, j2, ...
    in creation order across the process, which says nothing about the tensor)."""
    if not t.is_nested:
        return tuple(t.shape)
    if t.layout == torch.jagged:
        return tuple(d if isinstance(d, int) else "j" for d in t.shape)
    sizes = t._nested_tensor_size()  # strided nested: one row of sizes per component
    columns = [sorted(set(sizes[:, i].tolist())) for i in range(sizes.shape[1])]
    return (t.size(0), *(c[0] if len(c) == 1 else "j" for c in columns))


def parts(t: torch.Tensor) -> Parts:
    """The plain tensors holding a non-plain tensor's contents, as torch stores them (what torch.save
    writes): an uncoalesced COO tensor is not coalesced, a jagged tensor's values keep the rows its
    offsets skip. Raises for a layout without readable contents (meta, or one torch adds later)."""
    t = t.detach()
    layout, extra = t.layout, ""
    tensors: tuple[torch.Tensor, ...]
    if t.device.type == "meta":
        raise NotImplementedError("a meta tensor has no contents")
    if t.is_quantized:
        scheme = t.qscheme()
        if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            extra = f"{t.q_scale()!r},{t.q_zero_point()}"
            tensors = (t.int_repr(),)
        else:
            extra = str(t.q_per_channel_axis())
            tensors = (t.int_repr(), t.q_per_channel_scales(), t.q_per_channel_zero_points())
        extra = f"{scheme}:{extra}"
        values = None  # the integers are no values: a sampled difference in them would be no distance
    elif layout == torch.sparse_coo:
        extra, tensors, values = str(t.is_coalesced()), (t._indices(), t._values()), 1
    elif layout in (torch.sparse_csr, torch.sparse_bsr):
        tensors, values = (t.crow_indices(), t.col_indices(), t.values()), 2
    elif layout in (torch.sparse_csc, torch.sparse_bsc):
        tensors, values = (t.ccol_indices(), t.row_indices(), t.values()), 2
    elif layout == torch.jagged:
        nested: Any = t  # torch.nested's NestedTensor: its methods are not in Tensor's stubs
        lengths = nested.lengths()
        extra = str(nested._ragged_idx)
        tensors = (nested.offsets(), t.values()) if lengths is None else (nested.offsets(), lengths, t.values())
        values = len(tensors) - 1
    elif t.is_nested:  # strided nested: each component as the script sees it, and their sizes
        tensors, values = (t._nested_tensor_size(), *t.unbind()), 1 if t.size(0) else None
    else:
        raise NotImplementedError(f"no fingerprint for layout {layout}")
    # each part's dtype and shape too: the device reduction's lanes do not carry them
    key = f"{layout}|{t.dtype}|{logical_shape(t)}|{extra}|" + ";".join(f"{p.dtype}{tuple(p.shape)}" for p in tensors)
    return Parts(xxhash.xxh3_64_intdigest(key.encode()), tensors, values)


def _parts_cpu(t: torch.Tensor) -> tuple[int, tuple[float, ...]]:
    """(digest, samples) of a non-plain CPU tensor: its parts' digests hashed under its own seed."""
    p = parts(t)
    prints = [fingerprint_cpu(part) for part in p.tensors]
    digest = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(prints)}Q", *(d for d, _ in prints)), p.seed)
    return digest, _NO_SAMPLES if p.values is None else prints[p.values][1]


def shape_seed(t: torch.Tensor) -> int:
    """The digest of a tensor whose contents are not read: its dtype and (logical) shape."""
    return meta_seed(t.dtype, logical_shape(t) if t.is_nested else t.shape)


def _host_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with the same logical contents (a copy only when needed).

    Detached first: a copy of a tensor that requires grad would add a node to the user's graph."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return t


def _bf16_to_float(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits << 16))[0])


class SampleLayout(NamedTuple):
    """Where a contiguous buffer's sampled elements are (at 0, 1/3, 2/3 and the end): `unpack` reads the distinct
    ones in one struct call, with a format that skips the bytes between them (None: the dtype has no sample, or
    the tensor no element); `order` maps the N_SAMPLES samples to its results (tiny tensors repeat positions);
    `bf16`: the results are bfloat16 bits, to be widened to floats."""

    unpack: Callable[[Any], tuple[Any, ...]] | None
    order: tuple[int, ...]
    bf16: bool


def sample_layout(dtype: torch.dtype, numel: int) -> SampleLayout:
    fmt = _SAMPLE_FORMATS.get(dtype)
    if fmt is None or numel == 0:
        return SampleLayout(None, (), False)
    item = dtype.itemsize
    positions = sample_positions(numel)
    unique = sorted(set(positions))
    code, width = fmt[1], struct.calcsize(fmt)
    parts, cursor = ["<"], 0
    for p in unique:
        if p * item > cursor:
            parts.append(f"{p * item - cursor}x")
        parts.append(code)
        cursor = p * item + width
    return SampleLayout(struct.Struct("".join(parts)).unpack_from, tuple(unique.index(p) for p in positions),
                        dtype is torch.bfloat16)


def _sample_reader(dtype: torch.dtype, numel: int) -> Callable[[Any], tuple[float, ...]]:
    """A function reading the N_SAMPLES sampled elements of a contiguous buffer as floats (`sample_layout`)."""
    unpack, index, bf16 = sample_layout(dtype, numel)
    if unpack is None:
        return lambda buf: _NO_SAMPLES
    if index == tuple(range(N_SAMPLES)) and _SAMPLE_FORMATS[dtype][1] in "fde":
        return unpack  # the common case: already a tuple of 4 floats
    convert: Callable[[Any], float] = _bf16_to_float if bf16 else float

    def read(buf: Any) -> tuple[float, ...]:
        values = unpack(buf)
        return tuple([convert(values[i]) for i in index])

    return read


# (dtype, shape) -> (seed, ctypes buffer type or None when empty, sample reader): everything about
# a tensor that does not depend on its contents, worked out once per dtype and shape.
_plans: dict[tuple[torch.dtype, torch.Size], tuple[int, Any, Callable[[Any], tuple[float, ...]]]] = {}


def _plan(t: torch.Tensor) -> tuple[int, Any, Callable[[Any], tuple[float, ...]]]:
    numel = t.numel()
    # None: no buffer to read here (an empty tensor, or a quantized one, read through its parts)
    buffer_type = ctypes.c_char * t.nbytes if numel and not t.is_quantized else None
    plan = (meta_seed(t.dtype, t.shape), buffer_type, _sample_reader(t.dtype, numel))
    if len(_plans) >= _SHAPE_CACHE_LIMIT:
        _plans.clear()
    _plans[(t.dtype, t.shape)] = plan
    return plan


def fingerprint_cpu(t: torch.Tensor) -> tuple[int, tuple[float, ...]]:
    """(digest, samples) of a CPU tensor; the hot path, so one cache lookup and no objects beyond
    the tuple (about 1.5 us for a small tensor). Quantized tensors are told apart only on a plan's
    empty branch, off that path."""
    if t.layout != torch.strided or t.is_nested:
        return _parts_cpu(t)
    if not t.is_contiguous() or t.is_conj() or t.is_neg():
        t = _host_bytes(t)
    plan = _plans.get((t.dtype, t.shape))
    if plan is None:
        plan = _plan(t)
    seed, buffer_type, read_samples = plan
    if buffer_type is None:
        return _parts_cpu(t) if t.is_quantized else (seed, _NO_SAMPLES)
    ptr = t.data_ptr()
    if not ptr:  # elements but no memory: its storage was freed under it (FSDP resizes a storage to 0)
        raise RuntimeError("the tensor's storage holds no memory")
    buf = buffer_type.from_address(ptr)
    return xxhash.xxh3_64_intdigest(buf, seed), read_samples(buf)
