"""batch/reporting.py, cli/batch_command.py and batch/auditing.py without a subprocess: verdicts, exit codes, JSON,
HTML, the terminal rendering."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from batchcases import ROUNDING, call, origin, spot
from rich.console import Console

from detaudit.audit.pipeline import AuditOptions, Target
from detaudit.batch import auditing as audit_batch
from detaudit.batch.diagnosis import diagnose_batch
from detaudit.batch.finding import analyse
from detaudit.batch.reporting import BatchReport, BatchSettings, render_html, write_json
from detaudit.cli.batch_command import render_batch, summary_line
from detaudit.errors import UsageError
from detaudit.results import RepeatResult


def result(exit_code: int = 0, timed_out: bool = False) -> RepeatResult:
    return RepeatResult(0, "cpu", exit_code, 1.0, timed_out, "batch-0.trace", "batch-0.stdout", "batch-0.stderr", "x")


def report(events: list[dict[str, object]], *results: RepeatResult, run_to_run: str | None = None) -> BatchReport:
    finding = analyse(events)  # type: ignore[arg-type]
    return BatchReport("serve.py", [], "/runs/1", BatchSettings(), list(results or [result()]), finding,
                       diagnose_batch(finding), run_to_run=run_to_run)


VARIANT = [call(ROUNDING), origin(spot("aten.addmm"), spot("fc"))]


def test_verdicts_map_to_the_documented_exit_codes() -> None:
    assert report([call([])]).exit_code == 0
    assert report(VARIANT).exit_code == 1
    assert report([call([])], run_to_run="divergent").exit_code == 1
    assert report([]).exit_code == 6
    assert "never called a module" in (report([]).inconclusive_reason or "")
    assert report(VARIANT, result(1)).verdict == "script-failed"
    assert report(VARIANT, result(1)).exit_code == 3
    assert report(VARIANT, result(None, True)).exit_code == 5  # type: ignore[arg-type]


def test_the_json_form_has_the_issue_fields(tmp_path: Path) -> None:
    write_json(report(VARIANT), tmp_path / "b.json")
    data = json.loads((tmp_path / "b.json").read_text())
    assert (data["format"], data["version"]) == ("detaudit-batch", 2)
    assert data["harness"]["status"] == "fail_batch_invariance_at_7"  # the trace has no `ladder`: every prefix a rung
    assert data["verdict"] == "batch-variant"
    assert data["probed_calls"] == 1
    assert {"size": 1, "agree": False}.items() <= data["subsets"][0].items()
    first = data["first_variant"]
    assert (first["module"], first["op"], first["location"], first["max_ulp"]) == ("fc", "aten.addmm", "model.py:12", 3)
    assert data["causes"][0]["id"] == "batch-matmul"


def test_html_and_terminal_show_the_sizes_the_origin_and_the_cause() -> None:
    page = render_html(report(VARIANT))
    assert "aten.addmm" in page
    assert "batch 1 and 7 differ from 256" in page
    assert "<script" not in page
    out = io.StringIO()
    render_batch(report(VARIANT), Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "first op: aten.addmm" in text
    assert "model.py:12" in text
    assert "cause batch-matmul" in text
    assert summary_line(report([call([])])).endswith("1 call probed")


def test_the_terminal_keeps_batch_invariance_and_run_to_run_determinism_apart() -> None:
    out = io.StringIO()
    render_batch(report([call([])]), Console(file=out, width=300, color_system=None))
    assert ("batch-invariant (a row's result independent of the rest of its batch): batch-invariant; deterministic "
            "(the same inputs at the same shape, run to run): not checked with one repeat") in out.getvalue()


def test_a_missing_script_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        audit_batch.run_batch(AuditOptions(Target(tmp_path / "nope.py"), out_dir=tmp_path / "out"), BatchSettings())
    assert not (tmp_path / "out").exists()


def test_report_on_a_batch_run_directory_points_at_its_report(tmp_path: Path) -> None:
    from detaudit.errors import TraceError
    from detaudit.run.rundir import BATCH_FILE, read_run

    write_json(report(VARIANT), tmp_path / BATCH_FILE)
    with pytest.raises(TraceError, match="a `detaudit batch` run"):
        read_run(tmp_path)


TOKEN = {"type": "token", "at": 0, "fn": "Tensor.argmax", "loc": "decode.py:9", "site": "decode.py:9", "n": 0,
         "rows": 2, "ids": [7, 3], "top2": [[2.5, 2.25], [1.0, 0.5]]}
DECODED = [{**call(ROUNDING), "rows": 2, "choice": {"output": "output", "ids": [7, 3], "top2": TOKEN["top2"],
                                                    "flips": [{"subset": "prefix", "size": 1, "row": 0, "other": 9}]}},
           origin(spot("aten.addmm")), TOKEN]


def test_the_json_gives_the_first_divergent_token_with_its_size_and_op(tmp_path: Path) -> None:
    write_json(report(DECODED), tmp_path / "b.json")
    tokens = json.loads((tmp_path / "b.json").read_text())["tokens"]
    assert ({k: tokens["first"][k] for k in ("sequence", "position", "size", "token", "other", "margin")},
            tokens["op"]) == ({"sequence": 0, "position": 0, "size": 1, "token": 7, "other": 9, "margin": 0.25},
                              "aten.addmm")


def test_a_script_that_decodes_nothing_has_null_tokens(tmp_path: Path) -> None:
    write_json(report(VARIANT), tmp_path / "b.json")
    assert json.loads((tmp_path / "b.json").read_text())["tokens"] is None


def test_the_terminal_and_html_name_the_first_divergent_token() -> None:
    out = io.StringIO()
    render_batch(report(DECODED), Console(file=out, width=300, color_system=None))
    assert ("first divergent token: sequence 0 at position 0 (decode.py:9): 7 in the whole batch, 9 in a batch of 1 "
            "(margin 0.25); starts at aten.addmm (model.py:12)") in out.getvalue()
    assert "First divergent token" in render_html(report(DECODED))
