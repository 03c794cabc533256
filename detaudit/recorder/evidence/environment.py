"""Environment evidence: the hash seed, an environment fingerprint (allow-listed variables only, never
secrets), thread-count settings, the script's reads of the wall clock per call site, and its first
reads of other values from outside that differ in every run: the pid, OS entropy, uuids
(causes/order.py, device.py, clock.py, outside.py).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from detaudit.events import (
    CallEvent,
    ClockEvent,
    ClockReadsEvent,
    ClockSite,
    EnvironmentEvent,
    HashCallEvent,
    HashEvent,
    OutsideEvent,
)
from detaudit.recorder.evidence.base import Evidence, short
from detaudit.recorder.patch import wrap
from detaudit.recorder.pinning import aslr_disabled

MAX_CLOCK_SITES = 256
CLOCKS = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns")
SECRETS = ("token_bytes", "token_hex", "token_urlsafe", "randbits", "randbelow", "choice")
ENV_ALLOW = (
    "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS", "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE",
    "OMP_DYNAMIC", "OMP_PROC_BIND", "OMP_PLACES", "MKL_DYNAMIC", "MKL_CBWR",
    "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_DETERMINISTIC_REDUCTION",
)


def install_clocks(ev: Evidence) -> None:
    for name in CLOCKS:
        wrap(time, name, functools.partial(_clock, ev, label=f"time.{name}"))
    for owner, names in ((os, ("getpid", "urandom")), (uuid, ("uuid1", "uuid4"))):
        for name in names:
            wrap(owner, name, functools.partial(_outside, ev, label=f"{owner.__name__}.{name}"))


def install_hash(ev: Evidence) -> None:
    """`hash()` of a string or bytes at the script's own lines: its value changes with string hash
    randomization, and unlike a set's order it can reach the numbers directly (a seed, a bucket)."""
    wrap(builtins, "hash", functools.partial(_hash, ev))


def _hash(ev: Evidence, original: Callable[[Any], int]) -> Callable[[Any], int]:
    def hash(obj: Any, /) -> int:  # noqa: A001 (it replaces the builtin of that name)
        value = original(obj)
        if type(obj) in (str, bytes) and not ev.compiling():
            caller = sys._getframe(1)
            if ("hash", caller.f_code, caller.f_lineno) not in ev.seen and not ev.is_library(caller) \
                    and ev.outside_sites < MAX_CLOCK_SITES:
                ev.seen.add(("hash", caller.f_code, caller.f_lineno))
                ev.outside_sites += 1
                ev.emit(HashCallEvent(type="hash-call", loc=ev.where(caller), value=value,
                                      of=f"{type(obj).__name__} of length {len(obj)}"))
        return value

    return hash


def install_secrets(ev: Evidence, secrets: ModuleType) -> None:
    """`secrets` (OS entropy), when the script imports it."""
    for name in SECRETS:
        wrap(secrets, name, functools.partial(_outside, ev, label=f"secrets.{name}"))


def _outside(ev: Evidence, original: Callable[..., Any], label: str) -> Callable[..., Any]:
    """The first read per user call site of a value that differs in every run (causes/outside.py)."""
    def read(*args: Any, **kwargs: Any) -> Any:
        if not ev.compiling():
            caller = sys._getframe(1)
            if (label, caller.f_code, caller.f_lineno) not in ev.seen and not ev.is_library(caller) \
                    and ev.outside_sites < MAX_CLOCK_SITES:
                ev.seen.add((label, caller.f_code, caller.f_lineno))
                ev.outside_sites += 1
                ev.emit(OutsideEvent(type="outside", fn=label, loc=ev.where(caller)))
        return original(*args, **kwargs)

    return read


def hash_event() -> HashEvent:
    return HashEvent(type="hash", PYTHONHASHSEED=os.environ.get("PYTHONHASHSEED"),
                     randomization=sys.flags.hash_randomization, probe=hash("detaudit-hash-probe"),
                     aslr_disabled=aslr_disabled())


def install_torch(ev: Evidence, torch: ModuleType) -> None:
    wrap(torch, "set_num_threads", lambda original: _call_site(ev, original, "torch.set_num_threads"))


def _clock(ev: Evidence, original: Callable[[], Any], label: str) -> Callable[[], Any]:
    """Count the script's reads of the wall clock per call site: a loop bounded by time runs a
    different number of times in each repeat, and these counts show where (causes/clock.py)."""
    def clock() -> Any:
        if ev.compiling():
            return original()
        caller = sys._getframe(1)
        key = (caller.f_code, caller.f_lineno)
        if key in ev.clock_reads:
            site = ev.clock_reads[key]
        else:
            site = None if ev.is_library(caller) else [label, 0]
            if site is not None and len(ev.clock_reads) < MAX_CLOCK_SITES:
                ev.emit(ClockEvent(type="clock", fn=label, loc=ev.where(caller)))
            ev.clock_reads[key] = site
        if site is not None:
            site[1] += 1
        return original()

    return clock


def clock_reads(ev: Evidence) -> ClockReadsEvent | None:
    """At the end: the reads per user call site (None: the script never read the clock)."""
    sites = [ClockSite(fn=v[0], loc=ev.where_code(code, line), reads=v[1])
             for (code, line), v in ev.clock_reads.items() if v is not None]
    return ClockReadsEvent(type="clock-reads", sites=sites) if sites else None


def _call_site(ev: Evidence, original: Callable[..., Any], label: str) -> Callable[..., Any]:
    """Record every user call with its first argument (a setting such as a thread count)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        if ev.compiling():
            return original(*args, **kwargs)
        caller = sys._getframe(1)
        if not ev.is_library(caller):
            ev.emit(CallEvent(type="call", fn=label, value=short(args[0] if args else None), loc=ev.where(caller)))
        return original(*args, **kwargs)

    return call


def environment(ev: Evidence) -> EnvironmentEvent:
    torch = ev.torch
    cudnn = None
    if torch.backends.cudnn.is_available():
        cudnn = torch.backends.cudnn.version()
    driver = None
    with contextlib.suppress(OSError, IndexError):
        driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
    return EnvironmentEvent(
        type="environment", python=platform.python_version(), torch=torch.__version__,
        numpy=getattr(sys.modules.get("numpy"), "__version__", None), cuda=torch.version.cuda, cudnn=cudnn,
        driver=driver, cpu=_cpu_model(), machine=platform.machine(),
        os=f"{platform.system()} {platform.release()}", device_request=ev.config.get("device"),
        device=ev.device_as or ev.config.get("device"),
        env={k: os.environ[k] for k in ENV_ALLOW if k in os.environ},
        git=ev.config.get("git"),  # found by the parent (audit.execute): no subprocess in the repeat
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
