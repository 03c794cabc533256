"""drift/recordings.py: a configuration's repeats as `execute` gets them (execute replaced: nothing runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from detaudit.audit.pipeline import AuditOptions, Target
from detaudit.drift import recordings
from detaudit.drift.configurations import Configuration


def test_a_configuration_adds_its_arguments_environment_and_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[AuditOptions, str]] = []

    def execute(options: AuditOptions, run_dir: Path, on_done: Any, prefix: str) -> list[Any]:
        seen.append((options, prefix))
        return []

    monkeypatch.setattr(recordings, "execute", execute)
    config = Configuration("B", {"LOSS_WEIGHT": "2"}, ["--lr", "0.2"], threads=2, python="/opt/py/bin/python")
    recordings.record(AuditOptions(Target(Path("train.py"), ["--steps", "2"])), config, Path("run"), 1, None, None,
                      granularity="op", child_config={"op_window": [3, 3]})
    [(options, prefix)] = seen
    assert (prefix, options.target.script_args, options.target.python) == (
        "b", ["--steps", "2", "--lr", "0.2"], "/opt/py/bin/python")
    assert options.target.env == {"LOSS_WEIGHT": "2", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert (options.recording.granularity, options.recording.run_to_end, options.recording.child_config) == (
        "op", True, {"op_window": [3, 3]})
