"""drift/drift_html.py: the page plots B's largest difference and A's floor over the steps."""

from __future__ import annotations

from detaudit.drift.change_kinds import CandidateCause
from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_html import render_html
from detaudit.drift.drift_report import DriftReport, FloorSummary, StepFigures


def test_the_page_plots_the_difference_and_the_floor_over_the_steps() -> None:
    report = DriftReport("train.py", [], "run", "within-noise", Configuration("A"), Configuration("B", threads=2),
                         [], [], FloorSummary(10.0, 2, [], 1e-7, 1.0),
                         by_step=[StepFigures(0, 0.0, 1e-7, 0), StepFigures(1, 5e-8, 1e-7, 0)])
    page = render_html(report)
    assert (page.count("data-plot='difference'"), page.count("data-plot='floor'")) == (1, 1)
    assert "data-step='1' data-value='5e-08'" in page


def test_the_page_shows_each_side_s_settings_and_an_unset_one_as_unset() -> None:
    cause = CandidateCause("env LOSS_SCALE", None, "2", "script", "changes what the script computes")
    report = DriftReport("train.py", [], "run", "drift", Configuration("A", threads=1),
                         Configuration("B", {"LOSS_SCALE": "2"}), [], [], FloorSummary(10.0, 2, [], 1e-7, 1.0),
                         causes=[cause])
    page = render_html(report)
    assert "B: <code>LOSS_SCALE=2, device cpu</code>" in page
    assert "<b>env LOSS_SCALE</b>: (unset) -&gt; 2 (script)" in page
