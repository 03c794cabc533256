"""Fingerprints of tensors on an accelerator, computed where they live: a few numbers per tensor cross to the
host, once per optimizer step for all of them.

The digest (unchanged since the first device path, so traces recorded before batching compare with traces
recorded after it): the tensor's bytes as int32 words (when its size is not a multiple of 4 bytes, each byte
widened to a word), reduced to two lanes, sum_k x[k] * w0[k] and sum_k (x[k] ^ (x[k] >> 13)) * w1[k], each
product wrapping in int32 and the sum wrapping in int64; w0 and w1 are fixed odd hashes of the word's position
k in the tensor (`position_weights`). Integer addition is associative, so the device may reduce in any order
and the sums stay the same; the position weights make a permutation change them. The digest is xxh3-64 of the
lanes under the dtype/shape seed. Samples are read from the same words on the host, so the device does no
float conversion.

Three ways compute the same lanes:
- `DeviceReducer.reduce`: one tensor (module and op outputs, tensors too large to batch, sparse and nested
  layouts through their parts). Tensors of more than CHUNK_WORDS words are reduced in chunks, whose weights are
  computed for the chunk's positions, so a tensor of over 2^31 elements needs no weight vector of its size.
- `DeviceBatch`: the optimizer step's gradients, parameters and state (and buffers), copied with one
  `_foreach_copy_` per dtype into a staging buffer where each tensor starts on a LANE_BLOCK-word block, and
  reduced together: block sums, one cumulative sum over the blocks, the lanes read at each tensor's first and
  last block (the host subtracts). A constant number of aten ops whatever the tensor count (tests count them).
- The Triton kernel (`lanes_triton.py`), where triton imports and the tensor is on CUDA: the weights computed
  in registers, block sums in one launch for a batch; one launch into a zeroed slot for a single tensor.

Fail-safe (none of these ways has run on a GPU yet, and a user's first GPU audit must not be their test): the
first time the batch reduction or a Triton kernel runs in a process, its digests are checked against the
reference, the torch reduction of each tensor alone (`DeviceReducer.reduce(..., reference=True)`), on that
run's own tensors (one extra sync, once). On a mismatch or an error the process uses the reference from then
on, for that batch too, and says so once (`notify`, which the recorder turns into a `device-digest` event
that the report shows): a digest that was not verified is never recorded.

Memory, per device: the staging buffer grows to the largest batch seen, at most BATCH_BYTES (a batch that would
exceed it is reduced and the next starts at its beginning: the stream orders the reuse); the torch reduction
adds scratch of 3 words per buffer word and, per cached layout (at most LAYOUT_CACHE), 2 weights per word of
the layout (the Triton kernels need neither); the single-tensor weights are at most 2 x CHUNK_WORDS words.
Until the step's one transfer, a pending record holds 48 bytes on the device (64 in a batch: its lanes and
sample words; a separately allocated payload takes the allocator's 512-byte block on CUDA), and at most
core._PENDING_LIMIT (65,536) records wait before an early transfer: at most 32 MiB.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import xxhash

from detaudit.recorder.fingerprint import (
    _SAMPLE_FORMATS,
    N_SAMPLES,
    Fingerprint,
    fingerprint_cpu,
    is_plain,
    logical_shape,
    meta_seed,
    parts,
    shape_seed,
)

LANE_BLOCK = 256  # words per block of a batch: each tensor starts on a block
CHUNK_WORDS = 1 << 24  # words one single-tensor reduction reads at once (64 MiB); more: in chunks
BATCH_BYTES = 64 << 20  # the step boundary's staging buffer, per device, at most
BATCH_TENSOR_BYTES = 8 << 20  # a larger tensor is reduced on its own (its launches are amortized anyway)
LAYOUT_CACHE = 8  # batch layouts (weights, index tensors) kept per device; the step boundary repeats 1-3
_MIX = (0x9E3779B1, 0x85EBCA77)
_MUL = 0x2C1B3C6D
_MASK64 = (1 << 64) - 1
_NAN = float("nan")
_NO_SAMPLES = (_NAN,) * N_SAMPLES
_HELD = 4096  # per-shape caches (sample indices, sliced weights) are emptied past this size


def position_weights(pos: torch.Tensor) -> torch.Tensor:
    """The two lanes' odd int32 weights of the int64 positions `pos`, shape (2, n)."""
    lanes = []
    for lane in (0, 1):
        mixed = (pos + (lane + 1)) * _MIX[lane]
        mixed = (mixed ^ (mixed >> 15)) * _MUL
        lanes.append(((mixed ^ (mixed >> 12)) | 1).to(torch.int32))
    return torch.stack(lanes)


