"""Terminal rendering details that the e2e tests don't pin down."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from synthetic import training_records, write_run

from detaudit.audit import load_run
from detaudit.causes.context import finding
from detaudit.compare import RecordInfo
from detaudit.oprules import OpFinding
from detaudit.render import op_panel, verdict_line


def _record(kind: str, name: str, op: str = "") -> RecordInfo:
    return RecordInfo(index=4, kind=kind, name=name, module="Net", location="train.py:21", step=0, shape="4x4",
                      dtype="float32", op=op, backward=False)


def test_data_that_entered_from_outside_torch_gets_a_note_not_an_op_table() -> None:
    finding = OpFinding(verdict="inputs-differ", record=_record("op", "aten.addmm.default", op="aten.addmm.default"),
                        repeats=[1], reference=0, origin=_record("input", "Net.input[0]"), window=[0, 0],
                        traces="ops")
    report = SimpleNamespace(first_divergence=SimpleNamespace(op_finding=finding))
    console = Console(record=True, width=200)
    panel = op_panel(report)  # type: ignore[arg-type]
    assert panel is not None
    console.print(panel)
    text = console.export_text()
    assert "No op recorded in steps 0–0 produced the differing data" in text
    assert "Net.input[0] (train.py:21)" in text and "aten.addmm.default" in text
    assert "phase" not in text  # no input/output match table


def test_an_environment_change_is_not_called_nondeterminism(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    report = load_run(write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]]))
    report.causes = [finding("environment-change", 0.9, "the environment changed between the recordings "
                             "(torch, GPU): a difference between setups", [], "fix", basis="direct").cause]
    line = verdict_line(report).plain
    assert line.startswith("DIVERGENT: the environment changed between the recordings")
    assert "(torch, GPU differ)" in line
