"""recorder/full_values.py: the recorder keeps every element of exactly the records its config names (drift's
re-recording), writes the same trace as the plain Recorder, and is the plain Recorder when it names none."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from detaudit.recorder.boundary import HostGroup
from detaudit.recorder.core import Recorder
from detaudit.recorder.full_values import KeepingRecorder, recorder_for
from detaudit.trace import Kind, TraceWriter, read_trace
from detaudit.trace.values import ValuesKey, read_values

WANTED = [[1, "output", "fc", 1, 0], [1, "param", "fc.bias", 0, 0], [1, "output", "fc", 0, 1]]  # last: rank 1's


def recorded(tmp_path: Path, wanted: list[list[object]]) -> Path:
    """Two steps, each: `fc` called twice (two outputs), then the optimizer boundary's parameter group."""
    trace = tmp_path / "a-0.trace"
    rec = recorder_for(TraceWriter(trace, {"repeat": 0}), {"full_values": wanted}, trace)
    group = HostGroup([Kind.PARAM], [rec.intern("fc.bias")], fresh=False)
    for step in range(2):
        for call in range(2):
            rec.record_tensor(Kind.OUTPUT, rec.intern("fc"), torch.arange(6.0).reshape(2, 3) * (10 * step + call))
        rec.record_group(group, [torch.full((3,), float(step))], 0)
        rec.end_step()
    rec.close({"exit_code": 0})
    return trace


def test_a_config_naming_no_record_gets_the_plain_recorder(tmp_path: Path) -> None:
    trace = tmp_path / "a-0.trace"
    assert type(recorder_for(TraceWriter(trace, {"repeat": 0}), {}, trace)) is Recorder


def test_exactly_the_named_records_of_this_rank_are_kept(tmp_path: Path) -> None:
    kept = read_values(recorded(tmp_path, WANTED).with_suffix(".values"))
    assert set(kept) == {ValuesKey(1, "output", "fc", 1, 0), ValuesKey(1, "param", "fc.bias", 0, 0)}


def test_the_named_occurrence_s_elements_are_kept(tmp_path: Path) -> None:
    kept = read_values(recorded(tmp_path, WANTED).with_suffix(".values"))[ValuesKey(1, "output", "fc", 1, 0)]
    assert (kept.head.shape, kept.as_float64().tolist()) == (  # type: ignore[union-attr]
        [2, 3], (np.arange(6.0) * 11).tolist())


def test_a_parameter_of_the_optimizer_boundary_is_kept(tmp_path: Path) -> None:
    kept = read_values(recorded(tmp_path, WANTED).with_suffix(".values"))[ValuesKey(1, "param", "fc.bias", 0, 0)]
    assert kept.as_float64().tolist() == [1.0, 1.0, 1.0]  # type: ignore[union-attr]


def test_keeping_records_writes_the_trace_the_plain_recorder_writes(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "keeping").mkdir()
    plain, keeping = (read_trace(recorded(tmp_path / sub, wanted)).records
                      for sub, wanted in (("plain", []), ("keeping", WANTED)))
    assert (keeping["digest"].tolist(), keeping["step"].tolist()) == (plain["digest"].tolist(), plain["step"].tolist())


def test_a_keeping_recorder_is_installed_when_records_are_named(tmp_path: Path) -> None:
    trace = tmp_path / "a-0.trace"
    assert isinstance(recorder_for(TraceWriter(trace, {"repeat": 0}), {"full_values": WANTED}, trace),
                      KeepingRecorder)
