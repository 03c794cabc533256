"""`detaudit watch --against`'s reference and what changed since it (detaudit/audit/against.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from detaudit.audit.against import Reference, changes, load_reference
from detaudit.compare.baseline_diff import EnvironmentChange
from detaudit.errors import TraceError


def test_changed_script_arguments_come_first(tmp_path: Path) -> None:
    reference = Reference(tmp_path, tmp_path / "absent.trace", "cpu", "step", ("8",), {})
    found = changes(reference, "t.py", ["8", "0.02"], tmp_path / "absent.trace", "cpu")
    assert found == [EnvironmentChange("script arguments", "8", "8 0.02")]


def test_redacted_arguments_are_not_compared(tmp_path: Path) -> None:
    reference = Reference(tmp_path, tmp_path / "absent.trace", "cpu", "step", None, {})
    assert changes(reference, "t.py", ["8"], tmp_path / "absent.trace", "cpu") == []


def test_a_directory_that_is_neither_a_run_nor_a_baseline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not a detaudit run directory"):
        load_reference(tmp_path)
