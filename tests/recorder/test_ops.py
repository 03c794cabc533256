"""The op recorder (detaudit/recorder/ops.py), run in-process on small computations."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from recording import here, record

from detaudit.recorder import patch
from detaudit.recorder.core import Recorder
from detaudit.recorder.ops import install
from detaudit.trace import Flag, Kind, Trace, TraceWriter, read_trace


def rows(trace: Trace, name: str | None = None) -> list[dict[str, Any]]:
    out = []
    for r in trace.records:
        row = {"name": trace.strings[r["name"]], "module": trace.strings[r["module"]], "loc": trace.strings[r["loc"]],
               "node": trace.strings[r["aux"]], "flags": int(r["flags"]), "kind": int(r["kind"]),
               "step": int(r["step"]), "digest": int(r["digest"]),
               "ins": (int(r["in_ordered"]), int(r["in_unordered"]))}
        if name is None or row["name"] == name:
            out.append(row)
    return out


def test_forward_and_backward_ops_carry_module_line_and_autograd_node(tmp_path: Path) -> None:
    lines = {}

    def body(rec: Recorder) -> None:
        w = torch.randn(3, 2, requires_grad=True)
        rec.local.module_stack.append(rec.intern("net.0"))
        y = (torch.ones(4, 3) @ w).relu(); lines["forward"] = here()  # noqa: E702
        rec.local.module_stack.pop()
        y.sum().backward()

    trace = record(tmp_path / "t.trace", body)
    mm = rows(trace, "aten.mm.default")
    forward = [r for r in mm if not r["flags"] & Flag.BACKWARD]
    backward = [r for r in mm if r["flags"] & Flag.BACKWARD]
    assert len(forward) == 1
    assert backward
    assert (forward[0]["module"], forward[0]["loc"]) == ("net.0", lines["forward"])
    # a forward op's aux names the records that made its inputs, as distances back: randn's, two records back
    # (ones is the other); a backward op's names its autograd node
    every = rows(trace)
    at = every.index(forward[0])
    assert [every[at - int(d)]["name"] for d in forward[0]["node"].split(",")] == \
        ["aten.ones.default", "aten.randn.default"]
    # a backward op: the autograd node that ran it, and the forward line and module that created that node
    assert {(r["node"], r["loc"], r["module"]) for r in backward} == {("MmBackward0", lines["forward"], "net.0")}
    threshold = rows(trace, "aten.threshold_backward.default")
    assert threshold
    assert threshold[0]["node"] == "ReluBackward0"
    assert threshold[0]["loc"] == lines["forward"]
    assert all(r["kind"] == Kind.OP for r in rows(trace))


def test_views_are_not_recorded_and_their_digest_follows_their_base(tmp_path: Path) -> None:
    x = torch.randn(8, 32)
    weights = [torch.randn(64, 32), torch.randn(64, 32)]
    traces = [record(tmp_path / f"{i}.trace", lambda rec, w=w: x @ w.t())
              for i, w in enumerate([weights[0], weights[0].clone(), weights[1]])]
    names = [r["name"] for r in rows(traces[0])]
    assert names == ["aten.mm.default"]
    ins = [rows(t, "aten.mm.default")[0]["ins"] for t in traces]
    assert ins[0] == ins[1] != ins[2]


def test_the_same_inputs_in_another_order_keep_the_unordered_digest(tmp_path: Path) -> None:
    a, b = torch.randn(5), torch.randn(5)
    first = rows(record(tmp_path / "1.trace", lambda rec: torch.cat([a, b])), "aten.cat.default")[0]
    second = rows(record(tmp_path / "2.trace", lambda rec: torch.cat([b, a])), "aten.cat.default")[0]
    assert first["ins"][0] != second["ins"][0]
    assert first["ins"][1] == second["ins"][1]
    assert first["digest"] != second["digest"]


def test_plain_arguments_are_part_of_the_inputs(tmp_path: Path) -> None:
    x = torch.randn(6)
    one = rows(record(tmp_path / "1.trace", lambda rec: x * 2.0), "aten.mul.Tensor")[0]
    two = rows(record(tmp_path / "2.trace", lambda rec: x * 3.0), "aten.mul.Tensor")[0]
    assert one["ins"] != two["ins"]


def test_random_ops_are_flagged_and_their_overwritten_self_is_not_an_input(tmp_path: Path) -> None:
    def body(start: float) -> Callable[[Recorder], Any]:
        def run(rec: Recorder) -> None:
            torch.manual_seed(0)
            torch.full((16,), start).uniform_()
            nn.functional.dropout(torch.ones(16), 0.5, training=True)
        return run

    one, two = (rows(record(tmp_path / f"{s}.trace", body(s))) for s in (1.0, 2.0))
    uniform = [r for r in one if r["name"] == "aten.uniform_.default"]
    assert uniform
    assert uniform[0]["flags"] & Flag.RANDOM
    assert [r["ins"] for r in one if r["name"] == "aten.uniform_.default"] == \
           [r["ins"] for r in two if r["name"] == "aten.uniform_.default"]
    assert any(r["flags"] & Flag.RANDOM for r in one if "bernoulli" in r["name"] or "dropout" in r["name"])
    assert not any(r["flags"] & Flag.RANDOM for r in one if r["name"] in ("aten.full.default", "aten.mul.Tensor"))
    assert not any("empty" in r["name"] for r in one)


def test_reading_never_written_memory_is_flagged(tmp_path: Path) -> None:
    def body(rec: Recorder) -> None:
        torch.empty(5).sum()
        p = nn.Parameter(torch.empty(5))
        p.detach() * 2
        nn.init.ones_(p)
        p.detach() * 3

    trace = rows(record(tmp_path / "t.trace", body))
    flagged = {r["name"] for r in trace if r["flags"] & Flag.UNINIT}
    assert "aten.sum.default" in flagged
    muls = [r for r in trace if r["name"] == "aten.mul.Tensor"]
    assert [bool(r["flags"] & Flag.UNINIT) for r in muls] == [True, False]


def test_detaudit_own_tensor_work_is_not_recorded_as_ops(tmp_path: Path) -> None:
    def body(rec: Recorder) -> None:
        rec.record_object(Kind.CHECKPOINT, "x", torch.randn(4, 6).t())

    trace = rows(record(tmp_path / "t.trace", body))
    assert [r["name"] for r in trace] == ["aten.randn.default", "x"]


def test_in_place_ops_that_return_nothing_record_what_they_wrote(tmp_path: Path) -> None:
    a, b = torch.zeros(3), torch.zeros(4)
    trace = rows(record(tmp_path / "t.trace", lambda rec: torch._foreach_add_([a, b], 1.0)))
    assert [r["name"] for r in trace] == ["aten._foreach_add_.Scalar", "aten._foreach_add_.Scalar[1]"]


def test_an_op_window_records_only_its_steps_and_then_ends_the_repeat(tmp_path: Path) -> None:
    ended = []

    def body(rec: Recorder) -> None:
        x = torch.ones(3)
        for _ in range(3):
            x = x + 1
            rec.end_step()
            if ended:
                break

    trace = rows(record(tmp_path / "t.trace", body, {"granularity": "op", "op_window": [1, 1]},
                        on_end=lambda: ended.append(True)))
    assert [(r["name"], r["step"]) for r in trace] == [("aten.add.Tensor", 1)]
    assert ended == [True]


def test_optimizer_steps_record_their_updates_but_no_profiler_ops(tmp_path: Path) -> None:
    def body(rec: Recorder) -> None:
        w = nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([w], lr=0.1)
        w.sum().backward()
        opt.step()

    trace = rows(record(tmp_path / "t.trace", body))
    assert not any(r["name"].startswith("profiler") for r in trace)
    assert "aten.add_.Tensor" in {r["name"] for r in trace}


def test_step_granularity_turns_module_records_off(tmp_path: Path) -> None:
    rec = Recorder(TraceWriter(tmp_path / "t.trace", {"repeat": 0}))
    assert install(rec, {"granularity": "step"}, lambda: None) is None
    assert rec.record_modules is False
    assert install(rec, {"granularity": "module"}, lambda: None) is None
    rec.close({"exit_code": 0})


def test_memory_reused_by_a_tensor_made_without_an_op_is_not_blank(tmp_path: Path) -> None:
    """Memory torch.empty returned, now held by another storage made without an op (version 0 again,
    same address: what a freed block handed to torch.from_numpy looks like), holds real data."""
    same_address: list[bool] = []

    def body(rec: Recorder) -> None:
        e = torch.empty(1000)
        x = torch.from_numpy(e.numpy())  # another storage object over the same bytes
        x.numpy()[:] = 2.0  # written outside torch: no version bump
        same_address.append(x.data_ptr() == e.data_ptr() and x.untyped_storage() is not e.untyped_storage())
        x * 3

    trace = rows(record(tmp_path / "t.trace", body))
    assert same_address == [True]
    assert [r for r in trace if r["flags"] & Flag.UNINIT] == []


def test_device_path_at_op_granularity_resolves_without_recording_its_own_transfer(tmp_path: Path) -> None:
    """On the device path, op records know their inputs' digests (needed to prove an op is the source),
    and detaudit's own transfer ops are never recorded (both found on an H100)."""
    path = tmp_path / "t.trace"
    rec = Recorder(TraceWriter(path, {"repeat": 0}), device_path_on_cpu=True)
    since = len(patch.patched())
    ops = install(rec, {"granularity": "op"}, lambda: None)
    try:
        x = torch.randn(8, 4)
        for _ in range(3):
            x = (x @ torch.ones(4, 4)).relu()
            rec.end_step()
    finally:
        assert ops is not None
        ops.stop()
        patch.restore_all(since)
    rec.close({"exit_code": 0})
    trace = read_trace(path)
    names = [trace.strings[r["name"]] for r in trace.records]
    assert names, names
    assert not any("stack" in n or "_to_copy" in n for n in names), names
    assert (trace.records["flags"] & Flag.DEVICE).all()
    # inside the op window accelerator digests are taken at once, so every op's inputs are known
    assert (trace.records["in_ordered"] != 0).all()


