"""On a real GPU: device fingerprints equal a CPU re-computation of the same bytes, bit for bit.

`DeviceReducer` sums position-weighted int32 words in int64: integer arithmetic, so the CUDA
reduction (torch's, or the Triton kernels where triton imports) must give exactly the digest the same
reduction gives on the CPU copy, whatever order the device reduces in; so must the step boundary's batch
(`DeviceBatch`). A one-bit change anywhere must change the digest.
"""

from __future__ import annotations

import pytest
import torch

from detaudit.recorder.devicehash import DeviceReducer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run scripts/gpu-check.sh on a GPU)"),
]

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]


def _digest(reducer: DeviceReducer, t: torch.Tensor) -> tuple[int, tuple[float, ...]]:
    return reducer.digest_now(t)


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1234)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=gen, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (3,), (7, 5), (1025,), (64, 1000), (3, 5, 7, 9)], ids=str)
def test_cuda_digest_equals_cpu_recomputation(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    host = _sample(dtype, shape)
    reducer = DeviceReducer()
    assert _digest(reducer, host.cuda()) == _digest(reducer, host)
    assert _digest(DeviceReducer(use_triton=False), host.cuda()) == _digest(reducer, host)


def test_cuda_batch_equals_cpu_recomputation() -> None:
    from detaudit.recorder.devicehash import batchable

    tensors = [_sample(dtype, shape) for dtype in DTYPES for shape in ((3,), (7, 5), (1025,))]
    tensors = [t for t in tensors if batchable(t)]
    for use_triton in (None, False):
        reducer = DeviceReducer(use_triton=use_triton)
        slots = reducer.batch(torch.device("cuda")).add([t.cuda() for t in tensors])
        reducer.close_batches()
        got = [r.slot.read(r.payload.tensor.cpu().view(torch.int64).tolist(), 0) for r in slots]
        assert got == [_digest(reducer, t) for t in tensors]


def test_views_slices_and_transposes_match_their_cpu_copies() -> None:
    host = torch.randn(33, 17)
    dev = host.cuda()
    reducer = DeviceReducer()
    for view in (lambda t: t.t(), lambda t: t[1:, 3:], lambda t: t[::2], lambda t: t.view(-1)[5:7],
                 lambda t: t.view(-1)[1:2]):
        assert _digest(reducer, view(dev))[0] == _digest(reducer, view(host))[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8], ids=str)
def test_one_bit_anywhere_changes_the_digest(dtype: torch.dtype) -> None:
    host = _sample(dtype, (4096,))
    reducer = DeviceReducer()
    reference = _digest(reducer, host.cuda())[0]
    raw = host.view(torch.uint8).clone()
    for byte in (0, 1, raw.numel() // 2, raw.numel() - 1):
        for bit in (0, 7):
            flipped = raw.clone()
            flipped[byte] ^= 1 << bit
            assert _digest(reducer, flipped.view(dtype).cuda())[0] != reference, (byte, bit)


def test_swapping_two_elements_changes_the_digest() -> None:
    host = torch.arange(1000, dtype=torch.float32)
    swapped = host.clone()
    swapped[[10, 900]] = swapped[[900, 10]]
    reducer = DeviceReducer()
    assert _digest(reducer, host.cuda())[0] != _digest(reducer, swapped.cuda())[0]


def test_samples_are_the_values_at_fixed_positions() -> None:
    host = torch.randn(301)
    _, samples = _digest(DeviceReducer(), host.cuda())
    assert samples == tuple(float(host[i]) for i in (0, 100, 200, 300))


def test_large_tensor_digest_is_stable_across_calls() -> None:
    dev = torch.randn(64 << 20, device="cuda")  # 256 MB: many blocks, reduction order varies
    reducer = DeviceReducer()
    digests = {_digest(reducer, dev)[0] for _ in range(5)}
    assert len(digests) == 1
    assert digests == {_digest(reducer, dev.cpu())[0]}


def test_the_fast_ways_pass_their_first_run_check_on_this_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fail-safe's check (recorder/devicehash.py) on a real device: the batch reduction and, where triton
    imports, both Triton kernels are verified against the reference on their first run; none falls back."""
    from detaudit.recorder import devicehash

    fresh = devicehash.Checks()
    monkeypatch.setattr(devicehash, "checks", fresh)
    told: list[str] = []
    reducer = DeviceReducer(notify=told.append)
    tensors = [_sample(dtype, (7, 12)).cuda() for dtype in DTYPES]
    batched = [t for t in tensors if devicehash.batchable(t)]
    slots = reducer.batch(batched[0].device).add(batched)
    reducer.close_batches()
    for t in tensors:
        reducer.digest_now(t)
    assert told == []
    assert fresh.failed == {}
    expected = {"triton-batch", "triton-one"} if reducer.uses_triton(batched[0].device) else {"batch"}
    assert fresh.verified == expected
    assert all(s.payload is not None and s.payload.tensor is not None for s in slots)
