"""Every cause of nondeterminism detaudit can report, declared once (docs/causes.md#cause-ids).

Low enough for every stage to import (it imports only the leaves pin.py and events.py), so every stage reads
the same row: the detectors register their ids from `CauseId` (causes/context.py refuses an undeclared one),
the ranking reads `mechanism`, `--explain`'s confirmation reads `isolation` and `beyond_pins`, `run --perturb`
reads `perturb`, `explain` reads `by_chance`, `fix` reads `fix_knob`, and the docs test finds each row at
`doc_anchor`. Adding a cause is one row here, its detector, and its row in docs/causes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Literal

from detaudit.events import Kind
from detaudit.pin import Perturb, Pin


class CauseId(StrEnum):
    """A cause's id: its value is the name reports, files and docs use."""

    UNSEEDED_TORCH_RNG = "unseeded-torch-rng"
    UNSEEDED_NUMPY_RNG = "unseeded-numpy-rng"
    UNSEEDED_PYTHON_RNG = "unseeded-python-rng"
    VARYING_SEED = "varying-seed"
    PYTHON_HASH_SEED = "python-hash-seed"
    OBJECT_ORDER = "object-order"
    DATALOADER_WORKERS = "dataloader-workers"
    NONDETERMINISTIC_OP = "nondeterministic-op"
    CUDNN_BENCHMARK = "cudnn-benchmark"
    CUBLAS_WORKSPACE = "cublas-workspace"
    TF32 = "tf32"
    THREAD_COUNT = "thread-count"
    ALLOCATOR = "allocator"
    UNINITIALIZED_MEMORY = "uninitialized-memory"
    CONCURRENCY = "concurrency"
    ENVIRONMENT_CHANGE = "environment-change"
    ENVIRONMENT = "environment"
    FLAG_DRIFT = "flag-drift"
    FLAG_TYPO = "flag-typo"
    COLLECTIVE_ALGORITHM = "collective-algorithm"
    DEVICE_RNG_GEOMETRY = "device-rng-geometry"
    COMPILED_KERNELS = "compiled-kernels"
    WALL_CLOCK = "wall-clock"
    STDOUT_DIFFERS = "stdout-differs"
    CARRIED_STATE = "carried-state"
    NOT_REPRODUCED = "not-reproduced"
    OUTSIDE_VALUE = "outside-value"
    UNKNOWN = "unknown"


# mechanism evidence that is no event kind: the op-level re-run saw it (the divergent op's inputs reordered, an op
# proven nondeterministic), or the comparison itself did (causes/order.py parameters_reordered)
OP_RECORDS: Final = "op-records"
REORDERED_PARAMETERS: Final = "reordered-parameters"
Mechanism = Kind | Literal["op-records", "reordered-parameters"]
# the fix knob of a cause whose finding names the pins concerned (the RNG a worker drew from, the flag changed)
FINDING_PINS: Final = "finding-pins"
FixKnob = Pin | Literal["finding-pins"] | None


@dataclass(frozen=True)
class Isolation:
    """The cause a pin's experiment proves when no detector named its source (bisection): what it says then."""

    pin: Pin
    summary: str
    fix: str


@dataclass(frozen=True)
class CauseSpec:
    """One cause: what it must have observed in a run to be a cause, the experiments and settings that prove it,
    and what `detaudit fix` can do about it.

    `mechanism`: the evidence event kinds (events.Kind, or OP_RECORDS / REORDERED_PARAMETERS) of which a
    compared repeat must hold one, else the finding is a candidate not ruled out; `()`: the comparison itself is
    the observation. `fix_knob`: the knob of `detaudit fix` (fix/code.py KNOBS) that removes its source,
    FINDING_PINS where the finding's own pins say which, None where no knob's code reaches it (a seed the script
    draws from the clock, a set of objects: a change to the script). `beyond_pins`: "everything pinned still
    diverges" supports it. `by_chance`: its divergence may not come back in a re-run (a race, an atomic add, what
    an earlier repeat left), so the audit's own repeats are no control for it."""

    id: CauseId
    mechanism: tuple[Mechanism, ...] = ()
    isolation: Isolation | None = None
    fix_knob: FixKnob = None
    perturb: Perturb | None = None
    beyond_pins: bool = False
    by_chance: bool = False

    @property
    def doc_anchor(self) -> str:
        """Where docs/causes.md documents it: its row of the cause table carries an anchor named by its id."""
        return f"docs/causes.md#{self.id.value}"


