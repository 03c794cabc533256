"""The Report: verdict and exit code rules, the documented JSON schema, and well-formed JUnit XML.
Built from synthetic run directories through audit.load_run, as `detaudit report` does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from rich.console import Console
from synthetic import Rec, training_records, write_run, write_trace

from detaudit.audit.pipeline import load_run
from detaudit.cli.render import render
from detaudit.compare.tokens import TokenComparison, TokenDivergence
from detaudit.report.html import render_html
from detaudit.report.junit import to_junit, write_junit
from detaudit.report.model import SCHEMA_NAME, SCHEMA_VERSION, Report, report_json, write_json
from detaudit.trace import Flag

DIVERGENCE_KEYS = {"index", "category", "kind", "name", "module", "op", "step", "location", "repeats",
                   "max_abs_diff", "max_ulp_diff", "reference", "detail", "shape", "dtype", "phase"}
RUN_KEYS = {"repeat", "device", "exit_code", "duration_s", "records", "trace", "timed_out", "complete",
            "stdout", "stderr"}
CAUSE_KEYS = {"id", "confidence", "summary", "evidence", "fix"}


def _strict_json(report: Report, tmp_path: Path) -> dict[str, Any]:
    """Written and read back as strict JSON (NaN or Infinity would be invalid)."""
    path = tmp_path / "out" / "report.json"
    write_json(report, path)

    def refuse(token: str) -> None:
        raise AssertionError(f"non-standard JSON constant {token}")

    data: dict[str, Any] = json.loads(path.read_text(), parse_constant=refuse)
    return data


def _divergent_run(tmp_path: Path, name: str = "net.1") -> Report:
    recs = training_records(steps=3)
    other = list(recs)
    k = next(i for i, r in enumerate(recs) if r.name == name and r.step == 1)
    other[k] = other[k].but(digest=1, samples=(other[k].samples[0] + 0.5, *other[k].samples[1:]))
    return load_run(write_run(tmp_path / "run", [recs, recs, other]))


def test_deterministic_report(tmp_path: Path) -> None:
    recs = training_records()
    report = load_run(write_run(tmp_path / "run", [recs, recs, recs]))
    assert report.verdict == "deterministic"
    assert report.exit_code == 0
    data = _strict_json(report, tmp_path)
    assert data["schema"] == SCHEMA_NAME == "detaudit-report"
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["verdict"] == "deterministic"
    assert data["exit_code"] == 0
    assert data["first_divergence"] is None
    assert data["causes"] == []
    assert isinstance(data["environment"], dict)
    assert data["environment"]
    assert len(data["runs"]) == 3
    for i, run in enumerate(data["runs"]):
        assert set(run) >= RUN_KEYS
        assert run["repeat"] == i
        assert run["device"] == "cpu"
        assert run["exit_code"] == 0
        assert run["records"] == len(recs)
        assert run["complete"] is True
        assert run["trace"] == f"repeat-{i}.trace"
        assert isinstance(run["duration_s"], float)
    assert data["spread"]["records_compared"] == len(recs)
    assert data["spread"]["records_differing"] == 0


def test_divergent_report_fields(tmp_path: Path) -> None:
    report = _divergent_run(tmp_path)
    assert report.verdict == "divergent"
    assert report.exit_code == 1
    data = _strict_json(report, tmp_path)
    first = data["first_divergence"]
    assert set(first) >= DIVERGENCE_KEYS
    assert first["category"] == "content"
    assert first["kind"] == "output"
    assert first["name"] == "net.1"
    assert first["module"] == "net.1"
    assert first["op"] is None
    assert first["step"] == 1
    assert first["location"] == "train.py:10"
    assert first["repeats"] == [2]
    assert first["reference"] == 0
    assert first["max_abs_diff"] == pytest.approx(0.5)
    assert first["max_ulp_diff"] > 0
    assert all(set(c) >= CAUSE_KEYS for c in data["causes"])
    steps = {s["step"]: s for s in data["spread"]["by_step"]}
    assert steps[1]["differing"] == 1
    assert steps[0]["differing"] == 0
    assert steps[0]["max_abs_diff"] is None


def test_every_repeat_failing_is_failed_with_the_error(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    report = load_run(write_run(tmp_path / "run", [recs, recs], exit_codes=[1, 1]))
    assert report.verdict == "failed"
    assert report.exit_code == 3
    data = _strict_json(report, tmp_path)
    assert data["verdict"] == "failed"
    assert "RuntimeError: boom" in data["failure"]


@pytest.mark.parametrize("seen_at, verdict, words", [(8, "deterministic", ""), (None, "inconclusive", "not at all"),
                                                      (3, "inconclusive", "diverged on its own")])
def test_agreement_that_a_failed_self_check_puts_in_doubt_is_inconclusive(
        tmp_path: Path, seen_at: int | None, verdict: str, words: str) -> None:
    recs = training_records(steps=4)
    run_dir = write_run(tmp_path / "run", [recs, recs])
    record = json.loads((run_dir / "run.json").read_text())
    record["self_check"] = {"record": 8, "step": 1, "name": recs[8].name, "detected_at": seen_at}
    (run_dir / "run.json").write_text(json.dumps(record))
    report = load_run(run_dir)
    assert report.verdict == verdict
    assert report.exit_code == (0 if verdict == "deterministic" else 6)
    assert words in report.inconclusive_reason
    assert (words == "") == (report.inconclusive_reason == "")
    assert _strict_json(report, tmp_path)["match"]["self_check"]["passed"] is (seen_at == 8)


@pytest.mark.parametrize("contentless", ["all", "some"])
def test_agreement_on_content_less_records_only_is_inconclusive(tmp_path: Path, contentless: str) -> None:
    """Meta or unreadable tensors (NO_DATA: dtype and shape only) agree whatever the values were."""
    recs = [r.but(flags=int(Flag.NO_DATA)) if contentless == "all" or i % 2 else r
            for i, r in enumerate(training_records(steps=2))]
    report = load_run(write_run(tmp_path / "run", [recs, recs]))
    data = _strict_json(report, tmp_path)
    if contentless == "some":
        assert report.verdict == "deterministic"
        assert report.exit_code == 0
        assert data["match"]["records_without_contents"] == len(recs) // 2
        assert data["match"]["records_by_content"] == len(recs) - len(recs) // 2
        return
    assert report.verdict == "inconclusive"
    assert report.exit_code == 6
    assert f"every one of the {len(recs)} compared records is content-less" in report.inconclusive_reason
    assert data["match"]["records_without_contents"] == len(recs)
    assert data["verdict"] == "inconclusive"


def test_agreement_a_self_check_could_not_test_is_inconclusive(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, recs])
    record = json.loads((run_dir / "run.json").read_text())
    record["self_check"] = {"record": None, "step": None, "name": None, "detected_at": None,
                            "not_run": "no recorded tensor could carry the one-ULP change"}
    (run_dir / "run.json").write_text(json.dumps(record))
    report = load_run(run_dir)
    assert report.verdict == "inconclusive"
    assert report.exit_code == 6
    assert report.inconclusive_reason.startswith("--self-check could not make its negative control: no recorded")
    check = _strict_json(report, tmp_path)["match"]["self_check"]
    assert check["passed"] is False
    assert check["not_run"].startswith("no recorded tensor")


def test_some_repeats_failing_is_an_outcome_divergence(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    report = load_run(write_run(tmp_path / "run", [recs, recs[:7], recs], exit_codes=[0, 1, 0]))
    assert report.verdict == "divergent"
    assert report.exit_code == 1
    first = report_json(report)["first_divergence"]
    assert first["category"] == "outcome"
    assert first["repeats"] == [1]
    assert first["index"] == 7


def test_same_records_other_stdout_is_an_outcome_divergence(tmp_path: Path) -> None:
    recs = training_records()
    report = load_run(write_run(tmp_path / "run", [recs, recs], stdout=["loss 0.1\n", "loss 0.2\n"]))
    first = report_json(report)["first_divergence"]
    assert report.exit_code == 1
    assert first["category"] == "outcome"
    assert first["kind"] == "stdout"
    assert first["index"] == -1
    assert first["repeats"] == [1]


def test_timeout_exit_code_and_incomplete_run(tmp_path: Path) -> None:
    recs = training_records()
    report = load_run(write_run(tmp_path / "run", [recs, recs[:4]], exit_codes=[0, -15], timed_out=[False, True]))
    assert report.exit_code == 5
    data = _strict_json(report, tmp_path)
    assert [r["timed_out"] for r in data["runs"]] == [False, True]
    assert [r["complete"] for r in data["runs"]] == [True, False]
    assert data["runs"][1]["records"] == 4


def test_nan_and_inf_samples_never_reach_json(tmp_path: Path) -> None:
    nan, inf = float("nan"), float("inf")
    recs = [Rec("a", 1, samples=(nan, inf, -inf, 1.0)), Rec("b", 2, samples=(1.0, 2.0, 3.0, 4.0))]
    other = [recs[0].but(digest=5, samples=(1.0, nan, 0.0, 1.0)), recs[1]]
    report = load_run(write_run(tmp_path / "run", [recs, other]))
    data = _strict_json(report, tmp_path)  # raises on NaN/Infinity tokens
    assert data["first_divergence"]["index"] == 0


def _junit(report: Report, tmp_path: Path) -> ET.Element:
    path = tmp_path / "junit.xml"
    write_junit(report, path)
    text = path.read_text()
    assert text.startswith("<?xml")
    root = ET.fromstring(text)
    assert root.tag == "testsuite"
    cases = root.findall("testcase")
    assert int(root.get("tests", -1)) == len(cases)
    assert int(root.get("failures", -1)) == sum(len(c.findall("failure")) for c in cases)
    assert int(root.get("errors", -1)) == sum(len(c.findall("error")) for c in cases)
    return root


def test_junit_deterministic_has_no_failures(tmp_path: Path) -> None:
    recs = training_records()
    root = _junit(load_run(write_run(tmp_path / "run", [recs, recs])), tmp_path)
    assert root.get("failures") == "0"
    assert root.get("errors") == "0"
    assert len(root.findall("testcase")) == 3


def test_junit_divergent_names_the_first_divergence(tmp_path: Path) -> None:
    root = _junit(_divergent_run(tmp_path), tmp_path)
    failures = root.findall("testcase/failure")
    message = failures[0].get("message", "")
    assert len(failures) == 1
    assert "net.1" in message
    assert "step 1" in message


def test_junit_timeout_is_an_error_and_failed_repeat_a_failure(tmp_path: Path) -> None:
    recs = training_records()
    report = load_run(write_run(tmp_path / "run", [recs, recs[:3], recs], exit_codes=[0, -15, 2],
                                timed_out=[False, True, False]))
    root = _junit(report, tmp_path)
    assert root.get("errors") == "1"
    assert root.findall("testcase/error")[0].get("message") == "timed out"
    assert any("exited with 2" in f.get("message", "") for f in root.findall("testcase/failure"))


def test_junit_is_well_formed_with_hostile_names(tmp_path: Path) -> None:
    """Names come from user code (checkpoint names, module names): XML specials and control characters."""
    hostile = 'ck<"&\'>]]>\x1b[31m\x00\x07 é'
    recs = [Rec(hostile, 1, module=hostile, loc="a<b>.py:1"), Rec("ok", 2)]
    other = [recs[0].but(digest=9), recs[1]]
    report = load_run(write_run(tmp_path / "run", [recs, other], script="tr<ai>n&.py"))
    root = _junit(report, tmp_path)
    message = root.findall("testcase/failure")[0].get("message", "")
    assert "ck<\"&'>" in message
    assert json.loads(json.dumps(report_json(report)))["first_divergence"]["name"] == hostile


def test_junit_string_matches_written_file(tmp_path: Path) -> None:
    report = _divergent_run(tmp_path)
    write_junit(report, tmp_path / "j.xml")
    assert (tmp_path / "j.xml").read_text() == to_junit(report)


def test_a_repeat_timing_out_after_identical_records_is_a_timeout_not_a_divergence(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    report = load_run(write_run(tmp_path / "run", [recs, recs, recs[:5]], exit_codes=[0, 0, -15],
                                timed_out=[False, False, True]))
    assert report.verdict == "timeout"
    assert report.exit_code == 5
    assert report.first_divergence is None
    assert report.causes == []
    assert report.repeat_errors == {}
    data = _strict_json(report, tmp_path)
    assert data["verdict"] == "timeout"
    assert data["timed_out"] is True
    assert data["first_divergence"] is None
    assert data["spread"]["records_compared"] == 5
    assert data["runs"][2]["error"] is None


def test_every_repeat_timing_out_is_a_timeout_not_a_failure(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    report = load_run(write_run(tmp_path / "run", [recs[:4], recs[:6]], exit_codes=[-15, -9],
                                timed_out=[True, True]))
    assert report.verdict == "timeout"
    assert report.exit_code == 5
    assert report.failure == ""
    assert report.first_divergence is None
    assert report.repeat_errors == {}


def test_a_divergence_before_the_timeout_is_reported_with_exit_5(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    other = list(recs[:6])
    other[2] = other[2].but(digest=7)
    report = load_run(write_run(tmp_path / "run", [recs, other], exit_codes=[0, -15], timed_out=[False, True]))
    assert report.verdict == "divergent"
    assert report.exit_code == 5
    first = report_json(report)["first_divergence"]
    assert first["index"] == 2
    assert first["category"] == "content"


def test_not_timed_out_is_marked_false(tmp_path: Path) -> None:
    recs = training_records()
    assert _strict_json(load_run(write_run(tmp_path / "run", [recs, recs])), tmp_path)["timed_out"] is False


def test_junit_quotes_the_differing_stdout_line_of_each_repeat(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    run = write_run(tmp_path / "run", [recs, recs], stdout=["epoch 1 acc 0.91\n", "epoch 1 acc 0.92\n"])
    failure = ET.fromstring(to_junit(load_run(run))).find("testcase[@name='repeats agree']/failure")
    assert failure is not None
    assert failure.get("message") == "first divergence: stdout line 1"
    assert "stdout line 1, repeat 0: 'epoch 1 acc 0.91'" in (failure.text or "")
    assert "stdout line 1, repeat 1: 'epoch 1 acc 0.92'" in (failure.text or "")


LISTED = {"type": "carried", "what": "list", "path": "lightning_logs", "loc": "train.py:24",
          "by": "fsspec/implementations/local.py:64", "entries": ["version_0"]}


def _versioned(tmp_path: Path, carried_in: tuple[int, ...]) -> Report:
    """Three repeats that agree on every record and print another `v_num`; `carried_in`: the repeats whose
    trace holds the listing of a log directory an earlier repeat changed."""
    records = training_records(2)
    run = write_run(tmp_path / "run", [records] * 3,
                    stdout=[f"Epoch 0: 100%|██████████| 5/5 [00:00<00:00, {r}it/s, v_num={i}, train_loss=1.600]\n"
                            for i, r in enumerate(("37.82", "109.38", "8.10"))])
    for i in carried_in:
        (run / f"repeat-{i}.trace").unlink()
        write_trace(run / f"repeat-{i}.trace", records, {"exit_code": 0, "error": None}, events=[(0, LISTED)],
                    header={"repeat": i})
    return load_run(run)


def test_a_stdout_difference_explained_by_carried_state_is_reported_and_not_a_divergence(tmp_path: Path) -> None:
    report = _versioned(tmp_path, (1, 2))
    assert report.verdict == "deterministic"
    assert report.exit_code == 0
    assert report.first_divergence is None
    data = report_json(report)
    carried = data["carried_output"]
    assert carried["repeats"] == [1, 2]
    assert carried["stdout"]["field"] == "v_num"
    assert carried["evidence"][0].startswith("repeat 1 listed directory lightning_logs/, holding version_0")
    assert "at v_num" in carried["detail"]
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "Output that follows state carried between repeats" in text
    assert "v_num=1" in text
    assert "Output that follows state carried between repeats (not a divergence)" in render_html(report)


def test_a_differing_repeat_that_read_no_carried_state_keeps_the_divergence(tmp_path: Path) -> None:
    report = _versioned(tmp_path, (1,))
    assert report.verdict == "divergent"
    assert report.carried_output is None
    assert "carried_output" not in report_json(report)
    first = report.first_divergence
    assert first is not None
    assert first.stdout is not None
    assert first.stdout.field == "v_num"
    assert [c.id for c in report.causes][:2] == ["stdout-differs", "carried-state"]


def _tokens(at: int) -> TokenComparison:
    """Repeat 2's sequence 0 takes another token at position 7, chosen when record `at` was next."""
    first = TokenDivergence(sequence=0, position=7, fn="torch.argmax", loc="gen.py:9", reference=0, repeat=2,
                            token=1523, other=88, margin=0.0031, other_margin=0.002, at=at)
    return TokenComparison(repeats=3, distinct=2, sequences=2, tokens=10, groups=((0, 1), (2,)), divergences=(first,))


