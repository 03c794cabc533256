"""Evidence for the cause detectors, recorded cheaply in every repeat (docs/causes.md).

Recorded: seeding calls (value, call site, RNG state digest before and after), numpy Generator
creation, the first draw from each RNG per call site, RNG state digests and torch flags at the first
forward, the first optimizer step and the end, PYTHONHASHSEED, calls of the ops the running torch
lists as nondeterministic (with device), `torch.empty`-family calls from user code (with the digest
of what they returned), DataLoader settings and what happens inside its workers, user threads and
pools, and an environment fingerprint (allow-listed variables only, never secrets).

Cost: only the wrapped functions pay (seeding, RNG draws, listed ops, empty allocations, thread
starts; a dict lookup per call once a call site is known). Nothing runs per module call: the
first-forward and first-step hooks remove themselves, and the autograd graph is walked for the
first few backward calls only.

Sinks: trace events via `Recorder.event` (buffered until torch is imported); in forked children
(DataLoader workers) the main trace writer is inert, so events go to `<trace>.workers.jsonl`, one
`os.write` per line on an O_APPEND descriptor.
"""

from __future__ import annotations

import array
import contextlib
import difflib
import functools
import inspect
import json
import os
import platform
import random
import re
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import xxhash

import detaudit
import detaudit.recorder
from detaudit.recorder import location, oplist
from detaudit.recorder.pins import Pins, aslr_disabled

WORKERS_SUFFIX = ".workers.jsonl"
BACKWARD_WALKS = 4           # autograd graphs inspected (the first backward calls)
MAX_GRAPH_NODES = 20000
MAX_EMPTY_EVENTS = 256
MAX_CLOCK_SITES = 256
ENV_ALLOW = (
    "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS", "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE",
    "OMP_DYNAMIC", "OMP_PROC_BIND", "OMP_PLACES", "MKL_DYNAMIC", "MKL_CBWR",
    "KMP_AFFINITY", "KMP_BLOCKTIME", "KMP_DETERMINISTIC_REDUCTION",
)
TORCH_DRAWS = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "rand_like",
               "randn_like", "randint_like", "poisson")
TENSOR_DRAWS = ("uniform_", "normal_", "random_", "bernoulli_", "exponential_", "cauchy_", "geometric_")
NUMPY_DRAWS = ("random", "rand", "randn", "randint", "random_sample", "normal", "uniform", "choice", "shuffle",
               "permutation", "standard_normal", "binomial", "poisson", "exponential", "beta", "gamma")
PYTHON_DRAWS = ("random", "uniform", "randint", "randrange", "choice", "choices", "shuffle", "sample", "gauss",
                "normalvariate", "getrandbits", "betavariate", "expovariate")
EMPTY_FUNCTIONS = ("empty", "empty_like", "empty_strided")
FLAG_SETTERS = ("use_deterministic_algorithms", "set_float32_matmul_precision")
# flag attributes of torch.backends.cudnn / torch.backends.cuda.matmul: assignments are recorded with their
# call site; any other public name assigned there is a typo torch silently keeps (flag-typo)
MODULE_FLAGS = {"torch.backends.cudnn": ("benchmark", "deterministic", "enabled", "allow_tf32"),
                "torch.backends.cuda.matmul": ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                                               "allow_bf16_reduced_precision_reduction")}
COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "reduce", "all_gather",
               "reduce_scatter")
MAX_FLAG_EVENTS = 64
CLOCKS = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns")
# positional index of condition arguments, counting `self` for Tensor methods (same for torch.X(input, ...))
_POSITIONAL = {"indexput": {"accumulate": 3}, "put": {"accumulate": 3}, "scatterreduce": {"reduce": 4},
               "embeddingbag": {"mode": 4}}

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

_active: Evidence | None = None


def _never_compiling() -> bool:
    return False


# torch.compiler.is_compiling once torch is imported: every wrapper below passes straight through
# while dynamo traces (recorder/compiled.py), so wrapping never changes a compiled graph.
compiling: Callable[[], bool] = _never_compiling


def active() -> Evidence | None:
    return _active


def digest_bytes(data: bytes) -> str:
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def python_rng_digest(state: tuple[Any, ...]) -> str:
    """Digest of `random.getstate()` from its values, never `hash()`: on Python <= 3.11 `hash(None)`
    (the state's last field when no Gaussian is cached) is the object's address, different every run."""
    version, words, gauss_next = state
    return digest_bytes(array.array("Q", words).tobytes() + repr((version, gauss_next)).encode())