C = CauseId
CAUSES: Final[dict[CauseId, CauseSpec]] = {spec.id: spec for spec in (
    CauseSpec(C.UNSEEDED_TORCH_RNG, ("draw", "state", "rng-restore"), Isolation(
        Pin.TORCH_RNG, "the torch RNG differs between runs",
        "seed torch with a constant: `torch.manual_seed(0)` at the start of the script"), fix_knob=Pin.TORCH_RNG),
    CauseSpec(C.UNSEEDED_NUMPY_RNG, ("draw", "state", "generator"), Isolation(
        Pin.NUMPY_RNG, "NumPy randomness differs between runs",
        "seed NumPy with a constant (`np.random.seed(0)`, `np.random.default_rng(0)`)"), fix_knob=Pin.NUMPY_RNG),
    CauseSpec(C.UNSEEDED_PYTHON_RNG, ("draw", "state", "generator"), Isolation(
        Pin.PYTHON_RNG, "Python `random` differs between runs", "seed it with a constant: `random.seed(0)`"),
        fix_knob=Pin.PYTHON_RNG),
    # the script sets its seed again after any knob's constant seed: only a change at its line fixes it
    CauseSpec(C.VARYING_SEED, ("seed", "generator")),
    CauseSpec(C.PYTHON_HASH_SEED, ("hash-call",), Isolation(
        Pin.HASH_SEED, "string hash randomization changes an order derived from a set or dict",
        "iterate `sorted(...)` instead of a set of strings (or set `PYTHONHASHSEED=0`)"),
        fix_knob=Pin.HASH_SEED, perturb=Perturb.HASH_SEED),
    CauseSpec(C.OBJECT_ORDER, (OP_RECORDS, REORDERED_PARAMETERS), Isolation(
        Pin.ADDRESS_LAYOUT, "iteration over objects hashed by identity (memory address)",
        "keep the objects in a list, or sort them by a stable attribute, instead of a set"), beyond_pins=True),
    CauseSpec(C.DATALOADER_WORKERS, ("dataloader",), fix_knob=FINDING_PINS),
    CauseSpec(C.NONDETERMINISTIC_OP, ("op",), Isolation(
        Pin.DETERMINISTIC, "an op accumulates in thread or atomic order",
        "call `torch.use_deterministic_algorithms(True)` at the top of the script"),
        fix_knob=Pin.DETERMINISTIC, by_chance=True),
    CauseSpec(C.CUDNN_BENCHMARK, ("state", "flag"), Isolation(
        Pin.CUDNN, "cuDNN picks convolution algorithms per run",
        "set `torch.backends.cudnn.benchmark = False` and `torch.backends.cudnn.deterministic = True`"),
        fix_knob=Pin.CUDNN, perturb=Perturb.CUDNN_BENCHMARK),
    CauseSpec(C.CUBLAS_WORKSPACE, ("state", "modules"), Isolation(
        Pin.CUBLAS, "cuBLAS splits matmuls in a run-dependent way", "run with `CUBLAS_WORKSPACE_CONFIG=:4096:8`"),
        fix_knob=Pin.CUBLAS, perturb=Perturb.CUBLAS_WORKSPACE),
    CauseSpec(C.TF32, ("state", "flag", "environment"), Isolation(
        Pin.TF32_OFF, "TF32 precision", "turn TF32 off (`torch.set_float32_matmul_precision('highest')`)"),
        fix_knob=Pin.TF32_OFF),
    CauseSpec(C.THREAD_COUNT, ("state", "environment"), Isolation(
        Pin.ONE_THREAD, "a multithreaded reduction sums in a run-dependent order",
        "use a constant thread count, or `torch.use_deterministic_algorithms(True)`"),
        fix_knob=Pin.ONE_THREAD, perturb=Perturb.THREADS, by_chance=True),
    CauseSpec(C.ALLOCATOR, perturb=Perturb.ALLOCATOR),
    CauseSpec(C.UNINITIALIZED_MEMORY, ("empty",), Isolation(
        Pin.ZERO_EMPTY, "memory read before it is written", "use `torch.zeros` instead of `torch.empty`"),
        fix_knob=Pin.ZERO_EMPTY, by_chance=True),
    CauseSpec(C.CONCURRENCY, ("concurrency",), beyond_pins=True, by_chance=True),
    CauseSpec(C.ENVIRONMENT_CHANGE, ("environment",)),
    CauseSpec(C.ENVIRONMENT, ("environment",)),
    CauseSpec(C.FLAG_DRIFT, ("flag", "state"), fix_knob=FINDING_PINS),
    CauseSpec(C.FLAG_TYPO, ("flag-typo",), fix_knob=FINDING_PINS),
    CauseSpec(C.COLLECTIVE_ALGORITHM, ("collective", "ddp"), Isolation(
        Pin.NCCL, "NCCL's reduction algorithm or protocol varies",
        "set `NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_NVLS_ENABLE=0` on every rank and run"), fix_knob=Pin.NCCL),
    CauseSpec(C.DEVICE_RNG_GEOMETRY, ("draw",)),
    CauseSpec(C.COMPILED_KERNELS, ("compile",), fix_knob=Pin.DETERMINISTIC),
    CauseSpec(C.WALL_CLOCK, ("clock-reads",)),
    CauseSpec(C.STDOUT_DIFFERS),
    CauseSpec(C.CARRIED_STATE, ("carried", "file-read"), by_chance=True),
    CauseSpec(C.NOT_REPRODUCED),
    CauseSpec(C.OUTSIDE_VALUE, ("clock", "outside"), beyond_pins=True),
    # a set of sources the bisection isolated is reported as unknown with the pins of the set
    CauseSpec(C.UNKNOWN, fix_knob=FINDING_PINS, beyond_pins=True),
)}
# the cause each pin's experiment isolates alone (causes/confirm.py)
ISOLATED: Final[dict[Pin, CauseSpec]] = {s.isolation.pin: s for s in CAUSES.values() if s.isolation is not None}
# the cause `run --perturb` reports when varying a setting changed the bits (compare/perturb.py)
PERTURBED: Final[dict[Perturb, CauseId]] = {s.perturb: s.id for s in CAUSES.values() if s.perturb is not None}
