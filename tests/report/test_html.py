"""The HTML report (detaudit/report/html.py): one self-contained file whose plots hold the JSON's numbers."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from synthetic import training_records, write_run

from detaudit.audit.pipeline import load_run
from detaudit.compare import baseline_diff
from detaudit.compare.traces import ROOT_MODULE, StepSpread
from detaudit.report import baseline
from detaudit.report.html import heat_strip_svg, render_html
from detaudit.report.model import report_json
from detaudit.run.rundir import read_run
from detaudit.trace import Flag

_VOID = {"meta", "br", "img", "input", "link", "hr", "circle", "line", "polyline", "rect"}


class Page(HTMLParser):
    """Every element with its attributes, and a check that elements nest and close properly."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.stack: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        assert self.stack, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        assert self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def plot(self, name: str, tag: str) -> list[dict[str, str]]:
        """The data points of one plot, in document order."""
        inside, points = False, []
        for t, attrs in self.elements:
            if t == "svg":
                inside = attrs.get("data-plot") == name
            elif inside and t == tag:
                points.append(attrs)
        return points


def plotted(page: Page, name: str) -> dict[int, float]:
    """step -> value of a series: its plot's points, or the one sentence that says it is constant."""
    constant = [a for tag, a in page.elements if tag == "p" and a.get("data-constant") == name]
    if constant:
        return {int(step): float(constant[0]["data-value"]) for step in constant[0]["data-steps"].split()}
    return {int(p["data-step"]): float(p["data-value"]) for p in page.plot(name, "circle")}


def check_page(text: str, data: dict[str, Any]) -> Page:
    """Parses, loads nothing from outside, and its plots hold the numbers of the JSON report."""
    page = Page(text)
    assert page.stack == [], f"unclosed elements: {page.stack}"
    assert not re.search(r"https?://|//cdn|<script|<link|@import|url\(", text, re.I)
    for _, attrs in page.elements:
        for key in ("src", "href"):
            assert key not in attrs or attrs[key].startswith("#"), attrs
    steps = [s for s in data["spread"]["by_step"] if s["differing"]]
    if not steps and data.get("baseline"):
        steps = [s for s in data["baseline"]["by_step"] if s["differing"]]
    peaks = plotted(page, "max-abs-diff")
    assert peaks == {s["step"]: s["max_abs_diff"] for s in steps if s["max_abs_diff"] is not None}
    counts = plotted(page, "differing")
    assert counts == {s["step"]: s["differing"] for s in steps}
    cells = {(int(c["data-step"]), c["data-module"]): int(c["data-count"]) for c in page.plot("modules", "rect")
             if "data-count" in c}
    assert cells == {(s["step"], m): n for s in steps for m, n in s["modules"].items()}
    return page


def test_synthetic_divergence_report(tmp_path: Path) -> None:
    ref = training_records(steps=4)
    other = [r.but(digest=r.digest + 1, samples=tuple(x * 1.5 for x in r.samples)) if r.step >= 2 else r
             for r in ref]
    report = load_run(write_run(tmp_path / "run", [ref, other]))
    data = report_json(report)
    page = check_page(render_html(report), data)
    text = " ".join(page.text)
    assert "DIVERGENT" in text
    assert "First divergence" in text
    assert "Repeats" in text
    # the same number of records differs at every step from step 2: that count is a sentence, not a plot
    assert {attrs.get("data-plot") for tag, attrs in page.elements if tag == "svg"} == {"max-abs-diff", "modules"}
    assert {attrs.get("data-constant") for tag, attrs in page.elements if tag == "p"} >= {"differing"}
    modules = {c["data-module"] for c in page.plot("modules", "rect") if "data-module" in c}
    assert modules == {"net.0", "net.1"}


def test_deterministic_report_has_no_plots(tmp_path: Path) -> None:
    ref = training_records(steps=2)
    report = load_run(write_run(tmp_path / "run", [ref, ref]))
    page = check_page(render_html(report), report_json(report))
    assert not any(tag == "svg" for tag, _ in page.elements)
    assert "DETERMINISTIC" in " ".join(page.text)


def test_user_text_is_escaped(tmp_path: Path) -> None:
    ref = training_records(steps=1)
    ref[0] = ref[0].but(name="<script>alert(1)</script>", module="<b>")
    report = load_run(write_run(tmp_path / "run", [ref, [r.but(digest=r.digest + 1) for r in ref]]))
    data = report_json(report)
    text = render_html(report)
    assert "<script>" not in text
    assert "&lt;script&gt;" in text
    check_page(text, data)


