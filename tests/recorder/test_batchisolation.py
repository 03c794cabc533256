"""recorder/batchisolation.py: the probes cannot touch the script's state or files, forked (CPU) or in the
process (the CUDA path, taken here by declaring the call unforkable)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from detaudit.recorder import batchisolation
from detaudit.recorder.batchprobe import BatchProbe, ProbeSettings
from detaudit.recorder.core import Recorder
from detaudit.trace import TraceWriter, read_trace

COUNTER = [0]  # a global the forwards below change


def _probed(tmp_path: Path, run: Callable[[], Any]) -> list[dict[str, Any]]:
    path = tmp_path / "t.trace"
    recorder = Recorder(TraceWriter(path, {"repeat": 0}))
    probe = BatchProbe(recorder, lambda m: type(m).__name__, ProbeSettings())
    probe.install()
    try:
        run()
    finally:
        probe.remove()
        recorder.close({"exit_code": 0})
    return read_trace(path).events


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path a CUDA call takes: no forked copy."""
    monkeypatch.setattr(batchisolation, "forkable", lambda module, values: False)


class _Counts(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        COUNTER[0] += 1
        return x * 2


class _MakesDirs(nn.Module):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        os.mkdir(self.root / f"call{self.calls}")
        self.calls += 1
        return x * 2


class _Prints(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("forward", len(x))
        return x + 1


def _whys(events: list[dict[str, Any]]) -> list[str]:
    return [e.get("why", e["type"]) for e in events if e["type"] in ("batch-call", "batch-skip")]


def test_a_forked_probe_leaves_the_scripts_globals_as_a_plain_run_has_them(tmp_path: Path) -> None:
    COUNTER[0] = 0
    events = _probed(tmp_path, lambda: [_Counts()(torch.ones(8, 2)) for _ in range(3)])
    assert COUNTER[0] == 3
    assert _whys(events) == ["batch-call"] * 3


def test_a_forked_probe_making_a_directory_is_refused_and_the_call_reported(tmp_path: Path) -> None:
    (tmp_path / "dirs").mkdir()
    events = _probed(tmp_path, lambda: _MakesDirs(tmp_path / "dirs")(torch.ones(8, 2)))
    assert os.listdir(tmp_path / "dirs") == ["call0"]  # the script's own call made it, as under python
    assert _whys(events) == ["side-effects"]
    assert "os.mkdir" in events[0]["detail"]


def test_a_forked_copy_that_ends_without_a_result_fails_the_probe(tmp_path: Path) -> None:
    def dies() -> None:
        os._exit(3)

    with pytest.raises(batchisolation.ProbeFailed, match="exit status 3"):
        batchisolation.in_fork(dies)



def test_a_forked_copy_finds_the_temporary_directory_and_leaves_nothing_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tempfile's first look-up writes a test file and removes it (torch's first `import torch._dynamo`, made
    inside a probed forward, does it): the copy's diverted write must not make the directory look unusable."""
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert batchisolation.in_fork(tempfile.gettempdir) == batchisolation.Isolated(str(tmp_path), None, ())
    assert os.listdir(tmp_path) == []


def test_a_forked_copy_may_not_remove_a_file_it_did_not_write(tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("x")
    found = batchisolation.in_fork(lambda: os.remove(kept))
    assert found.refused == (f"os.remove({kept}, -1)",)


def test_a_forked_copy_writes_to_no_file_the_script_has_open(tmp_path: Path) -> None:
    with (tmp_path / "log.txt").open("w") as log:
        def write() -> None:
            log.write("from the copy\n")
            log.flush()
            with open(tmp_path / "new.txt", "w") as new:
                new.write("from the copy")

        batchisolation.in_fork(write)
        log.write("from the script\n")
    assert (tmp_path / "log.txt").read_text() == "from the script\n"
    assert not (tmp_path / "new.txt").exists()


def test_in_process_a_forward_that_changes_a_global_is_not_probed(tmp_path: Path, in_process: None) -> None:
    COUNTER[0] = 0
    events = _probed(tmp_path, lambda: [_Counts()(torch.ones(8, 2)) for _ in range(2)])
    assert COUNTER[0] == 2
    assert _whys(events) == ["side-effects"] * 2
    assert "changed `COUNTER`" in events[0]["detail"]


def test_in_process_a_forward_that_rebinds_a_global_is_not_probed(tmp_path: Path, in_process: None) -> None:
    module = sys.modules[__name__]
    events = _probed(tmp_path, lambda: _Rebinds()(torch.ones(8, 2)))
    assert _whys(events) == ["side-effects"]
    assert f"changed `REBOUND` in {module.__name__}" in events[0]["detail"]


REBOUND = 0


class _Rebinds(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global REBOUND
        REBOUND += 1
        return x * 2


def test_in_process_a_forward_without_effects_is_probed_and_its_prints_not_repeated(
        tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture[str]) -> None:
    events = _probed(tmp_path, lambda: _Prints()(torch.ones(8, 2)))
    assert _whys(events) == ["batch-call"]
    assert capsys.readouterr().out == "forward 8\n"


def test_in_process_and_forked_probes_find_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)).eval()
    x = torch.randn(256, 64)
    forked = _probed(tmp_path, lambda: model(x))
    monkeypatch.setattr(batchisolation, "forkable", lambda module, values: False)
    (tmp_path / "in").mkdir()
    in_process = _probed(tmp_path / "in", lambda: model(x))
    assert [e["subsets"] for e in forked if e["type"] == "batch-call"] == \
        [e["subsets"] for e in in_process if e["type"] == "batch-call"]


class _Logs(nn.Module):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with open(self.path, "a") as log:
            log.write(f"{len(x)}\n")
        return x * 2


def test_in_process_a_forward_that_writes_a_file_is_not_probed(tmp_path: Path, in_process: None) -> None:
    log = tmp_path / "forward.log"
    events = _probed(tmp_path, lambda: [_Logs(log)(torch.ones(8, 2)) for _ in range(2)])
    assert log.read_text() == "8\n8\n"
    assert _whys(events) == ["side-effects"] * 2
    assert f"opens {log} for writing" in events[0]["detail"]


def test_a_forked_probe_of_a_forward_that_writes_a_file_is_probed_and_writes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "forward.log"
    events = _probed(tmp_path, lambda: [_Logs(log)(torch.ones(8, 2)) for _ in range(2)])
    assert log.read_text() == "8\n8\n"
    assert _whys(events) == ["batch-call"] * 2
