"""recorder/compiled.py and the hooks' safety net: torch.compile wrappers, names, failing hooks,
inference tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from detaudit.recorder import compiled
from detaudit.recorder.core import Recorder, version_of
from detaudit.recorder.hooks import Hooks, ModuleNames
from detaudit.trace import Kind, TraceWriter, read_trace


def _recorder(tmp_path: Path) -> Recorder:
    return Recorder(TraceWriter(tmp_path / "t.trace", {"repeat": 0}))


@pytest.mark.slow  # torch.compile imports dynamo and inductor: seconds, in the first test that calls it
def test_compile_wrapper_is_recognised_and_its_hops_dropped_from_names() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model.add_module("enc", torch.compile(torch.nn.Linear(2, 2)))  # compiled lazily: no compilation here
    assert compiled.is_wrapper(model.enc)
    assert not compiled.is_wrapper(model)
    names = ModuleNames()
    names.add_root(model)
    assert names.modules[model.enc] == "enc"
    assert names.modules[model.enc._orig_mod] == "enc"
    assert {names.param_name(p, 0, 0) for p in model.enc.parameters()} == {"enc.weight", "enc.bias"}
    assert compiled.plain_name("a._orig_mod.b") == "a.b"
    assert compiled.plain_name("orig_modx") == "orig_modx"
    assert not compiled.compiling()


def test_a_hook_that_raises_stops_recording_instead_of_the_script(tmp_path: Path, capsys) -> None:
    hooks = Hooks(_recorder(tmp_path))
    calls: list[int] = []

    def failing(*args: object) -> None:
        calls.append(1)
        raise RuntimeError("cannot hash this")

    guarded = hooks.guard(failing)
    guarded(object())  # does not raise
    guarded(object())  # recording stopped: not called again
    assert calls == [1]
    assert hooks.stopped == "RuntimeError: cannot hash this"
    assert "recording stopped" in capsys.readouterr().err


def test_inference_tensors_are_recorded_and_never_served_from_the_cache(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    with torch.inference_mode():
        t = torch.ones(4)
        rec.record_object(Kind.CHECKPOINT, "x", t)
        t.add_(1)  # in place, with no version counter to tell
        rec.record_object(Kind.CHECKPOINT, "x", t)
    assert version_of(t) != version_of(t)
    rec.close({"exit_code": 0})
    digests = read_trace(tmp_path / "t.trace").records["digest"]
    assert digests[0] != digests[1]
