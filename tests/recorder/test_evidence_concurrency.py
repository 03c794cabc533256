"""recorder/evidence/concurrency.py: threads, pools, completion order, DataLoader settings and workers."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, get_type_hints

import torch
from evidence_sink import Sink
from torch.utils.data import DataLoader, TensorDataset

from detaudit.events import ConcurrencyEvent, DataLoaderEvent, WorkerStartEvent
from detaudit.recorder import patch
from detaudit.recorder.evidence import base, concurrency
from detaudit.recorder.evidence.base import Evidence


def fields(cls: Any) -> set[str]:
    return set(get_type_hints(cls)) - {"at", "worker"}


def work() -> None:
    pass


def test_thread_starts_are_recorded_once_per_site_with_their_target(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    start = threading.Thread.start
    concurrency.install_threads(ev)
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    [event] = sink.of("concurrency")
    assert set(event) == fields(ConcurrencyEvent)
    assert (event["what"], event["target"]) == ("threading.Thread.start", "work")
    assert "test_evidence_concurrency.py:" in event["loc"]
    patch.restore_all()
    assert threading.Thread.start is start


def test_pool_submissions_and_completion_order(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    concurrency.install_futures(ev, concurrent.futures)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(work) for _ in range(2)]
        for f in concurrent.futures.as_completed(futures):
            f.result()
    submit, completed = sink.of("concurrency")
    assert (submit["what"], submit["target"]) == ("ThreadPoolExecutor.submit", "work")
    assert (completed["what"], completed["target"]) == ("concurrent.futures.as_completed", None)


def test_a_dataloader_is_recorded_and_its_workers_get_the_recording_init_fn(evidence: tuple[Evidence, Sink],
                                                                             tmp_path: Any) -> None:
    ev, sink = evidence
    ev.side_path = str(tmp_path / "t.trace.workers.jsonl")
    concurrency.install_dataloader(ev, DataLoader)
    data = TensorDataset(torch.arange(4.0))
    plain = DataLoader(data, batch_size=2)
    workers = DataLoader(data, batch_size=2, num_workers=2, worker_init_fn=work)
    first, second = sink.of("dataloader")
    assert set(first) == fields(DataLoaderEvent)
    assert (first["num_workers"], first["worker_init_fn"], first["generator"], first["sampler"]) == (
        0, None, False, "SequentialSampler")
    assert (second["num_workers"], second["worker_init_fn"]) == (2, "work")
    assert plain.worker_init_fn is None
    assert isinstance(workers.worker_init_fn, concurrency.WorkerStart)
    assert workers.worker_init_fn.user_fn is work


def test_worker_start_records_each_workers_rng_states(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    calls: list[int] = []
    active, base.active = base.active, ev
    try:
        concurrency.WorkerStart(calls.append)(3)
    finally:
        base.active = active
    start, done = sink.events
    assert set(start) == fields(WorkerStartEvent)
    assert (start["type"], start["worker_id"], done["type"], calls) == ("worker-start", 3, "worker-init-done", [3])
    assert set(start["rng"]) >= {"torch", "python"}
    assert "initial_seed" in start["rng"]["torch"]