@pytest.mark.process
@pytest.mark.slow
def test_html_of_the_demo_run(tmp_path: Path) -> None:
    """The bundled demo, audited as `detaudit demo` does (without --explain): HTML from run, report, compare."""
    demo = Path(str(resources.files("detaudit") / "demo" / "train_demo.py"))
    result = run_cli(["run", str(demo), "-n", "2", "--out", "run", "--json", "run.json", "--html", "run.html"],
                     cwd=tmp_path)
    assert result.returncode == 1, result.output
    data = json.loads((tmp_path / "run.json").read_text())
    page = check_page((tmp_path / "run.html").read_text(), data)
    text = " ".join(page.text)
    for heading in ("Repeats", "First divergence", "The op behind it", "How the divergence spreads",
                    "Likely causes", "unseeded-numpy-rng", "Environment"):
        assert heading in text, heading
    assert len(plotted(page, "max-abs-diff")) == len([s for s in data["spread"]["by_step"] if s["differing"]])

    again = run_cli(["report", "run", "--html", "report.html", "--json", "report.json"], cwd=tmp_path)
    assert again.returncode == 1
    check_page((tmp_path / "report.html").read_text(), json.loads((tmp_path / "report.json").read_text()))
    compared = run_cli(["compare", "run/repeat-0.trace", "run/repeat-1.trace", "--html", "compare.html",
                        "--json", "compare.json"], cwd=tmp_path)
    assert compared.returncode == 1
    check_page((tmp_path / "compare.html").read_text(), json.loads((tmp_path / "compare.json").read_text()))


def test_baseline_section_and_its_spread(tmp_path: Path) -> None:
    """Repeats that agree but differ from a baseline: the plots show the spread from the baseline."""
    recs = training_records(steps=3)
    first = write_run(tmp_path / "first", [recs, recs])
    saved = baseline.save(first, load_run(first), tmp_path / "base")
    moved = [r.but(digest=r.digest + 7, samples=tuple(x + 0.5 for x in r.samples)) if r.step >= 1 else r
             for r in recs]
    later = write_run(tmp_path / "later", [moved, moved])
    record, results = read_run(later)
    record = replace(record, environment=replace(record.environment, cpu_count=64))
    report = load_run(later)
    report = replace(report, baseline=baseline_diff.check(baseline.load(saved), later, record, results))
    data = report_json(report)
    assert data["verdict"] == "deterministic"
    assert data["exit_code"] == 1
    page = check_page(render_html(report), data)
    text = " ".join(page.text)
    assert "from the baseline" in text
    assert "differs" in text
    assert "cpu_count" in text
    assert set(plotted(page, "differing")) == {1, 2}


def test_heat_strip_groups_long_runs_into_cells() -> None:
    steps = [StepSpread(s, 4, 2, 1.0, {"fc": 2}) for s in range(900)]
    page = Page(heat_strip_svg(steps))
    cells = [c for tag, c in page.elements if tag == "rect" and "data-count" in c]
    assert len(cells) == 300
    assert {c["data-steps"] for c in cells} == {"3"}
    assert sum(int(c["data-count"]) for c in cells) == 2 * 900  # every differing record is counted once


def test_a_constant_series_is_a_sentence_not_a_flat_line_on_a_log_axis(tmp_path: Path) -> None:
    ref = training_records(steps=4)
    other = [r.but(digest=r.digest + 1, samples=(r.samples[0] + 0.5, *r.samples[1:])) if r.name == "net.1" else r
             for r in ref]
    report = load_run(write_run(tmp_path / "run", [ref, other]))
    page = check_page(render_html(report), report_json(report))
    assert "max-abs-diff" not in {attrs.get("data-plot") for tag, attrs in page.elements if tag == "svg"}
    assert "max |diff|: constant 0.5 at every differing step" in " ".join(page.text)


def test_the_root_modules_own_parameters_are_labelled_as_parameters() -> None:
    steps = [StepSpread(0, 2, 2, 1.0, {ROOT_MODULE: 2})]
    page = Page(heat_strip_svg(steps))
    assert "parameters of the root module" in page.text


def test_a_candidate_not_ruled_out_is_listed_apart_from_the_causes(tmp_path: Path) -> None:
    from detaudit.pin import Pin
    from detaudit.results import Cause

    report = load_run(write_run(tmp_path / "run", [training_records(steps=1)] * 2))
    candidate = Cause("object-order", "possible", "a set's order", [], "sort it", [Pin.ADDRESS_LAYOUT], "no-evidence")
    text = " ".join(check_page(render_html(replace(report, not_ruled_out=[candidate])), report_json(report)).text)
    assert "Not ruled out" in text


def test_randomness_that_repeats_has_a_section(tmp_path: Path) -> None:
    from detaudit.causes.repetition import RepeatedRandomness

    report = load_run(write_run(tmp_path / "run", [training_records(steps=1)] * 2))
    found = RepeatedRandomness("data.py:31", "workers", "data.py:12", ["workers 0 and 1 drew alike"], "seed per worker")
    text = " ".join(check_page(render_html(replace(report, repeated_randomness=[found])), report_json(report)).text)
    assert "Randomness that repeats" in text


def test_the_summary_says_how_many_compared_records_had_no_contents(tmp_path: Path) -> None:
    """Records compared by dtype and shape only (vmapped, meta tensors) are counted apart (issue 45)."""
    recs = [r.but(flags=int(Flag.NO_DATA)) if i % 2 else r for i, r in enumerate(training_records(2))]
    page = render_html(load_run(write_run(tmp_path / "run", [recs, recs])))
    assert "0 of 12 aligned records differ (6 of them compared by dtype and shape only)." in page
