"""Latent findings: what is deterministic in these repeats and would not be elsewhere (docs/causes.md).

On any device: a thread drawing from an RNG the main thread draws from while it runs (a prefetch thread
beside a LazyLinear's first forward): whoever draws first takes the next numbers, so the repeats agree
only while the threads keep their timing.

On the CPU: a script that sets `torch.backends.cudnn.benchmark = True`, allows TF32, or calls an op torch
lists as nondeterministic on CUDA only passes: nothing of it varies on the CPU. The same script on a GPU
does vary (benchmark, the ops) or computes other numbers (TF32), so each is reported as a latent finding,
from the flag snapshots and the `latent-op` events every repeat records. Runs that used CUDA get the real
causes instead (causes/device.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from detaudit.causes.context import RepeatEvidence
from detaudit.causes.device import SNAPSHOTS, device_of
from detaudit.causes.flags import flag_call, flag_site
from detaudit.causes.repetition import RNG_NAMES
from detaudit.events import (
    MAIN_THREAD,
    ConcurrencyEvent,
    DrawEvent,
    EnvironmentEvent,
    FlagEvent,
    LatentOpEvent,
    ModulesEvent,
)
from detaudit.results import Latent, RepeatResult

HERE = "deterministic here (CPU); on CUDA it is not"


def latent_findings(ref: RepeatEvidence, runs: Sequence[RepeatResult]) -> list[Latent]:
    """The latent findings of an audit, read from the evidence of its first repeat (`ref`): the thread races,
    and when every repeat ran on the CPU, what CUDA would not reproduce."""
    found = [_thread_race(ref)]
    if runs and all(r.device == "cpu" for r in runs) and device_of(ref) == "cpu":
        found += [_cudnn_benchmark(ref), _tf32(ref), _ops(ref)]
    return [f for f in found if f is not None]


def recorded_versions(ref: RepeatEvidence) -> dict[str, Any]:
    """What the script ran with, as its trace records it: torch, NumPy, CUDA (null: a CPU-only build),
    cuDNN and the driver (the report's environment holds detaudit's own host facts beside them)."""
    env = ref.first(EnvironmentEvent)
    if env is None:
        return {}
    return {key: env.get(key) for key in ("torch", "numpy", "cuda", "cudnn", "driver")}


def _snapshot(rep: RepeatEvidence, key: str) -> list[tuple[str, object]]:
    """(when, value) of one flag at each snapshot."""
    return [(s["when"], s["flags"].get(key)) for s in rep.states() if s.get("when") in SNAPSHOTS and s.get("flags")]


def _set_at(rep: RepeatEvidence, *flags: str) -> list[str]:
    """The script's calls that set these flags, with their lines."""
    return [f"`{flag_call(e)}` at {flag_site(e)}" for e in rep.of(FlagEvent) if e["flag"] in flags]


def _cudnn_benchmark(rep: RepeatEvidence) -> Latent | None:
    on = [when for (when, bench), (_, det) in zip(_snapshot(rep, "cudnn.benchmark"),
                                                   _snapshot(rep, "cudnn.deterministic")) if bench and not det]
    if not on:
        return None
    modules = rep.first(ModulesEvent)
    convs = [f"{m['module']} ({m['class']})" for m in modules.get("matmul", []) if m["class"].startswith("Conv")] \
        if modules else []
    if modules is not None and not convs:
        return None  # no convolution for cuDNN to tune
    lines = _set_at(rep, "cudnn.benchmark") or [f"torch.backends.cudnn.benchmark was True at the {on[0]}"]
    if convs:
        lines.append(f"convolutions: {', '.join(convs[:6])}")
    return Latent("cudnn-benchmark", f"cudnn.benchmark is on with cudnn.deterministic off: {HERE}: cuDNN times "
                  "several convolution algorithms per run and keeps the fastest, so a GPU run can pick another "
                  "algorithm (some nondeterministic) each time", lines,
                  "set `torch.backends.cudnn.benchmark = False` and `torch.backends.cudnn.deterministic = True`")


