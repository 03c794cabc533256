"""Causes a `run --perturb` proves: a setting varied on purpose changed the bits (docs/perturb.md).

One detector per setting, each reporting the cause id that names what was varied (`thread-count`,
`python-hash-seed`, `cudnn-benchmark`, `cublas-workspace`, `allocator`). The proof is the run's own
design (compare/perturb.py): repeats with equal settings agree, and the group that differs in this one
setting differs in its bits; so the basis is `experiment` and the cause `confirmed`. What each repeat's
trace recorded of the setting (the thread count torch used, the variables it saw) shows the setting
took effect.
"""

from __future__ import annotations

from dataclasses import replace

from detaudit.cause_table import CAUSES, PERTURBED
from detaudit.causes.context import Context, Detector, Finding, RepeatEvidence, detects, finding, where
from detaudit.events import EnvironmentEvent
from detaudit.pin import Perturb, perturbations

# per setting: the summary (what a result recorded here means elsewhere) and the fix
TEXT: dict[Perturb, tuple[str, str]] = {
    Perturb.THREADS: (
        "sensitive to the intra-op thread count: a baseline recorded here will not reproduce on a machine with "
        "a different core count",
        "fix the thread count: `torch.set_num_threads(N)` at the start of the script, the same N on every machine "
        "(reductions and matmuls split their work by it); or compare results across machines within a tolerance "
        "(`--atol/--rtol`) instead of bit for bit"),
    Perturb.HASH_SEED: (
        "sensitive to the string hash seed: a result recorded here will not reproduce in a run with another "
        "hash seed, which every run draws for itself unless PYTHONHASHSEED is set",
        "iterate in a defined order (`sorted(...)` instead of a set, or a dict filled from one); or set "
        "PYTHONHASHSEED=0 in the environment before the interpreter starts, on every machine"),
    Perturb.CUDNN_BENCHMARK: (
        "sensitive to cuDNN's algorithm choice: with benchmarking, or on another GPU, convolutions run other "
        "algorithms and give other bits",
        "`torch.backends.cudnn.benchmark = False` and `torch.backends.cudnn.deterministic = True` at the start of "
        "the script; across GPU models compare within a tolerance"),
    Perturb.CUBLAS_WORKSPACE: (
        "sensitive to cuBLAS's workspace configuration: a machine with another CUBLAS_WORKSPACE_CONFIG (or none) "
        "gives other bits",
        "set CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment on every machine, with "
        "`torch.use_deterministic_algorithms(True)`"),
    Perturb.ALLOCATOR: (
        "sensitive to the CUDA caching allocator's layout: kernels chose otherwise by where tensors lie in "
        "memory, so another PYTORCH_CUDA_ALLOC_CONF or memory pressure gives other bits",
        "set PYTORCH_CUDA_ALLOC_CONF the same on every machine, and compare results across machines within a "
        "tolerance (`--atol/--rtol`)"),
}


def _recorded(rep: RepeatEvidence, knob: Perturb) -> str:
    """What a repeat's own trace recorded of the setting ("" when nothing): proof that it took effect."""
    flags = rep.flags_at("first-forward") or rep.flags_at("import") or {}
    if knob is Perturb.THREADS and "num_threads" in flags:
        return f"torch.get_num_threads() {flags.get('num_threads')}"
    if knob is Perturb.CUDNN_BENCHMARK and "cudnn.benchmark" in flags:
        return f"cudnn.benchmark {flags.get('cudnn.benchmark')}"
    event = rep.first(EnvironmentEvent)
    env = (event.get("env") if event is not None else None) or {}
    names = [name for name in perturbations(None)[knob].settings[0].env if name in env]
    return ", ".join(f"{name}={env[name]}" for name in names)


def _numbers(indices: tuple[int, ...]) -> str:
    """`repeat 1`, `repeats 0 and 2`, `repeats 0, 2 and 4`."""
    if len(indices) == 1:
        return f"repeat {indices[0]}"
    return f"repeats {', '.join(map(str, indices[:-1]))} and {indices[-1]}"


def _detector(knob: Perturb) -> Detector:
    spec = perturbations(None)[knob]
    cause = CAUSES[PERTURBED[knob]]
    summary, fix = TEXT[knob]
    pins = (cause.isolation.pin,) if cause.isolation is not None else ()  # the experiment that isolates it

    def perturbed(ctx: Context) -> Finding | None:
        found = ctx.perturbation
        outcome = next((k for k in found.sensitive if k.knob == knob.value), None) if found is not None else None
        if found is None or outcome is None or outcome.divergence is None:
            return None
        d = outcome.divergence
        lines = [f"{spec.description}: {outcome.values[0]} in {_numbers(outcome.base)}; "
                 f"{outcome.values[1]} in {_numbers(outcome.changed)}; every other setting equal",
                 "repeats with equal settings agree: " + "; ".join(_numbers(g) for g in found.groups)]
        evidence = {r.index: r for r in ctx.repeats}
        seen = [(i, _recorded(evidence[i], knob)) for i in (outcome.base[0], outcome.changed[0]) if i in evidence]
        if any(text for _, text in seen):
            lines.append("recorded: " + ", ".join(f"{text} in repeat {i}" for i, text in seen if text))
        size = f" (max |diff| {d.max_abs_diff:.3g}, {d.max_ulp_diff} ULP)" \
            if d.max_abs_diff is not None and d.max_ulp_diff is not None else ""
        lines.append(f"the two ended differently, every record both made agreeing: {d.detail}"
                     if d.category == "outcome" else f"first divergence between the two: {where(d)}{size}")
        op = ctx.op_with("nondeterministic-op")
        if op is not None:  # the op-level re-run: same inputs, other output, and only between the settings
            r = op.record
            lines.append(f"the op: {r.op} ({r.phase})" + (f" at {r.location}" if r.location else "")
                         + ": its inputs match in every repeat, its output differs between the settings")
        others = [f"{k.knob} ({k.values[0]} vs {k.values[1]})" for k in found.survived]
        if others:
            lines.append(f"changed no bit: {', '.join(others)}")
        made = finding(cause.id.value, 0.95, summary, lines, fix, pins, "experiment")
        made.cause = replace(made.cause, confidence="confirmed")
        return made

    perturbed.__name__ = perturbed.__qualname__ = f"perturbed_{knob.value.replace('-', '_')}"
    return detects(cause.id)(perturbed)


DETECTORS: tuple[Detector, ...] = tuple(_detector(knob) for knob in Perturb)
