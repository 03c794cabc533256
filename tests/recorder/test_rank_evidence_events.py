"""recorder/rank_evidence.py in-process (the fast lane): a DistributedSampler iterated again at an epoch
it already used is an event, once; test_rank_evidence.py runs a real DDP job (marked process)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import distributed as data_distributed

from detaudit.recorder import rank_evidence

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")


class Events:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def event(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def test_a_reused_sampler_epoch_is_recorded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.nn.parallel import distributed as ddp_module

    # restored after the test: install() patches both for the life of a rank
    monkeypatch.setattr(ddp_module.DistributedDataParallel, "__init__", ddp_module.DistributedDataParallel.__init__)
    monkeypatch.setattr(data_distributed.DistributedSampler, "__iter__", data_distributed.DistributedSampler.__iter__)
    recorder = Events()
    rank_evidence.install(recorder)  # type: ignore[arg-type]
    sampler = data_distributed.DistributedSampler(list(range(8)), num_replicas=2, rank=0, shuffle=True, seed=3)
    first = list(sampler)
    assert recorder.events == []
    assert list(sampler) == first
    assert list(sampler) == first
    [event] = recorder.events
    assert event["type"] == "sampler-epoch"
    assert event["epoch"] == 0
    assert event["seed"] == 3
    assert event["iterations"] == 2
    sampler.set_epoch(1)
    list(sampler)
    assert len(recorder.events) == 1


def test_an_unshuffled_sampler_is_never_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_distributed.DistributedSampler, "__iter__", data_distributed.DistributedSampler.__iter__)
    recorder = Events()
    rank_evidence._watch_sampler_epochs(recorder)  # type: ignore[arg-type]
    sampler = data_distributed.DistributedSampler(list(range(8)), num_replicas=2, rank=1, shuffle=False)
    list(sampler), list(sampler)
    assert recorder.events == []
