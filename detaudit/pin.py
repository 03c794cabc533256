"""The pins of `--explain`: the one list of what a repeat can hold fixed, and how.

A leaf (no torch, no other detaudit module): the parent names pins (causes/confirm.py, explain/runner.py,
the cause detectors) and the child applies them (recorder/pinning.py) from this one enum, so a pin
the parent can ask for is a pin the child knows (tests/test_pin.py checks the child handles each).

Each pin travels as environment variables for the repeat (`PinSpec.env`), as names the child
applies itself (`PinSpec.child`, written to the child config's `pins`), or both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Pin(StrEnum):
    """One source of nondeterminism a repeat can hold fixed (its value is the name users and files see)."""

    TORCH_RNG = "torch-rng"
    NUMPY_RNG = "numpy-rng"
    PYTHON_RNG = "python-rng"
    HASH_SEED = "hash-seed"
    ADDRESS_LAYOUT = "address-layout"
    DETERMINISTIC = "deterministic"
    ONE_THREAD = "one-thread"
    CUDNN = "cudnn"
    CUBLAS = "cublas"
    TF32_OFF = "tf32-off"
    ZERO_EMPTY = "zero-empty"
    NCCL = "nccl"


ALL = "all"  # the experiment that pins every source at once
CONTROL = "control"  # the experiment that pins nothing: does the divergence still reproduce now?
SEP = "+"  # experiment names for a set of pins: `hash-seed+one-thread`


@dataclass(frozen=True)
class PinSpec:
    """What pinning one source (or a set of them) does: environment variables for the repeat and the
    pins the child applies."""

    name: str
    description: str
    env: dict[str, str] = field(default_factory=dict)
    child: tuple[Pin, ...] = ()


PINS: dict[Pin, PinSpec] = {Pin(p.name): p for p in (
    PinSpec(Pin.TORCH_RNG, "the torch RNG (seeded by detaudit; the script's seeding calls fixed)",
            child=(Pin.TORCH_RNG,)),
    PinSpec(Pin.NUMPY_RNG, "the NumPy RNG (seeded; Generators given fixed seeds)", child=(Pin.NUMPY_RNG,)),
    PinSpec(Pin.PYTHON_RNG, "Python's `random` (seeded; seeding calls fixed)", child=(Pin.PYTHON_RNG,)),
    PinSpec(Pin.HASH_SEED, "the string hash seed (PYTHONHASHSEED=0)", env={"PYTHONHASHSEED": "0"}),
    # RNGs are seeded too: a random value's size changes allocation sizes, and with them addresses
    PinSpec(Pin.ADDRESS_LAYOUT, "the memory layout (address randomization off, PYTHONHASHSEED=0, RNGs seeded)",
            env={"PYTHONHASHSEED": "0"}, child=(Pin.ADDRESS_LAYOUT, Pin.TORCH_RNG, Pin.NUMPY_RNG, Pin.PYTHON_RNG)),
    # the kernels alone: its fill of uninitialized memory is left off (that source is zero-empty's)
    PinSpec(Pin.DETERMINISTIC, "the kernels (torch.use_deterministic_algorithms(True), without its fill of "
            "uninitialized memory)", child=(Pin.DETERMINISTIC,)),
    PinSpec(Pin.ONE_THREAD, "one thread (set_num_threads(1), OMP/MKL_NUM_THREADS=1)",
            env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, child=(Pin.ONE_THREAD,)),
    PinSpec(Pin.CUDNN, "cuDNN (benchmark off, deterministic on)", child=(Pin.CUDNN,)),
    PinSpec(Pin.CUBLAS, "cuBLAS (CUBLAS_WORKSPACE_CONFIG=:4096:8)", env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
    PinSpec(Pin.TF32_OFF, "float32 precision (TF32 off)", child=(Pin.TF32_OFF,)),
    PinSpec(Pin.ZERO_EMPTY, "uninitialized memory (torch.empty and kin return zeros)", child=(Pin.ZERO_EMPTY,)),
    PinSpec(Pin.NCCL, "NCCL's algorithm and protocol (NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_NVLS_ENABLE=0)",
            env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_NVLS_ENABLE": "0"}),
)}


def pins_of(names: Sequence[str]) -> list[Pin]:
    """The pins named (a child config's `pins`, an experiment's name split at SEP); ValueError names
    one this release does not know."""
    known = {p.value for p in Pin}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown pin {unknown[0]!r}; pins are {', '.join(known)}")
    return [Pin(n) for n in names]


def pin_of(name: str) -> PinSpec:
    """A pin by name; `all` is every pin at once; `a+b` is the set of pins a and b."""
    if name == ALL:
        return _combined(ALL, "every source at once", list(PINS))
    if name == CONTROL:
        return PinSpec(CONTROL, "nothing (a control)")
    if SEP in name:
        names = pins_of(name.split(SEP))
        return _combined(name, " and ".join(PINS[n].description for n in names), names)
    return PINS[Pin(name)]


def _combined(name: str, description: str, names: Sequence[Pin]) -> PinSpec:
    env: dict[str, str] = {}
    for n in names:
        env.update(PINS[n].env)
    return PinSpec(name, description, env, tuple(dict.fromkeys(c for n in names for c in PINS[n].child)))


def covers(pin: str, other: str) -> bool:
    """Pinning `pin` also pins everything `other` does (address-layout covers hash-seed)."""
    a, b = pin_of(pin), pin_of(other)
    return b.env.items() <= a.env.items() and set(b.child) <= set(a.child)


def also_pins(name: str) -> list[Pin]:
    """The other sources a one-pin experiment holds fixed besides its own (address-layout also pins the hash
    seed and the RNGs): its agreement confirms its own source only when these alone do not agree too."""
    if name not in PINS:
        return []
    return [p for p in PINS if p != name and covers(name, p)]


def separating_pin(first: Sequence[str], second: Sequence[str]) -> Pin | None:
    """The pin whose experiment tells two causes apart: it pins one cause's source and not the other's."""
    for name in [*first, *second]:
        if name in PINS and any(covers(name, p) for p in first) != any(covers(name, p) for p in second):
            return Pin(name)
    return None


# -- `run --perturb`: settings the repeats deliberately differ in ---------------------------------------------


class Perturb(StrEnum):
    """A setting that differs between machines, which `run --perturb` varies between repeats (its value is the
    name users and files see)."""

    THREADS = "threads"
    HASH_SEED = "hash-seed"
    CUDNN_BENCHMARK = "cudnn-benchmark"
    CUBLAS_WORKSPACE = "cublas-workspace"
    ALLOCATOR = "allocator"


@dataclass(frozen=True)
class Setting:
    """One value of a perturbed setting, travelling as the pins do: environment variables for the repeat, and
    torch flags the child sets right after `import torch` (`child`: flag -> value), before the script runs, so
    a script that sets the flag itself keeps its own value, as it would on another machine."""

    value: str  # as reports and files show it: `1`, `:4096:8`, `on`
    env: dict[str, str] = field(default_factory=dict)
    child: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class PerturbSpec:
    """How `run --perturb` varies one setting: its two values (the first is what every other repeat runs
    with), and whether only CUDA work can notice it. The cause a change of bits is reported as is its row's
    (cause_table.PERTURBED)."""

    knob: Perturb
    description: str
    settings: tuple[Setting, Setting]
    cuda_only: bool = False


CHILD_FLAGS = ("cudnn.benchmark",)  # the flags a Setting's `child` may hold (recorder/pinning.py applies them)


def perturbations(cpu_count: int | None) -> dict[Perturb, PerturbSpec]:
    """Every perturbation; threads run at 1 and at this machine's count (at least 2: two threads split a
    reduction otherwise than one, whatever the cores)."""
    many = str(max(2, cpu_count or 1))
    specs = (
        PerturbSpec(Perturb.THREADS, "the intra-op thread count (OMP_NUM_THREADS, MKL_NUM_THREADS)",
                    (Setting("1", {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}),
                     Setting(many, {"OMP_NUM_THREADS": many, "MKL_NUM_THREADS": many}))),
        # two fixed seeds, not 0: 0 turns randomization off, which is a setting no other machine has by default
        PerturbSpec(Perturb.HASH_SEED, "the string hash seed (PYTHONHASHSEED)",
                    (Setting("1", {"PYTHONHASHSEED": "1"}), Setting("2", {"PYTHONHASHSEED": "2"}))),
        PerturbSpec(Perturb.CUDNN_BENCHMARK, "cuDNN's algorithm choice (torch.backends.cudnn.benchmark)",
                    (Setting("off", child={"cudnn.benchmark": False}), Setting("on", child={"cudnn.benchmark": True})),
                    cuda_only=True),
        PerturbSpec(Perturb.CUBLAS_WORKSPACE, "cuBLAS's workspace (CUBLAS_WORKSPACE_CONFIG)",
                    (Setting(":4096:8", {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
                     Setting(":16:8", {"CUBLAS_WORKSPACE_CONFIG": ":16:8"})), cuda_only=True),
        PerturbSpec(Perturb.ALLOCATOR, "the CUDA caching allocator's layout (PYTORCH_CUDA_ALLOC_CONF)",
                    (Setting("expandable_segments:False", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}),
                     Setting("expandable_segments:True", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})),
                    cuda_only=True),
    )
    return {s.knob: s for s in specs}


def perturb_knobs(text: str) -> list[Perturb]:
    """`--perturb`'s comma list (`threads,hash-seed`, `all`) in catalogue order; ValueError names an unknown one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError("--perturb needs at least one setting")
    known = [p.value for p in Perturb]
    unknown = [n for n in names if n not in known and n != ALL]  # checked before `all`: `all,bogus` is a typo too
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r} for --perturb; settings are {', '.join(known)}, or all")
    if ALL in names:
        return list(Perturb)
    return [p for p in Perturb if p.value in names]