def sample_positions(numel: int) -> tuple[int, ...]:
    """The sampled elements: first, at 1/3, at 2/3, last (as on the host path)."""
    last = numel - 1
    return (0, last // 3, (2 * last) // 3, last)


def _sample_words(dtype: torch.dtype, numel: int, first_word: int, last_word: int) -> tuple[list[int], tuple[int, ...]]:
    """Word indices (two per sample: the word holding the sample's first byte and the next, clamped to
    `last_word`) and each sample's byte offset in its first word. The real part of a complex value comes first."""
    item = dtype.itemsize
    words, shifts = [], []
    for p in sample_positions(numel):
        byte = p * item
        w = first_word + byte // 4
        words += [w, min(w + 1, last_word)]
        shifts.append(byte % 4)
    return words, tuple(shifts)


@dataclass(frozen=True)
class Slot:
    """How to read one reduced tensor from the transferred values (the int64 view of its payload): `lanes`
    int64 lanes (two per part), then N_SAMPLES words, each holding a sampled element at byte `shifts[i]` (no
    samples when `dtype` is None)."""

    seed: int
    lanes: int
    dtype: torch.dtype | None
    shifts: tuple[int, ...] = ()

    def read(self, values: Sequence[int], base: int) -> tuple[int, tuple[float, ...]]:
        """(digest, samples) from the transferred values; `base`: where this record's payload starts."""
        digest = xxhash.xxh3_64_intdigest(struct.pack(f"<{self.lanes}q", *values[base:base + self.lanes]), self.seed)
        if self.dtype is None:
            return digest, _NO_SAMPLES
        at = base + self.lanes
        return digest, decode_samples(self.dtype, values[at:at + N_SAMPLES], self.shifts)


@dataclass(frozen=True)
class BatchSlot:
    """How to read one tensor of a batch: its 2 x 2 cumulative sums (at its last block, at the block before its
    first) at 4 * index, whose differences are the lanes; its sample words after all tensors' sums."""

    seed: int
    index: int
    dtype: torch.dtype | None
    shifts: tuple[int, ...]
    payload: Payload

    def read(self, values: Sequence[int], base: int) -> tuple[int, tuple[float, ...]]:
        at = base + 4 * self.index
        lanes = ((values[at] - values[at + 1]) & _MASK64, (values[at + 2] - values[at + 3]) & _MASK64)
        digest = xxhash.xxh3_64_intdigest(struct.pack("<2Q", *lanes), self.seed)
        if self.dtype is None:
            return digest, _NO_SAMPLES
        at = base + 4 * self.payload.count + N_SAMPLES * self.index
        return digest, decode_samples(self.dtype, values[at:at + N_SAMPLES], self.shifts)


@dataclass(frozen=True)
class Constant:
    """A record whose lanes need no device work (an empty tensor: both lanes are 0)."""

    seed: int

    def read(self, values: Sequence[int], base: int) -> tuple[int, tuple[float, ...]]:
        return xxhash.xxh3_64_intdigest(struct.pack("<2q", 0, 0), self.seed), _NO_SAMPLES


def decode_samples(dtype: torch.dtype, words: Sequence[int], shifts: Sequence[int]) -> tuple[float, ...]:
    """The sampled elements as floats (the real part of a complex value, bfloat16 widened), from the 8 bytes
    starting at the word holding each."""
    fmt = _SAMPLE_FORMATS[dtype]
    out = []
    for word, shift in zip(words, shifts, strict=True):
        value = struct.unpack_from(fmt, (word & _MASK64).to_bytes(8, "little"), shift)[0]
        if dtype is torch.bfloat16:
            value = struct.unpack("<f", struct.pack("<I", value << 16))[0]
        out.append(float(value))
    return tuple(out)


@dataclass
class Payload:
    """Device values of reduced tensors (int32, read as int64 once on the host); a batch's are filled in
    when it closes, before the step's transfer."""

    tensor: torch.Tensor | None = None
    count: int = 0  # tensors in a batch


@dataclass(frozen=True)
class Reduced:
    """One reduced tensor: its payload (None: nothing on the device) and how to read it."""

    payload: Payload | None
    slot: Slot | BatchSlot | Constant


Check = Literal["batch", "triton-batch", "triton-one"]
_CHECKED: dict[str, str] = {
    "batch": "the batched device digest (DeviceBatch's torch reduction)",
    "triton-batch": "the Triton batch kernel (lanes_triton.block_sums)",
    "triton-one": "the Triton single-tensor kernel (lanes_triton.reduce_one)",
}


class Checks:
    """Which fast ways this process has checked against the reference: verified, or failed (with why)."""

    def __init__(self) -> None:
        self.verified: set[Check] = set()
        self.failed: dict[Check, str] = {}

    def trusted(self, way: Check) -> bool | None:
        """True: verified; False: failed; None: not checked yet."""
        return True if way in self.verified else False if way in self.failed else None


checks = Checks()  # this process's (a forked child starts with its parent's)


def _triton_lanes() -> Any:
    """The Triton kernels' module, or None where triton does not import (CPU builds of torch) or no CUDA device
    is present."""
    try:
        from detaudit.recorder import lanes_triton
    except ImportError:
        return None
    return lanes_triton if lanes_triton.available() else None


class DeviceReducer:
    """Reduces tensors on their device; keeps per-device weights and index tensors between calls.

    `use_triton`: None picks the Triton kernels for CUDA tensors where triton imports; False never uses them
    (the torch reduction, which defines the digest, on any device). `notify` hears, once per process and way,
    that a fast way disagreed with the reference (or failed) and the reference is used instead."""

    def __init__(self, use_triton: bool | None = None, notify: Callable[[str], None] | None = None) -> None:
        self.notify = notify
        self._weights: dict[torch.device, torch.Tensor] = {}  # (2, n) prefix weights, n ≤ CHUNK_WORDS
        self._sliced: dict[tuple[torch.device, int], torch.Tensor] = {}
        self._samples: dict[tuple[torch.device, torch.dtype, int, int], tuple[torch.Tensor, tuple[int, ...]]] = {}
        self._triton: Any = _triton_lanes() if use_triton is not False else None  # the lanes_triton module
        self.batches: dict[torch.device, DeviceBatch] = {}

    def uses_triton(self, device: torch.device) -> bool:
        return self._triton is not None and bool(self._triton.handles(device))

    def failed(self, way: Check, why: str) -> None:
        """`way` disagreed with the reference or raised: the process uses the reference from now on."""
        checks.failed[way] = why
        if self.notify is not None:
            self.notify(f"{_CHECKED[way]} disagreed with the reference torch digest on this run's own tensors "
                        f"({why}): every digest after it was computed by the reference instead (slower, the same "
                        "digests as a working device path)")

    # -- one tensor ---------------------------------------------------------------------------
    def weights(self, device: torch.device, start: int, n: int) -> torch.Tensor:
        """(2, n) weights of positions start..start+n-1: a cached prefix for the first chunk of a tensor."""
        if start:
            return position_weights(torch.arange(start, start + n, dtype=torch.int64, device=device))
        key = (device, n)
        sliced = self._sliced.get(key)
        if sliced is not None:
            return sliced
        w = self._weights.get(device)
        if w is None or w.shape[1] < n:
            size = min(max(n, 1024, 0 if w is None else 2 * w.shape[1]), max(n, CHUNK_WORDS))
            w = self._weights[device] = position_weights(torch.arange(size, dtype=torch.int64, device=device))
            self._sliced.clear()
        if len(self._sliced) >= _HELD:
            self._sliced.clear()
        sliced = self._sliced[key] = w[:, :n]
        return sliced

    def lanes(self, words: torch.Tensor) -> torch.Tensor:
        """The two int64 lanes of a contiguous int32 word vector, in chunks of CHUNK_WORDS."""
        n = words.numel()
        total: torch.Tensor | None = None
        for start in range(0, max(n, 1), CHUNK_WORDS):
            part = words if n <= CHUNK_WORDS else words[start:start + CHUNK_WORDS]
            x = torch.stack([part, part ^ (part >> 13)])
            sums = (x * self.weights(words.device, start, part.numel())).sum(dim=1, dtype=torch.int64)
            total = sums if total is None else total + sums
        assert total is not None
        return total

    def _sample_index(self, device: torch.device, dtype: torch.dtype, numel: int,
                      nwords: int) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The sample word indices on the device, made there (no host-to-device copy, which would sync)."""
        key = (device, dtype, numel, nwords)
        held = self._samples.get(key)
        if held is None:
            words, shifts = _sample_words(dtype, numel, 0, nwords - 1)
            index = torch.zeros(len(words), dtype=torch.int64, device=device)
            for i, w in enumerate(words):  # Python scalars written in place: no host tensor crosses
                if w:
                    index[i] = w
            if len(self._samples) >= _HELD:
                self._samples.clear()
            held = self._samples[key] = (index, shifts)
        return held

    def _words(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(words the lanes read, words the samples are read from) of one strided tensor."""
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        flat = t.reshape(-1)
        if flat.numel() and (flat.stride(0) != 1 or not flat.is_contiguous()
                             or flat.storage_offset() * flat.element_size() % 4):
            # viewing the bytes as int32 needs unit stride (a one-element view keeps its stride) and 4-byte
            # alignment (a slice may start mid-word)
            flat = flat.clone(memory_format=torch.contiguous_format)
        raw = flat.view(torch.uint8)
        if raw.numel() % 4 == 0:
            words = raw.view(torch.int32)
            return words, words
        padded = raw.new_zeros(raw.numel() + (-raw.numel()) % 4)
        padded[:raw.numel()] = raw
        return raw.to(torch.int32), padded.view(torch.int32)

    def _plain(self, t: torch.Tensor, sampled: bool) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
        """(int64 lanes, int32 sample words or None, shifts) of one strided tensor."""
        words, readable = self._words(t)
        if not words.numel():
            return torch.zeros(2, dtype=torch.int64, device=t.device), None, ()
        if not sampled:
            return self.lanes(words), None, ()
        index, shifts = self._sample_index(t.device, t.dtype, t.numel(), readable.numel())
        return self.lanes(words), readable.take(index), shifts

    def reduce(self, t: torch.Tensor, reference: bool = False) -> Reduced:
        """Reduce one tensor on its device (no sync); read it after the transfer with `Reduced.slot`.
        `reference`: by the torch reduction, whatever else this reducer could use."""
        t = t.detach()
        if is_plain(t):
            seed = meta_seed(t.dtype, t.shape)
            if t.numel() == 0:
                return Reduced(None, Constant(seed))
            sampled = t.dtype in _SAMPLE_FORMATS
            if not reference and self.uses_triton(t.device) and checks.trusted("triton-one") is not False:
                done = self._checked_one(t)
                if done is not None:
                    return Reduced(Payload(done[0]), Slot(seed, 2, t.dtype if sampled else None, done[1]))
            lanes, samples, shifts = self._plain(t, sampled)
            pieces = [lanes.view(torch.int32)] if samples is None else [lanes.view(torch.int32), samples]
            payload = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
            return Reduced(Payload(payload), Slot(seed, 2, t.dtype if samples is not None else None, shifts))
        p = parts(t)
        reduced = [self._plain(part, i == p.values and part.dtype in _SAMPLE_FORMATS)
                   for i, part in enumerate(p.tensors)]
        lanes = torch.cat([r[0] for r in reduced]).view(torch.int32)
        if p.values is not None:
            _, samples, shifts = reduced[p.values]
            if samples is not None:
                slot = Slot(p.seed, 2 * len(reduced), p.tensors[p.values].dtype, shifts)
                return Reduced(Payload(torch.cat([lanes, samples])), slot)
        return Reduced(Payload(lanes), Slot(p.seed, 2 * len(reduced), None))

    def _checked_one(self, t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]] | None:
        """The Triton kernel's payload of one tensor and its sample shifts; the first time in the process,
        compared with the torch reduction's (a sync). None when the kernel failed that check: use the reference."""
        try:
            words, readable = self._words(t)
            index, shifts = self._sample_index(t.device, t.dtype, t.numel(), readable.numel())
            payload: torch.Tensor = self._triton.reduce_one(words, readable, index, LANE_BLOCK, _MIX, _MUL)
            if checks.trusted("triton-one"):
                return payload, shifts
            lanes, samples, _ = self._plain(t, t.dtype in _SAMPLE_FORMATS)
            expected = lanes.view(torch.int32) if samples is None else torch.cat([lanes.view(torch.int32), samples])
            if not torch.equal(payload[:expected.numel()], expected):
                self.failed("triton-one", f"{t.dtype} {tuple(t.shape)}: other lanes or samples")
                return None
        except Exception as exc:  # a kernel that cannot compile or launch here
            self.failed("triton-one", f"{type(exc).__name__}: {exc}")
            return None
        checks.verified.add("triton-one")
        return payload, shifts

    def digest_now(self, t: torch.Tensor) -> tuple[int, tuple[float, ...]]:
        """(digest, samples) of one tensor at once: its reduction and one transfer (a host sync)."""
        reduced = self.reduce(t)
        tensor = None if reduced.payload is None else reduced.payload.tensor
        values = [] if tensor is None else tensor.cpu().view(torch.int64).tolist()
        return reduced.slot.read(values, 0)

    # -- many tensors at once (the step boundary) ------------------------------------------------
    def batch(self, device: torch.device) -> DeviceBatch:
        """The open batch of `device` (one is opened when none is)."""
        found = self.batches.get(device)
        if found is None:
            found = self.batches[device] = DeviceBatch(self, device)
        return found

    def close_batches(self) -> None:
        """Reduce every open batch (before the step's transfer)."""
        for b in self.batches.values():
            b.close()


