"""recorder/evidence/kernels.py: listed ops, empty allocations, determinism flags and their typos."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest
import torch
from evidence_sink import Sink

from detaudit.events import (
    EmptyEvent,
    EmptyWritesEvent,
    FlagEvent,
    FlagTypoEvent,
    LatentOpEvent,
    ModulesEvent,
    OpEvent,
)
from detaudit.recorder import patch
from detaudit.recorder.evidence import kernels
from detaudit.recorder.evidence.base import Evidence


def fields(cls: Any) -> set[str]:
    return set(get_type_hints(cls)) - {"at", "worker"}


@pytest.fixture
def flags_kept() -> Any:
    """The torch flags these tests set, as they were."""
    cudnn = torch.backends.cudnn
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    cudnn.benchmark = saved[2]


def test_a_listed_op_on_a_listed_device_is_recorded_once_per_site(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    ev.device_as = "cuda"  # as the test fault injector reports it: index_add is listed for CUDA tensors
    kernels.install(ev, torch)
    for _ in range(2):
        torch.zeros(3).index_add_(0, torch.tensor([0, 0]), torch.ones(2))
    [op] = sink.of("op")
    assert set(op) == fields(OpEvent)
    assert (op["op"], op["device"], op["phase"], op["deterministic"]) == ("index_add_", "cuda", "forward", False)
    assert "index_add" in op["entry"]
    assert "test_evidence_kernels.py:" in op["loc"]


def test_the_same_op_on_the_cpu_is_not_listed_but_latent(evidence: tuple[Evidence, Sink]) -> None:
    """index_add_ is listed for CUDA tensors only: deterministic here, recorded as latent (causes/latent.py)."""
    ev, sink = evidence
    kernels.install(ev, torch)
    torch.zeros(3).index_add_(0, torch.tensor([0, 0]), torch.ones(2))
    assert sink.of("op") == []
    [latent] = sink.of("latent-op")
    assert set(latent) == fields(LatentOpEvent)
    assert (latent["op"], latent["phase"], latent["deterministic"]) == ("index_add_", "forward", False)
    assert "CUDA" in latent["entry"]
    assert "test_evidence_kernels.py:" in latent["loc"]


def test_the_backward_walk_finds_listed_nodes(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    ev.device_as = "cuda"
    kernels.install(ev, torch)
    x = torch.ones(4, requires_grad=True)
    y = x.index_select(0, torch.tensor([0, 0])).sum()  # the call itself: an op whose backward is listed
    torch.autograd.backward(y)
    assert [(e["op"], e["phase"]) for e in sink.of("op")] == [("index_select", "backward"),
                                                             ("IndexSelectBackward0", "backward")]


def test_on_the_cpu_the_backward_walk_finds_latent_nodes(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    kernels.install(ev, torch)
    x = torch.ones(4, requires_grad=True)
    torch.autograd.backward(x.index_select(0, torch.tensor([0, 0])).sum())
    assert sink.of("op") == []
    assert [(e["op"], e["phase"]) for e in sink.of("latent-op")] == [("index_select", "backward"),
                                                                    ("IndexSelectBackward0", "backward")]


def test_a_dense_bmm_is_not_latent_and_a_sparse_one_is(evidence: tuple[Evidence, Sink]) -> None:
    """torch lists bmm for sparse-dense CUDA tensors: attention's dense bmm (nanoGPT's) is no latent finding."""
    ev, sink = evidence
    kernels.install(ev, torch)
    a = torch.ones(2, 3, 3, requires_grad=True)
    torch.autograd.backward(torch.bmm(a, torch.ones(2, 3, 3)).sum())
    torch.autograd.backward(torch.bmm(torch.ones(2, 3, 3).to_sparse(), a).sum())
    assert [e["op"] for e in sink.of("latent-op")] == ["BmmBackward0"]


def test_empty_allocations_from_user_code_carry_their_contents_digest(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    kernels.install(ev, torch)
    t = torch.empty(2, 3)
    torch.ones(1).new_empty(4)
    first, second = sink.of("empty")
    assert set(first) == fields(EmptyEvent)
    assert (first["fn"], first["shape"], first["dtype"], first["device"], first["pinned"]) == (
        "torch.empty", [2, 3], "float32", "cpu", False)
    assert first["digest"] is not None
    assert second["fn"] == "Tensor.new_empty"
    assert t.shape == (2, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.int64, torch.bool])
def test_each_repeat_fills_empty_memory_with_its_own_finite_values(dtype: torch.dtype) -> None:
    """Leftover bytes are often the same in fresh processes: a read of them must not agree by chance."""
    from evidence_sink import recording

    filled = []
    for repeat in (0, 1, 2):
        with recording() as (ev, sink):
            ev.config["repeat"] = repeat
            kernels.install(ev, torch)
            t = torch.empty(3, 5, dtype=dtype, requires_grad=dtype.is_floating_point)
            filled.append(t.detach().clone())
            assert t._version == 0  # the op recorder keys never-written memory by its version
            assert sink.internal == 0
            assert not sink.of("empty")[0]["pinned"]
    assert not torch.equal(filled[0], filled[1])
    assert not torch.equal(filled[1], filled[2]) or dtype == torch.bool  # a bool has two values
    if dtype.is_floating_point:
        assert all(bool(f.isfinite().all()) for f in filled)
    assert len(set(filled[0].flatten().tolist())) > 1 or dtype == torch.bool  # a pattern, not one value


def test_the_first_forward_says_which_empty_tensors_were_written_since(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    kernels.install(ev, torch)
    initialised = torch.nn.Parameter(torch.empty(3, 4))
    torch.nn.init.kaiming_uniform_(initialised)
    left = torch.empty(5)
    torch.empty(2).tolist()  # read, then freed
    event = kernels.empty_writes_event(ev)
    assert event == {"type": "empty-writes", "states": ["written", "unwritten", "freed"]}
    assert set(event) == fields(EmptyWritesEvent)
    torch.empty(1)  # after the first forward: recorded, no longer watched
    assert kernels.empty_writes_event(ev) is None
    assert len(sink.of("empty")) == 4
    assert left.numel() == 5


def test_memory_a_fill_cannot_reach_keeps_its_leftover_bytes(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    kernels.install(ev, torch)
    overlapping = torch.empty_strided((4, 4), (1, 1))  # rows alias each other: no copy can write it
    assert overlapping.shape == (4, 4)
    assert sink.of("empty")[0]["fn"] == "torch.empty_strided"


def test_a_large_tensor_gets_a_filled_prefix_and_a_strided_one_none(evidence: tuple[Evidence, Sink],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded: an arena from `empty` that the script touches lazily must not be paged in whole."""
    ev, _ = evidence
    monkeypatch.setattr(kernels, "FILL_MAX", 8)
    whole, prefix, strided = torch.full((6,), 1e30), torch.full((12,), 1e30), torch.full((4, 4), 1e30).t()
    assert kernels._fill(ev, whole) == kernels._tensor_digest(whole)
    assert bool(whole.abs().lt(1).all())
    assert kernels._fill(ev, prefix) is None
    assert bool(prefix[:8].abs().lt(1).all())
    assert bool(prefix[8:].eq(1e30).all())
    assert kernels._fill(ev, strided) is None
    assert bool(strided.eq(1e30).all())


