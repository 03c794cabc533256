"""The Recorder: naming of nested values, the per-step cache, and the deferred device path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from detaudit.recorder import core
from detaudit.recorder.core import Recorder, iter_tensors, one_ulp
from detaudit.recorder.devicehash import fingerprint
from detaudit.trace import Flag, Kind, TraceWriter, read_trace


def _recorder(tmp_path: Path, **kwargs: bool) -> Recorder:
    return Recorder(TraceWriter(tmp_path / "t.trace", {"repeat": 0}), **kwargs)


def test_iter_tensors_names_nested_values_in_a_stable_order() -> None:
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    got = [(name, t.numel()) for name, t in iter_tensors({"x": a, "y": [b, (c,)]}, "ck")]
    assert got == [("ck.x", 1), ("ck.y[0]", 2), ("ck.y[1][0]", 3)]


def test_device_path_on_cpu_gives_the_same_records_as_host_path_apart_from_digest(tmp_path: Path) -> None:
    tensors = [torch.randn(4, 5), torch.arange(7), torch.randn(3, dtype=torch.float64)]
    traces = []
    for sub, device_path in (("host", False), ("device", True)):
        (tmp_path / sub).mkdir()
        rec = _recorder(tmp_path / sub, device_path_on_cpu=device_path)
        for i, t in enumerate(tensors):
            rec.record_object(Kind.CHECKPOINT, f"t{i}", t)
        rec.end_step()
        rec.record_object(Kind.CHECKPOINT, "after", tensors[0] * 2)
        rec.close({"exit_code": 0})
        traces.append(read_trace(tmp_path / sub / "t.trace"))
    host, device = traces
    assert len(host.records) == len(device.records) == 4
    assert [host.strings[n] for n in host.records["name"]] == [device.strings[n] for n in device.records["name"]]
    assert (host.records["samples"] == device.records["samples"]).all()
    assert (device.records["flags"] & Flag.DEVICE).all()
    assert list(device.records["step"]) == [0, 0, 0, 1]


def test_device_path_is_resolved_in_one_batch_per_step(tmp_path: Path, monkeypatch) -> None:
    transfers = []
    original = torch.Tensor.cpu

    def counting_cpu(self: torch.Tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
        transfers.append(self.shape)
        return original(self, *args, **kwargs)

    rec = _recorder(tmp_path, device_path_on_cpu=True)
    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    for i in range(10):
        rec.record_object(Kind.CHECKPOINT, f"t{i}", torch.randn(8))
    rec.end_step()
    assert len(transfers) == 1
    monkeypatch.undo()
    rec.close({"exit_code": 0})
    assert len(read_trace(tmp_path / "t.trace").records) == 10


def test_a_tensor_recorded_twice_in_a_step_is_hashed_once_unless_modified(tmp_path: Path, monkeypatch) -> None:
    import detaudit.recorder.core as core

    calls = []
    original = core.fingerprint_cpu
    monkeypatch.setattr(core, "fingerprint_cpu", lambda t: calls.append(1) or original(t))
    rec = _recorder(tmp_path)
    t = torch.randn(16)
    rec.record_object(Kind.OUTPUT, "a", t)
    rec.record_object(Kind.OUTPUT, "b", t)
    assert len(calls) == 1
    t.add_(1)  # bumps the version counter: must be hashed again
    rec.record_object(Kind.OUTPUT, "c", t)
    assert len(calls) == 2
    rec.close({"exit_code": 0})
    records = read_trace(tmp_path / "t.trace").records
    assert records["digest"][0] == records["digest"][1] != records["digest"][2]


def test_a_digest_is_not_reused_across_forwards_of_a_root_when_written_through_numpy(tmp_path: Path) -> None:
    """A write through a NumPy alias leaves `_version` alone: the next forward of a root re-hashes."""
    import numpy as np

    rec = _recorder(tmp_path)
    buf = np.zeros(8, dtype=np.float32)
    x = torch.from_numpy(buf)
    for value in (0.0, 1.0):
        buf[:] = value
        rec.root_forward(1)  # the pre hook of root module 1: the second call starts a new iteration
        rec.record_object(Kind.INPUT, "net.input", x)
    rec.close({"exit_code": 0})
    records = read_trace(tmp_path / "t.trace").records
    assert records["digest"][0] != records["digest"][1]


def test_rows_and_awaiting_device_digests_keep_record_order_in_the_pending_queue(tmp_path: Path) -> None:
    """A finished row (a meta tensor's) queued between records awaiting device digests is written in place."""
    rec = _recorder(tmp_path, device_path_on_cpu=True)
    rec.record_object(Kind.CHECKPOINT, "a", torch.randn(3))
    rec.record_object(Kind.CHECKPOINT, "m", torch.empty(2, device="meta"))
    rec.record_object(Kind.CHECKPOINT, "b", torch.arange(4))
    assert [type(p).__name__ for p in rec._pending] == ["DeviceRecord", "tuple", "DeviceRecord"]
    rec.close({"exit_code": 0})
    tr = read_trace(tmp_path / "t.trace")
    assert [tr.strings[n] for n in tr.records["name"]] == ["a", "m", "b"]
    assert list(tr.records["flags"] & Flag.NO_DATA) == [0, Flag.NO_DATA, 0]
    assert not rec._pending


def _every_layout() -> dict[str, torch.Tensor]:
    d = torch.tensor([[1.5, 0.0, -2.0, 0.0], [0.0, 3.0, 0.0, 4.0], [5.0, 0.0, 0.0, 6.0], [0.0, 7.0, 8.0, 0.0]])
    pieces = [torch.randn(2, 3), torch.randn(4, 3)]
    return {"strided": d, "coo": d.to_sparse(), "csr": d.to_sparse_csr(), "csc": d.to_sparse_csc(),
            "bsr": d.to_sparse_bsr((2, 2)), "bsc": d.to_sparse_bsc((2, 2)),
            "jagged": torch.nested.nested_tensor(pieces, layout=torch.jagged),
            "strided nested": torch.nested.nested_tensor(pieces, layout=torch.strided),
            "quantized": torch.quantize_per_tensor(d, 0.5, 0, torch.qint8), "meta": d.to("meta")}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's "sparse support is in beta"
@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device"])
def test_every_layout_is_recorded_with_its_contents_except_meta(tmp_path: Path, device_path: bool) -> None:
    """Only a meta tensor is content-less (NO_DATA: "not observed: contents"); a nested tensor's ragged
    dimension is "j" in the trace (torch's j1, j2... are numbered per process)."""
    tensors = _every_layout()
    rec = _recorder(tmp_path, device_path_on_cpu=device_path)
    for name, t in tensors.items():
        rec.record_object(Kind.SAVE, name, t)
    rec.close({"exit_code": 0})
    tr = read_trace(tmp_path / "t.trace")
    flags = {tr.strings[n]: int(f) & Flag.NO_DATA for n, f in zip(tr.records["name"], tr.records["flags"])}
    assert flags == {name: Flag.NO_DATA if name == "meta" else 0 for name in tensors}
    shapes = [tr.strings[s] for s in tr.records["shape"]]
    assert shapes[list(tensors).index("jagged")] == "2xjx3"
    assert shapes[list(tensors).index("strided nested")] == "2xjx3"
    assert len(set(tr.records["digest"])) == len(tensors)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_one_ulp_changes_every_layout_with_values_and_leaves_the_original() -> None:
    from detaudit.recorder.devicehash import fingerprint

    for name, t in _every_layout().items():
        before = fingerprint(t).digest
        changed = one_ulp(t)
        assert fingerprint(t).digest == before, name
        if name in ("meta", "quantized"):  # no values to change (--self-check never picks these)
            assert changed is t
        else:
            assert fingerprint(changed).digest != before, name
            assert fingerprint(changed).shape == fingerprint(t).shape, name


def test_a_checkpoint_name_that_is_no_string_raises_a_type_error_into_the_script(tmp_path: Path) -> None:
    """`checkpoint(123, t)` put an int into the string table: the trace read as corrupt. Raised under plain
    python too (no recorder), so the script behaves the same either way."""
    import pytest

    import detaudit

    rec = _recorder(tmp_path)
    for active in (None, rec):
        detaudit._set_active_recorder(active)
        try:
            for name in (123, None, b"bytes", ("a",)):
                with pytest.raises(TypeError, match=r"detaudit.checkpoint\(\) name must be a str, not"):
                    detaudit.checkpoint(name, torch.ones(2))  # type: ignore[arg-type]
            detaudit.checkpoint("fine", torch.ones(2))
        finally:
            detaudit._set_active_recorder(None)
    rec.close({"exit_code": 0})
    tr = read_trace(tmp_path / "t.trace")
    assert [tr.strings[i] for i in tr.records["name"]] == ["fine"]


class _Work:
    """A c10d Work stand-in: its future completes when the test says the collective is done."""

    def __init__(self) -> None:
        self.future: torch.futures.Future[None] = torch.futures.Future()

    def get_future(self) -> torch.futures.Future[None]:
        return self.future


def test_a_collectives_output_is_hashed_when_its_work_completes_and_written_in_record_order(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    rec = Recorder(TraceWriter(path, {"repeat": 0}))
    out, work = torch.zeros(4), _Work()
    rec.record_when_done(work, Kind.OP, rec.intern("c10d.allgather_.default"), out, 0, 0, 0, 0, (1, 1))
    rec.record_object(Kind.CHECKPOINT, "after", torch.ones(2))
    rec.resolve_pending()  # an optimizer step while the collective still runs: nothing can be written yet
    assert rec.writer.position == 0
    out.fill_(7.0)  # the collective writes its output, then completes
    work.future.set_result(None)
    out.fill_(-1.0)  # the script reuses the buffer once it has waited: not what the collective wrote
    rec.close({"exit_code": 0})
    trace = read_trace(path)
    assert [trace.strings[r["name"]] for r in trace.records] == ["c10d.allgather_.default", "after"]
    assert int(trace.records[0]["digest"]) == fingerprint(torch.full((4,), 7.0)).digest


def test_a_collective_that_never_completes_is_recorded_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "ASYNC_CLOSE_WAIT_S", 0.01)
    path = tmp_path / "t.trace"
    rec = Recorder(TraceWriter(path, {"repeat": 0}))
    rec.record_when_done(_Work(), Kind.OP, rec.intern("c10d.recv_.default"), torch.zeros(3), 0, 0, 0, 0, (1, 1))
    rec.close({"exit_code": 0})
    (row,) = read_trace(path).records
    assert int(row["flags"]) & Flag.NO_DATA


class _P2PWork:
    """gloo's send/recv Work: no future; completed once the script has waited for it."""

    def __init__(self) -> None:
        self.done = False

    def get_future(self) -> None:
        raise RuntimeError("Work::getFuture not implemented.")

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> None:
        raise AssertionError("the recorder must never wait for the script's work (a second wait blocks for ever)")


def test_a_recv_without_a_future_is_hashed_at_the_first_poll_after_the_script_waited(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    rec = Recorder(TraceWriter(path, {"repeat": 0}))
    buf, work = torch.zeros(3), _P2PWork()
    rec.record_when_done(work, Kind.OP, rec.intern("c10d.recv_.default"), buf, 0, 0, 0, 0, (1, 1))
    rec.poll_async()
    assert rec.polled  # still receiving
    buf.fill_(5.0)
    work.done = True  # the script's wait() returned
    rec.poll_async()  # the op recorder polls before the next op
    buf.fill_(0.0)
    rec.close({"exit_code": 0})
    (row,) = read_trace(path).records
    assert int(row["digest"]) == fingerprint(torch.full((3,), 5.0)).digest
    assert not int(row["flags"]) & Flag.NO_DATA


def test_each_steps_cpu_time_is_kept_in_the_footer_beside_its_wall_time(tmp_path: Path) -> None:
    """`detaudit fix` prices a knob per step from CPU time, which a loaded machine barely moves (docs/fix.md)."""
    rec = _recorder(tmp_path)
    for _ in range(3):
        sum(i * i for i in range(20_000))  # some CPU work in the step
        rec.end_step()
    rec.close({"exit_code": 0})
    footer = read_trace(tmp_path / "t.trace").footer or {}
    assert len(footer["step_cpu_times"]) == len(footer["step_times"]) == 3
    assert all(t > 0 for t in footer["step_cpu_times"])
