"""The run directory: its layout, and its versioned JSON records, written and read back strictly.

One directory per `detaudit run` (mode 0700; default `.detaudit/runs/<stamp>-<script>/`):

- `run.json` — the run record, format `detaudit-run` version 1 (records.RunRecord): how
  the script was run (script, arguments or `<redacted>`, cwd, repeats, devices, granularity,
  timeout, tolerance, env, stdout mode, bounds, torchrun launch, baseline), the host environment,
  and `results` (one entry per repeat, a launcher.RepeatResult) once the repeats ended; under
  `--granularity auto` also `narrowing` (the op-level re-run: `window`, `prefix`, `results`), under
  `--self-check` `self_check`, and `interrupted` after Ctrl-C.
- `<prefix>-<i>.trace|.stdout|.stderr` — repeat i's files (launcher.plan_repeats names them):
  prefix `repeat` for the run, `ops` (records.OPS_PREFIX) for the op-level re-run, `selfcheck`
  (match.SELF_CHECK_PREFIX), `explain-<pin>` (`explain-<pin>.2` for a later experiment with the same
  pin) for `--explain`; a torchrun run adds a per-rank suffix (distributed.Layout).
- `explain.json` — the stored `--explain` experiments, format `detaudit-explain` version 1
  (records.ExplainRecord), each with its `prefix` and `results`.
- `.explain.lock` — held (flock) by the one `detaudit explain` allowed per directory.
- `batch.json` — instead of run.json and report.json in a `detaudit batch` run directory (whose
  repeats are `batch-<i>.*`): its report, format `detaudit-batch` (docs/batch.md).
- `report.json` — the last report (docs/report-schema.md); `detaudit report RUN_DIR` rebuilds it
  from the files above alone.

The records are read and written as types (detaudit/records.py); this module opens the files.
Every file name a record holds must be a plain name inside the directory (never a path).
Bump a record's version on any incompatible change: readers refuse versions they do not know.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from detaudit import __version__
from detaudit.errors import OutputError, TraceError, UsageError, output_error
from detaudit.records import ExplainRecord, Host, RunRecord, StoredExperiment
from detaudit.results import RepeatResult
from detaudit.run.files import write_text_atomically
from detaudit.trace import load_json, open_regular

RUN_FILE = "run.json"
REPORT_FILE = "report.json"
EXPLAIN_FILE = "explain.json"
BATCH_FILE = "batch.json"  # `detaudit batch`'s report (docs/batch.md), in place of run.json
EXPLAIN_LOCK = ".explain.lock"
DEFAULT_RUNS_DIR = Path(".detaudit") / "runs"
MAX_RECORD_BYTES = 64 << 20  # run.json / explain.json larger than this were not written by detaudit
REDACTED = "<redacted>"


def new_run_dir(script: Path, out_dir: Path | None) -> Path:
    """A fresh directory for this run (mode 0700: traces hold the script's arguments and data digests).

    Never reuses one that already holds a run. The directory is claimed by creating it, or, for an
    existing empty `--out`, by `claim_run` creating run.json exclusively: two runs started together
    with one `--out` cannot both write into it.
    """
    try:
        if out_dir is not None:
            if out_dir.exists() and not out_dir.is_dir():
                raise UsageError(f"--out {out_dir} is a file, not a directory; give a new or empty directory")
            above = next((p for p in out_dir.absolute().parents if p.exists()), None)
            if above is not None and not above.is_dir():
                raise OutputError(f"cannot write {out_dir}: {above} is a file, not a directory")
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                out_dir.mkdir(mode=0o700)
            except FileExistsError:
                if any(out_dir.iterdir()):
                    raise UsageError(f"--out {out_dir} already exists and is not empty; detaudit never overwrites "
                                     "a run") from None
            return out_dir
        home = DEFAULT_RUNS_DIR.parent
        if not home.exists():
            home.mkdir(parents=True, exist_ok=True)
            # runs are local artefacts (traces can be large): keep them out of the user's repository
            (home / ".gitignore").write_text("# created by detaudit: its run directories are not for version "
                                             "control\n*\n")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = DEFAULT_RUNS_DIR / f"{stamp}-{script.stem}"
        base.parent.mkdir(parents=True, exist_ok=True)
        candidate, n = base, 1
        while True:
            try:
                candidate.mkdir(mode=0o700)
                return candidate
            except FileExistsError:
                n += 1
                candidate = base.with_name(f"{base.name}-{n}")
    except OSError as exc:
        raise output_error(out_dir if out_dir is not None else DEFAULT_RUNS_DIR, exc) from None


def claim_run(run_dir: Path, record: RunRecord) -> None:
    """Write the first run.json exclusively: whoever creates it owns the directory."""
    path = run_dir / RUN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise UsageError(f"--out {run_dir} was taken by another detaudit run started at the same time; give each "
                         "run its own directory") from None
    except OSError as exc:
        raise output_error(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(record.to_dict(), indent=2))
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise output_error(path, exc) from None


def write_record(run_dir: Path, record: RunRecord) -> None:
    """Replace run.json (atomically) with the record as it stands now."""
    write_text_atomically(run_dir / RUN_FILE, json.dumps(record.to_dict(), indent=2), mode=0o600)


def host_environment() -> Host:
    """The run record's `environment`: the machine detaudit runs on."""
    return Host(__version__, platform.python_version(), platform.platform(), platform.machine(), os.cpu_count())


def stored_args(args: Sequence[str], redact: bool) -> list[str]:
    """The script arguments as run files and reports keep them: each one replaced under --redact-args."""
    return [REDACTED] * len(args) if redact else list(args)


def read_run(run_dir: Path) -> tuple[RunRecord, list[RepeatResult]]:
    """The run record and per-repeat results of a run directory (a partial one after an interrupt too).

    Everything in run.json is checked (records.RunRecord.from_dict): field types, and every file it
    names, which must be a plain file name inside the run directory.
    """
    path = Path(run_dir) / RUN_FILE
    if not Path(run_dir).exists():
        raise UsageError(f"no such run directory: {run_dir}")
    if not os.path.lexists(path):  # a link planted as run.json is refused by its reader, naming it
        if os.path.lexists(Path(run_dir) / BATCH_FILE):
            raise TraceError(f"{run_dir}: a `detaudit batch` run, not a `run` (no run.json): its report is "
                             f"{Path(run_dir) / BATCH_FILE}")
        raise TraceError(f"{run_dir}: not a detaudit run directory (no run.json)")
    record = RunRecord.from_dict(read_json_record(path, "run record"), str(path))
    if not record.results:
        raise TraceError(f"{path}: the run did not finish (no results recorded)")
    _check_results_whole(Path(run_dir), record, path)
    return record, list(record.results)


def _check_results_whole(run_dir: Path, record: RunRecord, path: Path) -> None:
    """A run record lists one result per repeat it ran, numbered from 0 (an interrupted run's too: the
    launcher lists every planned repeat), and every repeat whose files are in the directory: a record that lists
    fewer (edited, or pieced together) would compare the repeats left as if they were all, a verdict on less than
    the run. Refused as corrupt (TraceError) instead."""
    results = record.results or ()
    devices = len(record.devices) or len({r.device for r in results})
    declared = None if record.repeats is None else record.repeats * devices
    listed = sorted(r.index for r in results)
    edited = "the record is corrupt or was edited (detaudit lists every repeat, an interrupted one too)"
    if declared is not None and len(results) != declared:
        raise TraceError(f"{path}: lists {len(results)} result(s) for the {record.repeats} repeat(s) it declares "
                         f"on {devices} device(s): {edited}")
    if listed != list(range(len(results))):
        raise TraceError(f"{path}: its results are repeats {', '.join(map(str, listed))}, not 0 to "
                         f"{len(results) - 1}: {edited}")
    files = (re.fullmatch(r"repeat-(\d+)\..+", name) for name in os.listdir(run_dir))
    unlisted = sorted({int(m[1]) for m in files if m is not None and int(m[1]) >= len(results)})
    if unlisted:
        raise TraceError(f"{path}: the directory holds the files of repeat(s) {', '.join(map(str, unlisted))}, "
                         f"which it does not list: {edited}")


def read_json_record(path: Path, what: str) -> Any:
    """A JSON record file of a run directory: a regular file, size-capped, deep nesting refused."""
    with open_regular(path, what) as fh:
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise TraceError(f"{path}: {what} larger than {MAX_RECORD_BYTES >> 20} MB; detaudit writes far smaller")
    return load_json(data, f"{path}: unreadable {what}")


def read_experiments(run_dir: Path) -> list[StoredExperiment]:
    """The stored experiments of explain.json (none when there is no file), validated
    (records.ExplainRecord.from_dict: field types and the repeat files each names)."""
    path = Path(run_dir) / EXPLAIN_FILE
    if not os.path.lexists(path):
        return []
    return list(ExplainRecord.from_dict(read_json_record(path, "experiment record"), str(path)).experiments)


def write_experiments(run_dir: Path, stored: Sequence[StoredExperiment]) -> None:
    """Replace explain.json (atomically) with these experiments."""
    write_text_atomically(Path(run_dir) / EXPLAIN_FILE, json.dumps(ExplainRecord(tuple(stored)).to_dict(), indent=2),
                          mode=0o600)


def free_prefix(run_dir: Path, base: str) -> str:
    """A repeat-file prefix no earlier repeat in `run_dir` used: `base`, else `base.2`, `base.3`...
    (any file of a repeat counts: its files are created exclusively, launcher.run_one)."""
    names = set(os.listdir(run_dir))
    prefix, n = base, 1
    while any(re.fullmatch(rf"{re.escape(prefix)}-\d+\..+", name) for name in names):
        n += 1
        prefix = f"{base}.{n}"
    return prefix
