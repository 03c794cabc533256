"""Parallel repeats share the script's working directory: find the ones that wrote the same file.

With `-j N` repeats run at the same time where `python script.py` would run, so a script that
checkpoints to a fixed name (`ckpt.pt`) and reloads it can read another repeat's checkpoint, and
the repeats would differ because of detaudit's parallelism, not the script. Each repeat records
the files it opens for writing (`file-write` events, recorder/evidence/writes.py); the repeats of a
parallel batch that wrote a path another repeat of the batch wrote too are re-run one after
another (audit/pipeline.py `execute`), each result saying why (`RepeatResult.rerun_alone`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from detaudit.events import WORKERS_SUFFIX, FileWriteEvent, kind_of
from detaudit.results import RepeatResult
from detaudit.run.launcher import RepeatPlan
from detaudit.trace import read_events

SHOWN_PATHS = 3


def shared_writes(results: Sequence[RepeatResult], run_dir: Path) -> dict[int, str]:
    """Repeat index -> why it must be re-run alone, for each repeat that wrote a file another wrote too."""
    writers: dict[str, set[int]] = {}
    for result in results:
        for event in read_events(Path(run_dir) / result.trace, kind_of(FileWriteEvent)):
            writers.setdefault(str(event["path"]), set()).add(result.index)
    shared = {path: indices for path, indices in writers.items() if len(indices) > 1}
    reasons: dict[int, str] = {}
    for index in sorted({i for indices in shared.values() for i in indices}):
        paths = sorted(path for path, indices in shared.items() if index in indices)
        shown = ", ".join(_display(p) for p in paths[:SHOWN_PATHS]) + (
            f" and {len(paths) - SHOWN_PATHS} more" if len(paths) > SHOWN_PATHS else "")
        others = sorted({i for p in paths for i in shared[p]} - {index})
        reasons[index] = (f"run in parallel (-j), it and repeat(s) {', '.join(map(str, others))} wrote {shown} in "
                          "the one working directory they share")
    return reasons


def discard(plan: RepeatPlan) -> None:
    """Remove a repeat's files before it is re-run (they are created exclusively; a link is unlinked, not
    followed)."""
    for path in (plan.trace, plan.stdout, plan.stderr, Path(str(plan.trace) + WORKERS_SUFFIX)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _display(path: str) -> str:
    """A path relative to the working directory when it is inside it (`ckpt.pt`), else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative
