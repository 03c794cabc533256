"""Property tests for fingerprints: equal bits give equal digests, any one-bit change is seen, and
views fingerprint like their contiguous copies (on the host path, the step boundary's host plan, the device
reduction and its batch)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detaudit.recorder.boundary import HostGroup
from detaudit.recorder.devicehash import DeviceReducer, batchable, fingerprint
from detaudit.trace import Kind

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128]

settings.register_profile("detaudit", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("detaudit")


def device_digest(t: torch.Tensor) -> int:
    """The DeviceReducer path, run on the CPU (same code as on an accelerator)."""
    return DeviceReducer(use_triton=False).digest_now(t)[0]


def batch_digest(t: torch.Tensor) -> int:
    """The step boundary's batched path (DeviceBatch), `t` between two other tensors; tensors it does not take
    (empty, not whole int32 words, sparse, nested, quantized) go through DeviceReducer.reduce as in the Recorder."""
    if not batchable(t):
        return device_digest(t)
    return batch_prints([torch.ones(3), t, torch.arange(5, dtype=torch.int64)])[1][0]


def batch_prints(tensors: list[torch.Tensor],
                 reducer: DeviceReducer | None = None) -> list[tuple[int, tuple[float, ...]]]:
    """(digest, samples) of each tensor through one DeviceBatch, closed and transferred as the Recorder does."""
    reducer = reducer or DeviceReducer(use_triton=False)
    slots = reducer.batch(tensors[0].device).add(tensors)
    reducer.close_batches()
    out = []
    for r in slots:
        assert r.payload is not None
        assert r.payload.tensor is not None
        out.append(r.slot.read(r.payload.tensor.cpu().view(torch.int64).tolist(), 0))
    return out


def group_digest(t: torch.Tensor) -> int:
    """The step boundary's host path (recorder/boundary.py's HostGroup), `t` between two other tensors, from the
    plan made at a first step and kept for the second (what every later step of a run uses)."""
    if not t.is_cpu:
        return fingerprint(t).digest
    group = HostGroup([Kind.PARAM] * 3, [1, 2, 3], fresh=False)
    tensors = [torch.ones(3), t, torch.arange(5, dtype=torch.int64)]
    first = group.rows(tensors, lambda t: (0, 0), 0, 0)
    again = group.rows(tensors, lambda t: (0, 0), 1, 0)
    assert first is not None
    assert again is not None
    assert first["digest"][1] == again["digest"][1]
    assert again["samples"][1].tobytes() == first["samples"][1].tobytes()
    return int(again["digest"][1])


DIGESTS = {"host": lambda t: fingerprint(t).digest, "device": device_digest, "batch": batch_digest,
           "group": group_digest}


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
        assert not copy.is_conj()
        assert not copy.is_neg()
        assert copy.is_contiguous()
        assert copy.storage_offset() == 0
        assert digest(view) == digest(copy), label


def test_conj_and_neg_views_are_views() -> None:
    """Guard the test above: these really are the lazy views the fingerprint must resolve."""
    z = torch.randn(3, 4, dtype=torch.complex64)
    assert z.conj().is_conj()
    assert z.conj().imag.is_neg()
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
    assert fp.shape == (0, 3)
    assert fp.dtype == "float32"
    assert all(math.isnan(s) for s in fp.samples)


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
    assert len(fp._plans) <= 8
    assert len(fp._meta_cache) <= 8
    assert fp.fingerprint_cpu(torch.arange(3.0)) == first


# -- every layout torch has: equal tensors agree, a changed value, index or offset is seen, and equal
#    values in another layout never share a digest (fingerprint.parts) --------------------------------

def _blocks(moved: bool = False) -> torch.Tensor:
    """A 4x4 matrix whose nonzeros fill 2x2 blocks; `moved` puts the second block one block column
    left: the same values in the same order, at other indices in every sparse layout."""
    d = torch.zeros(4, 4)
    d[:2, :2] = torch.tensor([[1.5, -2.0], [3.25, 4.0]])
    d[2:, slice(0, 2) if moved else slice(2, 4)] = torch.tensor([[5.0, 6.5], [-7.0, 8.0]])
    return d


def _pieces(split: int, base: torch.Tensor | None = None) -> list[torch.Tensor]:
    rows = (torch.arange(12, dtype=torch.float32).reshape(6, 2) * 0.75 - 3) if base is None else base
    return [rows[:split], rows[split:]]


LAYOUTS: dict[str, Any] = {
    "strided": lambda d: d,
    "coo": lambda d: d.to_sparse(),
    "csr": lambda d: d.to_sparse_csr(),
    "csc": lambda d: d.to_sparse_csc(),
    "bsr": lambda d: d.to_sparse_bsr((2, 2)),
    "bsc": lambda d: d.to_sparse_bsc((2, 2)),
    "quantized": lambda d: torch.quantize_per_tensor(d, 0.25, 3, torch.qint8),
    "quantized per channel": lambda d: torch.quantize_per_channel(
        d, torch.tensor([0.25, 0.5, 0.125, 1.0], dtype=torch.float64), torch.tensor([0, 1, 2, 3]), 0, torch.qint8),
}
NESTED: dict[str, Any] = {
    "jagged": lambda pieces: torch.nested.nested_tensor(pieces, layout=torch.jagged),
    "strided nested": lambda pieces: torch.nested.nested_tensor(pieces, layout=torch.strided),
}


def _changed_value(d: torch.Tensor) -> torch.Tensor:
    d = d.clone()
    d[3, 3] = 9.0  # a nonzero, so every sparse layout holds it (and 9.0 is a whole quantum apart)
    return d


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's "sparse support is in beta"
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("path", DIGESTS)
def test_each_layout_equal_tensors_agree_and_values_and_indices_count(path: str, layout: str) -> None:
    digest, build = DIGESTS[path], LAYOUTS[layout]
    base = digest(build(_blocks()))
    assert digest(build(_blocks().clone())) == base
    assert digest(build(_changed_value(_blocks()))) != base
    assert digest(build(_blocks(moved=True))) != base  # same values, other indices


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("layout", NESTED)
@pytest.mark.parametrize("path", DIGESTS)
def test_each_nested_layout_equal_agree_and_values_and_offsets_count(path: str, layout: str) -> None:
    digest, build = DIGESTS[path], NESTED[layout]
    base = digest(build(_pieces(2)))
    assert digest(build([p.clone() for p in _pieces(2)])) == base
    changed = _pieces(2)
    changed[1] = changed[1].clone()
    changed[1][-1, -1] += 1
    assert digest(build(changed)) != base
    assert digest(build(_pieces(3))) != base  # the same values, split elsewhere: other offsets


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("path", DIGESTS)
def test_equal_values_in_other_layouts_never_collide(path: str) -> None:
    digest = DIGESTS[path]
    d = _blocks()
    built = {name: build(d) for name, build in LAYOUTS.items()}
    built["uncoalesced coo"] = torch.sparse_coo_tensor(d.to_sparse().indices(), d.to_sparse().values(), d.shape)
    built["hybrid csr"] = d.unsqueeze(-1).to_sparse_csr(dense_dim=1)
    for name, build in NESTED.items():
        built[name] = build(_pieces(2, d.reshape(8, 2)))
    built["jagged transposed"] = built["jagged"].transpose(1, 2)
    digests = {name: digest(t) for name, t in built.items()}
    assert len(set(digests.values())) == len(digests), digests


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("path", DIGESTS)
def test_every_part_of_every_layout_is_read(path: str) -> None:
    """Flip one bit in each part of a copy (parts are views into it): each flip changes the digest."""
    from detaudit.recorder.fingerprint import parts

    digest = DIGESTS[path]
    tensors = {name: build(_blocks()) for name, build in LAYOUTS.items() if name != "strided"
               and "quantized" not in name}  # quantized parts are copies: test_quantization_parameters_count
    tensors |= {name: build(_pieces(2)) for name, build in NESTED.items()}
    tensors["jagged with lengths"] = torch.nested.narrow(torch.arange(24.0).reshape(3, 4, 2), 1,
                                                         torch.tensor([0, 1, 0]), torch.tensor([2, 3, 4]),
                                                         layout=torch.jagged)
    for name, t in tensors.items():
        base = digest(t)
        for i in range(len(parts(t).tensors)):
            copy = t.clone()
            part = parts(copy).tensors[i]
            if part.numel() == 0:
                continue
            before = part.clone()
            raw = part.view(torch.uint8)
            raw[(0,) * raw.dim()] ^= 1
            assert not torch.equal(parts(copy).tensors[i].view(torch.uint8), before.view(torch.uint8)), (name, i)
            assert digest(copy) != base, (name, i)


@pytest.mark.parametrize("path", DIGESTS)
def test_quantization_parameters_count(path: str) -> None:
    digest = DIGESTS[path]
    d = _blocks()
    base = digest(torch.quantize_per_tensor(d, 0.25, 3, torch.qint8))
    assert digest(torch.quantize_per_tensor(d, 0.25, 3, torch.qint8)) == base
    assert digest(torch.quantize_per_tensor(d, 0.5, 3, torch.qint8)) != base  # other scale
    assert digest(torch.quantize_per_tensor(d, 0.25, 4, torch.qint8)) != base  # other zero point
    assert digest(torch.quantize_per_tensor(d, 0.25, 3, torch.quint8)) != base
    scales, zeros = torch.tensor([0.25, 0.5, 0.125, 1.0], dtype=torch.float64), torch.tensor([0, 1, 2, 3])
    channel = digest(torch.quantize_per_channel(d, scales, zeros, 0, torch.qint8))
    assert channel == digest(torch.quantize_per_channel(d, scales.clone(), zeros.clone(), 0, torch.qint8))
    assert channel != digest(torch.quantize_per_channel(d, scales * 2, zeros, 0, torch.qint8))
    assert channel != digest(torch.quantize_per_channel(d, scales, zeros, 1, torch.qint8))  # other axis


def test_meta_tensors_have_no_contents() -> None:
    """dtype and shape only: no parts, and the Recorder flags the record NO_DATA (not observed: contents)."""
    from detaudit.recorder.fingerprint import parts

    m = torch.empty(3, 4, device="meta")
    assert fingerprint(m).digest == fingerprint(torch.empty(3, 4, device="meta")).digest
    assert fingerprint(m).digest != fingerprint(torch.empty(4, 3, device="meta")).digest
    assert all(math.isnan(s) for s in fingerprint(m).samples)
    with pytest.raises(NotImplementedError):
        parts(m)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_samples_come_from_the_values() -> None:
    d = _blocks()
    assert fingerprint(d.to_sparse_csr()).samples == (1.5, 3.25, 5.0, 8.0)  # values 0, 2, 4 and 7 of 8
    jagged = NESTED["jagged"](_pieces(2))
    assert fingerprint(jagged).samples == fingerprint(jagged.values()).samples
    assert fingerprint(jagged).shape == (2, "j", 2)
    assert all(math.isnan(s) for s in fingerprint(LAYOUTS["quantized"](d)).samples)  # integers, not values


sparse_matrices = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5),
                                     st.floats(-1e6, 1e6, allow_nan=False, width=32).filter(bool)),
                           min_size=1, max_size=12, unique_by=lambda e: e[:2])


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
@pytest.mark.parametrize("path", DIGESTS)
@given(entries=sparse_matrices, data=st.data())
def test_random_sparse_equal_agree_and_any_one_bit_is_seen(path: str, layout: str, entries: list[Any],
                                                            data: st.DataObject) -> None:
    digest, build = DIGESTS[path], LAYOUTS[layout]
    d = torch.zeros(6, 6)
    for row, col, value in entries:
        d[row, col] = value
    base = digest(build(d))
    assert digest(build(d.clone())) == base
    row, col, _ = data.draw(st.sampled_from(entries))
    changed = d.clone()
    changed.view(torch.int32)[row, col] ^= 1 << data.draw(st.integers(0, 31))
    if changed[row, col] != 0:  # a flip to -0.0 leaves a stored zero: still a change, but not this test's
        assert digest(build(changed)) != base
