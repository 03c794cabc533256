"""How the repeats ended: another exit status, or another line on stdout, is a divergence of its own.

Shared by the audit (repeats compared with each other) and the baseline check (the first repeat
compared with a recorded one); below both.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from detaudit.compare.stdout import DEFAULT_STDOUT, compare_stdout, steady_difference
from detaudit.results import Divergence, RecordInfo, RepeatResult, StdoutMode


def outcome_divergence(results: Sequence[RepeatResult], stdout: StdoutMode = DEFAULT_STDOUT,
                       run_dir: Path = Path(".")) -> Divergence | None:
    """Repeats that end differently: another exit status, or another line on stdout (docs/stdout.md).

    Only repeats that ended by themselves count: a timed-out repeat, or one stopped by
    --max-steps/--max-time, was stopped, and an incomplete recording's exit status is unknown. Stdout is
    compared between repeats on one device.
    """
    ended = [r for r in results if not r.timed_out and r.exit_code is not None and r.stopped_at_step is None]
    if len(ended) < 2:
        return None
    ref = ended[0]
    codes = [r for r in ended if r.exit_code != ref.exit_code]
    if codes:
        detail = "exit status differs: " + ", ".join(f"repeat {r.index} exited {r.exit_code}" for r in ended)
        return Divergence(-1, "outcome", None, [r.index for r in codes], ref.index, detail=detail)
    # lexists: a link planted as a capture is compared, so its reader refuses it (trace.open_regular)
    printed = [r for r in ended if r.device == ref.device and r.stdout and os.path.lexists(run_dir / r.stdout)]
    if stdout == "ignore" or len(printed) < 2 or printed[0] is not ref:
        return None
    found = compare_stdout([run_dir / r.stdout for r in printed], [r.index for r in printed], stdout)
    if found is None:
        return None
    hint = "; `--stdout ignore` skips stdout" if stdout == "masked" else \
        "; the default `--stdout masked` ignores timings (docs/stdout.md)"
    at = f" at {found.field}" if found.field else ""
    record = RecordInfo(-1, "stdout", f"line {found.line}", "", "", -1, "", "", "", False)
    return Divergence(-1, "outcome", record, found.repeats, ref.index, stdout=found,
                      detail=f"stdout line {found.line} differs{at} ({found.mode} comparison){hint}")


def outcome_beyond_noise(reference: Sequence[RepeatResult], other: RepeatResult,
                         stdout: StdoutMode = DEFAULT_STDOUT) -> tuple[Divergence | None, list[int]]:
    """`other`'s end against the first of `reference`'s repeats, as `run` compares repeats' ends: the exit status
    (`outcome_divergence`), then stdout with its volatile tokens masked (compare/stdout.py), beside a noise floor:
    the lines the reference's own repeats (run with the reduction order changed) print otherwise already (a loss in
    its last digits) are no evidence, so `other`'s difference there is not judged (`steady_difference`). Returns
    `other`'s divergence (None: none elsewhere) and those lines. Stdout paths are read as given (absolute ones
    where the repeats lie in other directories); stdout is compared between repeats on one device."""
    last = max((r.index for r in reference), default=-1)
    ended = outcome_divergence([*reference[:1], replace(other, index=last + 1)], "ignore")
    if ended is not None or not reference:
        return ended, []
    printed = [r for r in reference if r.device == other.device and r.stdout and os.path.lexists(r.stdout)]
    if not other.stdout or not os.path.lexists(other.stdout) or not printed or printed[0] is not reference[0]:
        return None, []
    found, noisy = steady_difference([Path(r.stdout) for r in printed], Path(other.stdout), stdout)
    if found is None:
        return None, noisy
    at = f" at {found.field}" if found.field else ""
    record = RecordInfo(-1, "stdout", f"line {found.line}", "", "", -1, "", "", "", False)
    return Divergence(-1, "outcome", record, [1], 0, stdout=found,
                      detail=f"stdout line {found.line} differs{at} ({found.mode} comparison)"), noisy
