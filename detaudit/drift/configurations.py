"""The two configurations `detaudit drift` compares, what differs between them (the candidate causes), and
the perturbed settings that measure configuration A's noise floor."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from detaudit.pin import Perturb, PerturbSpec, Setting, perturbations
from detaudit.run.perturb_plan import Perturbation

Family = Literal["reorder", "layout", "runtime", "script"]
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# settings that change only the order of floating-point reductions (run --perturb's catalogue): a difference
# in one of them explains noise, never a real change
_REORDER_VARIABLES = frozenset(k for spec in perturbations(None).values() for s in spec.settings for k in s.env)
# the settings run on CUDA as well as threads: cuBLAS's workspace and cuDNN's algorithm choice
_CUDA_FLOOR = (Perturb.CUBLAS_WORKSPACE, Perturb.CUDNN_BENCHMARK)


@dataclass(frozen=True)
class Configuration:
    """One side of the comparison: what its repeats add to the common script arguments and environment."""

    label: str  # "A" or "B"
    env: dict[str, str] = field(default_factory=dict)  # --a-env NAME=VALUE ...
    args: list[str] = field(default_factory=list)  # --a-args, shlex-split: after the common script arguments
    threads: int | None = None  # --a-threads: OMP_NUM_THREADS and MKL_NUM_THREADS
    python: str | None = None  # --a-python: another interpreter (None: the one running detaudit)
    device: str = "cpu"  # --a-device: cpu, cuda or auto (the script's own choice)
    nproc: int | None = None  # --a-nproc: each repeat a torchrun launch of this many ranks (None: one process)

    @property
    def world_size(self) -> int:
        return self.nproc or 1

    def described(self) -> str:
        """`LOSS_SCALE=2, args --lr 0.2, threads 1, device cpu`: the settings as the terminal and the page show them."""
        parts = [f"{k}={v}" for k, v in self.env.items()]
        parts += [f"args {' '.join(self.args)}"] if self.args else []
        parts += [f"threads {self.threads}"] if self.threads is not None else []
        parts += [f"python {self.python}"] if self.python else []
        parts += [f"nproc {self.nproc}"] if self.nproc is not None else []
        parts.append(f"device {self.device}")
        return ", ".join(parts)

    def environment(self) -> dict[str, str]:
        """The variables this configuration's repeats run with, over the inherited environment."""
        threads = {v: str(self.threads) for v in THREAD_VARIABLES} if self.threads is not None else {}
        return {**self.env, **threads}


@dataclass(frozen=True)
class Difference:
    """One setting A and B differ in (None: not set on that side), and what it can change: the reduction
    order only (`reorder`), the parallel layout (`layout`: the world size, which reorders the gradient
    all-reduce and runs the script's own averaging and sharding), the runtime (`runtime`: interpreter, device)
    or what the script computes (`script`)."""

    setting: str
    a: str | None
    b: str | None
    family: Family


def differences(a: Configuration, b: Configuration) -> list[Difference]:
    """Every setting A and B differ in: interpreter, device, threads, each environment variable, the arguments."""
    found = []
    sides: tuple[tuple[str, Family, str | None, str | None], ...] = (
        ("python", "runtime", a.python, b.python), ("device", "runtime", a.device, b.device),
        ("threads", "reorder", _text(a.threads), _text(b.threads)),
        ("nproc", "layout", _text(a.nproc), _text(b.nproc)))
    for setting, family, va, vb in sides:
        if va != vb:
            found.append(Difference(setting, va, vb, family))
    for name in sorted(set(a.env) | set(b.env)):
        if a.env.get(name) != b.env.get(name):
            found.append(Difference(f"env {name}", a.env.get(name), b.env.get(name),
                                    "reorder" if name in _REORDER_VARIABLES else "script"))
    if a.args != b.args:
        found.append(Difference("args", " ".join(a.args) or None, " ".join(b.args) or None, "script"))
    return found


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


def plain_threads(config: Configuration, cpu_count: int | None) -> int:
    """The thread count A's plain repeats run with: its own, else the inherited OMP_NUM_THREADS, else the cores."""
    if config.threads is not None:
        return config.threads
    inherited = config.env.get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS", "")
    return int(inherited) if inherited.isdigit() and int(inherited) > 0 else max(1, cpu_count or 1)


def floor_perturbation(config: Configuration, devices: list[str], cpu_count: int | None) -> Perturbation:
    """The settings A's extra repeats change, one per repeat (run --perturb's groups): the thread count (one
    thread if A runs more, else two: another split of every parallel reduction), and on CUDA cuBLAS's
    workspace and cuDNN's algorithm choice. The plain value of each is A's own."""
    plain = plain_threads(config, cpu_count)
    other = 1 if plain != 1 else 2
    threads = PerturbSpec(Perturb.THREADS, "the intra-op thread count",
                          (Setting(str(plain), {v: str(plain) for v in THREAD_VARIABLES}),
                           Setting(str(other), {v: str(other) for v in THREAD_VARIABLES})))
    catalogue = perturbations(cpu_count)
    cuda = [catalogue[k] for k in _CUDA_FLOOR] if any(d != "cpu" for d in devices) else []
    return Perturbation((threads, *cuda), {})
