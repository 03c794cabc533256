"""The step replay of `detaudit watch` (detaudit/recorder/replay.py), run in-process on small computations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from detaudit.recorder.core import Recorder
from detaudit.recorder.eventlog import EventLog
from detaudit.recorder.replay import COLLECTIVE, NO_GRAD_BUDGET, OVER_BUDGET, StepReplay, Watcher, _copier, _kind
from detaudit.trace import TraceWriter


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Recorder]:
    rec = Recorder(TraceWriter(tmp_path / "t.trace", {"repeat": 0}))
    yield rec
    rec.close({"exit_code": 0})


def replaying(rec: Recorder, tmp_path: Path, flip: dict[str, Any] | None = None) -> StepReplay:
    return StepReplay(rec, EventLog(str(tmp_path / "events.jsonl")), flip)


def events(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "events.jsonl"
    written = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [e for e in written if e["event"] != "header"]


def test_the_events_file_starts_with_its_format_and_version(tmp_path: Path) -> None:
    EventLog(str(tmp_path / "events.jsonl")).write({"event": "end", "step": 0})
    first = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[0])
    assert first == {"event": "header", "format": "detaudit-watch-events", "version": 1}


def test_a_random_op_draws_what_it_draws_unwatched_and_leaves_the_generator_there(recorder: Recorder,
                                                                                   tmp_path: Path) -> None:
    torch.manual_seed(3)
    plain = (torch.randn(5), torch.rand(2))
    torch.manual_seed(3)
    with replaying(recorder, tmp_path) as mode:
        watched = torch.randn(5)
    after = torch.rand(2)
    assert torch.equal(watched, plain[0])
    assert torch.equal(after, plain[1])
    assert mode.replayed == 1
    assert events(tmp_path) == []


def test_an_lstms_workspace_is_no_result_its_replay_must_reproduce(recorder: Recorder, tmp_path: Path) -> None:
    # oneDNN's LSTM leaves parts of its workspace undefined: each execution holds other bytes there (checked:
    # a mismatch of 255 without the rule), while its results agree bit for bit
    lstm = torch.nn.LSTM(4, 4)
    x = torch.randn(5, 2, 4)
    with replaying(recorder, tmp_path) as mode:
        lstm(x)
    assert mode.replayed > 0
    assert events(tmp_path) == []
    assert mode.set_aside == {"aten.mkldnn_rnn_layer.default": 1}


def test_an_in_place_op_is_applied_once_and_replayed_on_copies(recorder: Recorder, tmp_path: Path) -> None:
    x = torch.arange(4.0)
    with replaying(recorder, tmp_path) as mode:
        x.add_(1.5)
    assert x.tolist() == [1.5, 2.5, 3.5, 4.5]
    assert mode.replayed == 1


def test_an_in_place_op_copies_only_the_input_it_writes() -> None:
    x, y = torch.arange(4.0), torch.ones(4)
    call = ((x, y), {})
    args, _ = _copier(*call, ((0, "self"),))(call)
    assert (args[0] is not x, args[1] is y) == (True, True)


def test_an_input_read_from_the_memory_the_op_writes_is_copied_too() -> None:
    x = torch.arange(4.0)
    call = ((x, x[1:3]), {})
    args, _ = _copier(*call, ((0, "self"),))(call)
    assert (args[0] is not x, args[1] is not call[0][1]) == (True, True)


def test_an_in_place_op_on_itself_agrees_with_its_replay(recorder: Recorder, tmp_path: Path) -> None:
    x = torch.arange(4.0)
    with replaying(recorder, tmp_path) as mode:
        x.add_(x.view(4))
    assert x.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert (mode.replayed, events(tmp_path)) == (1, [])


def test_uninitialised_memory_is_skipped_and_counted(recorder: Recorder, tmp_path: Path) -> None:
    with replaying(recorder, tmp_path) as mode:
        torch.empty(3)
    assert mode.skipped == {"uninitialised": 1}


CALLS: list[int] = []


@torch.library.custom_op("detaudit_test::counted", mutates_args=())
def counted(x: torch.Tensor) -> torch.Tensor:
    """A custom op with an effect outside its tensors (a Python list here; a file, a socket, a counter...)."""
    CALLS.append(1)
    return x * 2


def test_a_custom_op_runs_once_and_is_named_as_not_replayed(recorder: Recorder, tmp_path: Path) -> None:
    CALLS.clear()
    with replaying(recorder, tmp_path) as mode:
        counted(torch.ones(3))
    assert (len(CALLS), mode.skipped) == (1, {"custom op detaudit_test.counted.default": 1})


def test_an_aten_op_with_a_registered_effect_runs_once(recorder: Recorder, tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    with replaying(recorder, tmp_path) as mode:
        torch.ops.aten._print("printed once")
    assert (capfd.readouterr().out, mode.skipped) == ("printed once\n", {"effectful op aten._print.default": 1})


_LIB = torch.library.Library("detaudit_test", "FRAGMENT")
_LIB.define("shard_exchange(Tensor x, str group_name) -> Tensor")


@pytest.mark.parametrize("op", ["_c10d_functional.all_reduce.default", "_c10d_functional.wait_tensor.default",
                                "_c10d_functional_autograd.all_gather_into_tensor.default", "c10d.allreduce_.default",
                                "detaudit_test.shard_exchange.default"])
def test_a_collective_of_any_namespace_is_never_replayed(op: str) -> None:
    """torch.distributed's namespaces, and an op of any namespace that takes a process group by name."""
    namespace, name, overload = op.split(".")
    assert _kind(getattr(getattr(getattr(torch.ops, namespace), name), overload))[0] == COLLECTIVE


