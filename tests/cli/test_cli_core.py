"""The CLI against a mocked core (as coverage.py tests its command line): each command is invoked
in-process with click's CliRunner while the library calls it makes (audit.follow_up.run_audit, audit.load_run,
audit.compare_recorded, explain.run_experiments, baseline.save) are replaced by fakes that record
their arguments and return a Report read from a synthetic run directory. The tests check how options
become library calls, and that the exit code follows the Report's verdict. No interpreter starts.

The core's API is reached in two places only: `Core` (what is patched, and where) and `flat` (the
AuditOptions fields by name, wherever in the options object they live): a refactor edits those.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner
from synthetic import training_records, write_run

import detaudit.audit.follow_up
import detaudit.audit.pipeline
import detaudit.explain.runner
import detaudit.report.baseline
import detaudit.run.devices
from detaudit.audit.follow_up import FollowUp
from detaudit.cli.commands import cli, main
from detaudit.errors import ExitCode, TraceError
from detaudit.report.model import Report
from detaudit.results import EXTRA_STEPS, Cause, Tolerance

LOAD_RUN = detaudit.audit.pipeline.load_run  # the real one, for the fakes' reports

# the AuditOptions fields the CLI sets, by name; each is found on the options object or on one of its
# dataclass parts (options.schedule.repeats as well as options.repeats)
OPTION_FIELDS = ("script", "script_args", "repeats", "devices", "own_device", "timeout", "jobs", "out_dir", "tolerance",
                 "granularity", "stdout", "baseline", "redact_args", "max_steps", "max_time", "self_check",
                 "nproc_per_node", "torchrun_args", "run_to_end")


def flat(options: Any) -> dict[str, Any]:
    """The options a command passed to run_audit, by name (OPTION_FIELDS)."""
    parts = [options, *(v for v in vars(options).values() if dataclasses.is_dataclass(v))]
    values = {}
    for name in OPTION_FIELDS:
        owners = [part for part in parts if hasattr(part, name)]
        assert len(owners) == 1, f"AuditOptions field {name!r} found in {len(owners)} places"
        values[name] = getattr(owners[0], name)
    return values


def synthetic_report(tmp_path: Path, verdict: str) -> Report:
    """A real Report of a synthetic run directory (no interpreter) with the given verdict."""
    recs = training_records()
    other = [r.but(digest=123) if i == 5 else r for i, r in enumerate(recs)]
    runs = {"deterministic": dict(traces=[recs, recs]), "divergent": dict(traces=[recs, other]),
            "failed": dict(traces=[recs, recs], exit_codes=[1, 1]),
            "timeout": dict(traces=[recs, recs], timed_out=[False, True]),
            "inconclusive": dict(traces=[[], []])}[verdict]
    run_dir = tmp_path / f"synthetic-{verdict}"
    if not run_dir.exists():
        write_run(run_dir, **runs)  # type: ignore[arg-type]
    report = LOAD_RUN(run_dir)
    assert report.verdict == verdict
    return report


class Core:
    """The library calls the CLI makes, replaced by fakes that record (name, args, kwargs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.tmp_path = tmp_path
        self.verdict = "deterministic"
        self.causes: list[Cause] = []
        monkeypatch.setattr(detaudit.run.devices, "cuda_available", lambda: False)  # the same on every machine
        for owner, name in ((detaudit.audit.follow_up, "run_audit"), (detaudit.audit.pipeline, "load_run"),
                            (detaudit.audit.pipeline, "compare_recorded"), (detaudit.explain.runner, "run_experiments"),
                            (detaudit.report.baseline, "save")):
            monkeypatch.setattr(owner, name, self._fake(name))

    def _fake(self, name: str) -> Any:
        def fake(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            if name == "save":
                dest = Path(args[2])
                dest.mkdir(parents=True, exist_ok=True)
                return dest
            report = synthetic_report(self.tmp_path, self.verdict)
            return dataclasses.replace(report, causes=self.causes) if self.causes else report
        return fake

    def called(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(args, kwargs) for n, args, kwargs in self.calls if n == name]

    def options(self) -> dict[str, Any]:
        """The options of the one run_audit call."""
        [(args, _)] = self.called("run_audit")
        return flat(args[0])

    def follow_up(self) -> FollowUp:
        """What the one run_audit call was told to follow a divergence with."""
        [(args, kwargs)] = self.called("run_audit")
        return args[4] if len(args) > 4 else kwargs["follow_up"]


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Core]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")
    yield Core(monkeypatch, tmp_path)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--lr')\n")
    return path


def invoke(args: list[str]) -> Any:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    return result


def test_run_defaults_become_the_documented_options(core: Core, script: Path) -> None:
    result = invoke(["run", str(script)])
    assert result.exit_code == 0, result.output
    assert core.options() == {
        "script": script, "script_args": [], "repeats": 3, "devices": ["cpu"], "own_device": True, "timeout": None,
        "jobs": 1, "out_dir": None, "tolerance": Tolerance(1e-5, 1.3e-6), "granularity": "auto", "stdout": "masked",
        "baseline": None, "redact_args": False, "max_steps": None, "max_time": None, "self_check": False,
        "nproc_per_node": None, "torchrun_args": [], "run_to_end": False}
    assert core.follow_up() == FollowUp(cheap=True)  # the cheap confirmation, no --explain
    assert core.called("save") == []


def test_every_run_option_reaches_the_audit_options(core: Core, script: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = invoke(["run", "-n", "5", "--device", "cpu", "--timeout", "30", "--out", "out", "-j", "2",
                     "--atol", "0.5", "--rtol", "0.25", "--stdout", "strict", "--granularity", "op",
                     "--baseline", str(base), "--redact-args", "--max-steps", "4", "--self-check", str(script)])
    assert result.exit_code == 0, result.output
    options = core.options()
    assert options["repeats"] == 5
    assert options["devices"] == ["cpu"]
    assert options["own_device"] is False
    assert options["timeout"] == 30.0
    assert options["out_dir"] == Path("out")
    assert options["jobs"] == 2
    assert options["tolerance"] == Tolerance(0.5, 0.25)
    assert options["stdout"] == "strict"
    assert options["granularity"] == "op"
    assert options["baseline"] == base
    assert options["redact_args"] is True
    assert options["max_steps"] == 4
    assert options["self_check"] is True


def test_run_to_end_reaches_the_audit_and_help_says_when_a_repeat_is_stopped(core: Core, script: Path) -> None:
    assert invoke(["run", "--run-to-end", str(script)]).exit_code == 0
    assert core.options()["run_to_end"] is True
    text = " ".join(invoke(["run", "--help"]).output.split())
    assert f"stopped {EXTRA_STEPS} optimizer steps after the step it first diverged in" in text


def test_max_time_and_torchrun_options(core: Core, script: Path) -> None:
    assert invoke(["run", "--max-time", "2.5", str(script)]).exit_code == 0
    assert core.options()["max_time"] == 2.5
    core.calls.clear()
    result = invoke(["run", "--nproc-per-node", "2", "--torchrun-args", "--max-restarts 0", str(script)])
    assert result.exit_code == 0, result.output
    assert core.options()["nproc_per_node"] == 2
    assert core.options()["torchrun_args"] == ["--max-restarts", "0"]


@pytest.mark.parametrize("args,message", [
    (["--max-time", "2", "--nproc-per-node", "2"], "--max-time cannot bound a torchrun run"),
    (["--torchrun-args", "--max-restarts 0"], "--torchrun-args needs --nproc-per-node"),
    (["--save-baseline", "b", "--nproc-per-node", "2"], "do not support --nproc-per-node"),
    (["--ignore-stdout", "--stdout", "strict"], "--ignore-stdout contradicts --stdout strict"),
    # several nodes: a launch after the repeats, decided per node, would start on one node alone
    (["--nproc-per-node", "1", "--torchrun-args", "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint h:1"],
     "--granularity auto (the default) and --self-check cannot run with --nnodes above 1"),
    (["--nproc-per-node", "1", "--granularity", "module", "--self-check", "--torchrun-args", "--nnodes=2"],
     "--self-check cannot run with --nnodes above 1"),
    (["--nproc-per-node", "1", "--granularity", "module", "--explain", "--torchrun-args", "--nnodes 1:2"],
     "--explain cannot run with --nnodes above 1"),
    (["--json", "-", "--junit", "-"], "cannot both write to stdout"),
])
def test_contradicting_options_are_usage_errors_before_any_audit(core: Core, script: Path, args: list[str],
                                                                  message: str) -> None:
    result = invoke(["run", *args, str(script)])
    assert result.exit_code == 2
    assert message in result.output
    assert core.calls == []


@pytest.mark.parametrize("args", [
    ["--max-time", "nan"], ["--max-time", "inf"], ["--max-time", "-1"], ["--atol", "-1e-5"], ["--rtol", "-0.1"],
    ["--atol", "nan"], ["--timeout", "nan"],
])
def test_a_bound_or_tolerance_that_is_not_finite_or_negative_is_refused(core: Core, script: Path,
                                                                       args: list[str]) -> None:
    """A nan --max-time wrote a run record detaudit then refused; a negative tolerance refuses equal values."""
    result = invoke(["run", *args, str(script)])
    assert result.exit_code == 2, result.output
    assert args[0] in result.output, result.output
    assert core.calls == []
    refused = invoke(["compare", "a", "b", "--atol", "-1"])
    assert refused.exit_code == 2
    assert "must be at least 0" in refused.output


def test_the_script_reaches_the_repeats_as_typed(core: Core, script: Path) -> None:
    """`./-y.py` reached the script as `-y.py`: sys.argv[0] is the script as typed, as under plain python."""
    assert invoke(["run", "./train.py"]).exit_code == 0
    [(args, _)] = core.called("run_audit")
    assert args[0].target.script == Path("train.py")
    assert args[0].target.as_typed == "./train.py"


def test_script_arguments_after_the_script_or_a_double_dash_reach_the_options(core: Core, script: Path) -> None:
    assert invoke(["run", str(script), "data.txt", "--epochs", "1", "-n", "5"]).exit_code == 0
    assert core.options()["script_args"] == ["data.txt", "--epochs", "1", "-n", "5"]
    assert core.options()["repeats"] == 3  # `-n 5` came after an option detaudit does not know: the script's
    core.calls.clear()
    assert invoke(["run", str(script), "-n", "2", "--", "--repeats", "--json", "x"]).exit_code == 0
    assert core.options()["script_args"] == ["--repeats", "--json", "x"]
    assert core.options()["repeats"] == 2


def test_ignore_stdout_is_the_ignore_mode(core: Core, script: Path) -> None:
    assert invoke(["run", "--ignore-stdout", str(script)]).exit_code == 0
    assert core.options()["stdout"] == "ignore"


@pytest.mark.parametrize("verdict,code", [("deterministic", 0), ("divergent", 1), ("failed", 3), ("timeout", 5),
                                          ("inconclusive", 6)])
def test_the_exit_code_follows_the_reports_verdict(core: Core, script: Path, verdict: str, code: int) -> None:
    core.verdict = verdict
    for args in (["run", "--no-explain", str(script)], ["report", "somerun"], ["compare", "a.trace", "b.trace"]):
        result = invoke(args)
        assert result.exit_code == code, (args, result.output)


def test_report_files_go_where_the_options_say(core: Core, script: Path, tmp_path: Path) -> None:
    core.verdict = "divergent"
    result = invoke(["run", "--no-explain", "--json", "out/r.json", "--junit", "r.xml", "--html", "r.html", "-q",
                     str(script)])
    assert result.exit_code == 1, result.output
    assert json.loads((tmp_path / "out" / "r.json").read_text())["verdict"] == "divergent"
    assert ET.parse(tmp_path / "r.xml").getroot().get("failures") == "1"
    assert (tmp_path / "r.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert len(result.stdout.strip().splitlines()) == 1  # -q: the verdict line alone


def test_json_to_stdout_carries_only_the_document(core: Core, script: Path) -> None:
    result = invoke(["report", "somerun", "--json", "-"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["verdict"] == "deterministic"
    assert "DETERMINISTIC" in result.stderr  # the rendering moved to stderr


def test_report_and_compare_pass_their_stdout_mode_and_tolerance(core: Core) -> None:
    assert invoke(["report", "somerun"]).exit_code == 0
    assert invoke(["report", "somerun", "--stdout", "strict"]).exit_code == 0
    assert [args for args, _ in core.called("load_run")] == [(Path("somerun"), None), (Path("somerun"), "strict")]
    assert invoke(["compare", "a.trace", "b.trace"]).exit_code == 0
    assert invoke(["compare", "a.trace", "b", "--atol", "0.1", "--ignore-stdout"]).exit_code == 0
    assert invoke(["compare", "a.trace", "b", "--rtol", "0.2"]).exit_code == 0
    assert [args for args, _ in core.called("compare_recorded")] == [
        ([Path("a.trace"), Path("b.trace")], None, None), ([Path("a.trace"), Path("b")], Tolerance(0.1, 0.0), "ignore"),
        ([Path("a.trace"), Path("b")], Tolerance(0.0, 0.2), None)]


def test_explain_after_a_run_gets_the_budget_and_jobs(core: Core, script: Path) -> None:
    assert invoke(["run", "--explain-all", "--budget", "7", "-j", "2", str(script), "secret"]).exit_code == 0
    # not redacted: the experiments read the script's arguments from the run directory
    assert core.follow_up() == FollowUp(cheap=True, explain=True, explain_all=True, budget=7, jobs=2, script_args=None)


def test_redacted_arguments_are_handed_to_the_experiments(core: Core, script: Path) -> None:
    assert invoke(["run", "--explain", "--redact-args", str(script), "secret"]).exit_code == 0
    assert core.follow_up().script_args == ("secret",)


def test_no_explain_asks_for_no_cheap_confirmation(core: Core, script: Path) -> None:
    assert invoke(["run", "--no-explain", str(script)]).exit_code == 0
    assert core.follow_up() == FollowUp()


def test_explain_command(core: Core) -> None:
    core.verdict = "divergent"
    run_dir = Path(synthetic_report(core.tmp_path, "divergent").run_dir)  # explain reads its run.json first
    result = invoke(["explain", str(run_dir), "--budget", "3", "--all", "-j", "2", "--json", "e.json"])
    assert result.exit_code == 1, result.output
    [(args, kwargs)] = core.called("run_experiments")
    assert args == (run_dir, 3, True)
    assert kwargs["jobs"] == 2
    assert json.loads(Path("e.json").read_text())["verdict"] == "divergent"


def test_save_baseline_only_asks_the_library_to_save(core: Core, script: Path) -> None:
    result = invoke(["run", "--save-baseline", "kept", str(script)])
    assert result.exit_code == 0, result.output
    [(args, _)] = core.called("save")
    assert args[2] == Path("kept")
    assert "baseline saved to kept" in result.stderr


@pytest.mark.parametrize("verdict,code", [("divergent", 0), ("deterministic", 1)])
def test_demo_exits_0_when_it_shows_its_divergence(core: Core, verdict: str, code: int) -> None:
    core.verdict = verdict
    assert invoke(["demo", "-n", "2"]).exit_code == code
    options = core.options()
    assert options["repeats"] == 2
    assert options["timeout"] == 120.0
    assert options["script"].name == "train_demo.py"
    assert core.follow_up().explain  # the demo always explains


def test_a_library_error_is_one_line_with_its_exit_code(core: Core, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    def corrupt(*args: Any, **kwargs: Any) -> Report:
        raise TraceError("somerun/repeat-0.trace is corrupt")

    monkeypatch.setattr(detaudit.audit.pipeline, "load_run", corrupt)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "somerun"])
    assert exit_info.value.code == ExitCode.BAD_TRACE
    assert capsys.readouterr().err.strip() == "detaudit: error: somerun/repeat-0.trace is corrupt"


def test_a_script_that_is_no_regular_file_is_refused_before_anything_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`run /dev/zero` read the "script" whole (the option scan) until the kernel killed it; a FIFO blocked."""
    import os

    monkeypatch.chdir(tmp_path)
    os.mkfifo("pipe.py")
    for script in ("/dev/zero", "pipe.py", "/dev/stdin"):
        with pytest.raises(SystemExit) as exit_info:
            main(["run", script, "--lr", "1"])
        assert exit_info.value.code == 2
        assert "not a regular file" in capsys.readouterr().err or script == "/dev/stdin"
    assert not (tmp_path / ".detaudit").exists()


def test_cuda_without_a_gpu_is_a_usage_error(core: Core, script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--device", "cuda", str(script)])
    assert exit_info.value.code == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert core.calls == []


@pytest.mark.parametrize(("body", "said"), [("raise RuntimeError('this module is broken')\n", "RuntimeError"),
                                            ("def (\n", "SyntaxError")])
def test_a_broken_module_from_the_environment_is_not_called_a_bug_in_detaudit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], body: str,
        said: str) -> None:
    """A broken module on PYTHONPATH that detaudit imports was reported as "a bug in detaudit" (exit 70)."""
    import sys

    (tmp_path / "envmod_broken.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "envmod_broken", raising=False)
    monkeypatch.delenv("DETAUDIT_DEBUG", raising=False)

    def importing(*args: Any, **kwargs: Any) -> Report:
        import envmod_broken  # noqa: F401  (what a lazy `import numpy` meets when PYTHONPATH holds a broken one)
        raise AssertionError("unreachable")

    monkeypatch.setattr(detaudit.audit.pipeline, "compare_recorded", importing)
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "a", "b"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "bug in detaudit" not in err
    assert f"a module detaudit imports is broken: {tmp_path / 'envmod_broken.py'}:1: {said}" in err


def test_detaudits_own_failure_is_still_an_internal_error(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DETAUDIT_DEBUG", raising=False)

    def buggy(*args: Any, **kwargs: Any) -> Report:
        raise RuntimeError("a bug")

    monkeypatch.setattr(detaudit.audit.pipeline, "compare_recorded", buggy)
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "a", "b"])
    assert exit_info.value.code == 70
    assert "This is a bug in detaudit" in capsys.readouterr().err


REPORT_OPTIONS = ("--json", "--junit", "--html", "--sarif")


@pytest.mark.parametrize("option", REPORT_OPTIONS)
def test_a_report_option_naming_the_script_is_refused_before_any_repeat(core: Core, script: Path,
                                                                        option: str) -> None:
    """Issue 27 C6: `--json s.py` overwrote the audited script with the report."""
    source = script.read_text()
    result = invoke(["run", str(script), option, str(script)])
    assert result.exit_code == 2
    assert "is the audited script" in result.output
    assert core.calls == []
    assert script.read_text() == source


@pytest.mark.parametrize("first, second", [(a, b) for a in REPORT_OPTIONS for b in REPORT_OPTIONS if a < b])
def test_two_report_options_naming_one_file_are_refused(core: Core, script: Path, first: str, second: str) -> None:
    result = invoke(["run", str(script), first, "r.out", second, "./r.out"])
    assert result.exit_code == 2
    assert "name the same path" in result.output
    assert core.calls == []


@pytest.mark.parametrize("option", [*REPORT_OPTIONS, "--save-baseline"])
@pytest.mark.parametrize("command", ["run", "report", "compare", "explain"])
def test_no_output_lands_in_a_run_directory_or_a_baseline(core: Core, script: Path, option: str,
                                                          command: str) -> None:
    """`--json RUN/run.json` made that run unreadable; a report is never written among a recording's files."""
    run_dir = Path(synthetic_report(core.tmp_path, "deterministic").run_dir)
    other = Path(synthetic_report(core.tmp_path, "divergent").run_dir)
    record = (other / "run.json").read_bytes()
    if option == "--save-baseline" and command != "run":
        return
    args = {"run": ["run", str(script)], "report": ["report", str(run_dir)], "explain": ["explain", str(run_dir)],
            "compare": ["compare", str(run_dir), str(run_dir)]}[command]
    for target in (other / "run.json", other / "new-report", run_dir / "x"):
        result = invoke([*args, option, str(target)])
        assert result.exit_code == 2, (target, result.output)
        assert "is inside" in result.output
    assert (other / "run.json").read_bytes() == record
    assert not (other / "new-report").exists()
    assert core.calls == []


def test_a_users_own_report_named_run_json_does_not_make_its_folder_a_run_directory(core: Core, script: Path) -> None:
    """`run --json run.json` then `explain RUN --json explain.json` in the same folder (the cause matrix does it):
    only detaudit's own run record marks a run directory, not any file of that name."""
    (core.tmp_path / "run.json").write_text('{"schema": "detaudit-report", "verdict": "divergent"}\n')
    result = invoke(["run", str(script), "--json", str(core.tmp_path / "report.json")])
    assert result.exit_code != 2 or "is inside" not in result.output, result.output
    assert core.calls


def test_save_baseline_into_a_non_empty_directory_exits_2_before_any_repeat(
        core: Core, script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 27 C8: the refusal exited 0 after the run; a CI job would not notice no baseline was kept."""
    (core.tmp_path / "kept").mkdir()
    (core.tmp_path / "kept" / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(script), "--save-baseline", "kept"])
    assert exit_info.value.code == 2
    assert "not a new or empty directory" in capsys.readouterr().err
    assert core.calls == []
