"""Why it diverged: detectors that read recorded evidence and the comparison (docs/causes.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from detaudit.compare import Comparison
from detaudit.launcher import RepeatResult
from detaudit.report import Cause


def diagnose(comparison: Comparison, traces: Sequence[Path], runs: Sequence[RepeatResult]) -> list[Cause]:
    """Ranked causes of the first divergence; empty for a deterministic run."""
    return []
