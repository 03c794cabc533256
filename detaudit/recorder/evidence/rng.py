"""RNG evidence: seeding calls (value, call site, state digest before and after), NumPy Generator
creation, and the first draw from each RNG per call site (causes/rng.py reads them).

Cost: only the wrapped functions pay, a set lookup per call once a call site is known.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from detaudit.events import DrawEvent, GeneratorEvent, Lib, RngRestoreEvent, SeedEvent
from detaudit.recorder.evidence.base import Evidence, digest_bytes, short
from detaudit.recorder.patch import wrap

TORCH_DRAWS = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "rand_like",
               "randn_like", "randint_like", "poisson")
TENSOR_DRAWS = ("uniform_", "normal_", "random_", "bernoulli_", "exponential_", "cauchy_", "geometric_")
NUMPY_DRAWS = ("random", "rand", "randn", "randint", "random_sample", "normal", "uniform", "choice", "shuffle",
               "permutation", "standard_normal", "binomial", "poisson", "exponential", "beta", "gamma")
PYTHON_DRAWS = ("random", "uniform", "randint", "randrange", "choice", "choices", "shuffle", "sample", "gauss",
                "normalvariate", "getrandbits", "betavariate", "expovariate")


def install_python(ev: Evidence) -> None:
    """Python's `random`, at child start (after its pin, if any)."""
    ev.pins.apply_python(random)
    ev.anchors["python"] = ev.rng_digest("python")
    _wrap_seed(ev, random, "seed", "python", "random.seed")
    for name in PYTHON_DRAWS:
        _wrap_draw(ev, random, name, "python", f"random.{name}")
    _wrap_restore(ev, random, "setstate", "python", "random.setstate")


def install_numpy(ev: Evidence, np_random: ModuleType) -> None:
    """`numpy.random`, as soon as the script imports it (after its pin, if any)."""
    ev.numpy = np_random
    ev.pins.apply_numpy(np_random)
    ev.anchors["numpy"] = ev.rng_digest("numpy")
    ev.emit({"type": "state", "when": "numpy-import", "rng": ev.rng_state()})
    _wrap_seed(ev, np_random, "seed", "numpy", "np.random.seed")
    wrap(np_random, "default_rng", lambda original: _default_rng(ev, original))
    for name in NUMPY_DRAWS:
        _wrap_draw(ev, np_random, name, "numpy", f"np.random.{name}")
    _wrap_restore(ev, np_random, "set_state", "numpy", "np.random.set_state")


def install_torch(ev: Evidence, torch: ModuleType) -> None:
    """torch's seeding functions and random ops (after the pins are applied)."""
    ev.anchors["torch"] = ev.rng_digest("torch")
    for name in ("manual_seed", "seed"):
        _wrap_seed(ev, torch, name, "torch", f"torch.{name}")
        _wrap_seed(ev, torch.random, name, "torch", f"torch.{name}")
    for name in ("manual_seed", "manual_seed_all"):
        _wrap_seed(ev, torch.cuda, name, "torch", f"torch.cuda.{name}")
    for name in TORCH_DRAWS:
        _wrap_draw(ev, torch, name, "torch", f"torch.{name}")
    for name in TENSOR_DRAWS:
        _wrap_draw(ev, torch.Tensor, name, "torch", f"Tensor.{name}")
    _wrap_draw(ev, torch.nn.functional, "dropout", "torch", "dropout")
    _wrap_restore(ev, torch, "set_rng_state", "torch", "torch.set_rng_state")
    _wrap_restore(ev, torch.random, "set_rng_state", "torch", "torch.random.set_rng_state")
    for name in ("set_rng_state", "set_rng_state_all"):
        _wrap_restore(ev, torch.cuda, name, "cuda", f"torch.cuda.{name}")
    # a torch.Generator's own set_state cannot be wrapped (an immutable C type): not observed


_DRAW_LABELS = frozenset({*(f"torch.{n}" for n in TORCH_DRAWS), *(f"Tensor.{n}" for n in TENSOR_DRAWS), "dropout",
                          *(f"np.random.{n}" for n in NUMPY_DRAWS), *(f"random.{n}" for n in PYTHON_DRAWS)})


def draws_again(ev: Evidence) -> None:
    """Report each call site's next draw again (`detaudit resume`, after a checkpoint is loaded and at the first
    optimizer step): which RNGs the script draws from after it resumed, and in training, not only where each
    was first drawn."""
    ev.seen = {key for key in ev.seen if not (isinstance(key, tuple) and len(key) == 3 and key[0] in _DRAW_LABELS)}


def _wrap_restore(ev: Evidence, owner: Any, name: str, lib: str, label: str) -> None:
    """An RNG's state set back, once per call site (`torch.random.fork_rng` does it inside library code)."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def restore(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if not ev.compiling():
                caller = sys._getframe(1)
                if ev.first_time("restore", label, caller.f_code, caller.f_lineno):
                    ev.emit(RngRestoreEvent(type="rng-restore", lib=lib, fn=label, loc=ev.where(caller),
                                            library=ev.is_library(caller)))
            return result

        return restore

    wrap(owner, name, make)


def _wrap_seed(ev: Evidence, owner: Any, name: str, lib: Lib, label: str) -> None:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def seed(*args: Any, **kwargs: Any) -> Any:
            if ev.compiling():
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
                ev.emit(SeedEvent(type="seed", lib=lib, fn=label, value=short(value), loc=ev.where(caller),
                                  library=library, drawn_before=False, state=None, pinned=pinned))
                return result
            after = ev.rng_digest(lib)
            ev.emit(SeedEvent(type="seed", lib=lib, fn=label, value=short(value), loc=ev.where(caller),
                              library=library, drawn_before=before is not None and before != ev.anchors.get(lib),
                              state=after, pinned=pinned))
            ev.anchors[lib] = after
            return result

        return seed

    wrap(owner, name, make)


def _default_rng(ev: Evidence, original: Callable[..., Any]) -> Callable[..., Any]:
    def default_rng(*args: Any, **kwargs: Any) -> Any:
        if ev.compiling():
            return original(*args, **kwargs)
        caller = sys._getframe(1)
        library = ev.is_library(caller)
        seed = args[0] if args else kwargs.get("seed")
        args, kwargs, pinned = ev.pins.seed_args("numpy-generator", args, kwargs, library, ev.worker_id())
        gen = original(*args, **kwargs)
        state = digest_bytes(repr(gen.bit_generator.state).encode())
        ev.emit(GeneratorEvent(type="generator", lib="numpy", fn="np.random.default_rng", seeded=seed is not None,
                               value=short(seed), loc=ev.where(caller), library=library, state=state,
                               pinned=pinned))
        return gen

    return default_rng


def _wrap_draw(ev: Evidence, owner: Any, name: str, lib: Lib, label: str) -> None:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def draw(*args: Any, **kwargs: Any) -> Any:
            if ev.compiling():
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            if (label, caller.f_code, caller.f_lineno) not in ev.seen:
                ev.seen.add((label, caller.f_code, caller.f_lineno))
                if label != "dropout" or (args[2] if len(args) > 2 else kwargs.get("training", True)):
                    explicit = kwargs.get("generator") is not None
                    event = DrawEvent(type="draw", lib=lib, fn=label, loc=ev.where(caller),
                                      generator="explicit" if explicit else "global")
                    if lib == "torch":
                        event["device"] = ev.draw_device(args, kwargs)
                    ev.emit(event)
                else:
                    ev.seen.discard((label, caller.f_code, caller.f_lineno))
            return original(*args, **kwargs)

        return draw

    wrap(owner, name, make)