def test_empty_tensors_without_plain_storage_pass_through(evidence: tuple[Evidence, Sink]) -> None:
    """A sparse layout, functorch's wrapped tensors: no fill, no watch, and never an error in the script."""
    ev, sink = evidence
    kernels.install(ev, torch)
    sparse = torch.empty((2, 2), layout=torch.sparse_coo)
    batched = torch.func.vmap(lambda x: torch.empty_like(x).copy_(x) * 2)(torch.ones(3, 2))
    grads = torch.func.grad(lambda x: (torch.empty_like(x).copy_(x) * x).sum())(torch.ones(2))
    assert sparse.is_sparse
    assert batched.eq(2).all()
    assert grads.eq(2).all()
    assert len(sink.of("empty")) == 3
    assert kernels.empty_writes_event(ev) == {"type": "empty-writes", "states": ["unknown"] * 3}


def test_the_zero_empty_pin_zeroes_what_empty_returns(evidence: tuple[Evidence, Sink]) -> None:
    _, sink = evidence
    ev = Evidence({"pins": ["zero-empty"]})
    ev.attach_recorder(sink)
    ev.torch = torch
    kernels.install(ev, torch)
    assert torch.empty(64).eq(0).all()
    assert sink.of("empty")[0]["pinned"]


def test_memory_torch_fills_itself_is_left_as_torch_filled_it(evidence: tuple[Evidence, Sink],
                                                             flags_kept: None) -> None:
    """The script's own `use_deterministic_algorithms(True)` fills `empty` memory with NaN (`detaudit fix`'s
    zero-empty knob): refilling it with random values would undo the script's fix; without the fill, leftover
    memory is still refilled."""
    ev, _ = evidence
    kernels.install(ev, torch)
    fill = torch.utils.deterministic.fill_uninitialized_memory
    try:
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        assert torch.empty(64).isnan().all()
        torch.utils.deterministic.fill_uninitialized_memory = False
        assert not torch.empty(64).isnan().any()
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill


