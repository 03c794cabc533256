"""The device digest's lanes as Triton kernels (devicehash.py defines them; this computes the same integers).

Imported only where triton imports (CUDA builds of torch ship it); `devicehash` falls back to the torch
reduction otherwise, and tests check the two agree bit for bit where both run. Each program reads one block
of LANE_BLOCK int32 words, computes the position weights in registers (int64 arithmetic, wrapping as torch's
does), and sums the wrapped int32 products in int64:
- `block_sums`: a batch's staging buffer, one launch; each block's position in its tensor and length come
  from two small index tensors, so words outside every tensor are masked out;
- `reduce_one`: one tensor, one launch into a zeroed payload (int64 atomic adds: integer addition, so the
  order the programs finish in does not matter), program 0 also gathering the sample words.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

SAMPLE_WORDS = 8  # two int32 words per sample, N_SAMPLES samples


def available() -> bool:
    return torch.cuda.is_available()


def handles(device: torch.device) -> bool:
    """The kernels take CUDA tensors only (devicehash asks, so a test can stand in for them on CPU)."""
    return device.type == "cuda"


@triton.jit
def _lanes(w: Any, pos: Any, MIX0: tl.constexpr, MIX1: tl.constexpr, MUL: tl.constexpr) -> Any:
    """Both lanes' sums of one block's words `w` (int32, 0 where masked) at int64 positions `pos`."""
    m0 = (pos + 1) * MIX0
    m0 = (m0 ^ (m0 >> 15)) * MUL
    w0 = ((m0 ^ (m0 >> 12)) | 1).to(tl.int32)
    m1 = (pos + 2) * MIX1
    m1 = (m1 ^ (m1 >> 15)) * MUL
    w1 = ((m1 ^ (m1 >> 12)) | 1).to(tl.int32)
    mixed = w ^ (w >> 13)
    s0 = tl.sum((w * w0).to(tl.int64), axis=0)
    s1 = tl.sum((mixed * w1).to(tl.int64), axis=0)
    return s0, s1


@triton.jit
def _block_sums_kernel(words: Any, block_pos: Any, block_len: Any, out: Any, blocks: Any, BLOCK: tl.constexpr,
                       MIX0: tl.constexpr, MIX1: tl.constexpr, MUL: tl.constexpr) -> None:
    b = tl.program_id(0)
    count = tl.load(block_len + b)
    first = tl.load(block_pos + b)
    offs = tl.arange(0, BLOCK)
    w = tl.load(words + b.to(tl.int64) * BLOCK + offs, mask=offs < count, other=0)
    s0, s1 = _lanes(w, first + offs.to(tl.int64), MIX0, MIX1, MUL)
    tl.store(out + b, s0)
    tl.store(out + blocks + b, s1)


@triton.jit
def _one_kernel(words: Any, n: Any, lanes: Any, samples_from: Any, sample_index: Any, samples_out: Any,
                BLOCK: tl.constexpr, SAMPLE_WORDS: tl.constexpr, MIX0: tl.constexpr, MIX1: tl.constexpr,
                MUL: tl.constexpr) -> None:
    b = tl.program_id(0)
    start = b.to(tl.int64) * BLOCK
    offs = tl.arange(0, BLOCK)
    pos = start + offs.to(tl.int64)
    w = tl.load(words + pos, mask=pos < n, other=0)
    s0, s1 = _lanes(w, pos, MIX0, MIX1, MUL)
    tl.atomic_add(lanes, s0)
    tl.atomic_add(lanes + 1, s1)
    if b == 0:
        k = tl.arange(0, SAMPLE_WORDS)
        tl.store(samples_out + k, tl.load(samples_from + tl.load(sample_index + k)))


def block_sums(words: torch.Tensor, block_pos: torch.Tensor, block_len: torch.Tensor, block: int,
               mix: tuple[int, int], mul: int) -> torch.Tensor:
    """(2, blocks) int64 lane sums of each `block`-word block of a batch's staging buffer (as the torch
    reduction's); `mix`, `mul`: the weights' constants (devicehash)."""
    blocks = block_pos.numel()
    out = torch.empty(2, blocks, dtype=torch.int64, device=words.device)
    _block_sums_kernel[(blocks,)](words, block_pos, block_len, out, blocks, BLOCK=block, MIX0=mix[0], MIX1=mix[1],
                                  MUL=mul)
    return out


def reduce_one(words: torch.Tensor, readable: torch.Tensor, sample_index: torch.Tensor, block: int,
               mix: tuple[int, int], mul: int) -> torch.Tensor:
    """One tensor's payload (int32: two int64 lanes, then the sample words), in one launch after a zeroing."""
    n = words.numel()
    payload = torch.zeros(4 + SAMPLE_WORDS, dtype=torch.int32, device=words.device)
    _one_kernel[(triton.cdiv(n, block),)](words, n, payload.view(torch.int64), readable, sample_index, payload[4:],
                                          BLOCK=block, SAMPLE_WORDS=SAMPLE_WORDS, MIX0=mix[0], MIX1=mix[1], MUL=mul)
    return payload