def test_an_in_place_op_records_the_contents_it_wrote(tmp_path: Path) -> None:
    """The version counter moves only after the dispatch mode returns: an in-place op's output must
    not be given the digest cached for its argument before the write."""
    def body(rec: Recorder) -> None:
        pooled = torch.zeros(4, 3)
        pooled.index_add_(0, torch.tensor([0, 1, 1, 3]), torch.ones(4, 3))
        pooled.add_(1)

    trace = record(tmp_path / "t.trace", body)
    digests = {row["name"]: row["digest"] for row in rows(trace)}
    assert len({digests["aten.zeros.default"], digests["aten.index_add_.default"], digests["aten.add_.Tensor"]}) == 3
    from detaudit.recorder.fingerprint import fingerprint_cpu

    expected = torch.zeros(4, 3).index_add_(0, torch.tensor([0, 1, 1, 3]), torch.ones(4, 3)).add_(1)
    assert digests["aten.add_.Tensor"] == fingerprint_cpu(expected)[0]


def test_ops_on_sparse_and_nested_tensors_are_recorded_and_never_raise_into_the_script(tmp_path: Path) -> None:
    """Making a jagged tensor is a view with ragged sizes (its geometry has no integers: it raised into
    the script); a strided nested tensor has no plain shape; a sparse one no strides."""
    results: dict[str, torch.Tensor] = {}

    def body(rec: Recorder) -> None:
        values = torch.arange(12.0).reshape(6, 2)
        jagged = torch.nested.nested_tensor_from_jagged(values, torch.tensor([0, 2, 6]))
        results["jagged"] = (jagged * 2).values()
        results["nested"] = torch.nested.nested_tensor([values[:2], values[2:]]).relu().unbind()[1]
        csr = torch.tensor([[0.0, 1.5], [2.0, 0.0]]).to_sparse_csr()
        results["csr"] = (csr * 3).values()
        results["coo"] = torch.sparse.mm(torch.eye(2).to_sparse(), torch.ones(2, 2))

    trace = record(tmp_path / "t.trace", body)
    assert torch.equal(results["jagged"], torch.arange(12.0).reshape(6, 2) * 2)
    assert torch.equal(results["nested"], torch.arange(4.0, 12.0).reshape(4, 2))
    assert torch.equal(results["csr"], torch.tensor([4.5, 6.0]))
    assert torch.equal(results["coo"], torch.ones(2, 2))
    recorded = {(r["name"], bool(r["flags"] & Flag.NO_DATA)) for r in rows(trace)}
    # the products and the relu, with their contents (torch's own meta bookkeeping tensors have none)
    assert {("aten.mul.Tensor", False), ("aten.relu.default", False)} <= recorded, recorded
    assert ("aten.mul.Tensor", True) not in recorded


