"""Kernel, device and environment causes: nondeterministic-op, cudnn-benchmark, cublas-workspace, tf32,
thread-count, uninitialized-memory, environment."""

from __future__ import annotations

import shlex
from typing import Any, Literal

from detaudit.cause_table import CauseId
from detaudit.causes.context import Context, Finding, RepeatEvidence, detects, finding
from detaudit.events import (
    CallEvent,
    DrawEvent,
    EmptyEvent,
    EmptyWritesEvent,
    EnvironmentEvent,
    ModuleEntry,
    ModulesEvent,
    OpEvent,
)
from detaudit.pin import Pin
from detaudit.results import Basis
from detaudit.trace import RecordStream

CUBLAS_OK = (":4096:8", ":16:8")
ENV_KEYS = ("python", "torch", "numpy", "cuda", "cudnn", "driver", "cpu", "machine", "os")
SNAPSHOTS = ("first-forward", "first-step", "end")
# variables other detectors own (thread counts) or that only say which device a repeat used
NOT_ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def _modules(rep: RepeatEvidence) -> tuple[str | None, list[ModuleEntry]]:
    """(device, matmul-heavy layers) of the first model run; (None, []) when no model ran."""
    mods = rep.first(ModulesEvent)
    return (mods.get("device"), mods.get("matmul", [])) if mods is not None else (None, [])


def _environment(rep: RepeatEvidence, key: Literal["device", "torch", "cuda"], default: str | None = None) -> Any:
    env = rep.first(EnvironmentEvent)
    return env.get(key, default) if env is not None else default


def _flags(ctx: Context, rep: RepeatEvidence, before_only: bool = False) -> list[tuple[str, dict[str, Any]]]:
    return [(s["when"], s["flags"]) for s in rep.states()
            if s.get("when") in SNAPSHOTS and s.get("flags") and (not before_only or ctx.precedes(s))]


def device_of(rep: RepeatEvidence) -> str:
    """The device a repeat computed on (as its evidence says; recordings compared by `compare` have no other)."""
    return str(_environment(rep, "device") or rep.device)


def _in(ctx: Context, names: list[str]) -> bool:
    rec = ctx.record
    return rec is not None and bool({rec.module, rec.name} & set(names))


@detects(CauseId.NONDETERMINISTIC_OP)
def nondeterministic_op(ctx: Context) -> Finding | None:
    ops = [e for e in ctx.ref.of(OpEvent) if ctx.precedes(e) and not e.get("deterministic")
           and (e.get("device") != "cpu" or e.get("threads", 1) > 1)]
    kernel = ctx.op_with("nondeterministic-op")
    if not ops and kernel is None:
        return None
    torch_version = _environment(ctx.ref, "torch", "?")
    lines = [f"{e['op']} ran on {e['device']} at {e.get('loc') or '?'} ({e.get('phase')}, {e.get('threads')} "
             f"threads, deterministic algorithms off); torch {torch_version} lists \"{e.get('entry')}\""
             for e in ops[:3]]
    if kernel is not None:
        lines.append(f"op-level records: {kernel.summary}")
    lines.append(f"first divergence: {ctx.where()}")
    score = 0.95 if kernel is not None else 0.8
    if _backward_op_behind_gradient(ctx, ops):
        score = max(score, 0.88)
    if ops or kernel is None:
        name, loc = ops[0]["op"], ops[0].get("loc")
    else:
        name, loc = kernel.record.op, kernel.record.location
    what = f"the backward pass at {loc} ({name})" if name.endswith(("Backward0", "Backward1")) else f"{name} at {loc}"
    fix = f"call `torch.use_deterministic_algorithms(True)` at the top of the script: {what} then uses a " \
          "deterministic kernel"
    cpu = any(e.get("device") == "cpu" for e in ops)
    if cpu:
        fix += "; on CPU, `torch.set_num_threads(1)` also removes it"
    return finding("nondeterministic-op", score, f"{name} accumulates in thread or atomic order, which changes "
                   "from run to run", lines, fix, [Pin.DETERMINISTIC] + ([Pin.ONE_THREAD] if cpu else []),
                   "op-records" if kernel is not None else "direct")


def _backward_op_behind_gradient(ctx: Context, ops: list[OpEvent]) -> bool:
    """A gradient (or backward record) diverged first, and a nondeterministic op ran in the backward pass."""
    rec = ctx.record
    return bool(ops) and rec is not None and (rec.kind == "grad" or rec.backward) \
        and any(e.get("phase") == "backward" for e in ops)