def batchable(t: torch.Tensor) -> bool:
    """Whether `DeviceBatch.add` takes this tensor: one strided buffer of whole int32 words, not empty, not large."""
    if t.layout != torch.strided or t.is_nested or t.is_quantized or t.device.type == "meta":
        return False
    nbytes = t.nbytes
    return 0 < nbytes <= BATCH_TENSOR_BYTES and nbytes % 4 == 0


@dataclass
class _Layout:
    """What a closed batch's reduction needs, for one arrangement of tensors in the staging buffer: built
    once and kept while the same tensors (by dtype and shape) come in the same order, as they do each step."""

    words: int  # words of the buffer in use (whole blocks)
    lane_index: torch.Tensor  # into the (2, blocks) cumulative sums: per tensor and lane, last block and the one before
    sample_index: torch.Tensor  # into the buffer's words: two per sample
    weights: torch.Tensor | None = None  # torch reduction: (2, words), 0 outside every tensor
    block_pos: torch.Tensor | None = None  # Triton: per block, its first word's position in its tensor ...
    block_len: torch.Tensor | None = None  # ... and how many of its words belong to it
    views: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class _Plan:
    """Where one `add` call's tensors go in the staging buffer: typed views, grouped by dtype for one
    `_foreach_copy_` each, and each tensor's segment (first word, words, dtype, numel)."""

    groups: list[tuple[list[torch.Tensor], list[int]]]
    segments: list[tuple[int, int, torch.dtype, int]]
    end: int  # bytes of the buffer in use after the call
    number: int = field(default_factory=itertools.count().__next__)  # names the plan in a layout's key


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor copied to `device` without a sync (pinned, asynchronous) where the device is CUDA."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _device_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return _to_device(torch.tensor(values, dtype=torch.int64), device)


