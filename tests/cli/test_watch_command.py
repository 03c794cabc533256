"""`detaudit watch`'s rendering (detaudit/cli/watch_command.py)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from detaudit.cli.watch_command import CadenceType, render_watch, summary_line, watch
from detaudit.report.watch_model import Against, Cadence, WatchReport, WatchSettings
from detaudit.results import RepeatResult
from detaudit.run.watchlog import Mismatch, Stopped, WatchLog


def test_a_stopped_mismatch_names_the_op_its_line_and_the_checkpoint_not_written() -> None:
    log = WatchLog(steps=3, checked_steps=(0, 3), mismatches=(
        Mismatch(3, "aten.index_put_.default", "net", "train.py:13", None, 1e-3, 126, "neither"),),
        stopped=Stopped("torch.save", 3, "ckpt.pt"))
    result = RepeatResult(0, "auto", 1, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    console = Console(record=True, width=200)
    render_watch(WatchReport("train.py", "run", WatchSettings(), result, log), console)
    text = console.export_text()
    assert "mismatch (replay) at step 3: aten.index_put_.default in net at train.py:13: max |diff| 0.001, 126 ULP" \
        in text
    assert "a third agrees with neither" in text
    assert "stopped the job at step 3 before torch.save: ckpt.pt was not written" in text
    assert "mismatch: 3 steps, 1 checked and the ops after the last, 1 mismatch; stopped before torch.save" in text


def test_a_run_that_differs_from_its_reference_at_step_0_agreed_on_no_step() -> None:
    differs = Mismatch(0, "0.weight", "", "train.py:31", None, 1e-4, 10, None, check="against")
    log = WatchLog(steps=2, checked_steps=(0,), mismatches=(differs,))
    result = RepeatResult(0, "auto", 1, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    console = Console(record=True, width=200)
    render_watch(WatchReport("train.py", "run", WatchSettings(), result, log, against=Against("base", None, differs)),
                 console)
    assert "against base: differs (agreed on no step)" in console.export_text()


def test_a_script_that_failed_without_a_mismatch_is_not_called_clean() -> None:
    result = RepeatResult(0, "auto", 1, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    report = WatchReport("train.py", "run", WatchSettings(), result, WatchLog(steps=0, checked_steps=(0,)))
    assert summary_line(report).startswith(
        "[bold yellow]script failed[/]: 0 steps, the whole run checked, 0 mismatches")


def test_status_every_takes_steps_or_seconds() -> None:
    parse = CadenceType().convert
    assert (parse("100", None, None), parse("30s", None, None)) == (Cadence(100), Cadence(30.0, "seconds"))


def test_status_every_refuses_what_is_no_count() -> None:
    with pytest.raises(click.BadParameter):
        CadenceType().convert("soon", None, None)


def test_a_report_into_standard_output_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('mine')\n")
    result = CliRunner().invoke(watch, [str(script), "--json", "-"])
    assert result.exit_code == 2


def _compiled_clean() -> WatchReport:
    result = RepeatResult(0, "auto", 0, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    return WatchReport("train.py", "run", WatchSettings(), result, WatchLog(steps=2, checked_steps=(0, 1)),
                       compiled=("TransformerEncoder",))


def test_a_compiled_model_s_summary_says_its_regions_were_not_checked() -> None:
    assert summary_line(_compiled_clean()).endswith("; compiled regions not checked")


def test_a_compiled_model_is_named_with_what_checks_it() -> None:
    console = Console(record=True, width=200)
    render_watch(_compiled_clean(), console)
    assert "compiled regions ran unreplayed (TransformerEncoder)" in console.export_text()


def test_a_script_with_no_optimizer_is_told_each_backward_ended_a_step() -> None:
    result = RepeatResult(0, "auto", 0, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    console = Console(record=True, width=200)
    render_watch(WatchReport("train.py", "run", WatchSettings(), result,
                             WatchLog(steps=3, checked_steps=(0,), boundary="backward")), console)
    assert "steps: each backward() (no optimizer was made before the first backward)" in console.export_text()
