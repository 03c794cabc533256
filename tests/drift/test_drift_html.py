"""drift/drift_html.py: the page plots B's largest difference and A's floor over the steps."""

from __future__ import annotations

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