def test_an_op_on_a_tensor_subclass_runs_once(recorder: Recorder, tmp_path: Path) -> None:
    """A subclass's own dispatch runs inside the op (DTensor's talks to the other ranks): never twice."""
    from torch.testing._internal.two_tensor import TwoTensor

    pair = TwoTensor(torch.ones(2), torch.ones(2))
    with replaying(recorder, tmp_path) as mode:
        pair + 1
    assert (mode.replayed, mode.skipped) == (0, {"tensor subclass": 1})


def test_a_flipped_bit_is_a_mismatch_that_a_third_execution_settles(recorder: Recorder, tmp_path: Path) -> None:
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    with replaying(recorder, tmp_path, {"op": "aten.mm.default", "step": 0, "execution": 2}):
        product = a @ b
    (mismatch,) = events(tmp_path)
    assert (mismatch["op"], mismatch["max_ulp"], mismatch["third_agrees_with"]) == ("aten.mm.default", 1, "first")
    assert torch.equal(product, a @ b)  # the script keeps its own, unflipped result


def _watcher(rec: Recorder, tmp_path: Path, stops: list[str], patience: float) -> Watcher:
    config = {"events": str(tmp_path / "events.jsonl"), "every": 1, "on_mismatch": "stop",
              "handshake": str(tmp_path / "watch-checked.json"), "save_patience_s": patience}
    return Watcher(rec, config, stops.append)


def test_a_save_the_parent_found_a_mismatch_before_is_stopped(recorder: Recorder, tmp_path: Path) -> None:
    (tmp_path / "watch-checked.json").write_text(json.dumps({"checked_to": -1, "mismatch_at": 0}))
    stops: list[str] = []
    watcher = _watcher(recorder, tmp_path, stops, 60.0)
    watcher._await_parent("ckpt.pt")
    watcher._halt_if_mismatched("torch.save", "ckpt.pt")
    assert stops == ["torch.save"]


def test_a_save_the_parent_never_caught_up_with_goes_ahead_and_says_so(recorder: Recorder, tmp_path: Path) -> None:
    stops: list[str] = []
    watcher = _watcher(recorder, tmp_path, stops, 0.0)
    watcher._await_parent("ckpt.pt")
    watcher._halt_if_mismatched("torch.save", "ckpt.pt")
    assert (stops, [e["event"] for e in events(tmp_path)]) == ([], ["unchecked_save"])


def _plain_watcher(rec: Recorder, tmp_path: Path, stops: list[str]) -> Watcher:
    return Watcher(rec, {"events": str(tmp_path / "events.jsonl"), "every": 2, "on_mismatch": "stop"}, stops.append)


def test_with_no_optimizer_each_backward_ends_a_step_and_says_so_once(recorder: Recorder, tmp_path: Path) -> None:
    watcher = _plain_watcher(recorder, tmp_path, [])
    watcher.backward_returned()
    watcher.backward_returned()
    assert [(e["event"], e["step"]) for e in events(tmp_path)] == [("boundary", 0), ("step", 0), ("step", 1)]


def test_with_an_optimizer_made_a_backward_ends_no_step(recorder: Recorder, tmp_path: Path) -> None:
    watcher = _plain_watcher(recorder, tmp_path, [])
    watcher.rule.optimizer_built()
    watcher.backward_returned()
    assert events(tmp_path) == []


def test_after_a_mismatch_the_job_stops_when_the_backward_returns(recorder: Recorder, tmp_path: Path) -> None:
    stops: list[str] = []
    watcher = _plain_watcher(recorder, tmp_path, stops)
    watcher.mode.mismatches = 1
    watcher.backward_returned()
    assert stops == ["update"]


def test_a_step_after_the_first_has_a_no_grad_budget_and_step_0_none(recorder: Recorder, tmp_path: Path) -> None:
    watcher = _plain_watcher(recorder, tmp_path, [])
    budgets = [watcher.mode.budget]
    watcher.backward_returned()
    assert budgets + [watcher.mode.budget] == [None, NO_GRAD_BUDGET]


def test_no_grad_ops_past_the_budget_run_once_and_are_counted(recorder: Recorder, tmp_path: Path) -> None:
    x = torch.randn(4)
    with replaying(recorder, tmp_path) as mode, torch.no_grad():
        mode.budget = 2
        for _ in range(5):
            x = x * 2
    assert (mode.replayed, mode.skipped) == (2, {OVER_BUDGET: 3})


def test_the_forward_and_backward_of_a_step_are_outside_the_budget(recorder: Recorder, tmp_path: Path) -> None:
    w = torch.randn(4, requires_grad=True)
    with replaying(recorder, tmp_path) as mode:
        mode.budget = 0
        (w * 3).sum().backward()
    assert OVER_BUDGET not in mode.skipped