@detects(CauseId.CUDNN_BENCHMARK)
def cudnn_benchmark(ctx: Context) -> Finding | None:
    on = [(rep.index, when) for rep in ctx.involved for when, f in _flags(ctx, rep)
          if f.get("cudnn.benchmark") and not f.get("cudnn.deterministic") and f.get("cudnn.enabled", True)]
    device, matmul = _modules(ctx.ref)
    convs = [m["module"] for m in matmul if m["class"].startswith("Conv")]
    conv_ops = [e for e in ctx.ref.of(OpEvent) if "conv" in e.get("op", "").lower() and e.get("device") == "cuda"]
    if not on or not (convs and device == "cuda" or conv_ops):
        return None
    lines = [f"torch.backends.cudnn.benchmark was True with cudnn.deterministic False (repeat {on[0][0]}, at the "
             f"{on[0][1]}): cuDNN times several convolution algorithms and keeps the fastest, which can change "
             "from run to run, and some of them are nondeterministic",
             f"convolutions on cuda: {', '.join(convs) or ', '.join(e['op'] for e in conv_ops)}",
             f"first divergence: {ctx.where()}"]
    score = 0.9 if _in(ctx, convs) else 0.8
    basis: Basis = "direct"
    found = ctx.op_with("nondeterministic-op")
    if found is not None and "conv" in (found.record.op or "").lower():
        # the op records prove a convolution kernel gave other bits from the same inputs: with benchmark on,
        # the algorithm cuDNN picked per run explains that first (nondeterministic-op is the general reading)
        lines.insert(2, f"op-level records: {found.summary}")
        score, basis = 0.97, "op-records"
    fix = "set `torch.backends.cudnn.benchmark = False` and `torch.backends.cudnn.deterministic = True` before " \
          "the first forward"
    return finding("cudnn-benchmark", score, "cuDNN autotuning (benchmark mode) picks convolution algorithms "
                   "per run", lines, fix, [Pin.CUDNN], basis)


@detects(CauseId.CUBLAS_WORKSPACE)
def cublas_workspace(ctx: Context) -> Finding | None:
    device, matmul = _modules(ctx.ref)
    layers = [m["module"] for m in matmul if not m["class"].startswith("Conv")]  # cuDNN's
    if device != "cuda" or not layers:
        return None
    flags = _flags(ctx, ctx.ref)
    if not flags or flags[-1][1].get("CUBLAS_WORKSPACE_CONFIG") in CUBLAS_OK:
        return None
    cuda = _environment(ctx.ref, "cuda")
    if cuda and tuple(int(x) for x in str(cuda).split(".")[:2] if x.isdigit()) < (10, 2):
        return None
    deterministic = any(f.get("deterministic_algorithms") for _, f in flags)
    lines = [f"CUBLAS_WORKSPACE_CONFIG is {flags[-1][1].get('CUBLAS_WORKSPACE_CONFIG')!r}: cuBLAS may split "
             "matmuls over several workspaces and streams in a run-dependent way",
             f"matmul layers on cuda: {', '.join(layers[:6])}"]
    if deterministic:
        lines.append("deterministic algorithms are on, which torch only honours for cuBLAS with this variable set")
    lines.append(f"first divergence: {ctx.where()}")
    score = 0.6 + (0.1 if deterministic else 0.0)  # present in most CUDA runs: only "possible" on its own
    fix = "run with `CUBLAS_WORKSPACE_CONFIG=:4096:8` in the environment (set before CUDA initializes), together " \
          "with `torch.use_deterministic_algorithms(True)`"
    return finding("cublas-workspace", score, "cuBLAS workspace configuration allows nondeterministic matmul "
                   "reductions", lines, fix, [Pin.CUBLAS])


def _tf32_reasons(flags: dict[str, Any]) -> list[str]:
    reasons = [k for k in ("matmul.allow_tf32", "cudnn.allow_tf32") if flags.get(k)]
    if flags.get("float32_matmul_precision", "highest") != "highest":
        reasons.append(f"float32_matmul_precision={flags['float32_matmul_precision']!r}")
    return reasons


