"""Property tests for fingerprints: equal bits give equal digests, any one-bit change is seen, and
views fingerprint like their contiguous copies (on the host path and the device reduction)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detaudit.recorder.fingerprint import DeviceReducer, fingerprint

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128]

settings.register_profile("detaudit", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("detaudit")


def device_digest(t: torch.Tensor) -> int:
    """The DeviceReducer path, run on the CPU (same code as on an accelerator)."""
    reducer = DeviceReducer()
    return reducer.finish(t.dtype, t.shape, reducer.reduce(t).tolist())[0]


DIGESTS = {"host": lambda t: fingerprint(t).digest, "device": device_digest}


@st.composite
def tensors(draw: st.DrawFn, dtypes: list[torch.dtype] = DTYPES, min_numel: int = 0) -> torch.Tensor:
    """A tensor of any listed dtype with arbitrary bits (NaN payloads, subnormals, -0.0 included)."""
    dtype = draw(st.sampled_from(dtypes))
    shape = tuple(draw(st.lists(st.integers(0 if min_numel == 0 else 1, 5), min_size=0, max_size=3)))
    numel = math.prod(shape)
    if numel < min_numel:
        shape, numel = (min_numel,), min_numel
    if dtype is torch.bool:
        return torch.tensor(draw(st.lists(st.booleans(), min_size=numel, max_size=numel)), dtype=torch.bool
                            ).reshape(shape)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = draw(st.binary(min_size=numel * itemsize, max_size=numel * itemsize))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone() if numel else \
        torch.empty(shape, dtype=dtype)


def flip_bit(t: torch.Tensor, element: int, bit: int) -> torch.Tensor:
    """A copy of `t` with one bit of one element flipped (for bool: the element's value)."""
    flat = t.contiguous().reshape(-1).clone()
    raw = flat.view(torch.uint8)
    if t.dtype is torch.bool:
        raw[element] ^= 1
    else:
        item = t.element_size()
        byte = element * item + (bit % (8 * item)) // 8
        raw[byte] ^= 1 << (bit % 8)
    return flat.reshape(t.shape)


@pytest.mark.parametrize("path", DIGESTS)
@given(t=tensors())
def test_equal_tensors_equal_digests(path: str, t: torch.Tensor) -> None:
    digest = DIGESTS[path]
    copy = t.clone()
    assert copy.data_ptr() != t.data_ptr() or t.numel() == 0
    assert digest(t) == digest(copy) == digest(t.detach().clone().contiguous())


@pytest.mark.parametrize("path", DIGESTS)
@given(t=tensors(min_numel=1), data=st.data())
def test_one_bit_change_changes_digest(path: str, t: torch.Tensor, data: st.DataObject) -> None:
    digest = DIGESTS[path]
    element = data.draw(st.integers(0, t.numel() - 1))
    bit = data.draw(st.integers(0, 8 * t.element_size() - 1))
    assert digest(flip_bit(t, element, bit)) != digest(t)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", DIGESTS)
def test_every_bit_of_every_dtype_counts(path: str, dtype: torch.dtype) -> None:
    """Exhaustive over bit positions of a few elements: no bit of any dtype is ignored."""
    digest = DIGESTS[path]
    t = (torch.arange(7) * 37 % 5).to(dtype)
    base = digest(t)
    bits = 1 if dtype is torch.bool else 8 * t.element_size()
    for element in (0, 3, 6):
        for bit in range(bits):
            assert digest(flip_bit(t, element, bit)) != base, (element, bit)


def _views(t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    views = [("transpose", t.t()), ("step slice", t[::2, 1::3]), ("flip-free column", t[:, 2]),
             ("expand", t[:1].expand(4, -1)), ("narrow offset", t.reshape(-1)[1:8]),
             ("permute3d", t.reshape(2, 3, -1).permute(2, 0, 1))]
    if t.is_complex():
        views += [("conj", t.conj()), ("conj transpose", t.conj().t()), ("neg view", t.conj().imag)]
    return views


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", DIGESTS)
def test_views_fingerprint_like_contiguous_copy(path: str, dtype: torch.dtype) -> None:
    digest = DIGESTS[path]
    base = (torch.arange(6 * 8, dtype=torch.float64).reshape(6, 8) * 1.37 - 20).to(dtype)
    if dtype.is_complex:
        base = base + 1j * torch.arange(48, dtype=torch.float64).reshape(6, 8).to(dtype)
    for label, view in _views(base):
        copy = view.clone(memory_format=torch.contiguous_format).resolve_conj().resolve_neg()
        assert not copy.is_conj() and not copy.is_neg()
        assert copy.is_contiguous() and copy.storage_offset() == 0
        assert digest(view) == digest(copy), label


def test_conj_and_neg_views_are_views() -> None:
    """Guard the test above: these really are the lazy views the fingerprint must resolve."""
    z = torch.randn(3, 4, dtype=torch.complex64)
    assert z.conj().is_conj() and z.conj().imag.is_neg()
    assert fingerprint(z.conj()).digest != fingerprint(z).digest  # conjugation changes the contents


@pytest.mark.parametrize("path", DIGESTS)
@given(t=tensors(min_numel=2), data=st.data())
def test_random_views_match_copies(path: str, t: torch.Tensor, data: st.DataObject) -> None:
    digest = DIGESTS[path]
    flat = t.reshape(-1)
    start = data.draw(st.integers(0, flat.numel() - 1))
    step = data.draw(st.integers(1, 3))
    view = flat[start::step]
    assert digest(view) == digest(view.clone())
    if t.dim() >= 2:
        assert digest(t.transpose(0, 1)) == digest(t.transpose(0, 1).contiguous())


@pytest.mark.parametrize("path", DIGESTS)
def test_zero_dim_and_empty(path: str) -> None:
    digest = DIGESTS[path]
    scalar = torch.tensor(1.5)
    assert digest(scalar) == digest(torch.tensor(1.5))
    assert digest(scalar) != digest(torch.tensor(-1.5))
    assert digest(scalar) != digest(torch.tensor([1.5]))  # 0-dim is not a one-element vector
    empties = [torch.empty(0), torch.empty(0, 3), torch.empty(3, 0), torch.empty(0, dtype=torch.int64)]
    assert len({digest(e) for e in empties}) == len(empties)
    assert digest(torch.empty(0, 3)) == digest(torch.zeros(0, 3))
    fp = fingerprint(torch.empty(0, 3))
    assert fp.shape == (0, 3) and fp.dtype == "float32" and all(math.isnan(s) for s in fp.samples)


@pytest.mark.parametrize("path", DIGESTS)
def test_dtype_and_shape_are_part_of_digest(path: str) -> None:
    digest = DIGESTS[path]
    t = torch.arange(24, dtype=torch.float32)
    same_bytes = [t, t.reshape(4, 6), t.reshape(6, 4), t.reshape(2, 3, 4), t.view(torch.int32),
                  t.view(torch.uint8), t.view(torch.float16), t.view(torch.bfloat16), t.view(torch.complex64)]
    assert len({digest(x) for x in same_bytes}) == len(same_bytes)


def test_samples_read_values_of_every_sampled_dtype() -> None:
    t = torch.tensor([1.0, -2.0, 3.0, 4.5, 8.0])
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        assert fingerprint(t.to(dtype)).samples == tuple(float(v) for v in t.to(dtype)[[0, 1, 2, 4]].tolist())


def test_device_reducer_deterministic_across_thread_counts() -> None:
    """The integer reduction gives the same digest however the sum is split across threads."""
    t = torch.randn(1 << 20).mul_(1e6)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = device_digest(t)
        torch.set_num_threads(2)
        two = device_digest(t)
    finally:
        torch.set_num_threads(before)
    assert one == two


@given(t=tensors(dtypes=[torch.float32, torch.float16, torch.int64, torch.int8, torch.bfloat16], min_numel=2),
       data=st.data())
def test_device_reducer_sees_swapped_elements(t: torch.Tensor, data: st.DataObject) -> None:
    flat = t.reshape(-1)
    i = data.draw(st.integers(0, flat.numel() - 1))
    j = data.draw(st.integers(0, flat.numel() - 1))
    raw = flat.view(torch.uint8).reshape(flat.numel(), -1)
    if i == j or torch.equal(raw[i], raw[j]):
        return
    swapped = flat.clone()
    swapped[[i, j]] = flat[[j, i]]
    assert device_digest(swapped) != device_digest(flat)


def test_device_reducer_sees_swaps_of_large_float_tensor() -> None:
    t = torch.randn(100_000)
    base = device_digest(t)
    gen = torch.Generator().manual_seed(0)
    for i, j in torch.randint(0, t.numel(), (200, 2), generator=gen).tolist():
        if t[i] != t[j]:
            swapped = t.clone()
            swapped[[i, j]] = t[[j, i]]
            assert device_digest(swapped) != base, (i, j)


def test_per_shape_caches_stay_bounded_and_digests_survive_a_refill(monkeypatch) -> None:
    import detaudit.recorder.fingerprint as fp

    monkeypatch.setattr(fp, "_SHAPE_CACHE_LIMIT", 8)
    first = fp.fingerprint_cpu(torch.arange(3.0))
    for n in range(1, 40):  # a dynamic-shape workload: a new shape each call
        fp.fingerprint_cpu(torch.ones(n))
    assert len(fp._plans) <= 8 and len(fp._meta_cache) <= 8
    assert fp.fingerprint_cpu(torch.arange(3.0)) == first
