"""What every evidence topic shares: the sink events go to, call-site lookup, RNG state digests.

Sinks: trace events via `Recorder.event` (buffered until torch is imported); in forked children
(DataLoader workers) the main trace writer is inert, so events go to `<trace>.workers.jsonl`, one
`os.write` per line on an O_APPEND descriptor.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import random
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import xxhash

from detaudit.events import WORKERS_SUFFIX, Event, Flags, Lib, RngDigest, Short
from detaudit.recorder import location, oplist
from detaudit.recorder.pinning import Pins

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


active: Evidence | None = None  # this process's, once installed (evidence.install)


def _never_compiling() -> bool:
    return False


class Evidence:
    """Everything one repeat records for the detectors; one instance per process (see `install`)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        # torch.compiler.is_compiling once torch is imported: every wrapper passes straight through while
        # dynamo traces (recorder/compiled.py), so wrapping never changes a compiled graph.
        self.compiling: Callable[[], bool] = _never_compiling
        trace = config.get("trace")
        self.side_path = str(trace) + WORKERS_SUFFIX if trace else None
        self.pins = Pins(config.get("pins", []), config.get("perturb", {}))
        self.pid = os.getpid()
        self.in_worker = False
        self.fork_at = 0
        self.recorder: Any = None
        self.torch: Any = None
        self.numpy: Any = None  # numpy.random, once imported
        self.buffer: list[Event] = []
        self.seen: set[Any] = set()
        self.anchors: dict[str, str | None] = {}
        # RNG objects the script owns, numbered in creation order (generators.py): draws name the number
        self.rng_objects: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.threads: weakref.WeakSet[Any] = weakref.WeakSet()  # threads started (concurrency.py): draws beside them
        self._rng_numbers = 0
        self.outside_sites = 0  # user call sites of outside values recorded (environment.py)
        self.device_as: str | None = None  # set by the test-only fault injector (faults.py)
        self.op_entries: dict[str, list[oplist.OpEntry]] = {}
        # user call sites of the wall clock: (code, line) -> [label, reads]; None for library code
        self.clock_reads: dict[tuple[Any, int], list[Any] | None] = {}
        # weak references to what user `empty*` calls returned, until the first forward (kernels.py)
        self.empties: list[Any] | None = []
        self.fill_generator: Any = None  # what fills `empty` memory: seeded from os.urandom per process
        self._library = location.installed_dirs()
        self._side_fd: int | None = None
        self._lock = threading.Lock()

    # -- sinks ------------------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        if os.getpid() != self.pid:
            self.after_fork()
        if self.in_worker:
            self._write_side(event)
        elif self.recorder is None:
            self.buffer.append(event)
        else:
            self.recorder.event(event)

    def _write_side(self, event: Event) -> None:
        if self.side_path is None:
            return
        # no pid: evidence holds only what repeats with the same state agree on (the header has the pid)
        line = json.dumps({"at": self.fork_at, "worker": self.worker_id(), **event}, default=short)
        with self._lock:
            if self._side_fd is None:
                try:  # never through a link planted at its name (run/files.py)
                    self._side_fd = os.open(self.side_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                                            0o600)
                except OSError:
                    self.side_path = None  # the workers' evidence is lost; their batches are still recorded
                    return
            try:
                os.write(self._side_fd, (line + "\n").encode())
            except OSError:  # the disk filled up: evidence is a by-product, never a worker's crash
                with contextlib.suppress(OSError):
                    os.close(self._side_fd)
                self._side_fd, self.side_path = None, None

    def after_fork(self) -> None:
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

    def where_code(self, code: Any, line: int) -> str:
        return f"{location.display_path(code.co_filename)}:{line}"

    def site(self, frame: FrameType) -> str:
        """The immediate caller's `file:line`, library code included (a framework resetting a flag)."""
        return f"{location.display_path(frame.f_code.co_filename)}:{frame.f_lineno}"

    def own(self, frame: FrameType) -> bool:
        """detaudit's own frames (a pin forcing a flag) are not the script's settings."""
        return frame.f_code.co_filename.startswith(location._skip_prefixes)

    def worker_id(self) -> int | None:
        if not self.in_worker or self.torch is None:
            return None
        info = self.torch.utils.data.get_worker_info()
        return info.id if info is not None else None

    def rng_object(self, obj: Any) -> int:
        """The number of an RNG object the script owns (a new one the first time it is seen)."""
        number = self.rng_objects.get(obj)
        if number is None:
            number = self.rng_objects[obj] = self._rng_numbers
            self._rng_numbers += 1
        return number

    def rng_number(self, obj: Any) -> int | None:
        """The number of an RNG object the script owns, None for any other object."""
        try:
            return self.rng_objects.get(obj)
        except TypeError:  # not weakly referenceable: none of ours
            return None

    def first_time(self, *key: Any) -> bool:
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    # -- devices -----------------------------------------------------------------------------------
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

    # -- RNG states and flags -----------------------------------------------------------------------
    def rng_digest(self, lib: Lib) -> str | None:
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

    def rng_state(self) -> dict[str, RngDigest]:
        state: dict[str, RngDigest] = {}
        libs: tuple[Lib, ...] = ("torch", "numpy", "python")
        for lib in libs:
            d = self.rng_digest(lib)
            if d is not None:
                state[lib] = {"digest": d, "drawn": d != self.anchors.get(lib)}
        if "torch" in state:
            state["torch"]["initial_seed"] = self.torch.initial_seed()
        return state

    def flags(self) -> Flags:
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


def digest_bytes(data: bytes) -> str:
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def python_rng_digest(state: tuple[Any, ...]) -> str:
    """Digest of `random.getstate()` from its values, never `hash()`: on Python <= 3.11 `hash(None)`
    (the state's last field when no Gaussian is cached) is the object's address, different every run."""
    version, words, gauss_next = state
    return digest_bytes(array.array("Q", words).tobytes() + repr((version, gauss_next)).encode())


@contextlib.contextmanager
def never_fatal() -> Iterator[None]:
    """Evidence is a by-product: a failure to record it must not break the script."""
    try:
        yield
    except Exception as exc:
        print(f"detaudit: could not record evidence: {type(exc).__name__}: {exc}", file=sys.stderr)


def short(value: Any) -> Short:
    """A JSON-safe, run-independent form of a value: an object's repr loses its address."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    text = _ADDRESS.sub(" at 0x?", repr(value))
    return text if len(text) <= 80 else text[:77] + "..."
