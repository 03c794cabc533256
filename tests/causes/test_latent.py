"""Latent findings (detaudit/causes/latent.py): deterministic on this CPU, not on CUDA; and how the report
shows them beside the versions every trace records."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console
from synthetic import training_records, write_run

from detaudit.audit.pipeline import load_run
from detaudit.causes.context import RepeatEvidence
from detaudit.causes.latent import latent_findings, recorded_versions
from detaudit.cli.render import render
from detaudit.events import Event
from detaudit.report.html import render_html
from detaudit.report.model import report_json
from detaudit.results import RepeatResult

ENVIRONMENT = {"type": "environment", "python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "2.1.0", "cuda": None,
               "cudnn": None, "driver": None, "cpu": "x86", "machine": "x86_64", "os": "Linux", "device_request": "cpu",
               "device": "cpu", "env": {}, "git": None}
DEFAULT_FLAGS = {"cudnn.benchmark": False, "cudnn.deterministic": False, "cudnn.enabled": True,
                 "cudnn.allow_tf32": True, "matmul.allow_tf32": False, "float32_matmul_precision": "highest"}
CONV = {"type": "modules", "root": "Net", "device": "cpu", "listed": [],
        "matmul": [{"module": "conv1", "class": "Conv2d"}]}


def state(**flags: Any) -> dict[str, Any]:
    return {"type": "state", "when": "first-forward", "rng": {}, "flags": {**DEFAULT_FLAGS, **flags}}


def flag(name: str, value: str) -> dict[str, Any]:
    return {"type": "flag", "flag": name, "value": value, "loc": "train.py:4", "by": "train.py:4"}


def evidence(*events: dict[str, Any], device: str = "cpu") -> RepeatEvidence:
    return RepeatEvidence(0, device, Path("t"), events=[cast(Event, e) for e in ({**ENVIRONMENT, "device": device},
                                                                                 *events)])


RUNS = [RepeatResult(i, "cpu", 0, 1.0, False, f"repeat-{i}.trace", "", "", "") for i in range(2)]


@pytest.mark.parametrize(("events", "found"), [
    ((state(), CONV), []),  # torch's defaults (cudnn.allow_tf32 is on by default: not the script's doing)
    ((flag("cudnn.benchmark", "True"), state(**{"cudnn.benchmark": True}), CONV), ["cudnn-benchmark"]),
    # benchmark with no convolution to tune, or with cudnn.deterministic on: nothing latent
    ((state(**{"cudnn.benchmark": True}), {**CONV, "matmul": []}), []),
    ((state(**{"cudnn.benchmark": True, "cudnn.deterministic": True}), CONV), []),
    ((flag("matmul.allow_tf32", "True"), state(**{"matmul.allow_tf32": True})), ["tf32"]),
    ((state(float32_matmul_precision="high"),), ["tf32"]),
    ((flag("cudnn.allow_tf32", "True"), state()), ["tf32"]),
    (({"type": "latent-op", "op": "index_add_", "entry": "torch.Tensor.index_add_() when called on CUDA tensor",
       "phase": "forward", "loc": "train.py:9", "deterministic": False}, state()), ["nondeterministic-op"]),
    (({"type": "latent-op", "op": "index_add_", "entry": "...", "phase": "forward", "loc": "train.py:9",
       "deterministic": True}, state()), []),  # CUDA would use a deterministic kernel (or raise)
])
def test_settings_deterministic_here_and_not_on_cuda(events: tuple[dict[str, Any], ...], found: list[str]) -> None:
    latent = latent_findings(evidence(*events), RUNS)
    assert [x.id for x in latent] == found
    for x in latent:
        assert "deterministic here (CPU); on CUDA it is not" in x.summary
        assert x.evidence
        assert x.fix


def test_a_run_on_cuda_gets_causes_not_latent_findings() -> None:
    events = (state(**{"cudnn.benchmark": True}), CONV)
    assert latent_findings(evidence(*events, device="cuda"), RUNS) == []
    assert latent_findings(evidence(*events), [RUNS[0], RepeatResult(1, "cuda", 0, 1.0, False, "t", "", "", "")]) == []


def test_the_versions_every_trace_records() -> None:
    assert recorded_versions(evidence()) == {"torch": "2.13.0+cpu", "numpy": "2.1.0", "cuda": None, "cudnn": None,
                                             "driver": None}
    assert recorded_versions(RepeatEvidence(0, "cpu", Path("t"))) == {}


def test_terminal_json_and_html_show_latent_findings_and_versions(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    events = [(0, ENVIRONMENT), (0, flag("cudnn.benchmark", "True")), (0, CONV),
              (0, state(**{"cudnn.benchmark": True}))]
    report = load_run(write_run(tmp_path / "run", [recs, recs], events=events))
    assert report.verdict == "deterministic"
    assert [x.id for x in report.latent] == ["cudnn-benchmark"]
    data = report_json(report)
    assert data["latent"][0]["id"] == "cudnn-benchmark"
    assert "convolutions: conv1 (Conv2d)" in data["latent"][0]["evidence"]
    assert {k: data["environment"][k] for k in ("torch", "numpy", "cuda")} == \
        {"torch": "2.13.0+cpu", "numpy": "2.1.0", "cuda": None}
    page = render_html(report)
    assert "Latent: deterministic in these repeats" in page
    assert "torch.backends.cudnn.benchmark = True" in page
    assert "<th>torch</th><td>2.13.0+cpu</td>" in page
    assert "<th>cuda</th><td>none</td>" in page
    out = io.StringIO()
    render(report, Console(file=out, width=200))
    assert "Latent — deterministic in these repeats" in out.getvalue()
    assert "cudnn-benchmark" in out.getvalue()


def draw(loc: str, thread: str | None, fn: str = "torch.randn", **more: Any) -> dict[str, Any]:
    event = {"type": "draw", "lib": "torch", "fn": fn, "loc": loc, "generator": "global", "device": "cpu", **more}
    return event if thread is None else {**event, "thread": thread}


PREFETCH_START = {"type": "concurrency", "what": "threading.Thread.start", "loc": "train.py:21", "target": "prefetch"}
PREFETCH_RACE = (PREFETCH_START, draw("train.py:15", "prefetch"), draw("train.py:26", "MainThread", "Tensor.uniform_"))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_thread_drawing_from_the_rng_the_main_thread_draws_from_is_latent_on_any_device(device: str) -> None:
    runs = [RepeatResult(i, device, 0, 1.0, False, f"repeat-{i}.trace", "", "", "") for i in range(2)]
    assert [x.id for x in latent_findings(evidence(*PREFETCH_RACE, device=device), runs)] == ["concurrency"]


def test_a_thread_race_names_the_start_and_both_draws() -> None:
    [race] = latent_findings(evidence(*PREFETCH_RACE), RUNS)
    assert race.evidence == ["thread `prefetch` (started at train.py:21) draws torch.randn at train.py:15 from torch's "
                             "global RNG, which the main thread draws from at train.py:26 (Tensor.uniform_) while a "
                             "thread it started runs"]


@pytest.mark.parametrize("main", [
    draw("train.py:26", None),  # the main thread drew only when no thread ran
    draw("train.py:26", "MainThread", generator="explicit", obj=1),  # from its own Generator
    draw("train.py:26", "MainThread", lib="numpy"),  # from another library's RNG
])
def test_draws_from_another_rng_or_at_another_time_are_no_race(main: dict[str, Any]) -> None:
    events = (PREFETCH_START, draw("train.py:15", "prefetch"), main)
    assert latent_findings(evidence(*events), RUNS) == []
