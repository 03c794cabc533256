"""Evidence events: one TypedDict per event kind, shared by the recorder that writes them and the
cause detectors that read them, so a renamed or retyped field fails mypy on both sides.

On disk each event is one JSON object (an `E` frame of the trace, or a line of the DataLoader
workers' side file `<trace>.workers.jsonl`), exactly the dict built here plus `at` (the index of the
next record, added by the trace writer) and, in the side file, `worker`. docs/trace-format.md and
docs/causes.md describe the fields; `schema.EVENT` checks their types where events are read back
(tests/test_events.py holds the two in step). Torch-free: the readers import it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Literal, NotRequired, TypedDict, TypeVar, Union, cast, get_args, get_type_hints

from detaudit.batch_events import BatchChoice, BatchSpot, BatchSubset, SkipReason

WORKERS_SUFFIX = ".workers.jsonl"  # `<trace>` + this: the DataLoader workers' events
PARAMETERS_BY_IDENTITY = "Parameters hashed by identity"  # SetOrigin.of: a set an optimizer's Parameters came through

Lib = Literal["torch", "numpy", "python"]
MAIN_THREAD = "MainThread"  # a DrawEvent's `thread`: the main thread, drawing while another thread ran
When = Literal["numpy-import", "import", "first-forward", "first-step", "end"]
Short = Union[None, bool, int, float, str]  # a value as `_short` keeps it: JSON-safe, no addresses
# a torch flag snapshot: "cudnn.benchmark", "deterministic_algorithms", "num_threads", the thread variables, ...
# (keys are flag names, data rather than fields: detectors iterate them)
Flags = dict[str, Union[bool, int, float, str, None]]


class _Event(TypedDict):
    at: NotRequired[int]  # added by the trace writer / side-file writer
    worker: NotRequired[int | None]  # DataLoader worker id (side file only)


class SeedEvent(_Event):
    """A seeding call (`torch.manual_seed`, `np.random.seed`, `random.seed`, ...)."""

    type: Literal["seed"]
    lib: Lib
    fn: str
    value: Short
    loc: str
    library: bool  # made by library code, not the script
    drawn_before: bool  # the RNG had been drawn from since its last seeding
    state: str | None  # digest of the RNG state after the call (None: a GPU-only seeding)
    pinned: int | None  # the value an --explain pin substituted
    by: NotRequired[str]  # library calls: the immediate caller (a seeding helper: `seed_everything`, `set_seed`)


class GeneratorEvent(_Event):
    """An RNG object the script owns was created or seeded: `np.random.default_rng`, `np.random.RandomState`
    (and its `.seed`), `random.Random` (and its `.seed`), `random.SystemRandom`, `torch.Generator`'s `.seed`
    and `.manual_seed`."""

    type: Literal["generator"]
    lib: Lib
    fn: str
    seeded: bool  # given a seed value (`Generator.seed()` draws one from the OS: not seeded)
    value: Short  # the seed given, or the one `Generator.seed()` drew
    loc: str
    library: bool
    state: str | None  # digest of the object's state after the call (None: SystemRandom, which has none)
    pinned: int | None
    obj: NotRequired[int]  # the object's number in this process (draws from it name it too)
    entropy: NotRequired[bool]  # every draw reads the OS (SystemRandom): no seed can fix it


class DrawEvent(_Event):
    """The first draw from an RNG at a call site."""

    type: Literal["draw"]
    lib: Lib
    fn: str
    loc: str
    generator: Literal["explicit", "global"]
    device: NotRequired[str]  # torch draws only
    obj: NotRequired[int]  # drawn from an RNG object the script owns (its GeneratorEvent's `obj`)
    library: NotRequired[bool]  # dropout only: called by library code (an nn.Dropout module in training mode)
    importing: NotRequired[bool]  # drawn while a module was being imported (a library's import-time draw)
    thread: NotRequired[str]  # drawn beside a started thread: MAIN_THREAD, or the drawing thread's target (name)


class RandomDrawEvent(_Event):
    """A draw at a user call site, fingerprinted with its context (recorder/evidence/draws.py): the first few
    per step and epoch, so causes/repetition.py can find draws that repeat where they should differ."""

    type: Literal["random-draw"]
    lib: Lib
    fn: str
    loc: str  # the user's line
    site: str  # the immediate caller's `file:line` (a library's line under the user's, a transform's)
    source: Literal["global", "object"]  # the library's global RNG, or an RNG object (`obj` when the script's)
    obj: NotRequired[int]  # the RNG object's number (its GeneratorEvent's `obj`)
    state: str | None  # digest of the generator's state just before the draw (None: unreadable)
    value: str | None  # digest of what was drawn (None: not kept, e.g. dropout's output or a GPU tensor)
    size: int  # how many values were drawn
    epoch: int  # DataLoader iterations started before the draw (the most by any one loader)
    n: int  # the draw's index among this site's draws in this epoch, in this process
    step: int  # optimizer steps completed (-1 in a DataLoader worker, which does not know them)
    grad: bool  # torch.is_grad_enabled(): False under no_grad / inference_mode (evaluation)
    evaluating: NotRequired[bool]  # True: every model the script switched with train()/eval() was in eval mode
    rank: NotRequired[int]  # the torchrun rank


class RngDigest(TypedDict):
    digest: str | None
    drawn: bool  # the state changed since the last seeding (or since the library was imported)
    initial_seed: NotRequired[int]  # torch only


class StateEvent(_Event):
    """RNG states (and flags, once torch is imported) at a fixed moment of the run."""

    type: Literal["state"]
    when: When
    rng: dict[str, RngDigest]  # by Lib
    flags: NotRequired[Flags]
    gpu: NotRequired[list[str]]  # the GPU names, at the end, when CUDA was initialized


class HashEvent(_Event):
    type: Literal["hash"]
    PYTHONHASHSEED: str | None
    randomization: int  # sys.flags.hash_randomization
    probe: int  # hash("detaudit-hash-probe")
    aslr_disabled: bool


class HashCallEvent(_Event):
    """The first `hash()` of a str or bytes at a user call site: its value changes with string hash
    randomization (a seed or bucket derived from `hash(prompt)`)."""

    type: Literal["hash-call"]
    loc: str
    value: int
    of: str  # what was hashed, without its content: `str of length 12`


class SetOrigin(TypedDict):
    """A set in scope where an op first ran whose iteration order changes from run to run (never its elements)."""

    name: str  # the variable holding it
    of: str  # "str", "bytes", "tuple holding str", "objects hashed by identity"
    size: int
    built: list[str]  # `file:line`s of its function that assign the name
    iterated: list[str]  # ... that iterate it (`for x in s`, a comprehension over it)
    used: list[str]  # ... that read it otherwise (`enumerate(s)`, `list(s)`, `s - other`)


class SetOrderEvent(_Event):
    """Op-level recording: the run-ordered sets in scope at the first op of a user line (recorder/evidence/
    set_order.py), so an op whose inputs arrive reordered is traced to the set that ordered them."""

    type: Literal["set-order"]
    loc: str  # the op's user line, as its records name it
    sets: list[SetOrigin]


class OpEvent(_Event):
    """A call of an op the running torch lists as nondeterministic (or its node in an autograd graph)."""

    type: Literal["op"]
    op: str
    device: str
    entry: str  # the line of torch's list that matched
    phase: Literal["forward", "backward"]
    loc: str
    threads: int
    deterministic: bool  # deterministic algorithms were on


class LatentOpEvent(_Event):
    """A call on the CPU of an op the running torch lists as nondeterministic on CUDA only: deterministic
    here, not when the same script runs on a GPU (a latent finding, never a cause of this run's divergence)."""

    type: Literal["latent-op"]
    op: str
    entry: str  # the line of torch's list that matched
    phase: Literal["forward", "backward"]
    loc: str
    deterministic: bool  # deterministic algorithms were on (then CUDA would use a deterministic kernel, or raise)


# "class" is a keyword: the functional form spells it
ModuleEntry = TypedDict("ModuleEntry", {"module": str, "class": str, "entry": NotRequired[str]})


class ModulesEvent(_Event):
    """Listed module classes and matmul-heavy layers in the first model run."""

    type: Literal["modules"]
    root: str
    device: str
    listed: list[ModuleEntry]
    matmul: list[ModuleEntry]


class EmptyEvent(_Event):
    """A `torch.empty`-family call from user code, with the digest of what it returned."""

    type: Literal["empty"]
    fn: str
    loc: str
    shape: list[int]
    dtype: str
    device: str
    digest: str | None
    pinned: bool  # the zero-empty pin zeroed it


EmptyState = Literal["written", "unwritten", "freed", "unknown"]


class EmptyWritesEvent(_Event):
    """At the first forward: what became of the memory each earlier `empty` event's call returned, in their
    order — written since (it no longer holds detaudit's fill: an init, a copy), still unwritten (a read
    of it reads the fill), freed, or unknown (device memory). Tells a layer's `empty` + init from a bug."""

    type: Literal["empty-writes"]
    states: list[EmptyState]


class CallEvent(_Event):
    """A user call of a setting such as `torch.set_num_threads`, with its first argument."""

    type: Literal["call"]
    fn: str
    value: Short
    loc: str


class FlagEvent(_Event):
    """A determinism flag set by a setter call or an assignment to torch.backends.*."""

    type: Literal["flag"]
    flag: str
    value: str
    loc: str  # the user's line that led to the call
    by: str  # the immediate caller (a library resetting the flag)


class FlagTypoEvent(_Event):
    """An assignment to a public name torch.backends.cudnn / cuda.matmul does not have (torch keeps it silently)."""

    type: Literal["flag-typo"]
    module: str
    name: str
    value: Short
    meant: str | None  # the closest flag name
    loc: str
    by: str


class CollectiveEvent(_Event):
    """`init_process_group` (with backend and world size) or the first call of a collective at a call site."""

    type: Literal["collective"]
    what: str
    loc: str
    backend: NotRequired[str]
    world_size: NotRequired[int]
    device: NotRequired[str | None]


class DataLoaderEvent(_Event):
    type: Literal["dataloader"]
    loc: str
    num_workers: int
    worker_init_fn: str | None
    generator: bool
    sampler: str


class WorkerStartEvent(_Event):
    """A DataLoader worker's RNG states after torch seeded it (before the user's worker_init_fn)."""

    type: Literal["worker-start"]
    worker_id: int
    rng: dict[str, RngDigest]


class WorkerInitDoneEvent(_Event):
    """A DataLoader worker's RNG states after the user's worker_init_fn."""

    type: Literal["worker-init-done"]
    worker_id: int
    rng: dict[str, RngDigest]


class ConcurrencyEvent(_Event):
    """A user thread start, pool construction or submission, or completion-order iteration."""

    type: Literal["concurrency"]
    what: str
    loc: str
    target: str | None


class ClockEvent(_Event):
    """The first read of the wall clock at a user call site."""

    type: Literal["clock"]
    fn: str
    loc: str


class OutsideEvent(_Event):
    """The first read, at a user call site, of a value from outside the program that differs in every run:
    the process id (`os.getpid`), OS entropy (`os.urandom`, `secrets.*`), a random or time-based `uuid`."""

    type: Literal["outside"]
    fn: str
    loc: str


class ClockSite(TypedDict):
    fn: str
    loc: str
    reads: int


class ClockReadsEvent(_Event):
    """At the end: how often each user call site read the clock."""

    type: Literal["clock-reads"]
    sites: list[ClockSite]


class EnvironmentEvent(_Event):
    """Versions, hardware and allow-listed environment variables (never secrets)."""

    type: Literal["environment"]
    python: str
    torch: str
    numpy: str | None
    cuda: str | None
    cudnn: int | None
    driver: str | None
    cpu: str
    machine: str
    os: str
    device_request: str | None
    device: str | None
    env: dict[str, str]
    git: dict[str, Any] | None  # found by the parent (audit.execute)


class CompileEvent(_Event):
    """What decides compiled numerics (recorder/compiled.py)."""

    type: Literal["compile"]
    frames: int
    inductor: dict[str, Union[bool, int, float, str, None]]
    env: dict[str, str]
    module: NotRequired[str]  # the compiled module, when seen at its first call


class DdpEvent(_Event):
    """A DistributedDataParallel wrapper was built (recorder/rank_evidence.py)."""

    type: Literal["ddp"]
    loc: str
    params: list[str]
    ignored: list[str]
    backend: str | None
    bucket_cap_mb: Any
    gradient_as_bucket_view: bool
    static_graph: bool
    find_unused_parameters: bool
    buffers: NotRequired[list[str]]  # buffers DDP broadcasts from rank 0 before each forward (broadcast_buffers)


class SamplerEpochEvent(_Event):
    """A shuffling DistributedSampler iterated again at an epoch it already used."""

    type: Literal["sampler-epoch"]
    loc: str
    epoch: int
    seed: int | None
    iterations: int


class CarriedEvent(_Event):
    """A file read or a directory listed that an earlier repeat of this audit changed.

    Recorded by recorder/evidence/file_access.py.
    """

    type: Literal["carried"]
    what: Literal["read", "list", "stat"]  # stat: its size, time or existence (os.path.getsize, exists, ...)
    path: str  # relative to the working directory when inside it
    loc: str  # the user's line that led to the call
    by: str  # the immediate caller (a library listing its log directory)
    entries: list[str]  # a listing: the entries an earlier repeat created or modified (at most 8, sorted)


class FileReadEvent(_Event):
    """A file the script opened for reading and its bytes' digest then, once per path and user line: other bytes at
    that read in another repeat are state the file carried in (recorder/evidence/file_access.py)."""

    type: Literal["file-read"]
    path: str  # relative to the working directory when inside it
    loc: str  # the user's line that led to the open (`by`: the immediate caller, torch.load's, np.load's)
    by: str
    size: int
    lines: int  # newlines in it; -1 over 8 MiB (then digested by its size, first and last MiB)
    digest: str


class UnobservedEvent(_Event):
    """A value passed to torch.save (or detaudit.checkpoint) that could not be encoded: not compared."""

    type: Literal["unobserved"]
    what: str  # its path: `torch.save[0].args`
    name: str  # its type (`mylib.Config`), or why it was not walked (`nested deeper than 32`)
    loc: str


class FileWriteEvent(_Event):
    """A file the script opened for writing (once per path): under `-j` the repeats share one working
    directory, and two repeats writing one file would read each other's data (audit/pipeline.py)."""

    type: Literal["file-write"]
    path: str  # absolute, as the script named it (not resolved)
    loc: str
    append: NotRequired[bool]  # opened for appending: what was there stays (a log every run adds to)


# -- `detaudit batch` (recorder/batchprobe.py; docs/batch.md; its parts: batch_events.py) ---------------
class BatchCallEvent(_Event):
    """One probed call: the batch's size and dim, and each probe's result."""

    type: Literal["batch-call"]
    module: str
    call: int  # the call's number among that module's probed calls
    rows: int
    batch_dim: int
    reproduced: bool  # re-evaluating the whole batch gave the call's own output, bit for bit
    subsets: list[BatchSubset]
    loc: str
    batch_dim_from: NotRequired[str]  # option, declared, convention (recorder/batchdim.py)
    batch_dim_detail: NotRequired[str]  # why that dim, in words
    not_compared: NotRequired[list[str]]  # output tensors without the batch's rows (aggregates), by path and shape
    training: NotRequired[bool]  # the probed module was in train mode (PyTorch's harness probes in eval())
    choice: NotRequired[BatchChoice]  # a floating output with rows and a last dim to choose over (logits)


class BatchSkipEvent(_Event):
    """A call that was not probed, or whose rows cannot be compared, and why."""

    type: Literal["batch-skip"]
    module: str
    call: int
    why: SkipReason
    detail: str


class BatchOriginEvent(_Event):
    """Where a variant call's difference starts: its variant probe re-run with submodules and ops watched."""

    type: Literal["batch-origin"]
    module: str
    call: int
    subset: str
    size: int
    first_module: BatchSpot | None
    first_op: BatchSpot | None
    note: str | None
    knob: NotRequired[str | None]  # the installed torch's batch-invariance setting (recorder/batchknob.py), if any


class DeviceDigestEvent(_Event):
    """A fast way of digesting device tensors (the batch reduction, a Triton kernel) disagreed with the reference
    torch digest on the run's own tensors, or failed: the reference digested everything after it
    (recorder/devicehash.py; once per process and way)."""

    type: Literal["device-digest"]
    detail: str  # which way, and how it disagreed


class CheckpointPart(TypedDict):
    """One recognised part of a saved or loaded object: where it sits and what it is."""

    path: str  # inside the object: `optimizer`, `rng.torch` ("" for the object itself)
    role: str  # module, optimizer, scheduler, scaler, rng-torch, rng-cuda, rng-numpy, rng-python


class CheckpointSaveEvent(_Event):
    """A `torch.save` call: where it wrote, after how many steps, and the structure of what it saved."""

    type: Literal["checkpoint-save"]
    path: str  # the file as the script named it (relative to the working directory when inside it)
    loc: str
    step: int  # optimizer steps completed when it was called
    keys: list[str]  # the top-level keys of a mapping (empty otherwise)
    parts: list[CheckpointPart]


class CheckpointLoadEvent(_Event):
    """A `torch.load` call, with the same description of what it returned."""

    type: Literal["checkpoint-load"]
    path: str
    loc: str
    step: int
    keys: list[str]
    parts: list[CheckpointPart]


class RngRestoreEvent(_Event):
    """An RNG state set back (`torch.set_rng_state`, `np.random.set_state`, `random.setstate`, ...)."""

    type: Literal["rng-restore"]
    lib: str  # torch, cuda, generator (a torch.Generator), numpy, python
    fn: str
    loc: str
    library: bool
    by: NotRequired[str]  # the immediate caller (`torch/random.py:... (fork_rng)`: its exit)
    state: NotRequired[str | None]  # torch, numpy, python: digest of the RNG state after the call


class StateRestoreEvent(_Event):
    """A `load_state_dict` call on a module, optimizer, LR scheduler or GradScaler (once per call site)."""

    type: Literal["state-restore"]
    what: str  # module, optimizer, scheduler, scaler
    name: str  # the object's class
    loc: str
    library: bool


class TokenEvent(_Event):
    """A decode step's token choice (recorder/evidence/tokens.py): at a call site of `argmax`, `multinomial` or
    `topk` whose choices the script feeds back as its model's next input. Its `at` is the record index at the
    choice (not where the event was written: a site's first choices are written once it is known to decode)."""

    type: Literal["token"]
    fn: str  # torch.argmax, Tensor.argmax, torch.multinomial, Tensor.multinomial, torch.topk, Tensor.topk
    loc: str  # the user's `file:line` (for a library's decode loop, the line that called it)
    site: str  # the immediate caller's `file:line`, library code included (`transformers/generation/utils.py:...`)
    n: int  # the choice's number at its site in this repeat: the token's position
    rows: int  # the batch's sequences (ids and top2 keep the first MAX_ROWS)
    ids: list[int]  # the token chosen for each sequence
    top2: list[list[float] | None] | None  # each row's two largest scores (None: not finite); None for a sample


class InitialParamsEvent(_Event):
    """`detaudit resume` only: the digests of the parameters an optimizer holds just before its first step."""

    type: Literal["initial-params"]
    step: int
    params: list[str]  # parameter names, as PARAM records name them
    digests: list[str]  # the digest of each, 16 hex digits (a record's digest)


Event = Union[SeedEvent, GeneratorEvent, DrawEvent, RandomDrawEvent, StateEvent, HashEvent, HashCallEvent, OpEvent,
              LatentOpEvent, ModulesEvent, EmptyEvent, EmptyWritesEvent, CallEvent, FlagEvent, FlagTypoEvent,
              CollectiveEvent, DataLoaderEvent, WorkerStartEvent, WorkerInitDoneEvent, ConcurrencyEvent, ClockEvent,
              OutsideEvent, ClockReadsEvent, EnvironmentEvent, CompileEvent, DdpEvent, SamplerEpochEvent, CarriedEvent,
              FileReadEvent, UnobservedEvent, FileWriteEvent, BatchCallEvent, BatchSkipEvent, BatchOriginEvent,
              CheckpointSaveEvent, CheckpointLoadEvent, RngRestoreEvent, StateRestoreEvent, InitialParamsEvent,
              DeviceDigestEvent, SetOrderEvent, TokenEvent]
Kind = Literal["seed", "generator", "draw", "random-draw", "state", "hash", "hash-call", "op", "latent-op", "modules",
               "empty", "empty-writes", "call", "flag", "flag-typo", "collective", "dataloader", "worker-start",
               "worker-init-done", "concurrency", "clock", "outside", "clock-reads", "environment", "compile", "ddp",
               "sampler-epoch", "carried", "file-read", "unobserved", "file-write", "batch-call", "batch-skip",
               "batch-origin", "checkpoint-save", "checkpoint-load", "rng-restore", "state-restore", "initial-params",
               "device-digest", "set-order", "token"]

E = TypeVar("E")


@functools.cache
def _kind(cls: Any) -> str:
    kind: str = get_args(get_type_hints(cls)["type"])[0]
    return kind


def kind_of(cls: type) -> str:
    """The `type` value of an event class: `kind_of(SeedEvent) == "seed"`."""
    return _kind(cls)


def select(events: Iterable[Event], cls: type[E]) -> list[E]:
    """The events of one kind, typed as that kind's TypedDict."""
    kind = _kind(cast(Any, cls))
    return [cast(E, e) for e in events if e.get("type") == kind]
