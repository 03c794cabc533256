"""cli/commands.py's command table (COMMANDS): every command of `detaudit` is one row and every row one command,
and each command's --help ends with the exit codes its row says it can return, in its own words where it has them."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from detaudit.cli.commands import COMMANDS, cli
from detaudit.errors import ExitCode

ROWS = {row.name: row for row in COMMANDS}


def help_exit_codes(text: str) -> dict[int, str]:
    """The `Exit codes:` table a --help ends with, code -> meaning."""
    table = text.split("Exit codes:\n", 1)[1]
    return {int(code): meaning for code, meaning in re.findall(r"^\s+(\d+)\s+(.+)$", table, re.M)}


def test_every_command_is_one_row_of_the_table() -> None:
    assert sorted(row.name for row in COMMANDS) == sorted(cli.commands)


def test_no_command_has_two_rows() -> None:
    assert len(ROWS) == len(COMMANDS)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_a_command_s_help_lists_the_exit_codes_of_its_row_with_their_meanings(name: str) -> None:
    row = ROWS[name]
    shown = help_exit_codes(CliRunner().invoke(cli, [name, "--help"], terminal_width=120).output)
    assert shown == {int(code): row.meanings.get(code, code.meaning) for code in row.codes}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_command_can_end_as_main_ends_any_command(name: str) -> None:
    """main() maps a usage error, an unreadable input, an unwritable output, a bug and the signals for every
    command."""
    assert {ExitCode.DETERMINISTIC, ExitCode.USAGE, ExitCode.BAD_TRACE, ExitCode.OUTPUT, ExitCode.INTERNAL,
            ExitCode.SIGHUP, ExitCode.INTERRUPTED, ExitCode.SIGTERM} <= ROWS[name].codes


@pytest.mark.parametrize(("code", "command"), [(ExitCode.NO_CHECKPOINT, "resume"), (ExitCode.UNCONTROLLED, "fix")])
def test_a_command_s_own_code_is_in_its_help_alone(code: ExitCode, command: str) -> None:
    assert [row.name for row in COMMANDS if code in row.codes] == [command]


def test_the_group_s_help_lists_every_exit_code() -> None:
    shown = help_exit_codes(CliRunner().invoke(cli, ["--help"], terminal_width=120).output)
    assert shown == {int(code): code.meaning for code in ExitCode}


def test_the_group_lists_each_command_with_its_row_s_summary_whole() -> None:
    text = CliRunner().invoke(cli, ["--help"], terminal_width=120).output
    listed = dict(re.findall(r"^  (\w+)\s+(.+)$", text.split("Commands:\n", 1)[1].split("\n\n", 1)[0], re.M))
    assert listed == {row.name: row.summary for row in COMMANDS}
