"""recorder/evidence/draws.py: each draw fingerprinted with its context, bounded per site, step and epoch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from evidence_sink import Sink
from torch.utils.data import DataLoader

from detaudit.recorder.evidence import draws, generators
from detaudit.recorder.evidence.base import Evidence


@pytest.fixture
def tracked(evidence: tuple[Evidence, Sink]) -> Iterator[tuple[Evidence, Sink]]:
    ev, sink = evidence
    draws.install(ev)
    state = torch.get_rng_state()
    try:
        yield ev, sink
    finally:
        draws.tracker = None
        torch.set_rng_state(state)


def test_a_draw_is_fingerprinted_with_the_state_it_started_from_and_its_values(tracked: Any) -> None:
    ev, sink = tracked
    generators.install_torch(ev, torch)
    torch.manual_seed(3)
    before = ev.rng_digest("torch")
    values = torch.randn(5)
    [drawn] = sink.of("random-draw")
    assert (drawn["state"], drawn["value"], drawn["size"]) == (before, draws.fingerprint(values, torch)[0], 5)
    assert (drawn["epoch"], drawn["n"], drawn["step"], drawn["grad"], drawn["source"]) == (0, 0, 0, True, "global")


def test_one_site_is_fingerprinted_a_few_times_per_step_and_epoch_and_only_counted_after(tracked: Any) -> None:
    ev, sink = tracked
    generators.install_torch(ev, torch)
    for step in range(draws.DRAWS_PER_EPOCH):
        sink.step = step  # type: ignore[attr-defined]  # the Recorder's optimizer step count
        for _ in range(draws.DRAWS_PER_STEP + 2):
            torch.rand(2)
    kept = sink.of("random-draw")
    assert len(kept) == draws.DRAWS_PER_EPOCH
    assert [e["n"] for e in kept[:4]] == [0, 1, 2, draws.DRAWS_PER_STEP + 2]


def test_each_dataloader_iteration_is_a_new_epoch_for_the_draws_after_it(tracked: Any) -> None:
    ev, sink = tracked
    generators.install_torch(ev, torch)
    assert draws.tracker is not None
    draws.install_loader(draws.tracker, DataLoader)
    loader = DataLoader(list(range(4)), batch_size=2)
    for _ in range(2):
        for _ in loader:
            torch.rand(1)
    # (the loader's own draw of its workers' base seed is fingerprinted too, at the `for` line)
    assert [e["epoch"] for e in sink.of("random-draw") if e["fn"] == "torch.rand"] == [1, 1, 2, 2]


def test_a_draw_under_no_grad_is_marked_so(tracked: Any) -> None:
    ev, sink = tracked
    generators.install_torch(ev, torch)
    with torch.no_grad():
        torch.rand(1)
    assert [e["grad"] for e in sink.of("random-draw")] == [False]


def test_a_draw_while_every_switched_model_is_in_eval_mode_is_marked_evaluating(tracked: Any) -> None:
    """`model.eval()` without `no_grad` (an evaluation loop that keeps grad on) marks the draws; back in train(),
    or with a teacher kept in eval() beside a student in train(), they are training draws."""
    ev, sink = tracked
    generators.install_torch(ev, torch)
    assert draws.tracker is not None
    draws.install_modes(draws.tracker, torch.nn.Module)
    student, teacher = torch.nn.Sequential(torch.nn.Dropout()), torch.nn.Linear(2, 2)
    torch.rand(1)  # no model switched yet
    student.eval()
    torch.rand(1)
    student.train()
    teacher.eval()
    torch.rand(1)
    student.eval()
    torch.rand(1)
    assert [bool(e.get("evaluating")) for e in sink.of("random-draw") if e["fn"] == "torch.rand"] == \
        [False, True, False, True]
    assert set(draws.tracker.modes) == {student, teacher}  # the Dropout inside the student is no model of its own


def test_values_are_digested_from_tensors_arrays_numbers_and_lists() -> None:
    array = np.arange(4.0)
    assert draws.fingerprint(torch.from_numpy(array), torch) == draws.fingerprint(array, torch)
    assert draws.fingerprint(0.5, torch)[1] == 1
    assert draws.fingerprint([1, 2, 3], torch)[1] == 3
    assert draws.fingerprint(None, torch) == (None, 0)


def test_a_value_whose_bytes_cannot_be_read_leaves_the_draw_and_its_state(tracked: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ev, sink = tracked
    generators.install_torch(ev, torch)

    def unreadable(result: Any, torch: Any) -> Any:
        raise RuntimeError("a layout with no bytes to read")

    monkeypatch.setattr(draws, "fingerprint", unreadable)
    drawn = torch.rand(3)
    [event] = sink.of("random-draw")
    assert (event["value"], event["state"] is not None, drawn.shape) == (None, True, (3,))


def test_a_process_keeps_at_most_max_kept_fingerprints_over_all_sites(tracked: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ev, sink = tracked
    monkeypatch.setattr(draws, "MAX_KEPT", 2)
    generators.install_torch(ev, torch)
    torch.rand(1)
    torch.randn(1)
    torch.rand(1)
    assert len(sink.of("random-draw")) == 2