def test_flag_setters_and_assignments_are_recorded_with_their_site(evidence: tuple[Evidence, Sink],
                                                                   flags_kept: None) -> None:
    ev, sink = evidence
    kernels.install(ev, torch)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = True
    setter, assignment = sink.of("flag")
    assert set(setter) == fields(FlagEvent)
    assert (setter["flag"], setter["value"]) == ("use_deterministic_algorithms", "True, warn_only=True")
    assert (assignment["flag"], assignment["value"]) == ("cudnn.benchmark", "True")
    assert setter["loc"] == setter["by"]
    assert "test_evidence_kernels.py:" in setter["loc"]


def test_a_misspelt_flag_is_recorded_with_the_name_it_meant(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    kernels.install(ev, torch)
    cudnn: Any = torch.backends.cudnn
    cudnn.determinstic = True
    try:
        [typo] = sink.of("flag-typo")
    finally:
        del cudnn.determinstic
    assert set(typo) == fields(FlagTypoEvent)
    assert (typo["module"], typo["name"], typo["value"], typo["meant"]) == (
        "torch.backends.cudnn", "determinstic", True, "deterministic")
    patch.restore_all()
    cudnn.determinstic = True  # restored: no longer watched
    del cudnn.determinstic
    assert len(sink.of("flag-typo")) == 1


def test_the_first_model_lists_its_matmul_layers(evidence: tuple[Evidence, Sink]) -> None:
    ev, _ = evidence
    kernels.install(ev, torch)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(2, 1))
    event = kernels.modules_event(ev, model)
    assert set(event) == fields(ModulesEvent) - {"at", "worker"}
    assert event["matmul"] == [{"module": "0", "class": "Conv2d"}, {"module": "2", "class": "Linear"}]
    assert (event["root"], event["device"], event["listed"]) == ("Sequential", "cpu", [])


@pytest.mark.parametrize(("mode", "latent"), [("mean", []), ("sum", []), ("max", ["EmbeddingBagBackward0"])])
def test_an_embedding_bag_is_latent_only_in_the_mode_torch_lists(evidence: tuple[Evidence, Sink], mode: str,
                                                                  latent: list[str]) -> None:
    """torch lists EmbeddingBag's backward for `mode='max'` only (issue 45: a mean bag was quoted the max entry)."""
    ev, sink = evidence
    kernels.install(ev, torch)
    bag = torch.nn.EmbeddingBag(10, 3, mode=mode)
    torch.autograd.backward(bag(torch.tensor([[1, 2], [3, 4]])).sum())
    assert [e["op"] for e in sink.of("latent-op")] == latent


@pytest.mark.parametrize(("layer", "entry"), [(torch.nn.Conv1d(2, 2, 3), "torch.nn.Conv1d "),
                                              (torch.nn.Conv2d(2, 2, 3), "torch.nn.Conv2d "),
                                              (torch.nn.ConvTranspose2d(2, 2, 3), "torch.nn.ConvTranspose2d ")])
def test_a_convolution_quotes_the_entry_of_its_own_dimensionality(evidence: tuple[Evidence, Sink],
                                                                  layer: torch.nn.Module, entry: str) -> None:
    ev, sink = evidence
    kernels.install(ev, torch)
    spatial = (5,) * (layer.weight.dim() - 2)
    torch.autograd.backward(layer(torch.ones(1, 2, *spatial)).sum())
    [latent] = sink.of("latent-op")
    assert latent["entry"].startswith(entry)


@pytest.mark.parametrize(("mode", "listed"), [("mean", []), ("max", ["EmbeddingBag"])])
def test_a_bag_in_the_first_model_is_listed_only_in_the_mode_torch_lists(evidence: tuple[Evidence, Sink], mode: str,
                                                                         listed: list[str]) -> None:
    ev, _ = evidence
    ev.device_as = "cuda"  # EmbeddingBag is listed for CUDA tensors
    kernels.install(ev, torch)
    event = kernels.modules_event(ev, torch.nn.Sequential(torch.nn.EmbeddingBag(10, 3, mode=mode)))
    assert [m["class"] for m in event["listed"]] == listed
