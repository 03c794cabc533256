"""The device fingerprint path (recorder/devicehash.py), run on CPU tensors: the digest is the one traces
recorded before batching hold, the batch and the chunked reduction give the single pass's digests, and one
optimizer step's records take a constant number of aten ops whatever the tensor count.

The digest property tests (bit flips, permutations, dtypes, views, layouts) run every path, the batch
included, in tests/recorder/test_fingerprint.py. Triton-vs-torch equality runs only where triton and CUDA are
present (skipped, and said so, elsewhere)."""

from __future__ import annotations

import collections
import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fingerprint import DTYPES, batch_prints
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.recorder import devicehash
from detaudit.recorder.core import Recorder
from detaudit.recorder.devicehash import DeviceReducer, batchable, position_weights
from detaudit.recorder.hooks import Hooks
from detaudit.trace import Flag, TraceWriter, read_trace


def _golden_cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(5, 7, generator=g, dtype=torch.float64)
    cases = {
        "f32 5x7": base.float(), "f64 5x7": base, "f16 odd 7": base[0].half(), "bf16 5x7": base.bfloat16(),
        "i8 5": (base[0, :5] * 50).to(torch.int8), "u8 16": torch.arange(16, dtype=torch.uint8),
        "bool 3": torch.tensor([True, False, True]), "i64 4": torch.tensor([1, -2, 3 << 40, -(1 << 62)]),
        "c64 2x3": torch.complex(base[:2, :3].float(), base[2:4, :3].float()), "f32 scalar": torch.tensor(1.25),
        "f32 empty 0x3": torch.empty(0, 3), "f32 transpose": base.float().t(),
        "f32 long 3000": torch.linspace(-3, 3, 3000),
    }
    if hasattr(torch, "float8_e4m3fn"):
        cases["f8e4m3 6"] = torch.linspace(-2, 2, 6).to(torch.float8_e4m3fn)
    return cases


# Computed with the device path as it was before batching (DeviceReducer in fingerprint.py, commit 2e4610d):
# a trace recorded then must compare with one recorded now, so these values must never change.
GOLDEN = {
    "f32 5x7": 0x470b39c5010ee5e0, "f64 5x7": 0xe2f41341211d128f, "f16 odd 7": 0x368a33c341a2c79e,
    "bf16 5x7": 0xc0bf9c7a2199f477, "i8 5": 0xd9abf6ec8e8544b2, "u8 16": 0x8f1937fe7535adbd,
    "bool 3": 0x9ce50bddb2f9eaa7, "i64 4": 0xf5e72ed65c73e896, "c64 2x3": 0x9a0ec311f4caa7c6,
    "f32 scalar": 0x5d277f40c03081d6, "f32 empty 0x3": 0x133a466020bbd144, "f32 transpose": 0xffedd053e0d09954,
    "f32 long 3000": 0xb1f954b5a197e310, "f8e4m3 6": 0x4c1ecf884af7a4b9,
}
GOLDEN_SAMPLES = {
    "f16 odd 7": (0.0662841796875, 1.8369140625, 1.12109375, 0.60107421875),
    "bf16 5x7": (0.06640625, 0.515625, 0.57421875, 0.12890625), "i8 5": (3.0, 2.0, 91.0, 56.0),
    "bool 3": (1.0, 1.0, 0.0, 1.0), "i64 4": (1.0, -2.0, 3298534883328.0, -4.611686018427388e+18),
    "c64 2x3": (0.06626754254102707, 0.046991556882858276, 0.7378295660018921, -0.798347532749176),
    "f32 transpose": (0.06626754254102707, -0.798347532749176, 0.458016961812973, 0.12903855741024017),
}


@pytest.mark.parametrize("name", list(_golden_cases()))
def test_digests_and_samples_are_those_of_traces_recorded_before_batching(name: str) -> None:
    t = _golden_cases()[name]
    digest, samples = DeviceReducer(use_triton=False).digest_now(t)
    assert digest == GOLDEN[name]
    if name in GOLDEN_SAMPLES:
        assert samples == GOLDEN_SAMPLES[name]
    if batchable(t):
        assert batch_prints([torch.randn(9), t])[1] == (digest, samples)


