"""recorder/checkpoints.py: what a saved or loaded object is made of, and the events and records of a save, a
load, a restore and (under `resume`) a training step. The hooks are called directly, as the wrappers would
call them, so nothing is patched in the test process."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from detaudit.recorder.checkpoints import Checkpoints, describe, role_of
from detaudit.recorder.core import Recorder
from detaudit.recorder.hooks import Hooks
from detaudit.trace import Kind, TraceWriter, read_trace


def _training() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    return model, optimizer, scheduler


def test_state_dicts_and_rng_states_are_recognised_by_their_shape() -> None:
    model, optimizer, scheduler = _training()
    scaler = torch.amp.GradScaler("cpu")
    assert [role_of(v) for v in (model, model.state_dict(), optimizer.state_dict(), scheduler.state_dict(),
                                 scaler.state_dict(), torch.get_rng_state(), np.random.get_state(),
                                 np.random.default_rng(0).bit_generator.state, random.getstate())] == [
        "module", "module", "optimizer", "scheduler", "scaler", "rng-torch", "rng-numpy", "rng-numpy", "rng-python"]
    assert role_of({"step": 3, "lr": 0.1}) is None
    assert role_of(torch.zeros(3)) is None


def test_a_checkpoint_is_described_by_its_keys_and_the_paths_of_its_parts() -> None:
    model, optimizer, _ = _training()
    keys, parts = describe({"model": model.state_dict(), "opt": optimizer.state_dict(), "step": 4,
                            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}})
    assert keys == ["model", "opt", "step", "rng"]
    assert [(p["path"], p["role"]) for p in parts] == [("model", "module"), ("opt", "optimizer"),
                                                       ("rng.torch", "rng-torch"), ("rng.python", "rng-python")]
    assert describe(model) == ([], [{"path": "", "role": "module"}])


def test_saves_loads_restores_and_a_resumed_step_are_recorded(tmp_path: Path) -> None:
    model, optimizer, scheduler = _training()
    path = tmp_path / "t.trace"
    recorder = Recorder(TraceWriter(path, {"repeat": 0}))
    hooks = Hooks(recorder)
    checkpoints = Checkpoints(recorder, hooks, resume=True)
    checkpoints._on_save({"model": model.state_dict()}, str(tmp_path / "ckpt.pt"))
    checkpoints._on_load({"model": model.state_dict(), "scheduler": scheduler.state_dict()}, "ckpt.pt")
    for _ in range(2):  # once per call site
        checkpoints._on_restore("scheduler", scheduler, None)
    hooks._on_forward_pre(model, ())  # names the parameters
    checkpoints._on_step_pre(optimizer, (), {})
    checkpoints._on_step_pre(optimizer, (), {})
    recorder.close({"exit_code": 0})
    trace = read_trace(path)
    kinds = [e["type"] for e in trace.events]
    assert kinds == ["checkpoint-save", "checkpoint-load", "state-restore", "initial-params"]
    save, load, restore, initial = trace.events
    assert save["path"] == str(tmp_path / "ckpt.pt")
    assert save["parts"] == [{"path": "model", "role": "module"}]
    assert load["keys"] == ["model", "scheduler"]
    assert restore["what"] == "scheduler"
    assert restore["name"] == "StepLR"
    assert initial["params"] == ["weight", "bias"]
    assert len(initial["digests"][0]) == 16
    rates = [r for r in trace.records if r["kind"] == Kind.OPTSTATE]
    assert [trace.strings[r["name"]] for r in rates] == ["optimizer Adam:lr"] * 2
