"""The run directory: its layout, and its versioned JSON records, written and read back strictly.

One directory per `detaudit run` (mode 0700; default `.detaudit/runs/<stamp>-<script>/`):

- `run.json` — the run record, format `detaudit-run` version 1 (RUN_FORMAT, RUN_VERSION): how
  the script was run (script, arguments or `<redacted>`, cwd, repeats, devices, granularity,
  timeout, tolerance, env, stdout mode, bounds, torchrun launch, baseline), the host environment,
  and `results` (one entry per repeat, a launcher.RepeatResult) once the repeats ended; under
  `--granularity auto` also `narrowing` (the op-level re-run: `window`, `prefix`, `results`), under
  `--self-check` `self_check`, and `interrupted` after Ctrl-C. Field types: schema.RUN_RECORD.
- `<prefix>-<i>.trace|.stdout|.stderr` — repeat i's files (launcher.plan_repeats names them):
  prefix `repeat` for the run, `ops` (OPS_PREFIX) for the op-level re-run, `selfcheck`
  (match.SELF_CHECK_PREFIX), `explain-<pin>` (`explain-<pin>.2` for a later experiment with the same
  pin) for `--explain`; a torchrun run adds a per-rank suffix (distributed.Layout).
- `explain.json` — the stored `--explain` experiments, format `detaudit-explain` version 1
  (EXPLAIN_FORMAT, EXPLAIN_VERSION; schema.EXPLAIN_RECORD), each with its `prefix` and `results`.
- `.explain.lock` — held (flock) by the one `detaudit explain` allowed per directory.
- `report.json` — the last report (docs/report-schema.md); `detaudit report RUN_DIR` rebuilds it
  from the files above alone.

Every file name a record holds must be a plain name inside the directory (never a path).
Bump a record's version on any incompatible change: readers refuse versions they do not know.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from detaudit import __version__, schema
from detaudit.errors import OutputError, TraceError, UsageError, output_error
from detaudit.results import RepeatResult, Tolerance
from detaudit.run.files import write_text_atomically
from detaudit.trace import load_json, open_regular

RUN_FORMAT = "detaudit-run"
RUN_VERSION = 1
RUN_FILE = "run.json"
REPORT_FILE = "report.json"
EXPLAIN_FILE = "explain.json"
EXPLAIN_FORMAT = "detaudit-explain"
EXPLAIN_VERSION = 1
EXPLAIN_LOCK = ".explain.lock"
OPS_PREFIX = "ops"  # traces of the op-level re-run under --granularity auto
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


def claim_run(run_dir: Path, record: dict[str, Any]) -> None:
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
            fh.write(json.dumps(record, indent=2))
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise output_error(path, exc) from None


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Replace run.json (atomically) with the record as it stands now."""
    write_text_atomically(run_dir / RUN_FILE, json.dumps(record, indent=2), mode=0o600)


def host_environment() -> dict[str, Any]:
    """The run record's `environment`: the machine detaudit ran on."""
    return {
        "detaudit": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def stored_args(args: Sequence[str], redact: bool) -> list[str]:
    """The script arguments as run files and reports keep them: each one replaced under --redact-args."""
    return [REDACTED] * len(args) if redact else list(args)


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[RepeatResult]]:
    """The run record and per-repeat results of a run directory (a partial one after an interrupt too).

    Everything in run.json is checked here: field types (schema.RUN_RECORD) and every file it
    names, which must be a plain file name inside the run directory.
    """
    path = Path(run_dir) / RUN_FILE
    if not Path(run_dir).exists():
        raise UsageError(f"no such run directory: {run_dir}")
    if not path.is_file():
        raise TraceError(f"{run_dir}: not a detaudit run directory (no run.json)")
    record = read_json_record(path, "run record")
    if not isinstance(record, dict) or record.get("format") != RUN_FORMAT:
        raise TraceError(f"{path}: not a detaudit run record")
    if record.get("version") != RUN_VERSION:
        raise TraceError(f"{path}: run record version {record.get('version')!r} is not supported "
                         f"(this detaudit reads version {RUN_VERSION})")
    schema.check(record, schema.RUN_RECORD, str(path))
    if not record.get("results"):
        raise TraceError(f"{path}: the run did not finish (no results recorded)")
    results = repeat_results(record["results"], path, "results")
    if record.get("narrowing"):
        repeat_results(record["narrowing"]["results"], path, "narrowing.results")
    return record, results


def repeat_results(entries: list[dict[str, Any]], path: Path, where: str) -> list[RepeatResult]:
    """RepeatResults from (schema-checked) run-file entries; the files they name stay in the run directory."""
    results = [RepeatResult.from_dict(e) for e in entries]
    for i, r in enumerate(results):
        for key in ("trace", "stdout", "stderr"):
            name = getattr(r, key)
            if not is_plain_name(name):
                raise TraceError(f"{path}: field `{where}[{i}].{key}` must name a file inside the run directory, "
                                 f"not {name!r}")
    return results



def tolerance_of(record: dict[str, Any]) -> Tolerance:
    """The run's tolerance (keys this release does not know are ignored)."""
    stored = record.get("tolerance") or {}
    return Tolerance(**{k: float(stored[k]) for k in ("atol", "rtol") if k in stored})


def is_plain_name(name: str) -> bool:
    """A file name with no directory part: it can only resolve inside the run directory."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def read_json_record(path: Path, what: str) -> Any:
    """A JSON record file of a run directory: a regular file, size-capped, deep nesting refused."""
    with open_regular(path, what) as fh:
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise TraceError(f"{path}: {what} larger than {MAX_RECORD_BYTES >> 20} MB; detaudit writes far smaller")
    return load_json(data, f"{path}: unreadable {what}")


def read_experiments(run_dir: Path) -> list[dict[str, Any]]:
    """The stored experiments of explain.json (none when there is no file), validated: field types
    (schema.EXPLAIN_RECORD) and the repeat files each names."""
    path = Path(run_dir) / EXPLAIN_FILE
    if not path.exists():
        return []
    data = read_json_record(path, "experiment record")
    if not isinstance(data, dict) or data.get("format") != EXPLAIN_FORMAT or data.get("version") != EXPLAIN_VERSION:
        raise TraceError(f"{path}: not an experiment record this detaudit reads")
    schema.check(data, schema.EXPLAIN_RECORD, str(path))
    experiments = list(data.get("experiments", []))
    for i, entry in enumerate(experiments):
        repeat_results(entry.get("results", []), path, f"experiments[{i}].results")
    return experiments


def write_experiments(run_dir: Path, stored: list[dict[str, Any]]) -> None:
    """Replace explain.json (atomically) with these experiment entries."""
    write_text_atomically(Path(run_dir) / EXPLAIN_FILE, json.dumps(
        {"format": EXPLAIN_FORMAT, "version": EXPLAIN_VERSION, "experiments": stored}, indent=2), mode=0o600)


def free_prefix(run_dir: Path, base: str) -> str:
    """A repeat-file prefix no earlier repeat in `run_dir` used: `base`, else `base.2`, `base.3`..."""
    prefix, n = base, 1
    while any(Path(run_dir).glob(f"{prefix}-*.trace")):
        n += 1
        prefix = f"{base}.{n}"
    return prefix
