"""A run compared with a recorded baseline (`detaudit run --baseline DIR`): its first repeat's trace with the
baseline's, and the environment fingerprint field by field, naming the changes a `--perturb` setting stands for.

The baseline's files (saved, read back and validated) are report/baseline.py's; this is the comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from detaudit.compare.outcome import outcome_divergence
from detaudit.compare.perturb import PerturbationFinding
from detaudit.compare.stdout import DEFAULT_STDOUT
from detaudit.compare.traces import StepSpread, compare_traces
from detaudit.pin import Perturb
from detaudit.records import RunRecord
from detaudit.results import Divergence, RepeatResult, StdoutMode
from detaudit.trace import RecordStream


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


@dataclass(frozen=True)
class EnvironmentChange:
    """One environment fingerprint field that differs from the baseline's (compare/baseline_diff.py)."""

    field: str
    baseline: Any
    current: Any


# survived: the baseline's run (or this one) varied the setting with `--perturb` and no bit changed; sensitive:
# this run's `--perturb` showed the bits depend on it; untested: no run varied it
SensitivityStatus = Literal["survived", "sensitive", "untested"]


@dataclass(frozen=True)
class Sensitivity:
    """An environment difference from the baseline that a `--perturb` setting stands for (compare/baseline_diff.py),
    and what is known of the script's sensitivity to it."""

    setting: str  # a `--perturb` setting: threads, hash-seed, ...
    fields: list[str]  # the fingerprint fields that changed
    status: SensitivityStatus
    note: str


@dataclass(frozen=True)
class BaselineCheck:
    """The run's first repeat compared with a recorded baseline (`detaudit run --baseline DIR`)."""

    path: str
    divergence: Divergence | None
    environment_changes: list[EnvironmentChange]
    records_compared: int = 0
    records_differing: int = 0
    by_step: list[StepSpread] = field(default_factory=list)
    sensitivities: list[Sensitivity] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return self.divergence is None


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
