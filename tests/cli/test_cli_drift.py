"""cli/drift_command.py's options as the Configurations drift/drift_check.py gets, in-process with click's
CliRunner: run_drift is replaced by a fake, so no interpreter starts; and the terminal rendering of a drift.
The runs themselves are test_e2e_drift.py's."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from detaudit.audit.pipeline import AuditOptions
from detaudit.cli.commands import cli
from detaudit.cli.drift_command import summary_line
from detaudit.compare.tokens import TokenComparison, TokenDivergence
from detaudit.drift import drift_check
from detaudit.drift.change_kinds import CandidateCause, ChangeEvidence
from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_report import (
    Counts,
    DriftReport,
    DriftTokens,
    FirstDrift,
    FloorSummary,
    NotComparable,
    OpWindow,
    OutcomeDrift,
    RankDisagreement,
    RecordRow,
    Rerecorded,
    RerecordedRecord,
    write_json,
)
from detaudit.errors import ExitCode


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train.py"
    path.write_text("import torch\nprint(torch.ones(2).sum())\n")
    return path


def drifted(a: Configuration, b: Configuration) -> DriftReport:
    first = FirstDrift(0, "grad", "fc.weight", "", "train.py:9", None, 2.0, "float32", "4x4",
                       ChangeEvidence(factor=2.0, growth="starts-large"))
    cause = CandidateCause("env LOSS_WEIGHT", None, "2", "script", "changes what the script computes")
    floor = FloorSummary(10.0, 2, [{"threads": "1"}], 0.0, None)
    return DriftReport("train.py", [], "run", "drift", a, b, [], [], floor, first_drift=first, causes=[cause])


def _fake(seen: list[tuple[AuditOptions, Configuration, Configuration]]) -> Any:
    def run_drift(options: AuditOptions, a: Configuration, b: Configuration, *_: Any) -> DriftReport:
        seen.append((options, a, b))
        return drifted(a, b)
    return run_drift


def test_each_side_s_options_become_its_configuration(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[AuditOptions, Configuration, Configuration]] = []
    monkeypatch.setattr(drift_check, "run_drift", _fake(seen))
    result = CliRunner().invoke(cli, ["drift", script.name, "--a-threads", "1", "--b-threads", "2", "--b-env",
                                      "LOSS_WEIGHT=2", "--b-args", "--lr '0.2'", "--", "--steps", "2"],
                                catch_exceptions=False)
    assert result.exit_code == ExitCode.DIVERGENT, result.output
    [(options, a, b)] = seen
    assert (options.target.script_args, a, b) == (["--steps", "2"], Configuration("A", threads=1),
                                                  Configuration("B", {"LOSS_WEIGHT": "2"}, ["--lr", "0.2"], 2))


def test_the_drift_is_shown_with_its_factor_and_the_candidate_cause(script: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drift_check, "run_drift", _fake([]))
    result = CliRunner().invoke(cli, ["drift", script.name, "--b-env", "LOSS_WEIGHT=2"], catch_exceptions=False)
    assert "constant factor 2 (B = 2 x A)" in result.output
    assert "candidate env LOSS_WEIGHT: (unset) -> 2 (script)" in result.output


def test_an_environment_setting_without_a_value_is_a_usage_error(script: Path) -> None:
    result = CliRunner().invoke(cli, ["drift", script.name, "--b-env", "LOSS_WEIGHT"])
    assert result.exit_code == ExitCode.USAGE


def test_a_bad_environment_setting_names_the_side_s_option(script: Path) -> None:
    result = CliRunner().invoke(cli, ["drift", script.name, "--a-env", "FOO"])
    assert "Invalid value for --a-env: 'FOO' is not NAME=VALUE" in result.output


def test_an_interpreter_that_is_not_a_file_is_a_usage_error(script: Path) -> None:
    result = CliRunner().invoke(cli, ["drift", script.name, "--b-python", "/no/such/python"])
    assert result.exit_code == ExitCode.USAGE


def test_the_summary_line_counts_the_records_within_noise() -> None:
    report = replace(drifted(Configuration("A"), Configuration("B")), verdict="within-noise", first_drift=None,
                     counts=Counts(aligned=5, equivalent=2, within_noise=3))
    assert summary_line(report).startswith(
        "[bold green]WITHIN NOISE[/] · 5 records aligned: 2 equivalent, 3 within noise")


def test_a_baseline_keeps_a_so_an_option_of_a_is_refused(script: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["drift", script.name, "--baseline", str(tmp_path), "--a-threads", "2"])
    assert result.exit_code == ExitCode.USAGE


def test_a_side_s_world_size_becomes_its_nproc(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[AuditOptions, Configuration, Configuration]] = []
    monkeypatch.setattr(drift_check, "run_drift", _fake(seen))
    CliRunner().invoke(cli, ["drift", script.name, "--b-nproc", "2"], catch_exceptions=False)
    [(_, a, b)] = seen
    assert (a.nproc, b.nproc) == (None, 2)


def test_a_world_size_with_another_interpreter_is_a_usage_error(script: Path) -> None:
    result = CliRunner().invoke(cli, ["drift", script.name, "--b-nproc", "2", "--b-python", sys.executable])
    assert result.exit_code == ExitCode.USAGE


def test_per_rank_records_set_aside_and_ranks_that_disagree_are_shown(script: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def run_drift(options: AuditOptions, a: Configuration, b: Configuration, *_: Any) -> DriftReport:
        return replace(drifted(a, b), not_comparable=[NotComparable("output", 8, 16, "different sample sets per rank")],
                       rank_disagreements=[RankDisagreement("b", 1, 0, "grad", "fc.weight")])
    monkeypatch.setattr(drift_check, "run_drift", run_drift)
    result = CliRunner().invoke(cli, ["drift", script.name, "--b-nproc", "2"], catch_exceptions=False)
    assert "not comparable: output records (A 8, B 16): different sample sets per rank" in result.output
    assert "B rank 1's step 0 grad fc.weight differs from rank 0's" in result.output


def test_b_kept_from_an_earlier_run_refuses_an_option_of_b(script: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["drift", script.name, "--b-from", str(tmp_path), "--b-env", "X=1"])
    assert result.exit_code == ExitCode.USAGE


def test_a_per_rank_row_names_its_rank(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = RecordRow(0, "output", "fc", 0, "fc", "train.py:5", "drift", 1.0, 1e-8, 1e8, rank=1)
    monkeypatch.setattr(drift_check, "run_drift", lambda options, a, b, *_: replace(drifted(a, b), records=[row]))
    result = CliRunner().invoke(cli, ["drift", script.name, "--a-nproc", "2", "--b-nproc", "2"],
                                catch_exceptions=False)
    assert "fc (rank 1)" in result.output


def test_a_drift_that_starts_in_the_update_says_why_no_op_window_ran(script: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def run_drift(options: AuditOptions, a: Configuration, b: Configuration, *_: Any) -> DriftReport:
        report = drifted(a, b)
        assert report.first_drift is not None
        return replace(report, first_drift=replace(report.first_drift, kind="param"))
    monkeypatch.setattr(drift_check, "run_drift", run_drift)
    result = CliRunner().invoke(cli, ["drift", script.name, "--b-args", "--lr 0.2"], catch_exceptions=False)
    shown = " ".join(result.output.split())
    assert "no op window: the first drift is a param record whose step's other records are within noise: the " \
           "change starts in optimizer.step()" in shown


def test_an_op_window_that_names_no_op_says_so(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drift_check, "run_drift", lambda options, a, b, *_: replace(drifted(a, b), op_runs=2))
    result = CliRunner().invoke(cli, ["drift", script.name, "--b-args", "--lr 0.2"], catch_exceptions=False)
    shown = " ".join(result.output.split())
    assert "op window: no op of step 0 departs in B beyond 10 times its ULP bound" in shown


def test_a_drift_of_unknown_size_says_so_instead_of_a_ratio(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run_drift(options: AuditOptions, a: Configuration, b: Configuration, *_: Any) -> DriftReport:
        report = drifted(a, b)
        assert report.first_drift is not None
        return replace(report, first_drift=replace(report.first_drift, detail="differs at an unrecorded position: "
                                                                              "size unknown"))
    monkeypatch.setattr(drift_check, "run_drift", run_drift)
    result = CliRunner().invoke(cli, ["drift", script.name], catch_exceptions=False, env={"COLUMNS": "200"})
    assert "train.py:9: differs at an unrecorded position: size unknown" in result.output


def sized(a: Configuration, b: Configuration) -> DriftReport:
    """A drift whose first record's size was unknown and found by re-recording (1000 at an unsampled element)."""
    report = drifted(a, b)
    assert report.first_drift is not None
    row = RecordRow(0, "param", "0.bias", 0, "", "train.py:9", "drift", 1000.0, 1e-7, 1e10,
                    detail="sized by re-recording: the largest |B-A| over all 32 elements", sized=True)
    rerecorded = Rerecorded(2, [RerecordedRecord(0, "param", "0.bias", 0, 0, True),
                                RerecordedRecord(1, "param", "0.bias", 0, 0, False, "the re-recording of B does not "
                                                 "reproduce the first (another digest): no evidence of its elements")])
    return replace(report, records=[row], rerecorded=rerecorded,
                   first_drift=replace(report.first_drift, ratio_to_floor=1e10, detail=row.detail))


