"""cli_session.py: what a command prints while the library works (consoles, progress lines, a baseline
that could not be saved); the commands themselves are tested in test_cli_core.py."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

import detaudit.cli.session as session
import detaudit.report.baseline
from detaudit.errors import ExitCode, OutputError
from detaudit.results import RepeatResult


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> StringIO:
    text = StringIO()
    monkeypatch.setattr(session, "err_console", Console(file=text, width=200))
    return text


def test_progress_off_a_terminal_is_one_plain_line_per_repeat(stderr: StringIO) -> None:
    context, on_done = session.progress_runner(False, 2)
    with context:
        on_done(RepeatResult(0, "cpu", 0, 1.25, False, "repeat-0.trace", "", "", ""))
        on_done(RepeatResult(1, "cpu", None, 9.0, True, "repeat-1.trace", "", "", ""))
    assert stderr.getvalue().splitlines() == ["repeat-0 (cpu): exit 0 in 1.2s", "repeat-1 (cpu): timed out in 9.0s"]


def test_quiet_shows_no_progress(stderr: StringIO) -> None:
    context, on_done = session.progress_runner(True, 2)
    assert on_done is None
    with context:
        pass
    assert stderr.getvalue() == ""


def test_a_pipe_is_never_wrapped_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("sys.stdout", StringIO())
    assert session.stdout_console().width == session.PIPE_WIDTH


@pytest.mark.parametrize("run_exit, expected", [(0, ExitCode.OUTPUT), (1, None)])
def test_a_baseline_that_cannot_be_saved_fails_a_run_that_agreed(stderr: StringIO, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, run_exit: int,
                                                                 expected: int | None) -> None:
    """Issue 27 C8: a CI job must notice that no baseline was kept; a divergent run's exit 1 already says so."""
    def refuse(*args: object) -> Path:
        raise OutputError("cannot write base: read-only")

    monkeypatch.setattr(detaudit.report.baseline, "save", refuse)

    class Finished:
        run_dir = str(tmp_path)
        exit_code = run_exit

    assert session.save_baseline_to(Finished(), tmp_path / "base") == expected
    assert "cannot write base: read-only" in stderr.getvalue()
