"""Baselines: one recorded run kept (committed, or a CI artifact) to compare later runs with.

`detaudit run SCRIPT --save-baseline DIR` keeps the first repeat's trace (`reference.trace`,
about 90 bytes a record) and a manifest (`baseline.json`): how it was run, how it ended, and
the environment fingerprint (host, Python, torch build, threads, determinism flags, the
environment variables that steer them). `--baseline DIR` compares a new run's first repeat with
it, as well as the repeats with each other, and names every fingerprint field that changed, so
"the upgrade changed the numbers" reads differently from "the job is nondeterministic".

Format `detaudit-baseline` version 1 (docs/trace-format.md, "Baselines"); read back strictly:
a manifest that is not one, of another version, or whose trace does not match its checksum is
refused (exit 4). JSON and the trace format only: never pickle.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from detaudit import __version__
from detaudit.compare.baseline_diff import Baseline, fingerprint
from detaudit.errors import TraceError, UsageError
from detaudit.records import BaselineManifest, Reference, is_plain_name
from detaudit.report.model import Report
from detaudit.results import RepeatResult
from detaudit.run.files import copy_atomically, write_text_atomically
from detaudit.run.rundir import read_run
from detaudit.trace import load_json, open_regular, sha256_regular

MANIFEST = "baseline.json"
MAX_MANIFEST_BYTES = 16 << 20
TRACE = "reference.trace"
STDOUT = "reference.stdout"  # compared line by line as the run's --stdout mode says (docs/stdout.md)


def effective_granularity(granularity: str) -> str:
    """What the compared traces hold: `auto` records modules (its op-level re-run goes elsewhere)."""
    return "module" if granularity == "auto" else granularity


def replaces(dest: Path) -> str | None:
    """What saving into `dest` replaces, in words (the older baseline's script, arguments, records and when it
    was recorded), or None when `dest` holds no baseline. Read leniently: a damaged one is still replaced."""
    manifest_path = Path(dest) / MANIFEST
    if not os.path.lexists(manifest_path):
        return None
    try:
        with open_regular(manifest_path, "baseline manifest") as fh:
            data = load_json(fh.read(MAX_MANIFEST_BYTES), f"{manifest_path}: unreadable baseline manifest")
        old = BaselineManifest.from_dict(data, str(manifest_path))
    except (TraceError, OSError):
        return f"a baseline in {dest} whose {MANIFEST} could not be read"
    args = f" {' '.join(old.script_args)}" if old.script_args else ""
    records = f", {old.reference.records} records" if old.reference.records is not None else ""
    when = f"recorded {old.created}" if old.created else "of unknown date"
    return f"the baseline of {old.script}{args} {when} (detaudit {old.detaudit_version or '?'}{records})"


def save(run_dir: Path, report: Report, dest: Path) -> Path:
    """Keep `report`'s first repeat as a baseline in `dest` (new, empty, or an older baseline to replace:
    `replaces` says what that was, read before this call)."""
    if report.agreement != "deterministic":  # a gate's verdict (repeated-randomness) has repeats that agree
        raise UsageError(f"baseline not saved: the run is {report.verdict}; a baseline must come from repeats "
                         "that agree, or every later comparison would fail")
    dest = Path(dest)
    check_destination(dest)
    record, results = read_run(run_dir)
    first = results[0]
    source = Path(run_dir) / first.trace
    dest.mkdir(parents=True, exist_ok=True)
    copy_atomically(source, "trace", dest / TRACE)  # read never through a link, written by rename
    printed = Path(run_dir) / first.stdout
    if first.stdout and os.path.lexists(printed):
        copy_atomically(printed, "stdout capture", dest / STDOUT)
    if first.exit_code is None:
        raise UsageError("baseline not saved: the first repeat's exit status is unknown")
    manifest = BaselineManifest(
        script=Path(record.script).name, script_args=record.script_args,
        granularity=effective_granularity(record.granularity or "module"),
        reference=Reference(TRACE, sha256_regular(dest / TRACE, "baseline trace"), first.device, first.exit_code,
                            first.stdout_digest, report.comparison.records[0]),
        environment=fingerprint(record, source, first.device), detaudit_version=__version__,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        survived={k.knob: k.values for k in report.perturbation.survived} if report.perturbation else {})
    write_text_atomically(dest / MANIFEST, json.dumps(manifest.to_dict(), indent=2) + "\n")
    return dest


def check_destination(dest: Path) -> None:
    """`--save-baseline DIR` must be a new or empty directory, or a baseline to replace (UsageError, exit 2);
    the CLI checks it before any repeat runs, so a CI job never learns only at the end that nothing was kept."""
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not (dest / MANIFEST).is_file())):
        raise UsageError(f"--save-baseline {dest}: not a new or empty directory, nor a baseline to replace")


def load(path: Path) -> Baseline:
    """Read and validate a baseline directory (or its baseline.json)."""
    path = Path(path)
    directory = path.parent if path.name == MANIFEST else path
    manifest_path = directory / MANIFEST
    if not os.path.lexists(manifest_path):
        raise TraceError(f"{path}: not a detaudit baseline (no {MANIFEST}); record one with "
                         "`detaudit run SCRIPT --save-baseline DIR`")
    with open_regular(manifest_path, "baseline manifest") as fh:  # no FIFO or device; size-capped; nesting refused
        data = load_json(fh.read(MAX_MANIFEST_BYTES), f"{manifest_path}: unreadable baseline manifest")
    manifest = BaselineManifest.from_dict(data, str(manifest_path))
    ref = manifest.reference
    # the directory resolved, never its files: a link planted as one is refused when it is opened
    trace = directory.resolve() / ref.trace
    printed = directory.resolve() / STDOUT
    result = RepeatResult(index=0, device=ref.device, exit_code=ref.exit_code, duration_s=None, timed_out=False,
                          trace=str(trace), stdout=str(printed) if os.path.lexists(printed) else "",
                          stderr="", stdout_digest=ref.stdout_digest)
    baseline = Baseline(directory, trace, manifest.granularity, manifest.script, list(manifest.script_args), result,
                        dict(manifest.environment), dict(manifest.survived))
    if not is_plain_name(ref.trace) or not os.path.lexists(trace):
        raise TraceError(f"{manifest_path}: its trace {ref.trace!r} is missing")
    if sha256_regular(trace, "baseline trace") != ref.sha256:
        raise TraceError(f"{trace}: does not match the checksum in {MANIFEST} (edited or corrupt); "
                         "record the baseline again")
    return baseline