def test_a_record_sized_by_re_recording_is_shown_with_its_ratio_and_the_interpreters_it_cost(
        script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drift_check, "run_drift", lambda options, a, b, *_: sized(a, b))
    result = CliRunner().invoke(cli, ["drift", script.name], catch_exceptions=False, env={"COLUMNS": "250"})
    shown = " ".join(result.output.split())
    assert "drift (sized)" in shown
    assert "train.py:9: 1e+10x floor (sized by re-recording: the largest |B-A| over all 32 elements)" in shown
    assert "re-recorded A and B once more keeping the full values of 2 record(s) of unknown size (2 interpreters): " \
           "1 sized by re-recording (rows marked `sized`)" in shown
    assert "not sized: step 1 param 0.bias: the re-recording of B does not reproduce the first" in shown
    assert "2 interpreters started (2 to size records by re-recording)" in shown


def test_the_summary_line_shows_a_sized_first_drift_s_ratio_not_size_unknown() -> None:
    assert "first drift: step 0 grad fc.weight (1e+10x floor)" in summary_line(sized(Configuration("A"),
                                                                                      Configuration("B")))


def kept_run(path: Path) -> Path:
    """A drift run directory as an earlier check left it (its drift.json and A's trace)."""
    path.mkdir()
    write_json(drifted(Configuration("A"), Configuration("B")), path / "drift.json")
    (path / "a-0.trace").write_bytes(b"kept")
    return path


