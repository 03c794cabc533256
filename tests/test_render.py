"""Terminal rendering details that the e2e tests don't pin down."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from synthetic import training_records, write_run

from detaudit.audit import load_run
from detaudit.compare import RecordInfo
from detaudit.oprules import OpFinding
from detaudit.render import op_panel


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


def _rendered(report: object) -> str:
    from detaudit.render import render

    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 - devnull, test only
    render(report, console)  # type: ignore[arg-type]
    return console.export_text()


def test_repeats_that_all_failed_alike_are_not_said_to_end_differently(tmp_path: Path) -> None:
    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, recs], exit_codes=[3, 3])
    (run_dir / "repeat-0.stderr").write_text("")  # the script failed without a word
    text = _rendered(load_run(run_dir))
    assert "The script's error" in text and "(no output on stderr)" in text and "ended differently" not in text
    late = write_run(tmp_path / "late", [recs, recs, recs], exit_codes=[0, 1, 1], timed_out=[True, False, False])
    text = _rendered(load_run(late))
    assert "Repeat 1 exited 1" in text and "ended differently" not in text


def test_inconclusive_verdict_line_says_why(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", [[], []])
    text = _rendered(load_run(run_dir))
    assert text.startswith("INCONCLUSIVE: nothing to compare") and "agree bit for bit" not in text