@detects(CauseId.TF32)
def tf32(ctx: Context) -> Finding | None:
    """TF32 separates devices (a TF32 GPU against the CPU), or two recordings on a GPU made with
    TF32 on in one and off in the other; within one setting it rounds the same way every run."""
    on_cuda = [rep for rep in ctx.involved if device_of(rep) == "cuda" and _modules(rep)[0] == "cuda"]
    if not on_cuda:
        return None
    settings = {rep.index: next(((when, _tf32_reasons(f)) for when, f in reversed(_flags(ctx, rep))), None)
                for rep in ctx.involved}
    lines = []
    if len({device_of(r) for r in ctx.involved}) >= 2:
        for rep in on_cuda:
            when, reasons = settings[rep.index] or ("", [])
            if reasons:
                lines.append(f"repeat {rep.index} ran on cuda with {', '.join(reasons)} (at the {when}): TF32 "
                             "keeps 10 mantissa bits in matmuls and convolutions, the CPU keeps 23")
                break
    else:
        known = {i: s[1] for i, s in settings.items() if s is not None}
        if len({tuple(r) for r in known.values()}) > 1:
            text = "; ".join(f"repeat {i}: {', '.join(r) or 'TF32 off'}" for i, r in known.items())
            lines.append(f"the TF32 settings differ between the runs ({text}): TF32 keeps 10 mantissa bits in "
                         "matmuls and convolutions, float32 keeps 23")
    if not lines:
        return None
    d = ctx.divergence
    if d.max_abs_diff is not None:
        lines.append(f"max |diff| {d.max_abs_diff:.3g} against repeat {d.reference} ({device_of(ctx.ref)})")
    lines.append(f"first divergence: {ctx.where()}")
    fix = "set `torch.backends.cuda.matmul.allow_tf32 = False` and `torch.backends.cudnn.allow_tf32 = False` (or " \
          "`torch.set_float32_matmul_precision('highest')`) in every run you compare"
    return finding("tf32", 0.85, "TF32 numerics differ from float32 in the other run", lines, fix, [Pin.TF32_OFF],
                   "direct")


