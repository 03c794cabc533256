"""recorder/objects.py: torch.save's argument walked into leaves: tensors, encoded values (NumPy arrays,
Python scalars, strings, bytes, None) named by their path, and what cannot be encoded, listed."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from detaudit.recorder.core import Recorder
from detaudit.recorder.devicehash import fingerprint
from detaudit.recorder.objects import MAX_LEAVES, Encoded, PythonNumber, Unencodable, walk
from detaudit.trace import Flag, Kind, TraceWriter, read_trace


def digests(value: Any) -> dict[str, Any]:
    """path -> a comparable digest of each leaf (a tensor's fingerprint, an encoding, an unencodable type)."""
    out: dict[str, Any] = {}
    for path, leaf in walk(value, "save"):
        if isinstance(leaf, PythonNumber):
            leaf = leaf.tensor
        out[path] = (fingerprint(leaf).digest if isinstance(leaf, torch.Tensor) else
                     (leaf.dtype, leaf.digest) if isinstance(leaf, Encoded) else leaf)
    return out


def rng_checkpoint(numpy_seed: int | None, python_seed: int | None) -> dict[str, Any]:
    """The layout of Hugging Face Trainer's rng_state.pth, with a seeded torch and the other two as given."""
    torch.manual_seed(0)
    np.random.seed(numpy_seed)
    random.seed(python_seed)
    np.random.rand(), random.random()
    return {"model": torch.nn.Linear(2, 2).state_dict(), "epoch": 3, "lr": 0.1, "name": "run",
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}}


def test_equal_objects_give_equal_leaves_and_an_unseeded_rng_state_is_named_by_its_path() -> None:
    same = digests(rng_checkpoint(1, 2))
    assert same == digests(rng_checkpoint(1, 2))
    assert {"save.model.weight", "save.epoch", "save.lr", "save.name", "save.rng.torch", "save.rng.numpy[0]",
            "save.rng.numpy[1]", "save.rng.numpy[2]", "save.rng.python[0]", "save.rng.python[1]",
            "save.rng.python[2]"} <= set(same)
    other = digests(rng_checkpoint(5, 2))
    assert {p for p in same if same[p] != other[p]} == {"save.rng.numpy[1]"}  # the key; the position is equal
    other = digests(rng_checkpoint(1, 7))
    assert {p for p in same if same[p] != other[p]} == {"save.rng.python[1]"}


@pytest.mark.parametrize("a,b", [
    (1, 2), (1.0, 1.5), (True, False), ("run-1", "run-2"), (b"\x00", b"\x01"), (None, 0), (2 ** 80, 2 ** 80 + 1),
    (np.arange(3), np.arange(1, 4)), (np.float32(1), np.float32(2)), (np.array(["a", "b"]), np.array(["a", "c"])),
    ((1, 2.5), (1, 2.0)), ([1, 2, 3], [1, 2, 4]), ({"k": [1, "x"]}, {"k": [1, "y"]}), (1 + 2j, 1 + 3j),
    (argparse.Namespace(lr=0.1), argparse.Namespace(lr=0.2)), (torch.float32, torch.float64), ({1, 2}, {1, 3}),
])
def test_every_encodable_value_differs_when_it_differs_and_agrees_when_equal(a: Any, b: Any) -> None:
    assert digests(a) == digests(a)
    assert digests(a) != digests(b)
    assert not any(isinstance(leaf, Unencodable) for leaf in digests(a).values())


def test_numbers_keep_their_values_as_samples_and_match_the_tensor_they_would_be() -> None:
    leaves = dict(walk({"a": np.arange(4, dtype=np.float32), "step": 7, "ints": list(range(625))}, "s"))
    assert fingerprint(leaves["s.a"]).digest == fingerprint(torch.arange(4, dtype=torch.float32)).digest
    step = leaves["s.step"]
    assert isinstance(step, PythonNumber)
    assert step.tensor.dtype == torch.int64
    assert tuple(leaves["s.ints"].shape) == (625,)  # one record for a list of numbers, not 625


def test_a_set_is_encoded_in_a_stable_order() -> None:
    assert digests({"b", "a", "c"}) == digests({"c", "b", "a"})


def test_arbitrary_objects_and_overlong_or_deep_trees_are_listed_never_skipped() -> None:
    class Config:
        pass

    leaves = digests({"config": Config(), "ok": 1})
    assert isinstance(leaves["save.config"], Unencodable)
    assert leaves["save.config"].type_name.endswith("Config")
    assert isinstance(leaves["save.ok"], int)  # a tensor's digest: encoded beside it
    deep: list[Any] = []
    deep.append(deep)  # a list that holds itself
    assert any(isinstance(leaf, Unencodable) and "deeper" in leaf.type_name for leaf in digests(deep).values())
    many = list(walk([str(i) for i in range(MAX_LEAVES + 10)], "save"))
    assert len(many) == MAX_LEAVES + 1
    assert isinstance(many[-1][1], Unencodable)


def test_the_recorder_writes_encoded_values_as_save_records_and_unencodable_ones_as_events(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    rec = Recorder(TraceWriter(path, {"repeat": 0}))
    rec.record_object(Kind.SAVE, "torch.save[0]", {"w": torch.ones(2), "run": "abc", "obj": object()})
    rec.close({"exit_code": 0})
    trace = read_trace(path)
    names = [trace.strings[r["name"]] for r in trace.records]
    assert names == ["torch.save[0].w", "torch.save[0].run"]
    assert all(int(r["kind"]) == Kind.SAVE for r in trace.records)
    unobserved = [e for e in trace.events if e["type"] == "unobserved"]
    assert [(e["what"], e["name"]) for e in unobserved] == [("torch.save[0].obj", "object")]
    assert isinstance(dict(walk("abc", "x"))["x"], Encoded)


def test_a_saved_python_number_is_a_flagged_scalar_record_and_a_tensor_is_not_flagged(tmp_path: Path) -> None:
    """A global step or a score saved beside the weights: its value kept as a 0-dim record, flagged as no tensor
    of the script's (compare/saved_values.py), so carried state can explain it as it does a saved path."""
    path = tmp_path / "t.trace"
    rec = Recorder(TraceWriter(path, {"repeat": 0}))
    rec.record_object(Kind.SAVE, "torch.save[0]", {"w": torch.ones(2), "loss": torch.tensor(0.5), "step": 7,
                                                   "best": 0.25, "done": True})
    rec.close({"exit_code": 0})
    trace = read_trace(path)
    flagged = {trace.strings[r["name"]]: bool(int(r["flags"]) & Flag.PYTHON_VALUE) for r in trace.records}
    assert flagged == {"torch.save[0].w": False, "torch.save[0].loss": False, "torch.save[0].step": True,
                       "torch.save[0].best": True, "torch.save[0].done": True}
    step = next(r for r in trace.records if trace.strings[r["name"]] == "torch.save[0].step")
    assert step["samples"][0] == 7.0
