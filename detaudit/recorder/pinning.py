"""Pins for `--explain`: hold one source of nondeterminism fixed inside a repeat.

The launcher passes pin names in the child config (`pins`: detaudit.pin.Pin values); environment-level
pins (PYTHONHASHSEED, CUBLAS_WORKSPACE_CONFIG, OMP_NUM_THREADS) travel as environment variables instead
(detaudit.pin.PINS).
A pin overrides what the script does: seeding calls made by user code get a fixed value (the
k-th call gets PIN_SEED + k, offset per DataLoader worker), flags are forced at import and again
at the first forward and the first optimizer step (scripts set them after import).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from detaudit.pin import CHILD_FLAGS, Pin, pins_of
from detaudit.recorder.patch import wrap

PIN_SEED = 1234
ADDR_NO_RANDOMIZE = 0x0040000
_PIN_OF_LIB = {"torch": Pin.TORCH_RNG, "numpy": Pin.NUMPY_RNG, "numpy-generator": Pin.NUMPY_RNG,
               "python": Pin.PYTHON_RNG}


class Pins:
    """The pins of one repeat (the child config's `pins`; a name this release does not know is a ValueError),
    and the flags a `run --perturb` setting gives it (`perturb`: flag -> value, detaudit.pin.CHILD_FLAGS)."""

    def __init__(self, names: Iterable[str], perturb: Mapping[str, bool] | None = None) -> None:
        self.names: frozenset[Pin] = frozenset(pins_of(list(names)))
        self._calls: dict[str, int] = {}
        unknown = set(perturb or {}) - set(CHILD_FLAGS)
        if unknown:
            raise ValueError(f"unknown perturbed flag {sorted(unknown)[0]!r}; flags are {', '.join(CHILD_FLAGS)}")
        self.perturb = dict(perturb or {})

    def active(self, name: str) -> bool:
        """Whether the pin of this name (a Pin value) holds in this repeat."""
        return name in self.names

    def seed_args(self, lib: str, args: tuple[Any, ...], kwargs: dict[str, Any], library: bool,
                  worker: int | None) -> tuple[tuple[Any, ...], dict[str, Any], int | None]:
        """The arguments a user seeding call runs with, and the pinned value (None: not pinned)."""
        if library or _PIN_OF_LIB[lib] not in self.names:
            return args, kwargs, None
        k = self._calls.get(lib, 0)
        self._calls[lib] = k + 1
        value = PIN_SEED + k + (0 if worker is None else 1000 * (worker + 1))
        kwargs = {key: v for key, v in kwargs.items() if key != "seed"}
        return (value, *args[1:]), kwargs, value

    def apply_python(self, random_module: ModuleType) -> None:
        if Pin.PYTHON_RNG in self.names:
            random_module.seed(PIN_SEED)

    def apply_numpy(self, np_random: ModuleType) -> None:
        if Pin.NUMPY_RNG in self.names:
            np_random.seed(PIN_SEED)

    def apply_torch(self, torch: ModuleType) -> None:
        """At import: the perturbed flags (once: the script may set its own after), then the pins: seed, and
        make the script's own flag calls unable to undo a pin."""
        if "cudnn.benchmark" in self.perturb:
            torch.backends.cudnn.benchmark = self.perturb["cudnn.benchmark"]
        if Pin.TORCH_RNG in self.names:
            torch.manual_seed(PIN_SEED)
        if Pin.DETERMINISTIC in self.names:
            wrap(torch, "use_deterministic_algorithms", _always_deterministic)
        if Pin.ONE_THREAD in self.names:
            wrap(torch, "set_num_threads", _always_one_thread)
        self.apply_torch_flags(torch)

    def apply_torch_flags(self, torch: ModuleType) -> None:
        """Force the flag pins (again at the first forward and step: scripts set flags after import)."""
        if Pin.DETERMINISTIC in self.names:
            torch.use_deterministic_algorithms(True, warn_only=True)
            # the kernels alone: the fill is a separate source (uninitialized memory, the zero-empty pin), and
            # with it on, this experiment would also "confirm" a read of memory never written
            torch.utils.deterministic.fill_uninitialized_memory = Pin.ZERO_EMPTY in self.names
        if Pin.ONE_THREAD in self.names:
            torch.set_num_threads(1)
        if Pin.CUDNN in self.names:
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
        if Pin.TF32_OFF in self.names:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")


def _always_deterministic(original: Callable[..., None]) -> Callable[..., None]:
    def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
        original(True, warn_only=True)

    return use_deterministic_algorithms


def _always_one_thread(original: Callable[[int], None]) -> Callable[[int], None]:
    def set_num_threads(n: int) -> None:
        original(1)

    return set_num_threads


def aslr_disabled() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.personality(0xFFFFFFFF) & ADDR_NO_RANDOMIZE)
    except (OSError, AttributeError):
        return False


def reexec_without_aslr(names: Iterable[str]) -> None:
    """The `address-layout` pin: restart this interpreter with address randomization off.

    Object ids (memory addresses) then repeat from run to run, so iteration over a set of objects
    hashed by identity does too. No-op where the personality call is refused (the experiment then
    says so through the `hash` event's `aslr_disabled`).
    """
    if Pin.ADDRESS_LAYOUT not in set(names) or not sys.platform.startswith("linux") or aslr_disabled():
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        current = libc.personality(0xFFFFFFFF)
        if current == -1 or libc.personality(current | ADDR_NO_RANDOMIZE) == -1:
            return
    except (OSError, AttributeError):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # sys.orig_argv (3.10+) keeps the interpreter's own options; before it, argv is `-m detaudit.run.child ...`
    argv = getattr(sys, "orig_argv", None)
    os.execv(sys.executable, [sys.executable, *(argv[1:] if argv else ["-m", "detaudit.run.child", *sys.argv[1:]])])
