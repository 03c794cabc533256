"""A DataLoader's batches as op records linked to the draws that chose them (detaudit/recorder/loader_batches.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from recording import record
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from detaudit.recorder.core import Recorder
from detaudit.recorder.loader_batches import MAX_TENSORS
from detaudit.trace import LOADER_BATCH, Kind, Trace


def _batches(tmp_path: Path, steps: int = 2, workers: int = 0) -> Trace:
    data = TensorDataset(torch.arange(40).view(20, 2), torch.arange(20))

    def body(rec: Recorder) -> None:
        loader = DataLoader(data, sampler=RandomSampler(data, replacement=True, num_samples=1000), batch_size=4,
                            num_workers=workers)
        batches = iter(loader)
        for _ in range(steps):
            x, y = next(batches)
            (x * 2).sum()

    return record(tmp_path / "t.trace", body)


def _names(trace: Trace) -> list[str]:
    return [trace.strings[r["name"]] for r in trace.records if r["kind"] == Kind.OP]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    return _batches(tmp_path_factory.mktemp("loader"))


def test_each_tensor_of_each_batch_is_one_record(trace: Trace) -> None:
    assert [n for n in _names(trace) if n.startswith(LOADER_BATCH)] == [LOADER_BATCH, f"{LOADER_BATCH}[1]"] * 2


def test_the_first_batch_is_linked_to_the_samplers_draws_and_its_collation(trace: Trace) -> None:
    names = _names(trace)
    first = names.index(LOADER_BATCH)
    makers = [first - int(d) for d in trace.strings[trace.records[first]["aux"]].split(",")]
    # RandomSampler's seed from the global RNG, its private Generator's draw, the collating stack
    assert sorted(names[m] for m in makers) == ["aten.randint.generator", "aten.random_.default", "aten.stack.default"]


def test_an_op_on_the_batch_is_linked_to_its_record(trace: Trace) -> None:
    names = _names(trace)
    mul = names.index("aten.mul.Tensor")
    makers = [mul - int(d) for d in trace.strings[trace.records[mul]["aux"]].split(",")]
    assert [names[m] for m in makers] == [LOADER_BATCH]


def test_batches_drawn_ahead_by_workers_are_linked_to_their_own_draws(tmp_path: Path) -> None:
    """A two-worker loader draws four batches' indices when it starts: the first batch's draws, not the last's."""
    trace = _batches(tmp_path, steps=1, workers=2)
    names = _names(trace)
    first = names.index(LOADER_BATCH)
    makers = sorted(first - int(d) for d in trace.strings[trace.records[first]["aux"]].split(","))
    assert "aten.random_.default" in [names[m] for m in makers]


def test_a_batch_of_many_tensors_records_the_first_few(tmp_path: Path) -> None:
    data = TensorDataset(*(torch.arange(8) for _ in range(MAX_TENSORS + 4)))
    trace = record(tmp_path / "t.trace", lambda rec: next(iter(DataLoader(data, batch_size=2))))
    assert sum(n.startswith(LOADER_BATCH) for n in _names(trace)) == MAX_TENSORS
