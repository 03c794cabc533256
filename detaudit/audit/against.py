"""`detaudit watch --against RUN_DIR|BASELINE`: the watched run compared with an earlier recording of the script.

While the job runs, its trace is followed record by record against the reference's (compare/live.py's
Follower, bit for bit): the first record that differs is reported on standard error at once and, unless
`--on-mismatch continue`, the job is asked to stop at its next step boundary (the stop file that `run`'s live
comparison uses, recorder/bounds.py). Afterwards the two traces are compared whole (compare/traces.py) for the
first divergence's record, module and line, and the environment fingerprints (report/baseline.py) and the
script's arguments are compared for what changed between the two recordings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detaudit.compare import baseline_diff
from detaudit.compare.baseline_diff import EnvironmentChange
from detaudit.compare.live import Follower
from detaudit.compare.traces import compare_traces
from detaudit.errors import UsageError
from detaudit.records import RunRecord
from detaudit.report import baseline
from detaudit.run.rundir import host_environment, read_run
from detaudit.run.watchlog import Mismatch

_WATCHABLE = ("step", "module")  # granularities the watched run can record (op records would be replayed)


@dataclass(frozen=True)
class Reference:
    """The earlier recording: its trace, how it was recorded, and the environment it ran in."""

    given: Path
    trace: Path
    device: str
    granularity: str
    script_args: tuple[str, ...] | None  # None: redacted
    environment: dict[str, Any]


def load_reference(path: Path) -> Reference:
    """A baseline directory (`run --save-baseline`) or a run directory (its first repeat)."""
    if path.is_dir() and os.path.lexists(path / baseline.MANIFEST):
        saved = baseline.load(path)
        granularity = baseline.effective_granularity(saved.granularity)
        reference = Reference(path, saved.trace, saved.result.device, granularity, tuple(saved.script_args),
                              dict(saved.environment))
    else:
        record, results = read_run(path)
        trace = path / results[0].trace
        granularity = baseline.effective_granularity(record.granularity or "module")
        reference = Reference(path, trace, results[0].device, granularity,
                              None if record.args_redacted else tuple(record.script_args),
                              baseline_diff.fingerprint(record, trace, results[0].device))
    if reference.granularity not in _WATCHABLE:
        raise UsageError(f"--against {path} was recorded at granularity {reference.granularity}; watch records at "
                         f"{' or '.join(_WATCHABLE)}: record the reference with `run --granularity step`")
    return reference


def follow(reference: Reference, trace: Path) -> Follower:
    """The live comparison of the watched run's trace with the reference's, bit for bit."""
    return Follower(trace, reference.trace)


def first_difference(reference: Reference, trace: Path) -> Mismatch | None:
    """The first record of the watched run that differs from the reference's, described."""
    comparison = compare_traces([reference.trace, trace], ["same", "same"])
    found = comparison.first_divergence
    if found is None:
        return None
    record = found.record
    return Mismatch(record.step if record is not None else 0, record.name if record is not None else found.category,
                    (record.module or None) if record is not None else None,
                    (record.location or None) if record is not None else None,
                    None, found.max_abs_diff or 0.0, found.max_ulp_diff or 0, None, "against")


def changes(reference: Reference, script: str, script_args: list[str], trace: Path, device: str) \
        -> list[EnvironmentChange]:
    """What differs between the reference's recording and this one: the script's arguments, then the
    environment fingerprint's fields (versions, thread counts, determinism flags, variables)."""
    now = baseline_diff.fingerprint(RunRecord(script, tuple(script_args), environment=host_environment()),
                                    trace, device) if trace.is_file() else {}
    found = baseline_diff.environment_changes(reference.environment, now)
    if reference.script_args is not None and list(reference.script_args) != script_args:
        found.insert(0, EnvironmentChange("script arguments", " ".join(reference.script_args) or "(none)",
                                          " ".join(script_args) or "(none)"))
    return found
