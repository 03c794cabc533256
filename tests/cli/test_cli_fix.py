"""cli/fix.py's options as the library values fix/trials.py gets, in-process with click's CliRunner: run_fix
(or the audit under it) is replaced by a fake, so no interpreter starts. The search itself is
test_e2e_fix.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import detaudit.run.devices
from detaudit.audit.pipeline import AuditOptions
from detaudit.cli.commands import cli, main
from detaudit.errors import ExitCode
from detaudit.fix import trials
from detaudit.fix.fix_report import FixReport
from detaudit.pin import Perturb


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(detaudit.run.devices, "cuda_available", lambda: False)  # the same on every machine
    path = tmp_path / "train.py"
    path.write_text("import torch\nprint(torch.ones(2).sum())\n")
    return path


def _fake_fix(seen: list[AuditOptions], tmp_path: Path) -> Any:
    def run_fix(options: AuditOptions, budget: int, *_: Any) -> FixReport:
        seen.append(options)
        perturbation = options.schedule.perturbation
        return FixReport(script="train.py", run_dir=str(tmp_path), verdict="deterministic", audit_exit_code=0,
                         budget=budget, perturb=tuple(s.knob.value for s in perturbation.specs) if perturbation else ())
    return run_fix


def test_perturb_reaches_the_audit_and_the_experiments_as_runs_option_does(
        script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[AuditOptions] = []
    monkeypatch.setattr(trials, "run_fix", _fake_fix(seen, tmp_path))
    result = CliRunner().invoke(cli, ["fix", "-n", "2", "--perturb", "threads", script.name], catch_exceptions=False)
    assert result.exit_code == ExitCode.DETERMINISTIC, result.output
    perturbation = seen[0].schedule.perturbation
    assert perturbation is not None
    assert [s.knob for s in perturbation.specs] == [Perturb.THREADS]
    assert seen[0].schedule.repeats == 2 * len(perturbation.groups)  # --repeats per group, as for `run`
    assert "the repeats agree under --perturb threads; nothing to fix" in result.output


def test_without_perturb_fix_is_unperturbed(script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[AuditOptions] = []
    monkeypatch.setattr(trials, "run_fix", _fake_fix(seen, tmp_path))
    result = CliRunner().invoke(cli, ["fix", "-n", "2", script.name], catch_exceptions=False)
    assert result.exit_code == ExitCode.DETERMINISTIC, result.output
    assert seen[0].schedule.perturbation is None
    assert seen[0].schedule.repeats == 2
    assert "under --perturb" not in result.output


@pytest.mark.parametrize(("perturb", "says"), [
    ("hash-seed", "the knob hash-seed (PYTHONHASHSEED=0) is an environment variable the perturbation itself sets"),
    ("all", "the knob hash-seed (PYTHONHASHSEED=0)"),  # on a run without a GPU: threads and hash-seed
    ("cudnn-benchmark", "only CUDA work can notice this setting"),
    ("threads,bogus", "unknown setting 'bogus'"),
])
def test_a_perturbation_fix_cannot_search_under_is_a_usage_error_before_any_repeat(
        script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], perturb: str,
        says: str) -> None:
    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("the audit ran")

    monkeypatch.setattr(trials, "audit", never)
    with pytest.raises(SystemExit) as ended:
        main(["fix", "--perturb", perturb, script.name])
    output = " ".join(capsys.readouterr().err.split())
    assert ended.value.code == ExitCode.USAGE, output
    assert says in output, output
    assert not (script.parent / ".detaudit").exists()


def test_perturb_with_torchrun_is_refused_as_for_run(script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["fix", "--perturb", "threads", "--nproc-per-node", "2", script.name])
    assert ended.value.code == ExitCode.USAGE
    assert "--nproc-per-node" in capsys.readouterr().err


def test_an_audit_that_cannot_be_fixed_is_shown_from_memory(script: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's own report says why there is nothing to search: the one run_fix handed on_audit, never read back
    from its run directory (removed here before the command ends)."""
    import shutil

    from synthetic import training_records, write_run

    from detaudit.audit.pipeline import load_run

    recs = training_records(steps=1)
    failed = load_run(write_run(tmp_path / "run", [recs, recs], exit_codes=[1, 1]))

    def run_fix(options: AuditOptions, budget: int, on_done: Any, on_progress: Any, on_trial: Any,
                on_audit: Any) -> FixReport:
        on_audit(failed)
        shutil.rmtree(tmp_path / "run")
        return FixReport(script="train.py", run_dir=failed.run_dir, verdict="failed", audit_exit_code=1, budget=budget)

    monkeypatch.setattr(trials, "run_fix", run_fix)
    result = CliRunner().invoke(cli, ["fix", "-n", "2", script.name], catch_exceptions=False)
    assert result.exit_code == failed.exit_code, result.output  # reading the removed run back would exit 4