def _tf32(rep: RepeatEvidence) -> Latent | None:
    matmul = [when for when, v in _snapshot(rep, "matmul.allow_tf32") if v]
    precision = [f"{when}: {v}" for when, v in _snapshot(rep, "float32_matmul_precision") if v not in (None, "highest")]
    calls = _set_at(rep, "matmul.allow_tf32", "cudnn.allow_tf32", "set_float32_matmul_precision")
    # cudnn.allow_tf32 is on by default: only the script's own call to allow it is a finding
    cudnn = [c for c in calls if "cudnn.allow_tf32 = True" in c]
    if not (matmul or precision or cudnn):
        return None
    lines = calls or ([f"torch.backends.cuda.matmul.allow_tf32 was True at the {matmul[0]}"] if matmul else []) + \
        [f"float32 matmul precision below highest ({p})" for p in precision[:1]]
    return Latent("tf32", f"TF32 is allowed: {HERE} in the same way: on an Ampere or later GPU float32 matmuls "
                  "and convolutions round their inputs to 10 mantissa bits, so a GPU run does not reproduce this "
                  "run's numbers (nor a GPU without TF32 another's)", lines,
                  "`torch.backends.cuda.matmul.allow_tf32 = False`, `torch.backends.cudnn.allow_tf32 = False` "
                  "(or `torch.set_float32_matmul_precision('highest')`) where results must match across devices")


def _thread_race(rep: RepeatEvidence) -> Latent | None:
    """A draw in a thread from an RNG the main thread drew from while a thread ran: the same global RNG of one
    library (on one device), or the same RNG object of the script's."""
    draws = [d for d in rep.of(DrawEvent) if "thread" in d and (d["generator"] == "global" or "obj" in d)]
    main = [d for d in draws if d["thread"] == MAIN_THREAD]
    pairs = [(t, m) for t in draws if t["thread"] != MAIN_THREAD for m in main if _rng(m) == _rng(t)]
    if not pairs:
        return None
    starts = {e.get("target"): e["loc"] for e in rep.of(ConcurrencyEvent) if e["what"] == "threading.Thread.start"}
    lines = list(dict.fromkeys(  # one line per pair of lines (nn.init draws a weight and a bias at one)
        f"thread `{t['thread']}`" + (f" (started at {starts[t['thread']]})" if t["thread"] in starts else "")
        + f" draws {t['fn']} at {t['loc']} from {_rng_name(t)}, which the main thread draws from at {m['loc']} "
        f"({m['fn']}) while a thread it started runs" for t, m in pairs))[:4]
    return Latent("concurrency", f"threads share {_rng_name(pairs[0][0])}: deterministic in these repeats only while "
                  "the threads keep their timing; whichever thread draws first takes the next numbers, so a run in "
                  "which the timing shifts draws other values in both", lines,
                  f"give the thread an RNG of its own (`g = torch.Generator().manual_seed(1)`, drawn with "
                  f"`generator=g`; `np.random.default_rng(1)`; `random.Random(1)`), or draw its values in the main "
                  f"thread before starting it (the draw at {pairs[0][0]['loc']})")


def _rng(draw: DrawEvent) -> tuple[object, ...]:
    """Which RNG a draw took from: a library's global one (torch's per device), or the script's object."""
    return draw["lib"], draw["generator"], draw.get("obj"), draw.get("device")


def _rng_name(draw: DrawEvent) -> str:
    if "obj" in draw:
        return f"the script's RNG object #{draw['obj']}"
    return RNG_NAMES[draw["lib"]]


def _ops(rep: RepeatEvidence) -> Latent | None:
    ops = [e for e in rep.of(LatentOpEvent) if not e.get("deterministic")]
    if not ops:
        return None
    lines = [f"{e['op']} ({e['phase']}) at {e.get('loc') or '?'}: torch lists \"{e['entry']}\"" for e in ops[:4]]
    return Latent("nondeterministic-op", f"{ops[0]['op']} is {HERE}: torch lists it as nondeterministic on CUDA "
                  "(atomic adds whose order changes from run to run)", lines,
                  "call `torch.use_deterministic_algorithms(True)` at the top of the script (CUDA then uses a "
                  "deterministic kernel, or raises where it has none)")