def _reference_weight(position: int, lane: int) -> int:
    """position_weights in plain Python with explicit 64-bit wrapping (the spec of the digest's weights)."""
    def wrap(x: int) -> int:
        x &= (1 << 64) - 1
        return x - (1 << 64) if x >> 63 else x

    mixed = wrap((position + lane + 1) * devicehash._MIX[lane])
    mixed = wrap((mixed ^ (mixed >> 15)) * devicehash._MUL)
    w = (mixed ^ (mixed >> 12)) | 1
    w &= 0xFFFFFFFF
    return w - (1 << 32) if w >> 31 else w


def test_position_weights_hold_past_2_to_the_31() -> None:
    """Tensors of over 2^31 elements: their positions' weights are what the definition says."""
    positions = [0, 1, 1000, 2**31 - 1, 2**31, 2**31 + 5, 2**32 + 7, 2**40 + 3, 2**62]
    got = position_weights(torch.tensor(positions, dtype=torch.int64))
    for lane in (0, 1):
        assert got[lane].tolist() == [_reference_weight(p, lane) for p in positions]


def test_chunked_reduction_gives_the_single_pass_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam for huge tensors: reduced in chunks of CHUNK_WORDS words (weights computed for each chunk's
    positions), the digest is the one-pass digest; a tensor of over 2^31 elements takes this path."""
    tensors = [torch.randn(1000), torch.randn(33, 17).t(), torch.arange(777, dtype=torch.int16),
               torch.randint(0, 2, (301,), dtype=torch.bool), torch.randn(40, dtype=torch.complex128)]
    whole = [DeviceReducer(use_triton=False).digest_now(t) for t in tensors]
    monkeypatch.setattr(devicehash, "CHUNK_WORDS", 64)
    assert [DeviceReducer(use_triton=False).digest_now(t) for t in tensors] == whole
    swapped = tensors[0].clone()
    swapped[[10, 900]] = swapped[[900, 10]]  # two chunks apart
    assert DeviceReducer(use_triton=False).digest_now(swapped)[0] != whole[0][0]


def test_a_full_staging_buffer_is_reduced_and_refilled(monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = [torch.randn(300 + 37 * i) for i in range(12)] + [torch.arange(50, dtype=torch.int64)]
    alone = [DeviceReducer(use_triton=False).digest_now(t) for t in tensors]
    monkeypatch.setattr(devicehash, "BATCH_BYTES", 8 * 1024)  # a few tensors per batch
    reducer = DeviceReducer(use_triton=False)
    got = batch_prints(tensors, reducer)
    assert got == alone
    assert reducer.batch(torch.device("cpu"))._buffer.numel() <= 8 * 1024


def test_stale_bytes_of_an_earlier_batch_do_not_count() -> None:
    """A later batch lays tensors out elsewhere in the same buffer; the bytes between them are old."""
    reducer = DeviceReducer(use_triton=False)
    batch_prints([torch.randn(5000), torch.randn(3)], reducer)
    small = [torch.randn(3), torch.randn(700), torch.arange(9, dtype=torch.int32)]
    assert batch_prints(small, reducer) == [DeviceReducer(use_triton=False).digest_now(t) for t in small]


def test_a_batch_keeps_what_the_tensor_held_when_it_was_added() -> None:
    """Gradients are added before optimizer.step and reduced after it: a later in-place change is not seen."""
    reducer = DeviceReducer(use_triton=False)
    t = torch.randn(64)
    expected = DeviceReducer(use_triton=False).digest_now(t)
    slots = reducer.batch(t.device).add([t])
    t.add_(1.0)
    reducer.close_batches()
    payload = slots[0].payload
    assert payload is not None
    assert payload.tensor is not None
    assert slots[0].slot.read(payload.tensor.view(torch.int64).tolist(), 0) == expected


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_batches_with_others(dtype: torch.dtype) -> None:
    tensors = [(torch.arange(12) * 7 % 5).to(dtype).reshape(3, 4), torch.randn(5), (torch.arange(8) % 3).to(dtype)]
    tensors = [t for t in tensors if batchable(t)]
    assert batch_prints(tensors) == [DeviceReducer(use_triton=False).digest_now(t) for t in tensors]


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _adam_step_ops(tmp_path: Path, params: int, device_path: bool = True) -> tuple[int, int, collections.Counter[str]]:
    """(aten ops in the optimizer hooks, records, ops by name) for the third step of `params` 8x8 parameters
    trained with Adam, through the device path run on CPU tensors (`device_path`), or the host path."""
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(params)]
    optimizer = torch.optim.Adam(weights, lr=1e-3)
    rec = Recorder(TraceWriter(tmp_path / f"{params}-{device_path}.trace", {"repeat": 0}),
                   device_path_on_cpu=device_path)
    hooks = Hooks(rec)
    counted = _CountOps()
    before = 0
    for step in range(3):
        optimizer.zero_grad()
        sum((w * w).sum() for w in weights).backward()  # type: ignore[union-attr]
        before = rec.writer.position
        mode = counted if step == 2 else None
        with mode or contextlib.nullcontext():
            hooks._on_step_pre(optimizer, (optimizer,), {})
        optimizer.step()
        with mode or contextlib.nullcontext():
            hooks._on_step_post(optimizer, (optimizer,), {})
    records = rec.writer.position - before
    rec.close({"exit_code": 0})
    trace = read_trace(tmp_path / f"{params}-{device_path}.trace")
    assert (trace.records["flags"] & Flag.DEVICE).all() if device_path else not trace.records["flags"].any()
    return sum(counted.ops.values()), records, counted.ops


def test_one_adam_step_takes_a_constant_number_of_aten_ops(tmp_path: Path) -> None:
    """64 parameters with Adam: parameters, gradients, both moments and the step counts (320 tensors) in at most
    16 aten ops, views included (on a GPU one more, the transfer, which the CPU skips), and no more for twice
    the parameters."""
    ops, records, names = _adam_step_ops(tmp_path, 64)
    assert records == 64 * 5  # grad, param, step, exp_avg, exp_avg_sq
    assert ops <= 16, names
    assert _adam_step_ops(tmp_path, 128)[0] == ops


def test_the_host_step_boundary_dispatches_no_aten_op(tmp_path: Path) -> None:
    """On the host the step's 320 tensors are checked, hashed in place and written without one aten op: what is
    left per tensor is attribute reads and xxh3 (recorder/boundary.py)."""
    ops, records, names = _adam_step_ops(tmp_path, 64, device_path=False)
    assert records == 64 * 5
    assert ops == 0, names


def test_device_step_records_equal_the_per_tensor_path(tmp_path: Path) -> None:
    """The batched step boundary writes what recording each tensor alone (and transferring it at once, as
    inside an op window) writes: digests, samples, order."""
    traces = []
    for batched in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        rec = Recorder(TraceWriter(tmp_path / f"{batched}.trace", {"repeat": 0}), device_path_on_cpu=True)
        rec.eager_device = not batched
        hooks = Hooks(rec)
        for _ in range(3):
            model(torch.randn(5, 4)).square().mean().backward()
            hooks._on_step_pre(optimizer, (optimizer,), {})
            optimizer.step()
            hooks._on_step_post(optimizer, (optimizer,), {})
            optimizer.zero_grad()
        rec.close({"exit_code": 0})
        traces.append(read_trace(tmp_path / f"{batched}.trace"))
    batched_trace, alone = traces
    assert len(batched_trace.records) == len(alone.records) > 0
    for field in ("kind", "name", "step", "shape", "dtype", "digest", "flags"):
        assert (batched_trace.records[field] == alone.records[field]).all(), field
    assert batched_trace.records["samples"].tobytes() == alone.records["samples"].tobytes()


@pytest.mark.cuda
def test_triton_kernels_give_the_torch_reduction_s_digests() -> None:
    pytest.importorskip("triton", reason="triton is not installed (CPU build of torch): the Triton path is unused here")
    if not torch.cuda.is_available():
        pytest.skip("the Triton kernels run on CUDA tensors only; no CUDA device here")
    from detaudit.recorder import lanes_triton

    assert lanes_triton.available()
    assert DeviceReducer().uses_triton(torch.device("cuda"))
    tensors = [torch.randn(1), torch.randn(1000), torch.randn(33, 17).t(), torch.arange(7, dtype=torch.int16),
               torch.randint(0, 2, (301,), dtype=torch.bool), torch.randn(40, dtype=torch.complex128),
               torch.randn(3 << 20), torch.randn(300).bfloat16()]
    for t in tensors:
        host = DeviceReducer(use_triton=False).digest_now(t)
        assert DeviceReducer().digest_now(t.cuda()) == host
        assert DeviceReducer(use_triton=False).digest_now(t.cuda()) == host
    on_device = [t.cuda() for t in tensors if batchable(t)]
    assert batch_prints(on_device, DeviceReducer()) == batch_prints([t.cpu() for t in on_device])


# -- the fail-safe: a fast way is checked against the reference the first time it runs in a process --------
@pytest.fixture
def fresh_checks(monkeypatch: pytest.MonkeyPatch) -> devicehash.Checks:
    """A process in which no fast way has run yet."""
    fresh = devicehash.Checks()
    monkeypatch.setattr(devicehash, "checks", fresh)
    return fresh


def _reference(tensors: list[torch.Tensor]) -> list[tuple[int, tuple[float, ...]]]:
    return [DeviceReducer(use_triton=False).digest_now(t) for t in tensors]


def _tensors() -> list[torch.Tensor]:
    torch.manual_seed(3)
    return [torch.randn(300), torch.arange(50, dtype=torch.int64), torch.randn(8, 9).half()]


def _corrupt(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    real = devicehash.DeviceBatch._reduce

    def reduce(self: devicehash.DeviceBatch, layout: Any) -> torch.Tensor:
        if how == "raise":
            raise RuntimeError("no kernel image is available for execution on the device")
        payload = real(self, layout).clone()
        payload[0] ^= 1  # one bit of the first tensor's lanes
        return payload

    monkeypatch.setattr(devicehash.DeviceBatch, "_reduce", reduce)


def test_a_working_batch_reduction_is_verified_once_and_then_trusted(fresh_checks: devicehash.Checks) -> None:
    reducer = DeviceReducer(use_triton=False)
    assert batch_prints(_tensors(), reducer) == _reference(_tensors())
    assert (fresh_checks.verified, fresh_checks.failed) == ({"batch"}, {})
    assert reducer.batch(torch.device("cpu"))._references is None  # later batches carry no references


@pytest.mark.parametrize("how", ["mismatch", "raise"])
def test_a_failing_batch_reduction_falls_back_to_the_reference_and_says_so_once(
        fresh_checks: devicehash.Checks, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    _corrupt(monkeypatch, how)
    told: list[str] = []
    reducer = DeviceReducer(use_triton=False, notify=told.append)
    assert batch_prints(_tensors(), reducer) == _reference(_tensors())
    assert batch_prints(_tensors()[::-1], reducer) == _reference(_tensors()[::-1])  # and every batch after it
    assert list(fresh_checks.failed) == ["batch"]
    assert len(told) == 1
    assert "batched device digest" in told[0]


class _FakeTriton:
    """Stands in for lanes_triton on CPU tensors, through the same seam: right (the torch reduction's lanes,
    computed another way) or wrong (one bit off) or failing (raises, as a kernel that cannot compile)."""

    def __init__(self, how: str) -> None:
        self.how = how

    def handles(self, device: torch.device) -> bool:
        return True

    def _fault(self, out: torch.Tensor, at: int) -> torch.Tensor:
        if self.how == "raise":
            raise RuntimeError("triton: failed to compile")
        if self.how == "mismatch":
            out.view(-1)[at] ^= 1
        return out

    def reduce_one(self, words: torch.Tensor, readable: torch.Tensor, sample_index: torch.Tensor, block: int,
                   mix: tuple[int, int], mul: int) -> torch.Tensor:
        lanes = DeviceReducer(use_triton=False).lanes(words)
        payload = torch.cat([lanes.view(torch.int32), readable.take(sample_index)])
        return self._fault(payload, 0)  # lane 0

    def block_sums(self, words: torch.Tensor, block_pos: torch.Tensor, block_len: torch.Tensor, block: int,
                   mix: tuple[int, int], mul: int) -> torch.Tensor:
        blocks = block_pos.numel()
        w = words[:blocks * block].view(blocks, block)
        offs = torch.arange(block)
        weights = position_weights((block_pos[:, None] + offs).reshape(-1)).view(2, blocks, block)
        inside = offs < block_len[:, None]
        sums = [torch.where(inside, x * weights[lane], 0).sum(dim=1, dtype=torch.int64)
                for lane, x in enumerate((w, w ^ (w >> 13)))]
        return self._fault(torch.stack(sums), -1)  # lane 1 of the last block (block 0 is in no tensor)


def _with_triton(how: str, told: list[str]) -> DeviceReducer:
    reducer = DeviceReducer(use_triton=False, notify=told.append)
    reducer._triton = _FakeTriton(how)
    return reducer


@pytest.mark.parametrize("how", ["right", "mismatch", "raise"])
def test_the_triton_single_tensor_kernel_is_checked_the_first_time(fresh_checks: devicehash.Checks, how: str) -> None:
    told: list[str] = []
    reducer = _with_triton(how, told)
    assert [reducer.digest_now(t) for t in _tensors()] == _reference(_tensors())
    assert (list(fresh_checks.verified), list(fresh_checks.failed)) == (
        (["triton-one"], []) if how == "right" else ([], ["triton-one"]))
    assert len(told) == (0 if how == "right" else 1)


@pytest.mark.parametrize("how", ["right", "mismatch", "raise"])
def test_the_triton_batch_kernel_is_checked_the_first_time(fresh_checks: devicehash.Checks, how: str) -> None:
    told: list[str] = []
    reducer = _with_triton(how, told)
    assert batch_prints(_tensors(), reducer) == _reference(_tensors())
    assert batch_prints(_tensors()[1:], reducer) == _reference(_tensors()[1:])
    assert (list(fresh_checks.verified), list(fresh_checks.failed)) == (
        (["triton-batch"], []) if how == "right" else ([], ["triton-batch"]))
    assert [line.split(" disagreed")[0] for line in told] == (
        [] if how == "right" else ["the Triton batch kernel (lanes_triton.block_sums)"])


def _recorded_steps(path: Path) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    rec = Recorder(TraceWriter(path, {"repeat": 0}), device_path_on_cpu=True)
    hooks = Hooks(rec)
    for _ in range(3):
        model(torch.randn(5, 4)).square().mean().backward()
        hooks._on_step_pre(optimizer, (optimizer,), {})
        optimizer.step()
        hooks._on_step_post(optimizer, (optimizer,), {})
        optimizer.zero_grad()
    rec.close({"exit_code": 0})
    return read_trace(path)


def test_a_recorder_whose_batch_reduction_fails_records_the_reference_digests_and_one_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devicehash, "checks", devicehash.Checks())
    healthy = _recorded_steps(tmp_path / "healthy.trace")
    monkeypatch.setattr(devicehash, "checks", devicehash.Checks())
    _corrupt(monkeypatch, "mismatch")
    faulty = _recorded_steps(tmp_path / "faulty.trace")
    assert (faulty.records["digest"] == healthy.records["digest"]).all()
    assert faulty.records["samples"].tobytes() == healthy.records["samples"].tobytes()
    assert [e["type"] for e in faulty.events if e["type"] == "device-digest"] == ["device-digest"]
    assert [e for e in healthy.events if e["type"] == "device-digest"] == []