def test_the_json_report_answers_in_tokens(tmp_path: Path) -> None:
    report = replace(_divergent_run(tmp_path), tokens=_tokens(at=9))
    found = _strict_json(report, tmp_path)["tokens"]
    assert (found["distinct_outputs"], found["repeats"], found["first_divergent_tokens"][0]["position"],
            found["first_divergent_tokens"][0]["token"], found["first_divergent_tokens"][0]["other_token"]) \
        == (2, 3, 7, 1523, 88)


def test_a_token_chosen_after_the_first_divergent_record_is_tied_to_it(tmp_path: Path) -> None:
    report = replace(_divergent_run(tmp_path), tokens=_tokens(at=9))  # the first divergent record is #7
    assert report_json(report)["tokens"]["first_divergent_tokens"][0]["follows_first_divergence"] is True


def test_a_token_chosen_before_the_first_divergent_record_is_not_tied_to_it(tmp_path: Path) -> None:
    report = replace(_divergent_run(tmp_path), tokens=_tokens(at=7))
    assert report_json(report)["tokens"]["first_divergent_tokens"][0]["follows_first_divergence"] is False


def test_a_report_without_decoding_has_no_token_answer(tmp_path: Path) -> None:
    assert report_json(_divergent_run(tmp_path))["tokens"] is None


def test_a_reports_token_answer_reads_back(tmp_path: Path) -> None:
    report = replace(_divergent_run(tmp_path), tokens=_tokens(at=9))
    assert Report.from_dict(json.loads(json.dumps(report.to_dict()))).tokens == report.tokens
