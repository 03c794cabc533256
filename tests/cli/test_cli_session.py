"""cli_session.py: what a command prints while the library works (consoles, progress lines, a baseline
that could not be saved); the commands themselves are tested in test_cli_core.py."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console, Group
from rich.text import Text

import detaudit.cli.session as session
import detaudit.report.baseline
from detaudit.errors import ExitCode, OutputError
from detaudit.results import RepeatProgress, RepeatResult


@pytest.fixture
def stderr(monkeypatch: pytest.MonkeyPatch) -> StringIO:
    text = StringIO()
    monkeypatch.setattr(session, "err_console", Console(file=text, width=200))
    return text


def test_progress_off_a_terminal_is_one_plain_line_per_repeat(stderr: StringIO) -> None:
    with session.RepeatsProgress(False, 2) as progress:
        assert progress.on_done is not None
        progress.on_done(RepeatResult(0, "cpu", 0, 1.25, False, "repeat-0.trace", "", "", ""))
        progress.on_done(RepeatResult(1, "cpu", None, 9.0, True, "repeat-1.trace", "", "", ""))
        progress.on_done(RepeatResult(2, "cpu", 0, 3.0, False, "repeat-2.trace", "", "", "", stopped_at_step=9,
                                      stopped_by="divergence", diverged_at_step=5))
    assert stderr.getvalue().splitlines() == ["repeat-0 (cpu): exit 0 in 1.2s", "repeat-1 (cpu): timed out in 9.0s",
                                              "repeat-2 (cpu): stopped after step 9 (diverged at step 5) in 3.0s"]


def test_a_running_repeat_is_a_plain_line_every_few_seconds_never_a_flood(stderr: StringIO,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(session.time, "monotonic", lambda: clock[0])
    with session.RepeatsProgress(False, 2) as progress:
        assert progress.on_progress is not None
        for step in range(0, 60):  # a poll every 0.25 s for 15 s
            progress.on_progress(RepeatProgress(1, "repeat-1", step, 4.0, 0, step, None, None, 100, 20.0))
            clock[0] += 0.25
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 2
    assert clock[0] - 100.0 >= session.PLAIN_EVERY_S
    assert lines == ["running repeat-1: step 1, 4.0 steps/s; agrees with repeat 0 through step 1; about 20s left",
                     "running repeat-1: step 41, 4.0 steps/s; agrees with repeat 0 through step 41; about 20s left"]


@pytest.mark.parametrize("progress, line", [
    (RepeatProgress(0, "repeat-0", 12, None), "repeat-0: step 12"),
    (RepeatProgress(1, "repeat-1", 300, 12.5, 0, 299, None, None, 3000, 216.0),
     "repeat-1: step 300, 12.5 steps/s; agrees with repeat 0 through step 299; about 3m36s left"),
    (RepeatProgress(2, "explain-hash-seed-2", 14, 50.0, 0, 11, 12, 16, 3000, 0.04),
     "explain-hash-seed-2: step 14, 50.0 steps/s; diverged from repeat 0 at step 12, stopping after step 16; "
     "about 0s left"),
    (RepeatProgress(1, "repeat-1", 10, 1.0, 0, None, None, None, None, 7300.0), "repeat-1: step 10, 1.0 steps/s; "
     "about 2h01m left"),
])
def test_describe_progress(progress: RepeatProgress, line: str) -> None:
    assert session.describe_progress(progress) == line


def test_quiet_shows_no_progress(stderr: StringIO) -> None:
    with session.RepeatsProgress(True, 2) as progress:
        assert progress.on_done is None
        assert progress.on_progress is None
    assert stderr.getvalue() == ""


def test_a_pipe_is_never_wrapped_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("sys.stdout", StringIO())
    assert session.stdout_console().width == session.PIPE_WIDTH


def test_off_a_terminal_prose_wraps_at_a_readable_width_and_a_soft_wrapped_line_stays_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45: a report piped to a file had lines of 867 characters."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = StringIO()
    monkeypatch.setattr("sys.stdout", out)
    console = session.stdout_console()
    prose = " ".join(["word"] * 100)
    console.print(prose)
    console.print(Group(Text("a heading"), Text(prose)))  # a block of lines (render.py's match_block)
    console.print(prose, soft_wrap=True)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines[:-1]) <= session.PROSE_WIDTH
    assert lines[-1] == prose


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


class Kind:
    """A report kind of the tests' own: the finisher knows it only through a Presentation."""

    exit_code = 3


def presentation(written: list[str]) -> session.Presentation[Kind]:
    def reporter(name: str) -> session.Reporter[Kind]:
        return lambda report, path: written.append(f"{name} {path}")

    return session.Presentation({"json": reporter("json"), "html": reporter("html")}, lambda r: "one line",
                                lambda r, console: console.print("full rendering"))


@pytest.mark.parametrize(("paths", "written", "on_stderr"), [
    ({"json": None, "html": None}, [], False),
    ({"json": Path("r.json"), "html": Path("r.html")}, ["json r.json", "html r.html"], False),
    ({"json": Path("-"), "html": None}, ["json -"], True),
])
def test_one_finisher_writes_the_files_asked_for_renders_and_exits_with_the_kinds_code(
        stderr: StringIO, monkeypatch: pytest.MonkeyPatch, paths: dict[str, Path | None], written: list[str],
        on_stderr: bool) -> None:
    stdout = StringIO()
    monkeypatch.setattr(session, "stdout_console", lambda quiet=False: Console(file=stdout, width=200))
    done: list[str] = []
    with pytest.raises(SystemExit) as ended:
        session.finish_with(Kind(), presentation(done), paths, quiet=False)
    assert ended.value.code == 3
    assert done == written
    assert "full rendering" in (stderr if on_stderr else stdout).getvalue()


def test_quiet_prints_the_summary_line_only(stderr: StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    stdout = StringIO()
    monkeypatch.setattr(session, "stdout_console", lambda quiet=False: Console(file=stdout, width=200))
    with pytest.raises(SystemExit):
        session.finish_with(Kind(), presentation([]), {"json": None}, quiet=True, exit_code=0)
    assert stdout.getvalue() == "one line\n"