def _garbage(t: torch.Tensor, seed: int) -> torch.Tensor:
    """Leftover bytes that differ per recording, written without an op (the recorder still sees the memory
    as never written, as it sees torch.empty's)."""
    t.numpy()[:] = (seed + 1) * 1e9
    return t


# Every c10d collective a one-rank gloo group runs, each writing into buffers from torch.empty.
COLLECTIVES: dict[str, Callable[[torch.Tensor, int], list[torch.Tensor]]] = {}


def _collectives() -> None:
    import torch.distributed as dist

    def fresh(seed: int) -> torch.Tensor:
        return _garbage(torch.empty(4), seed)

    def gather(x: torch.Tensor, s: int) -> list[torch.Tensor]:
        outs = [fresh(s)]
        dist.all_gather(outs, x)
        return outs

    def each(call: Callable[[torch.Tensor, torch.Tensor], Any]) -> Callable[[torch.Tensor, int], list[torch.Tensor]]:
        def run(x: torch.Tensor, s: int) -> list[torch.Tensor]:
            out = fresh(s)
            call(out, x)
            return [out]

        return run

    def broadcast(x: torch.Tensor, s: int) -> list[torch.Tensor]:
        out = fresh(s)
        out.copy_(x)  # the root reads what it sends
        dist.broadcast(out, 0)
        return [out]

    def all_reduce_async(x: torch.Tensor, s: int) -> list[torch.Tensor]:
        y = x.clone()
        dist.all_reduce(y, async_op=True).wait()
        return [y]

    COLLECTIVES.update({
        "all_reduce": all_reduce_async,
        "all_gather": gather,
        "all_gather_into_tensor": each(lambda o, x: dist.all_gather_into_tensor(o, x)),
        "reduce_scatter": each(lambda o, x: dist.reduce_scatter(o, [x])),
        "reduce_scatter_tensor": each(lambda o, x: dist.reduce_scatter_tensor(o, x)),
        "broadcast": broadcast,
        "all_to_all": each(lambda o, x: dist.all_to_all([o], [x])),
        "all_to_all_single": each(lambda o, x: dist.all_to_all_single(o, x)),
        "scatter": each(lambda o, x: dist.scatter(o, [x], 0)),
        "gather": each(lambda o, x: dist.gather(x, [o], 0)),
        "barrier": lambda x, s: [x + 0 if dist.barrier() is None else x],
    })