def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({paths[k].rstrip(os.sep) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")
                  if paths.get(k)})


class Evidence:
    """Everything one repeat records for the detectors; one instance per process (see `install`)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        trace = config.get("trace")
        self.side_path = str(trace) + WORKERS_SUFFIX if trace else None
        self.pins = Pins(config.get("pins", []))
        self.pid = os.getpid()
        self.in_worker = False
        self.fork_at = 0
        self.recorder: Any = None
        self.torch: Any = None
        self.numpy: Any = None  # numpy.random, once imported
        self.buffer: list[dict[str, Any]] = []
        self.seen: set[Any] = set()
        self.anchors: dict[str, str | None] = {}
        self.device_as: str | None = None  # set by the test-only fault injector (faults.py)
        self.walks = 0
        self._stepped = False
        self.empty_events = 0
        self.flag_events = 0
        self.op_entries: dict[str, list[oplist.OpEntry]] = {}
        # user call sites of the wall clock: (code, line) -> [label, reads]; None for library code
        self.clock_reads: dict[tuple[Any, int], list[Any] | None] = {}
        self._library = _library_prefixes()
        self._side_fd: int | None = None
        self._lock = threading.Lock()

    # -- sinks ------------------------------------------------------------------------------
    def emit(self, event: dict[str, Any]) -> None:
        if os.getpid() != self.pid:
            self._after_fork()
        if self.in_worker:
            self._write_side(event)
        elif self.recorder is None:
            self.buffer.append(event)
        else:
            self.recorder.event(event)

    def _write_side(self, event: dict[str, Any]) -> None:
        if self.side_path is None:
            return
        # no pid: evidence holds only what repeats with the same state agree on (the header has the pid)
        line = json.dumps({"at": self.fork_at, "worker": self.worker_id(), **event}, default=_short)
        with self._lock:
            if self._side_fd is None:
                self._side_fd = os.open(self.side_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(self._side_fd, (line + "\n").encode())

    def _after_fork(self) -> None:
        """In a forked child (a DataLoader worker): write to the side file, re-learn call sites."""
        if self.recorder is not None:
            self.fork_at = getattr(self.recorder, "writer", self.recorder).position
        self.pid = os.getpid()
        self.in_worker = True
        self.seen = set()
        self._side_fd = None
        self._lock = threading.Lock()

    def attach_recorder(self, recorder: Any) -> None:
        self.recorder = recorder
        for event in self.buffer:
            recorder.event(event)
        self.buffer.clear()

    # -- call sites ---------------------------------------------------------------------------
    def is_library(self, frame: FrameType) -> bool:
        name = frame.f_code.co_filename
        return name.startswith(self._library) or name.startswith(location._skip_prefixes) or name.startswith("<frozen")

    def where(self, frame: FrameType | None) -> str:
        """The user's `file:line` at or above `frame`."""
        while frame is not None and self.is_library(frame):
            frame = frame.f_back
        if frame is None:
            return ""
        return f"{location.display_path(frame.f_code.co_filename)}:{frame.f_lineno}"

    def worker_id(self) -> int | None:
        if not self.in_worker or self.torch is None:
            return None
        info = self.torch.utils.data.get_worker_info()
        return info.id if info is not None else None

    def first_time(self, *key: Any) -> bool:
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    # -- RNG states -----------------------------------------------------------------------------
    def rng_digest(self, lib: str) -> str | None:
        try:
            if lib == "torch" and self.torch is not None:
                return digest_bytes(self.torch.get_rng_state().numpy().tobytes())
            if lib == "numpy" and self.numpy is not None:
                _, keys, pos, has_gauss, cached = self.numpy.get_state()
                return digest_bytes(keys.tobytes() + repr((pos, has_gauss, cached)).encode())
            if lib == "python":
                return python_rng_digest(random.getstate())
        except Exception:
            return None
        return None

    def rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for lib in ("torch", "numpy", "python"):
            d = self.rng_digest(lib)
            if d is not None:
                state[lib] = {"digest": d, "drawn": d != self.anchors.get(lib)}
        if "torch" in state:
            state["torch"]["initial_seed"] = self.torch.initial_seed()
        return state

    # -- installation ---------------------------------------------------------------------------
    def install_early(self) -> None:
        """At child start, before the script: Python's RNG, threads, hash seed, fork handling."""
        location.skip_paths(location.package_dir(detaudit.recorder), detaudit.__file__ or "")
        self.pins.apply_python(random)
        self.anchors["python"] = self.rng_digest("python")
        self._wrap_seed(random, "seed", "python", "random.seed")
        for name in PYTHON_DRAWS:
            self._wrap_draw(random, name, "python", f"random.{name}")
        self._wrap_method(threading.Thread, "start", "threading.Thread.start")
        for name in CLOCKS:
            self._wrap_clock(name)
        self.emit({"type": "hash", "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED"),
                   "randomization": sys.flags.hash_randomization, "probe": hash("detaudit-hash-probe"),
                   "aslr_disabled": aslr_disabled()})
        os.register_at_fork(after_in_child=self._after_fork)

    def import_callbacks(self) -> dict[str, Callable[[ModuleType], None]]:
        """Modules to instrument as soon as the script imports them (see child._AfterImport)."""
        callbacks = {"numpy.random": self.on_numpy_random, "concurrent.futures": self.on_futures,
                     "multiprocessing.pool": self.on_mp_pool}
        for name in list(callbacks):
            if name in sys.modules:
                callbacks.pop(name)(sys.modules[name])
        return callbacks

    def on_numpy_random(self, np_random: ModuleType) -> None:
        self.numpy = np_random
        location.skip_paths(location.package_dir(sys.modules["numpy"]))
        self.pins.apply_numpy(np_random)
        self.anchors["numpy"] = self.rng_digest("numpy")
        self.emit({"type": "state", "when": "numpy-import", "rng": self.rng_state()})
        self._wrap_seed(np_random, "seed", "numpy", "np.random.seed")
        self._wrap_generator(np_random)
        for name in NUMPY_DRAWS:
            self._wrap_draw(np_random, name, "numpy", f"np.random.{name}")

    def on_futures(self, futures: ModuleType) -> None:
        for cls in (futures.ThreadPoolExecutor, futures.ProcessPoolExecutor):
            self._wrap_method(cls, "submit", f"{cls.__name__}.submit")
        self._wrap_function(futures, "as_completed", "concurrent.futures.as_completed")

    def on_mp_pool(self, pool: ModuleType) -> None:
        for name in ("__init__", "imap_unordered"):
            self._wrap_method(pool.Pool, name, f"multiprocessing.Pool.{name.strip('_') or name}")

    def on_torch(self, torch: ModuleType) -> None:
        """Right after `import torch` (before the script sees it) and before the recorder's hooks."""
        global compiling
        from detaudit.recorder import compiled

        compiling = compiled.compiling
        self.torch = torch
        if "numpy.random" in sys.modules and self.numpy is None:
            self.on_numpy_random(sys.modules["numpy.random"])
        self.pins.apply_torch(torch)
        self.anchors["torch"] = self.rng_digest("torch")
        for name in ("manual_seed", "seed"):
            self._wrap_seed(torch, name, "torch", f"torch.{name}")
            self._wrap_seed(torch.random, name, "torch", f"torch.{name}")
        for name in ("manual_seed", "manual_seed_all"):
            self._wrap_seed(torch.cuda, name, "torch", f"torch.cuda.{name}")
        for name in TORCH_DRAWS:
            self._wrap_draw(torch, name, "torch", f"torch.{name}")
        for name in TENSOR_DRAWS:
            self._wrap_draw(torch.Tensor, name, "torch", f"Tensor.{name}")
        self._wrap_draw(torch.nn.functional, "dropout", "torch", "dropout")
        for name in EMPTY_FUNCTIONS:
            self._wrap_empty(torch, name, f"torch.{name}")
        self._wrap_empty(torch.Tensor, "new_empty", "Tensor.new_empty")
        self._wrap_call_site(torch, "set_num_threads", "torch.set_num_threads")
        self._wrap_flags(torch)
        if torch.distributed.is_available():
            self._wrap_collectives(torch.distributed)
        self._wrap_listed_ops(torch)
        self._wrap_backward(torch.autograd)
        self._wrap_dataloader(torch.utils.data.DataLoader)
        from detaudit.recorder import faults

        faults.install(self, torch)
        self.emit(self.environment())
        self.emit({"type": "state", "when": "import", "rng": self.rng_state(), "flags": self.flags()})
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        self._first_forward = nn_module.register_module_forward_pre_hook(self._on_first_forward)
        self._first_step = optim.register_optimizer_step_pre_hook(self._on_first_step)

    def finish(self) -> None:
        """At the end of the repeat (also on timeout): the final flags and RNG states."""
        if os.getpid() != self.pid or self.in_worker:
            return
        sites = [{"fn": v[0], "loc": self.where_code(code, line), "reads": v[1]}
                 for (code, line), v in self.clock_reads.items() if v is not None]
        if sites:
            self.emit({"type": "clock-reads", "sites": sites})
        event: dict[str, Any] = {"type": "state", "when": "end", "rng": self.rng_state()}
        if self.torch is not None:
            from detaudit.recorder import compiled

            if compiled.was_used():
                self.emit(compiled.evidence())
            event["flags"] = self.flags()
            cuda = self.torch.cuda
            if cuda.is_initialized():
                event["gpu"] = [cuda.get_device_name(i) for i in range(cuda.device_count())]
        self.emit(event)

    # -- one-shot hooks ---------------------------------------------------------------------------
    def _on_first_forward(self, module: Any, args: Any) -> None:
        if compiling():
            return
        self._first_forward.remove()
        self.pins.apply_torch_flags(self.torch)
        with _never_fatal():
            self.emit({"type": "state", "when": "first-forward", "rng": self.rng_state(), "flags": self.flags()})
            self._modules(module)

    def _on_first_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # torch iterates the live hook dict here, so the hook cannot remove itself: one check per step
        if self._stepped or compiling():
            return
        self._stepped = True
        self.pins.apply_torch_flags(self.torch)
        with _never_fatal():
            self.emit({"type": "state", "when": "first-step", "rng": self.rng_state(), "flags": self.flags()})

    def _modules(self, root: Any) -> None:
        """Listed module classes (Conv2d, MaxUnpool2d, ...) and matmul-heavy layers in the first model."""
        listed, linear = [], []
        device = "cpu"
        for p in root.parameters():
            device = self.device(p)
            break
        root_name = type(root).__name__
        for qual, module in root.named_modules():
            cls = type(module).__name__
            name = qual or root_name
            for entry in self.op_entries.get(oplist.op_key(cls), []):
                if oplist.applies(entry, device, True, {}):
                    listed.append({"module": name, "class": cls, "entry": entry.text})
                    break
            if cls in ("Linear", "Bilinear", "MultiheadAttention", "LSTM", "GRU", "RNN") or cls.startswith("Conv"):
                linear.append({"module": name, "class": cls})
        self.emit({"type": "modules", "root": root_name, "device": device, "listed": listed, "matmul": linear})

    def device(self, t: Any) -> str:
        return self.device_as or t.device.type

    def draw_device(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Where a torch random op draws: its tensor's device, its `device=` argument, or the default."""
        torch = self.torch
        if args and isinstance(args[0], torch.Tensor):
            return self.device(args[0])
        requested = kwargs.get("device")
        if requested is not None:
            return self.device_as or torch.device(requested).type
        default = getattr(torch, "get_default_device", None)
        return self.device_as or (default().type if default is not None else "cpu")

    # -- flags and environment ------------------------------------------------------------------
    def flags(self) -> dict[str, Any]:
        torch = self.torch
        b = torch.backends
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {
                "cudnn.benchmark": b.cudnn.benchmark, "cudnn.deterministic": b.cudnn.deterministic,
                "cudnn.enabled": b.cudnn.enabled, "cudnn.allow_tf32": b.cudnn.allow_tf32,
                "matmul.allow_tf32": b.cuda.matmul.allow_tf32,
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
                "fill_uninitialized_memory": bool(torch.utils.deterministic.fill_uninitialized_memory),
                "num_threads": torch.get_num_threads(), "num_interop_threads": torch.get_num_interop_threads(),
                "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"),
                "cuda_initialized": torch.cuda.is_initialized(),
            }

    def environment(self) -> dict[str, Any]:
        torch = self.torch
        cudnn = None
        if torch.backends.cudnn.is_available():
            cudnn = torch.backends.cudnn.version()
        driver = None
        with contextlib.suppress(OSError, IndexError):
            driver = Path("/proc/driver/nvidia/version").read_text().splitlines()[0].strip()
        return {
            "type": "environment", "python": platform.python_version(), "torch": torch.__version__,
            "numpy": getattr(sys.modules.get("numpy"), "__version__", None), "cuda": torch.version.cuda, "cudnn": cudnn,
            "driver": driver, "cpu": _cpu_model(), "machine": platform.machine(),
            "os": f"{platform.system()} {platform.release()}", "device_request": self.config.get("device"),
            "device": self.device_as or self.config.get("device"),
            "env": {k: os.environ[k] for k in ENV_ALLOW if k in os.environ},
            "git": self.config.get("git"),  # found by the parent (audit.execute): no subprocess in the repeat
        }

    # -- wrappers ---------------------------------------------------------------------------------
    def _wrap_seed(self, owner: Any, name: str, lib: str, label: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        ev = self

        @functools.wraps(original)
        def seed(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            library = ev.is_library(caller)
            before = ev.rng_digest(lib)
            value = args[0] if args else kwargs.get("seed")
            args, kwargs, pinned = ev.pins.seed_args(lib, args, kwargs, library, ev.worker_id())
            if pinned is not None and label == "torch.seed":  # takes no seed: pin the generator directly
                ev.torch.default_generator.manual_seed(pinned)
                result = pinned
            else:
                result = original(*args, **kwargs)
            if label == "torch.seed":
                value = result
            if label.startswith("torch.cuda."):
                # seeds the GPU generators only, and runs inside torch.manual_seed before the CPU generator is
                # seeded: the CPU state read here would be the unseeded one (entropy, a different digest per run)
                ev.emit({"type": "seed", "lib": lib, "fn": label, "value": _short(value), "loc": ev.where(caller),
                         "library": library, "drawn_before": False, "state": None, "pinned": pinned})
                return result
            after = ev.rng_digest(lib)
            ev.emit({"type": "seed", "lib": lib, "fn": label, "value": _short(value), "loc": ev.where(caller),
                     "library": library, "drawn_before": before is not None and before != ev.anchors.get(lib),
                     "state": after, "pinned": pinned})
            ev.anchors[lib] = after
            return result

        replace(owner, name, seed)

    def _wrap_generator(self, np_random: ModuleType) -> None:
        original = np_random.default_rng
        ev = self

        @functools.wraps(original)
        def default_rng(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            library = ev.is_library(caller)
            seed = args[0] if args else kwargs.get("seed")
            args, kwargs, pinned = ev.pins.seed_args("numpy-generator", args, kwargs, library, ev.worker_id())
            gen = original(*args, **kwargs)
            state = digest_bytes(repr(gen.bit_generator.state).encode())
            ev.emit({"type": "generator", "lib": "numpy", "fn": "np.random.default_rng", "seeded": seed is not None,
                     "value": _short(seed), "loc": ev.where(caller), "library": library, "state": state,
                     "pinned": pinned})
            return gen

        setattr(np_random, "default_rng", default_rng)  # noqa: B010 (mypy: module attribute)

    def _wrap_draw(self, owner: Any, name: str, lib: str, label: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        ev = self

        @functools.wraps(original)
        def draw(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            if (label, caller.f_code, caller.f_lineno) not in ev.seen:
                ev.seen.add((label, caller.f_code, caller.f_lineno))
                if label != "dropout" or (args[2] if len(args) > 2 else kwargs.get("training", True)):
                    explicit = kwargs.get("generator") is not None
                    event = {"type": "draw", "lib": lib, "fn": label, "loc": ev.where(caller),
                             "generator": "explicit" if explicit else "global"}
                    if lib == "torch":
                        event["device"] = ev.draw_device(args, kwargs)
                    ev.emit(event)
                else:
                    ev.seen.discard((label, caller.f_code, caller.f_lineno))
            return original(*args, **kwargs)

        replace(owner, name, draw)

    def _wrap_empty(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        ev = self

        @functools.wraps(original)
        def empty(*args: Any, **kwargs: Any) -> Any:
            t = original(*args, **kwargs)
            if compiling():
                return t
            caller = sys._getframe(1)
            if ev.is_library(caller):
                return t
            if ev.pins.active("zero-empty"):
                with ev.torch.no_grad():
                    t.zero_()
            if ev.empty_events < MAX_EMPTY_EVENTS:
                ev.empty_events += 1
                ev.emit({"type": "empty", "fn": label, "loc": ev.where(caller), "shape": list(t.shape),
                         "dtype": str(t.dtype).removeprefix("torch."), "device": ev.device(t),
                         "digest": _tensor_digest(t), "pinned": ev.pins.active("zero-empty")})
            return t

        replace(owner, name, empty)

    def _wrap_listed_ops(self, torch: ModuleType) -> None:
        """Wrap the functions and methods the running torch lists as nondeterministic."""
        for entry in oplist.parse(torch.use_deterministic_algorithms.__doc__ or ""):
            self.op_entries.setdefault(entry.key, []).append(entry)
        hot = {"getitem", "resize", "bmm"}  # hot paths or conditions only the autograd walk can see
        for key, entries in self.op_entries.items():
            api = entries[0].api
            if key in hot or api.startswith("torch.nn.") and not api.startswith("torch.nn.functional."):
                continue
            base = api.rsplit(".", 1)[1].rstrip("_")
            if api.startswith("torch.nn.functional."):
                targets = [(torch.nn.functional, base)]
            else:
                targets = [(o, n) for o in (torch, torch.Tensor) for n in (base, base + "_")]
            for owner, name in targets:
                if getattr(owner, name, None) is not None:
                    self._wrap_op(owner, name, key, entries)

    def _wrap_op(self, owner: Any, name: str, key: str, entries: list[oplist.OpEntry]) -> None:
        original = getattr(owner, name)
        torch = self.torch
        positions = _POSITIONAL.get(key, {})
        ev = self

        @functools.wraps(original)
        def op(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            if (name, caller.f_code, caller.f_lineno) not in ev.seen and args and isinstance(args[0], torch.Tensor):
                ev.seen.add((name, caller.f_code, caller.f_lineno))
                first = args[0]
                values = {arg: str(kwargs[arg]) if arg in kwargs else str(args[i]) for arg, i in positions.items()
                          if arg in kwargs or len(args) > i}
                if "accumulate" in positions and "accumulate" not in values:
                    values["accumulate"] = "False"
                grad = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
                device = ev.device(first)
                for entry in entries:
                    if oplist.applies(entry, device, grad, values):
                        ev.emit({"type": "op", "op": name, "device": device, "entry": entry.text,
                                 "phase": "backward" if entry.backward else "forward", "loc": ev.where(caller),
                                 "threads": torch.get_num_threads(),
                                 "deterministic": torch.are_deterministic_algorithms_enabled()})
                        break
            return original(*args, **kwargs)

        replace(owner, name, op)

    def _wrap_backward(self, autograd: ModuleType) -> None:
        original = autograd.backward
        ev = self

        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if ev.walks < BACKWARD_WALKS:
                ev.walks += 1
                with _never_fatal():
                    ev._walk_graph(tensors, sys._getframe(1))
            return original(tensors, *args, **kwargs)

        replace(autograd, "backward", backward)

    def _walk_graph(self, tensors: Any, caller: FrameType) -> None:
        torch = self.torch
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        roots = [t for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        if not roots:
            return
        device = self.device(roots[0])
        stack = [t.grad_fn for t in roots]
        seen: set[int] = set()
        loc = self.where(caller)
        while stack and len(seen) < MAX_GRAPH_NODES:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            stack.extend(fn for fn, _ in node.next_functions)
            node_name = node.name()
            for key in oplist.node_keys(node_name):
                for entry in self.op_entries.get(key, []):
                    if oplist.applies(entry, device, True, {}) and self.first_time("node", node_name, device):
                        self.emit({"type": "op", "op": node_name, "device": device, "entry": entry.text,
                                   "phase": "backward", "loc": loc, "threads": torch.get_num_threads(),
                                   "deterministic": torch.are_deterministic_algorithms_enabled()})

    # -- determinism flags and collectives -----------------------------------------------------------
    def site(self, frame: FrameType) -> str:
        """The immediate caller's `file:line`, library code included (a framework resetting a flag)."""
        return f"{location.display_path(frame.f_code.co_filename)}:{frame.f_lineno}"

    def _own(self, frame: FrameType) -> bool:
        """detaudit's own frames (a pin forcing a flag) are not the script's settings."""
        return frame.f_code.co_filename.startswith(location._skip_prefixes)

    def _flag_event(self, event: dict[str, Any], caller: FrameType) -> None:
        if self._own(caller) or self.flag_events >= MAX_FLAG_EVENTS:
            return
        self.flag_events += 1
        self.emit({**event, "loc": self.where(caller), "by": self.site(caller)})

    def _wrap_flags(self, torch: ModuleType) -> None:
        for name in FLAG_SETTERS:
            self._wrap_flag_setter(torch, name)
        self._watch_module(torch.backends.cudnn, "torch.backends.cudnn", "cudnn.")
        self._watch_module(torch.backends.cuda.matmul, "torch.backends.cuda.matmul", "matmul.")

    def _wrap_flag_setter(self, torch: ModuleType, name: str) -> None:
        original = getattr(torch, name)
        ev = self

        @functools.wraps(original)
        def setter(*args: Any, **kwargs: Any) -> Any:
            value = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
            ev._flag_event({"type": "flag", "flag": name, "value": value}, sys._getframe(1))
            return original(*args, **kwargs)

        replace(torch, name, setter)

    def _watch_module(self, module: ModuleType, label: str, prefix: str) -> None:
        """Record assignments to a torch.backends flag module (its class is torch's own, so patchable)."""
        cls = type(module)
        if cls is ModuleType:
            return
        flags = MODULE_FLAGS[label]
        known = set(dir(module)) | set(flags)
        original = cls.__setattr__
        ev = self

        def __setattr__(obj: Any, name: str, value: Any) -> None:
            if obj is module:
                caller = sys._getframe(1)
                if name in flags:
                    ev._flag_event({"type": "flag", "flag": prefix + name, "value": repr(value)}, caller)
                elif name not in known and not name.startswith("_") and not isinstance(value, ModuleType):
                    ev._flag_event({"type": "flag-typo", "module": label, "name": name, "value": _short(value),
                                    "meant": next(iter(difflib.get_close_matches(name, flags, 1)), None)}, caller)
            original(obj, name, value)

        cls.__setattr__ = __setattr__  # type: ignore[method-assign]

    def _wrap_collectives(self, dist: ModuleType) -> None:
        """Runs that use collectives: the backend, and the first call of each collective per call site."""
        init = dist.init_process_group
        ev = self

        @functools.wraps(init)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = init(*args, **kwargs)
            caller = sys._getframe(1)
            with _never_fatal():
                ev.emit({"type": "collective", "what": "init_process_group", "backend": str(dist.get_backend()),
                         "world_size": dist.get_world_size(), "loc": ev.where(caller)})
            return result

        replace(dist, "init_process_group", init_process_group)
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is not None:
                self._wrap_collective(dist, name, original)

    def _wrap_collective(self, dist: ModuleType, name: str, original: Callable[..., Any]) -> None:
        ev = self

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if ev.first_time("collective", name, caller.f_code, caller.f_lineno):
                tensor = args[0] if args else None
                ev.emit({"type": "collective", "what": name, "loc": ev.where(caller),
                         "device": ev.device(tensor) if hasattr(tensor, "device") else None})
            return original(*args, **kwargs)

        replace(dist, name, collective)

    def _wrap_dataloader(self, loader_cls: type) -> None:
        original = loader_cls.__init__  # type: ignore[misc]
        ev = self

        @functools.wraps(original)
        def init(loader: Any, *args: Any, **kwargs: Any) -> None:
            original(loader, *args, **kwargs)
            caller = sys._getframe(1)
            if ev.is_library(caller):
                return
            fn = loader.worker_init_fn
            ev.emit({"type": "dataloader", "loc": ev.where(caller), "num_workers": loader.num_workers,
                     "worker_init_fn": getattr(fn, "__qualname__", None) if fn is not None else None,
                     "generator": loader.generator is not None, "sampler": type(loader.sampler).__name__})
            if loader.num_workers > 0 and ev.side_path is not None:
                loader.worker_init_fn = WorkerStart(fn)

        loader_cls.__init__ = init  # type: ignore[misc]

    def where_code(self, code: Any, line: int) -> str:
        return f"{location.display_path(code.co_filename)}:{line}"

    def _wrap_clock(self, name: str) -> None:
        """Count the script's reads of the wall clock per call site: a loop bounded by time runs a
        different number of times in each repeat, and these counts show where (causes/clock.py)."""
        original = getattr(time, name, None)
        if original is None:
            return
        ev = self
        label = f"time.{name}"

        @functools.wraps(original)
        def clock() -> Any:
            if compiling():
                return original()
            caller = sys._getframe(1)
            key = (caller.f_code, caller.f_lineno)
            if key in ev.clock_reads:
                site = ev.clock_reads[key]
            else:
                site = None if ev.is_library(caller) else [label, 0]
                if site is not None and len(ev.clock_reads) < MAX_CLOCK_SITES:
                    ev.emit({"type": "clock", "fn": label, "loc": ev.where(caller)})
                ev.clock_reads[key] = site
            if site is not None:
                site[1] += 1
            return original()

        setattr(time, name, clock)

    def _wrap_method(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        ev = self

        @functools.wraps(original)
        def method(obj: Any, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if not ev.is_library(caller) and ev.first_time(label, caller.f_code, caller.f_lineno):
                target = getattr(obj, "_target", None) or (args[0] if args and callable(args[0]) else None)
                ev.emit({"type": "concurrency", "what": label, "loc": ev.where(caller),
                         "target": getattr(target, "__qualname__", None)})
            return original(obj, *args, **kwargs)

        setattr(owner, name, method)

    def _wrap_call_site(self, owner: Any, name: str, label: str) -> None:
        """Record every user call with its first argument (a setting such as a thread count)."""
        original = getattr(owner, name)
        ev = self

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            if not ev.is_library(caller):
                ev.emit({"type": "call", "fn": label, "value": _short(args[0] if args else None),
                         "loc": ev.where(caller)})
            return original(*args, **kwargs)

        replace(owner, name, call)

    def _wrap_function(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        ev = self

        @functools.wraps(original)
        def function(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if not ev.is_library(caller) and ev.first_time(label, caller.f_code, caller.f_lineno):
                ev.emit({"type": "concurrency", "what": label, "loc": ev.where(caller), "target": None})
            return original(*args, **kwargs)

        setattr(owner, name, function)


class WorkerStart:
    """A DataLoader `worker_init_fn` wrapper: records each worker's RNG states after torch seeded it.

    Picklable (a top-level class holding the user's function), so a spawn-started worker still runs;
    only forked workers (the default on Linux) inherit the instrumentation and record evidence.
    """

    def __init__(self, user_fn: Callable[[int], Any] | None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        ev = _active
        if ev is not None:
            ev.emit({"type": "worker-start", "worker_id": worker_id, "rng": ev.rng_state()})
        if self.user_fn is not None:
            self.user_fn(worker_id)
            if ev is not None:
                ev.emit({"type": "worker-init-done", "worker_id": worker_id, "rng": ev.rng_state()})


def replace(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    """Put `wrapper` (made with functools.wraps) in place of `owner.name`, invisibly to TorchScript.

    TorchScript resolves a function a scripted body calls by identity: a torch builtin through its
    builtin table (keyed by id, filled at `import torch`), a Python function by compiling its source.
    The wrapper is registered as the same builtin, or hands TorchScript the original to compile
    (`__prepare_scriptable__`), so `torch.jit.script` compiles exactly as under plain python.
    """
    original = getattr(owner, name)
    setattr(owner, name, wrapper)
    builtins: Any = sys.modules.get("torch.jit._builtins")
    op = builtins._find_builtin(original) if builtins is not None else None
    if op is not None:
        builtins._register_builtin(wrapper, op)
    elif inspect.isfunction(original):
        wrapper.__prepare_scriptable__ = lambda: original  # type: ignore[attr-defined]


@contextlib.contextmanager
def _never_fatal() -> Iterator[None]:
    """Evidence is a by-product: a failure to record it must not break the script."""
    try:
        yield
    except Exception as exc:
        print(f"detaudit: could not record evidence: {type(exc).__name__}: {exc}", file=sys.stderr)


def _short(value: Any) -> Any:
    """A JSON-safe, run-independent form of a value: an object's repr loses its address."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    text = _ADDRESS.sub(" at 0x?", repr(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _tensor_digest(t: Any) -> str | None:
    if t.device.type != "cpu" or t.numel() > (1 << 22):
        return None
    from detaudit.fingerprint import fingerprint_cpu

    try:
        return f"{fingerprint_cpu(t)[0]:016x}"
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def install(config: dict[str, Any]) -> Evidence:
    """Called once at child start, before the script runs (after a pinned re-exec, if any)."""
    global _active
    _active = Evidence(config)
    _active.install_early()
    return _active


def attach(recorder: Any, torch: ModuleType) -> None:
    """When torch is imported: events now go to the trace; instrument torch before the script sees it."""
    if _active is not None:
        _active.attach_recorder(recorder)
        _active.on_torch(torch)


def finish(recorder: Any) -> None:
    """Before the trace is closed (also a script that never imported torch gets its evidence)."""
    if _active is None:
        return
    try:
        if _active.recorder is None:
            _active.attach_recorder(recorder)
        _active.finish()
    except Exception as exc:  # the script's outcome matters more than the last evidence
        print(f"detaudit: could not record the final evidence: {exc}", file=sys.stderr)
