"""Exit codes: one enum (errors.ExitCode) that --help (tests/cli/test_commands.py), README and docs all follow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from detaudit.errors import DetauditError, ExitCode, OutputError, TraceError, UsageError

ROOT = Path(__file__).resolve().parents[1]


def exit_code_tables(text: str) -> list[set[int]]:
    """The codes in the first column of every Markdown table whose header's first cell names a code."""
    tables: list[set[int]] = []
    rows = iter(text.splitlines())
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        if cells and re.fullmatch(r"(exit )?codes?", cells[0].lower()):
            codes: set[int] = set()
            for row in rows:
                if not row.lstrip().startswith("|"):
                    break
                codes.update(int(n) for n in re.findall(r"\b\d+\b", row.strip().strip("|").split("|")[0]))
            tables.append(codes)
    return tables


def test_a_markdown_exit_code_table_is_read_whole() -> None:
    text = "| code | meaning |\n|---|---|\n| 0 | ok |\n| 129 / 130 | stopped |\n\n| other | x |\n| 5 | y |\n"
    assert exit_code_tables(text) == [{0, 129, 130}]


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_exit_code_tables_in_readme_and_docs_list_every_code_of_the_enum(doc: str) -> None:
    path = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    tables = exit_code_tables(path.read_text())
    if doc == "README.md":
        assert tables, "README has lost its exit-code table"
    for codes in tables:
        assert codes == {int(c) for c in ExitCode}, f"{doc}: its exit-code table differs from errors.ExitCode"


def test_the_errors_map_to_their_codes() -> None:
    assert (DetauditError.exit_code, UsageError.exit_code, TraceError.exit_code, OutputError.exit_code) == \
        (ExitCode.USAGE, ExitCode.USAGE, ExitCode.BAD_TRACE, ExitCode.OUTPUT)
    assert ExitCode.INTERRUPTED == 128 + 2
    assert ExitCode.SIGTERM == 128 + 15
    assert ExitCode.SIGHUP == 128 + 1