def _copy_all(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """One `_foreach_copy_` (one multi-tensor launch on CUDA); element by element where torch lacks it."""
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        foreach(destinations, sources)
        return
    for dst, src in zip(destinations, sources, strict=True):
        dst.copy_(src)


class DeviceBatch:
    """The tensors recorded at one optimizer step boundary on one device, copied into a staging buffer as they
    are recorded (so later in-place updates do not reach them) and reduced together when the batch closes."""

    def __init__(self, reducer: DeviceReducer, device: torch.device) -> None:
        self.reducer = reducer
        self.device = device
        self._buffer = torch.empty(0, dtype=torch.uint8, device=device)
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._layouts: dict[tuple[Any, ...], _Layout] = {}
        self._scratch: torch.Tensor | None = None  # torch reduction: (3, words) int32
        self._stream: Any = None  # CUDA: the stream that last used the buffer and scratch
        self._open()

    @property
    def way(self) -> Check:
        return "triton-batch" if self.reducer.uses_triton(self.device) else "batch"

    def _open(self) -> None:
        self._end = 4 * LANE_BLOCK  # block 0 stays out of every tensor: the cumulative sums start at 0 there
        self._segments: list[tuple[int, int, torch.dtype, int]] = []
        self._payload = Payload()
        self._keys: list[int] = []  # ids of the plans used, for the layout's key
        # until the batch reduction is verified in this process: each tensor's reference reduction, made when
        # it was added (a later in-place change must not reach it), and its slot in the batch
        self._references: list[tuple[Reduced, Reduced]] | None = None if checks.trusted(self.way) else []

    def add(self, tensors: Sequence[torch.Tensor]) -> list[Reduced]:
        """Copy `tensors` (all `batchable`, on this device) into the buffer; their slots, read once the batch
        closed and the step's values came to the host."""
        out: list[Reduced] = []
        at = 0
        while at < len(tensors):
            take = self._fit(tensors, at)
            if take == 0:  # the buffer is full: reduce what it holds, start again at its beginning
                self.close()
                take = max(1, self._fit(tensors, at))
            out += self._add(tensors[at:at + take])
            at += take
        return out

    def _fit(self, tensors: Sequence[torch.Tensor], at: int) -> int:
        """How many of tensors[at:] fit in the buffer's space left (growing it up to BATCH_BYTES)."""
        end, count = self._end, 0
        for t in tensors[at:]:
            size = -(-t.nbytes // (4 * LANE_BLOCK)) * 4 * LANE_BLOCK
            if end + size > BATCH_BYTES and (count or end > 4 * LANE_BLOCK):
                break
            end += size
            count += 1
        return count

    def _follow_stream(self) -> None:
        """On CUDA, work on the buffer is ordered by its stream; a script that switched streams since its last use
        gets its new stream to wait for the old one (an event, no host sync)."""
        if self.device.type != "cuda":
            return
        stream = torch.cuda.current_stream(self.device)
        if self._stream is not None and stream != self._stream:
            stream.wait_stream(self._stream)
        self._stream = stream

    def _add(self, tensors: Sequence[torch.Tensor]) -> list[Reduced]:
        self._follow_stream()
        key = (self._end, *[(t.dtype, t.shape) for t in tensors])
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(tensors)
            if len(self._plans) >= 4 * LAYOUT_CACHE:
                self._plans.clear()
            self._plans[key] = plan
        with torch.no_grad():
            for views, which in plan.groups:
                _copy_all(views, [tensors[i] for i in which])
        first = len(self._segments)
        self._segments += plan.segments
        self._keys.append(plan.number)
        self._end = plan.end
        payload = self._payload
        slots = []
        for i, (_, _, dtype, numel) in enumerate(plan.segments):
            k = first + i
            sampled = dtype if dtype in _SAMPLE_FORMATS else None
            shifts = _sample_words(dtype, numel, 0, 0)[1] if sampled is not None else ()
            slots.append(Reduced(payload, BatchSlot(meta_seed(dtype, tensors[i].shape), k, sampled, shifts, payload)))
        if self._references is not None:
            self._references += [(self.reducer.reduce(t, reference=True), slot) for t, slot in zip(tensors, slots,
                                                                                                  strict=True)]
        return slots

    def _plan(self, tensors: Sequence[torch.Tensor]) -> _Plan:
        end = self._end
        needed = end + sum(-(-t.nbytes // (4 * LANE_BLOCK)) * 4 * LANE_BLOCK for t in tensors)
        if needed > self._buffer.numel():
            self._grow(needed)
        groups: dict[torch.dtype, tuple[list[torch.Tensor], list[int]]] = {}
        segments = []
        for i, t in enumerate(tensors):
            view = self._buffer[end:end + t.nbytes].view(t.dtype).view(t.shape)
            group = groups.setdefault(t.dtype, ([], []))
            group[0].append(view)
            group[1].append(i)
            segments.append((end // 4, t.nbytes // 4, t.dtype, t.numel()))
            end += -(-t.nbytes // (4 * LANE_BLOCK)) * 4 * LANE_BLOCK
        return _Plan(list(groups.values()), segments, end)

    def _grow(self, needed: int) -> None:
        """A larger staging buffer (what is staged is copied over); plans and layouts of the old one are dropped."""
        size = min(max(needed, 2 * self._buffer.numel()), max(needed, BATCH_BYTES))
        grown = torch.empty(size, dtype=torch.uint8, device=self.device)
        if self._end > 4 * LANE_BLOCK:
            grown[:self._end].copy_(self._buffer[:self._end])
        self._buffer = grown
        self._plans.clear()
        self._layouts.clear()
        self._scratch = None

    def close(self) -> None:
        """Reduce what the batch holds into its payload, and open the next batch."""
        if not self._segments:
            return
        payload, segments = self._payload, self._segments
        self._follow_stream()
        payload.count = len(segments)
        if self._references is None:  # verified in this process
            payload.tensor = self._reduce(self._layout_now())
        else:
            payload.tensor = self._checked(self._references)
        self._open()

    def _layout_now(self) -> _Layout:
        layout = self._layouts.get((self._end, *self._keys))
        if layout is None:
            layout = self._layout(self._segments)
            if len(self._layouts) >= LAYOUT_CACHE:
                self._layouts.clear()
            self._layouts[(self._end, *self._keys)] = layout
        return layout

    def _checked(self, references: list[tuple[Reduced, Reduced]]) -> torch.Tensor:
        """The batch's payload the first time in the process (compared with each tensor's reference reduction:
        one sync), or when the batch reduction failed that check: the references in the batch's format."""
        way = self.way
        if checks.trusted(way):  # verified by another batch since this one opened
            return self._reduce(self._layout_now())
        if checks.trusted(way) is None:
            try:
                batched = self._reduce(self._layout_now())
                values = batched.cpu().view(torch.int64).tolist()
                for k, (reference, slot) in enumerate(references):
                    expected = _read(reference)
                    if slot.slot.read(values, 0) != expected:
                        raise _Mismatch(f"tensor {k} of {len(references)}: another digest or other samples")
            except Exception as exc:  # a mismatch, or a kernel that cannot compile or launch here
                self.reducer.failed(way, str(exc) if isinstance(exc, _Mismatch) else f"{type(exc).__name__}: {exc}")
            else:
                checks.verified.add(way)
                return batched
        return _as_batch([reference for reference, _ in references], self.device)

    def _layout(self, segments: list[tuple[int, int, torch.dtype, int]]) -> _Layout:
        words = self._end // 4
        blocks = words // LANE_BLOCK
        lane_index, sample_index = [], []
        pos = torch.full((words,), -1, dtype=torch.int64)
        block_pos = [0] * blocks
        block_len = [0] * blocks
        for first, n, dtype, numel in segments:
            b0, b1 = first // LANE_BLOCK, (first + n - 1) // LANE_BLOCK
            for lane in (0, 1):
                lane_index += [lane * blocks + b1, lane * blocks + b0 - 1]
            if dtype in _SAMPLE_FORMATS:
                sample_index += _sample_words(dtype, numel, first, words - 1)[0]
            else:
                sample_index += [0] * (2 * N_SAMPLES)
            pos[first:first + n] = torch.arange(n)
            for b in range(b0, b1 + 1):
                block_pos[b] = (b - b0) * LANE_BLOCK
                block_len[b] = min(LANE_BLOCK, n - (b - b0) * LANE_BLOCK)
        layout = _Layout(words, _device_tensor(lane_index, self.device), _device_tensor(sample_index, self.device))
        buffer_words = self._buffer[:self._end].view(torch.int32)
        layout.views["words"] = buffer_words
        if self.reducer.uses_triton(self.device):
            layout.block_pos = _device_tensor(block_pos, self.device)
            layout.block_len = _device_tensor(block_len, self.device)
            return layout
        pos = _to_device(pos, self.device)  # the weights are made on the device (a mask index there would sync)
        # words outside every tensor (stale bytes of earlier batches) get weight 0: they count for nothing
        layout.weights = torch.where(pos >= 0, position_weights(pos.clamp(min=0)), 0)
        if self._scratch is None or self._scratch.shape[1] < words:
            self._scratch = torch.empty(3, self._buffer.numel() // 4, dtype=torch.int32, device=self.device)
        layout.views["mixed"] = self._scratch[0, :words]
        layout.views["p0"], layout.views["p1"] = self._scratch[1, :words], self._scratch[2, :words]
        layout.views["blocks"] = self._scratch[1:, :words].view(2, blocks, LANE_BLOCK)
        layout.views["w0"], layout.views["w1"] = layout.weights[0], layout.weights[1]
        return layout

    def _reduce(self, layout: _Layout) -> torch.Tensor:
        """The batch's payload: per tensor its 2 x 2 cumulative sums, then its sample words (int32 pairs)."""
        v = layout.views
        words = v["words"]
        if layout.weights is None:
            sums = self.reducer._triton.block_sums(words, layout.block_pos, layout.block_len, LANE_BLOCK, _MIX, _MUL)
        else:
            torch.bitwise_right_shift(words, 13, out=v["mixed"])
            v["mixed"].bitwise_xor_(words)
            torch.mul(words, v["w0"], out=v["p0"])
            torch.mul(v["mixed"], v["w1"], out=v["p1"])
            sums = v["blocks"].sum(dim=2, dtype=torch.int64)
        lanes = sums.cumsum(dim=1).take(layout.lane_index)
        return torch.cat([lanes.view(torch.int32), words.take(layout.sample_index)])


class _Mismatch(Exception):
    """A fast way's digest differs from the reference's."""


def _read(reduced: Reduced) -> tuple[int, tuple[float, ...]]:
    tensor = None if reduced.payload is None else reduced.payload.tensor
    return reduced.slot.read([] if tensor is None else tensor.cpu().view(torch.int64).tolist(), 0)


def _as_batch(references: list[Reduced], device: torch.device) -> torch.Tensor:
    """Each tensor's reference payload (2 int64 lanes, then its sample words) laid out as a batch's: per tensor
    the cumulative sums at its last block and before its first (the lanes and 0: their differences are the
    lanes), then every tensor's sample words (zeros for a dtype without samples)."""
    lanes, samples = [], []
    for reduced in references:
        tensor = reduced.payload.tensor if reduced.payload is not None else None
        assert tensor is not None  # a batched tensor is never empty
        pair = tensor[:4].view(torch.int64)
        lanes.append(torch.stack([pair[0], torch.zeros_like(pair[0]), pair[1], torch.zeros_like(pair[1])]))
        samples.append(tensor[4:] if tensor.numel() > 4 else torch.zeros(2 * N_SAMPLES, dtype=torch.int32,
                                                                         device=device))
    return torch.cat([torch.cat(lanes).view(torch.int32), *samples])


def fingerprint(t: torch.Tensor) -> Fingerprint:
    """Fingerprint one tensor, on any device (the convenient, non-hot-path entry point)."""
    t = t.detach()
    if t.device.type == "cpu":
        digest, samples = fingerprint_cpu(t)
    elif t.device.type == "meta":
        digest, samples = shape_seed(t), _NO_SAMPLES
    else:
        digest, samples = DeviceReducer().digest_now(t)
    return Fingerprint(digest, str(t.dtype).removeprefix("torch."), logical_shape(t), samples)