_collectives()


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_a_collectives_outputs_are_written_not_read(name: str, one_rank: None, tmp_path: Path) -> None:
    """Its output buffers (from torch.empty, holding other leftovers in each recording) are no inputs and
    no never-written memory: two recordings agree record for record, and nothing is flagged uninitialised,
    neither the collective nor the op that reads what it wrote."""
    traces = []
    for seed in range(2):
        def body(rec: Recorder, seed: int = seed) -> None:
            outs = COLLECTIVES[name](torch.arange(4.0), seed)
            torch.stack(outs).sum()

        traces.append(rows(record(tmp_path / f"{seed}.trace", body)))
    assert [(r["name"], r["digest"], r["ins"]) for r in traces[0]] == \
        [(r["name"], r["digest"], r["ins"]) for r in traces[1]]
    assert not [r["name"] for r in traces[0] if r["flags"] & Flag.UNINIT]
    if name != "barrier":
        assert any(r["name"].startswith("c10d.") for r in traces[0])


def test_an_lstms_workspace_is_recorded_by_dtype_and_shape_and_its_backward_reads_it_so(tmp_path: Path) -> None:
    # oneDNN's LSTM returns a workspace whose bytes it need not define: two identical calls leave other bytes
    # there (checked: they differ without the rule), and neither the record nor the backward's inputs show them
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 4)
    x = torch.randn(5, 2, 4)

    def body(rec: Recorder) -> None:
        for _ in range(2):
            lstm(x)[0].sum().backward()

    trace = record(tmp_path / "t.trace", body)
    workspaces = rows(trace, "aten.mkldnn_rnn_layer.default[3]")
    backwards = rows(trace, "aten.mkldnn_rnn_layer_backward.default")
    assert [bool(r["flags"] & Flag.NOT_RESULT) for r in workspaces] == [True, True]
    assert workspaces[0]["digest"] == workspaces[1]["digest"]
    assert backwards[0]["ins"] == backwards[1]["ins"]
