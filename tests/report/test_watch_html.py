"""`detaudit watch --html`: the watch report as a page (detaudit/report/watch_html.py)."""

from __future__ import annotations

from detaudit.compare.baseline_diff import EnvironmentChange
from detaudit.report.watch_html import render_watch_html
from detaudit.report.watch_model import Against, WatchReport, WatchSettings
from detaudit.results import RepeatResult
from detaudit.run.watchlog import Mismatch, Stopped, WatchLog

RESULT = RepeatResult(0, "auto", 1, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
RACE = Mismatch(3, "aten.index_put_.default", "net", "train.py:13", None, 1e-3, 126, "neither")


def stopped_page() -> str:
    log = WatchLog(steps=3, checked_steps=(0, 3), replayed_ops=40, mismatches=(RACE,),
                   stopped=Stopped("torch.save", 3, "ckpt<1>.pt"))
    return render_watch_html(WatchReport("train.py", "run", WatchSettings(), RESULT, log))


def test_the_page_names_the_op_its_line_and_what_the_third_execution_said() -> None:
    page = stopped_page()
    assert "<td>aten.index_put_.default</td><td>net</td><td>train.py:13</td>" in page
    assert "a third agrees with neither" in page


def test_the_page_says_the_checkpoint_was_not_written_escaped() -> None:
    assert "stopped the job at step 3 before torch.save: ckpt&lt;1&gt;.pt was not written" in stopped_page()


def test_the_verdict_is_the_pages_heading() -> None:
    assert ">MISMATCH</span></h1>" in stopped_page()


def test_against_names_the_reference_and_what_changed() -> None:
    against = Against("base", None, Mismatch(0, "0.weight", None, "fit.py:18", None, 0.01, 9, None, "against"),
                      (EnvironmentChange("script arguments", "(none)", "400 0.02"),))
    page = render_watch_html(WatchReport("fit.py", "run", WatchSettings(), RESULT, WatchLog(), against))
    assert "<td>script arguments</td><td>(none)</td><td>400 0.02</td>" in page


def test_a_clean_page_has_no_mismatch_section() -> None:
    clean = RepeatResult(0, "auto", 0, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    page = render_watch_html(WatchReport("fit.py", "run", WatchSettings(), clean, WatchLog(steps=8)))
    assert "<h2>Mismatches</h2>" not in page