@pytest.mark.parametrize("option", ["--json", "--html"])
@pytest.mark.parametrize("kept_as", ["--baseline", "--b-from"])
def test_a_report_into_a_kept_recording_is_refused_before_anything_runs(
        script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, kept_as: str) -> None:
    """`--json X/drift.json` or `--html X/a-0.trace` replaced the baseline's own files (issue 43)."""
    seen: list[tuple[AuditOptions, Configuration, Configuration]] = []
    monkeypatch.setattr(drift_check, "run_drift", _fake(seen))
    kept = kept_run(tmp_path / "kept")
    target = kept / ("drift.json" if option == "--json" else "a-0.trace")
    result = CliRunner().invoke(cli, ["drift", script.name, kept_as, str(kept), option, str(target)])
    assert (result.exit_code, seen, (kept / "a-0.trace").read_bytes()) == (ExitCode.USAGE, [], b"kept")


def test_a_report_into_any_drift_run_directory_is_refused(script: Path, tmp_path: Path) -> None:
    """Not only the one this check keeps: another drift run's drift.json marks a recording, as run.json does."""
    kept = kept_run(tmp_path / "other")
    result = CliRunner().invoke(cli, ["drift", script.name, "--json", str(kept / "report.json")])
    assert result.exit_code == ExitCode.USAGE


def test_a_printed_result_that_differs_is_shown_with_both_lines(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run_drift(options: AuditOptions, a: Configuration, b: Configuration, *_: Any) -> DriftReport:
        return replace(drifted(a, b), first_drift=None,
                       outcome=OutcomeDrift("stdout line 2 differs (masked comparison)", 2, "positives 14",
                                            "positives 46"))
    monkeypatch.setattr(drift_check, "run_drift", run_drift)
    result = CliRunner().invoke(cli, ["drift", script.name], catch_exceptions=False, env={"COLUMNS": "200"})
    assert "B ends otherwise: stdout line 2 differs (masked comparison)\n  A: positives 14\n  B: positives 46" in \
        result.output


def test_a_that_disagrees_with_itself_is_said_before_the_records(script: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def run_drift(options: AuditOptions, a: Configuration, b: Configuration, *_: Any) -> DriftReport:
        return replace(drifted(a, b), a_disagrees="A's own plain repeats disagree", records=[
            RecordRow(0, "grad", "fc.weight", 0, "", "train.py:9", "drift", 1.0, 1e-8, 1e8)])
    monkeypatch.setattr(drift_check, "run_drift", run_drift)
    output = CliRunner().invoke(cli, ["drift", script.name], catch_exceptions=False).output
    assert output.index("A disagrees with itself") < output.index("fc.weight")


def decoded(a: Configuration, b: Configuration) -> DriftReport:
    """A drift whose decoder's second sequence flips at token 3, chosen after the first drift's record #5."""
    flip = TokenDivergence(sequence=1, position=3, fn="Tensor.argmax", loc="gen.py:9", reference=0, repeat=1,
                           token=3, other=8, margin=0.25, other_margin=None, at=7)
    compared = TokenComparison(repeats=2, distinct=2, sequences=2, tokens=4, groups=((0,), (1,)), divergences=(flip,))
    window = OpWindow(0, "aten.addmm", "head", "gen.py:5", False, 40.0)
    return replace(drifted(a, b), tokens=DriftTokens(compared, 3, 1, 5), op_window=window)


def test_a_decoder_s_drift_leads_with_its_first_divergent_token(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drift_check, "run_drift", lambda options, a, b, *_: decoded(a, b))
    output = CliRunner().invoke(cli, ["drift", script.name], catch_exceptions=False, env={"COLUMNS": "200"}).output
    assert output.splitlines()[4] == ("tokens: 2 distinct outputs among A and B; sequence 1 first differs at token 3: "
                                      "3 vs 8 in B (margin 0.25)")


def test_a_decoder_s_first_divergent_token_is_tied_to_the_first_drift_and_its_op(
        script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drift_check, "run_drift", lambda options, a, b, *_: decoded(a, b))
    output = CliRunner().invoke(cli, ["drift", script.name], catch_exceptions=False, env={"COLUMNS": "200"}).output
    assert "token 3 was chosen after the first drift (record #5: step 0 grad fc.weight) already differed (op " \
           "aten.addmm at gen.py:5)" in output