@detects(CauseId.THREAD_COUNT)
def thread_count(ctx: Context) -> Finding | None:
    keys = ("num_threads", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    lines = []
    before = False
    for when in SNAPSHOTS:
        snaps = [dict(_flags(ctx, rep)).get(when) for rep in ctx.involved]
        if any(s is None for s in snaps):
            continue
        for key in keys:
            values = [s.get(key) for s in snaps if s is not None]
            if ctx.differs(values):
                lines.append(f"{'torch.get_num_threads()' if key == 'num_threads' else key} at the {when}: "
                             f"{ctx.pair_text(values)}")
                before = before or any(ctx.precedes(s) for r in ctx.involved for s in r.states()
                                       if s.get("when") == when)
        if lines:
            break
    if not lines:
        return None
    calls = [e for e in ctx.ref.of(CallEvent) if e.get("fn") == "torch.set_num_threads"]
    if calls:
        lines.append(f"torch.set_num_threads({calls[0].get('value')}) at {calls[0].get('loc')}")
    lines.append(f"first divergence: {ctx.where()}")
    where = f" at {calls[0].get('loc')}" if calls else ""
    fix = f"use a constant thread count: `torch.set_num_threads(4)`{where} (or OMP_NUM_THREADS=4); reductions " \
          "are summed in per-thread chunks, so another count gives other bits"
    return finding("thread-count", 0.85 if before else 0.6, "the number of threads differs between runs, and "
                   "reductions split their work by it", lines, fix, [Pin.ONE_THREAD],
                   "direct" if before else "circumstantial")


def _record_digests(ctx: Context) -> dict[int, str]:
    """The first divergent record's digest in each involved repeat."""
    index = ctx.divergence.index
    digests: dict[int, str] = {}
    if index < 0:
        return digests
    for rep in ctx.involved:
        try:
            seen = 0
            for chunk in RecordStream(rep.path).chunks(limit=index + 1):  # the record ends the last chunk
                seen += len(chunk)
                if seen == index + 1:
                    digests[rep.index] = f"{int(chunk[-1]['digest']):016x}"
        except Exception:
            continue
    return digests


@detects(CauseId.UNINITIALIZED_MEMORY)
def uninitialized_memory(ctx: Context) -> Finding | None:
    varying = _varying_empties(ctx)
    found = ctx.op_with("uninitialized-memory")
    if not varying and found is None:
        return None
    varying.sort(key=lambda v: v[0] != "unwritten")  # the likeliest readers first
    lines = [f"{v[0]['fn']}({'x'.join(map(str, v[0].get('shape', [])))}) at {v[0].get('loc')} returned different "
             f"contents in each repeat ({ctx.pair_text([x.get('digest') for x in v], lambda d: d[:8])}; detaudit "
             "fills such memory differently in each process, so a read of it cannot agree by chance)"
             for _, v in varying[:3]]
    note, score = _written_before_use(varying)
    lines += note
    # every one written before use: nothing of a read of leftover memory was seen (detaudit's own fill always varies)
    basis: Basis = "no-evidence" if score < 0.5 else "circumstantial"
    reached = _reached_unchanged(ctx, varying)
    if reached is not None:
        lines.append(f"the tensor {reached['fn']} returned at {reached.get('loc')} reached {ctx.where()} unchanged")
        score, basis = 0.95, "direct"
    if found is not None:
        lines.append(f"op-level records: {found.summary}")
        score, basis = 0.95, "op-records"
    lines.append(f"first divergence: {ctx.where()}")
    if varying:
        first = varying[0][1][0]
        fn, loc = first["fn"], first.get("loc")
        fix = f"use `{fn.replace('empty', 'zeros')}(...)` instead of `{fn}(...)` at {loc}, or write every " \
              "element before reading it"
    else:
        where = found.record.location if found is not None else None
        fix = f"use `torch.zeros` instead of `torch.empty` where {where or 'it'} reads the memory"
    return finding("uninitialized-memory", score, "a tensor from torch.empty (or kin) is read before every "
                   "element is written: its leftover contents differ per run", lines, fix, [Pin.ZERO_EMPTY], basis)


def _varying_empties(ctx: Context) -> list[tuple[str | None, list[EmptyEvent]]]:
    """The `empty` tensors made before the divergence whose contents differ between repeats: (their state at the
    first forward, the repeats' events)."""
    writes = ctx.ref.first(EmptyWritesEvent)
    states = writes["states"] if writes is not None else []
    varying: list[tuple[str | None, list[EmptyEvent]]] = []
    for empties in ctx.aligned(lambda r: list(enumerate(r.of(EmptyEvent)))):
        k, e = empties[0]
        digests = [x.get("digest") for _, x in empties]
        if not e.get("pinned") and ctx.precedes(e) and None not in digests and ctx.differs(digests):
            varying.append((states[k] if k < len(states) else None, [x for _, x in empties]))
    return varying


def _written_before_use(varying: list[tuple[str | None, list[EmptyEvent]]]) -> tuple[list[str], float]:
    """What the writes before the first forward say, and the score they leave: the fill always varies (detaudit's
    own) and most `empty` tensors are written before use (a layer's init): one still unwritten when the first
    forward began is worth more, all of them written since much less."""
    unwritten = sum(state == "unwritten" for state, _ in varying)
    if unwritten:
        return [f"{unwritten} of them had not been written when the first forward began"], 0.6
    if varying and all(state == "written" for state, _ in varying):
        return ["each was written in place before the first forward (an init or a copy): probably not read "
                "uninitialised"], 0.25
    return [], 0.5


def _reached_unchanged(ctx: Context, varying: list[tuple[str | None, list[EmptyEvent]]]) -> EmptyEvent | None:
    """The first `empty` tensor whose contents are those of the diverging record in every repeat."""
    record_digests = _record_digests(ctx) if varying else {}
    for _, v in varying:
        if all(record_digests.get(x_rep.index) == x.get("digest") for x, x_rep in zip(v, ctx.involved)):
            return v[0]
    return None


@detects(CauseId.ENVIRONMENT, CauseId.ENVIRONMENT_CHANGE)
def environment(ctx: Context) -> Finding | None:
    envs = [r.first(EnvironmentEvent) for r in ctx.involved]
    if any(e is None for e in envs):
        return None
    lines = _environment_changes(ctx, [e for e in envs if e is not None])
    changed = bool(lines)
    devices = [device_of(r) for r in ctx.involved]
    if ctx.differs(devices):
        lines.append(f"device: {ctx.pair_text(devices)} (kernels differ between devices; compared within "
                     "tolerance)")
    if not lines:
        return None
    lines.append(f"first divergence: {ctx.where()}")
    if changed:
        fields = ", ".join(line.split(":", 1)[0] for line in lines[:-1])
        fix = ("compare recordings made with the same code, library versions and hardware (pin versions in a "
               "lockfile, note the GPU model), or compare across them within a tolerance (`--atol`/`--rtol`)")
        return finding("environment-change", 0.9, f"the environment changed between the recordings ({fields}): a "
                       "difference between setups, not run-to-run nondeterminism", lines, fix, basis="direct")
    fix = "compare across devices within a tolerance (`--atol`/`--rtol`), or on one device bit for bit"
    return finding("environment", 0.6, "the compared repeats ran on different devices", lines, fix,
                   basis="circumstantial")


def _environment_changes(ctx: Context, envs: list[EnvironmentEvent]) -> list[str]:
    """What differs between the repeats' setups, a line each: versions and machine, environment variables,
    GPU model, script arguments, code."""
    lines = [f"{key}: {ctx.pair_text(values)}" for key, values in _versions(envs) if ctx.differs(values)]
    lines += [f"{key}: {ctx.pair_text(values)}" for key, values in _variables(ctx, envs) if ctx.differs(values)]
    gpus = _gpus(ctx)
    if ctx.differs(gpus):
        lines.append(f"GPU: {ctx.pair_text(gpus)}")
    arguments = [r.script_args for r in ctx.involved]
    if None not in arguments and ctx.differs(arguments):  # `compare` of two runs made with other arguments
        lines.append(f"script arguments: {ctx.pair_text(arguments, shlex.join)}")
    gits = [e.get("git") for e in envs]
    # the commit and the script's own bytes: a dirty flag alone flips when any file of the repository is edited
    if ctx.differs([(g or {}).get("commit") for g in gits]) or ctx.differs([(g or {}).get("script") for g in gits]):
        lines.append(f"code: {ctx.pair_text(gits, _git_text)} (another commit or uncommitted changes)")
    return lines


def _versions(envs: list[EnvironmentEvent]) -> list[tuple[str, list[Any]]]:
    """(key, each repeat's value) of the versions and machine the environment event names."""
    return [(key, [e.get(key) for e in envs]) for key in ENV_KEYS]


def _variables(ctx: Context, envs: list[EnvironmentEvent]) -> list[tuple[str, list[Any]]]:
    """(variable, each repeat's value) of the environment variables, but those other detectors own and those
    `run --perturb` varied on purpose (its experiment, causes/perturbed_settings.py, not a change)."""
    deliberate = ctx.perturbation.variables if ctx.perturbation is not None else frozenset()
    variables = [{k: v for k, v in (e.get("env") or {}).items() if k not in NOT_ENVIRONMENT and k not in deliberate}
                 for e in envs]
    return [(key, [v.get(key) for v in variables]) for key in sorted({k for v in variables for k in v})]


def _gpus(ctx: Context) -> list[Any]:
    return [next((s.get("gpu") for s in r.states() if s.get("gpu")), None) for r in ctx.involved]


def _git_text(git: Any) -> str:
    if not isinstance(git, dict):
        return "no git commit"
    script = f", script {str(git['script'])[:8]}" if git.get("script") else ""
    return str(git.get("commit", "?"))[:12] + (" (dirty)" if git.get("dirty") else "") + script


@detects(CauseId.DEVICE_RNG_GEOMETRY)
def device_rng_geometry(ctx: Context) -> Finding | None:
    """Seeded CUDA random ops give other numbers on another GPU model: Philox offsets follow the launch
    geometry (pytorch issues #196613, #194676), so the same seed is not the same stream across models."""
    gpus = _gpus(ctx)
    if None in gpus or not ctx.differs(gpus):
        return None
    draws = [e for e in ctx.ref.of(DrawEvent) if e.get("lib") == "torch" and e.get("device") == "cuda"
             and ctx.precedes(e)]
    if not draws:
        return None
    lines = [f"GPU: {ctx.pair_text(gpus)}"]
    lines += [f"{e['fn']} at {e.get('loc')} drew on cuda ({e.get('generator')} generator)" for e in draws[:3]]
    lines.append(f"first divergence: {ctx.where()}")
    fix = (f"draw on the CPU with a seeded generator and move the result (`torch.randn(..., device='cpu', "
           f"generator=g).to('cuda')`) at {draws[0].get('loc')}: CPU streams do not depend on the GPU model")
    return finding("device-rng-geometry", 0.92, "a seeded random op on the GPU gives other numbers on another GPU "
                   "model", lines, fix, basis="direct")
