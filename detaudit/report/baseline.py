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
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from detaudit import __version__
from detaudit.compare.outcome import outcome_divergence
from detaudit.compare.perturb import PerturbationFinding
from detaudit.compare.stdout import DEFAULT_STDOUT
from detaudit.compare.traces import compare_traces
from detaudit.errors import TraceError, UsageError
from detaudit.pin import Perturb
from detaudit.records import BaselineManifest, Reference, RunRecord, is_plain_name
from detaudit.report.model import BaselineCheck, EnvironmentChange, Report, Sensitivity
from detaudit.results import RepeatResult, StdoutMode
from detaudit.run.files import copy_atomically, write_text_atomically
from detaudit.run.rundir import read_run
from detaudit.trace import RecordStream, load_json, open_regular, sha256_regular

MANIFEST = "baseline.json"
MAX_MANIFEST_BYTES = 16 << 20
TRACE = "reference.trace"
STDOUT = "reference.stdout"  # compared line by line as the run's --stdout mode says (docs/stdout.md)


@dataclass(frozen=True)
class Baseline:
    """A baseline read back and validated."""

    path: Path
    trace: Path
    granularity: str
    script: str
    script_args: list[str]
    result: RepeatResult  # the recorded repeat: device, exit status, stdout digest
    environment: dict[str, Any]
    survived: dict[str, tuple[str, ...]] = field(default_factory=dict)  # `--perturb` settings that changed no bit


def effective_granularity(granularity: str) -> str:
    """What the compared traces hold: `auto` records modules (its op-level re-run goes elsewhere)."""
    return "module" if granularity == "auto" else granularity


ENVIRONMENT_KEYS = ("python", "torch", "numpy", "cuda", "cudnn", "driver", "cpu", "machine", "os")
FLAG_KEYS = ("num_threads", "num_interop_threads", "deterministic_algorithms", "float32_matmul_precision",
             "matmul.allow_tf32", "cudnn.allow_tf32", "cudnn.benchmark", "cudnn.deterministic")


def fingerprint(record: RunRecord, trace: Path, device: str) -> dict[str, Any]:
    """The environment one repeat ran in, from its trace's evidence (docs/causes.md): versions, hardware,
    allow-listed variables, and the thread count and determinism flags as they stood at the first
    optimizer step (else the first forward, else at import)."""
    stream = RecordStream(trace)
    stream.drain()
    events = stream.events
    env = next((e for e in events if e.get("type") == "environment"), {})
    states = {e.get("when"): e.get("flags") for e in events if e.get("type") == "state" and e.get("flags")}
    flags = states.get("first-step") or states.get("first-forward") or states.get("import") or {}
    host = record.environment
    found: dict[str, Any] = {"detaudit": host.detaudit, "cpu_count": host.cpu_count, "device": device}
    found.update({key: env.get(key) for key in ENVIRONMENT_KEYS})
    found.update({key: flags.get(key) for key in FLAG_KEYS})
    found.update({f"${name}": value for name, value in sorted((env.get("env") or {}).items())})
    return found


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
    if report.verdict != "deterministic":
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


def check(baseline: Baseline, run_dir: Path, record: RunRecord, results: Sequence[RepeatResult],
          stdout: StdoutMode = DEFAULT_STDOUT, perturbed: PerturbationFinding | None = None) -> BaselineCheck:
    """Compare the run's first repeat with the baseline, and list what changed around it (`perturbed`: what
    this run's `--perturb` found, which names the changes the script is known to be sensitive to)."""
    current = results[0]
    trace = Path(run_dir) / current.trace
    labels = [baseline.result.device, current.device]  # same device: bit for bit; else within the tolerance
    comparison = compare_traces([baseline.trace, trace], labels, record.tolerance,
                                truncated=[False, current.timed_out])
    outcome = outcome_divergence([baseline.result, replace(current, index=1)], stdout, Path(run_dir))
    divergence = comparison.first_divergence or outcome
    if divergence is not None and divergence.category == "structure" and outcome is not None:
        divergence = outcome
    now = fingerprint(record, trace, current.device) if trace.is_file() else {}
    changes = environment_changes(baseline.environment, now)
    if baseline.script_args != list(record.script_args):
        changes.insert(0, EnvironmentChange("script arguments", " ".join(baseline.script_args) or "(none)",
                                            " ".join(record.script_args) or "(none)"))
    return BaselineCheck(str(baseline.path), divergence, changes, comparison.records_compared,
                         comparison.records_differing, comparison.by_step,
                         sensitivities(changes, baseline.survived, perturbed, differs=divergence is not None))


# the fingerprint fields (fingerprint() above) in which each `--perturb` setting differs between machines
SENSITIVE_FIELDS: dict[Perturb, tuple[str, ...]] = {
    Perturb.THREADS: ("num_threads", "cpu_count", "$OMP_NUM_THREADS", "$MKL_NUM_THREADS"),
    Perturb.HASH_SEED: ("$PYTHONHASHSEED",),
    Perturb.CUDNN_BENCHMARK: ("cudnn.benchmark",),
    Perturb.CUBLAS_WORKSPACE: ("$CUBLAS_WORKSPACE_CONFIG",),
    Perturb.ALLOCATOR: ("$PYTORCH_CUDA_ALLOC_CONF",),
}


def sensitivities(changes: Sequence[EnvironmentChange], survived: dict[str, tuple[str, ...]],
                  perturbed: PerturbationFinding | None, differs: bool) -> list[Sensitivity]:
    """The changed fingerprint fields that a `--perturb` setting stands for, each with what is known: this run
    showed the bits depend on it, a perturbed run (the baseline's or this one) changed it and no bit moved, or
    no run tested it (listed only when the run `differs` from the baseline: then it is a suspect)."""
    changed = {c.field for c in changes}
    sensitive = {k.knob: k.values for k in perturbed.sensitive} if perturbed is not None else {}
    survived = {**survived, **({k.knob: k.values for k in perturbed.survived} if perturbed is not None else {})}
    found = []
    for knob, names in SENSITIVE_FIELDS.items():
        fields = [name for name in names if name in changed]
        if not fields:
            continue
        if knob.value in sensitive:
            values = " vs ".join(sensitive[knob.value])
            found.append(Sensitivity(knob.value, fields, "sensitive", f"this run's --perturb {knob.value} showed "
                                     f"the bits change with it ({values}): " + (
                                         "the difference from the baseline matches it" if differs else
                                         "a machine where it differs from the baseline's will not match it")))
        elif knob.value in survived:
            values = " vs ".join(survived[knob.value])
            found.append(Sensitivity(knob.value, fields, "survived", f"a --perturb {knob.value} run changed it "
                                     f"({values}) and no bit moved: it does not explain a difference"))
        elif differs:
            found.append(Sensitivity(knob.value, fields, "untested", f"not tested: `detaudit run --perturb "
                                     f"{knob.value}` tells whether the difference comes from it"))
    return found


def environment_changes(before: dict[str, Any], after: dict[str, Any]) -> list[EnvironmentChange]:
    """Every fingerprint field whose value differs (a field only one side has counts as changed)."""
    return [EnvironmentChange(key, before.get(key), after.get(key))
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]

