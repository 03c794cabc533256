"""RNG evidence: seeding calls (value, call site, state digest before and after; through a helper
too, with the helper's line), RNG states set back (`torch.set_rng_state`, as `fork_rng` does), the
RNG objects the script owns (NumPy Generators and RandomStates, `random.Random` and SystemRandom,
`torch.Generator` seeding) and the first draw from each RNG per call site (causes/rng.py reads them).

RNG objects are numbered in the order the script creates (or first seeds) them, and a draw from one
names its number, so a detector can tie the line that drew to the line that created or seeded it.
Classes whose methods cannot be patched (torch.Generator, np.random.RandomState: C types) are
replaced by a recording subclass whose metaclass keeps `isinstance` true for the original's
instances; objects made by library code are not followed.

Cost: only the wrapped functions pay, a set lookup per call once a call site is known.
"""

from __future__ import annotations

import functools
import random
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from detaudit.events import MAIN_THREAD, DrawEvent, GeneratorEvent, Lib, RngRestoreEvent, SeedEvent
from detaudit.recorder.evidence import draws
from detaudit.recorder.evidence.base import Evidence, digest_bytes, python_rng_digest, short
from detaudit.recorder.patch import wrap

TORCH_DRAWS = ("rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial", "rand_like",
               "randn_like", "randint_like", "poisson")
TENSOR_DRAWS = ("uniform_", "normal_", "random_", "bernoulli_", "exponential_", "cauchy_", "geometric_")
NUMPY_DRAWS = ("random", "rand", "randn", "randint", "random_sample", "normal", "uniform", "choice", "shuffle",
               "permutation", "standard_normal", "binomial", "poisson", "exponential", "beta", "gamma")
GLOBAL_RNGS: tuple[Lib, ...] = ("torch", "numpy", "python")
BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")  # np.random.Generator(PCG64(seed))
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
    _install_python_objects(ev)


def install_numpy(ev: Evidence, np_random: ModuleType) -> None:
    """`numpy.random`, as soon as the script imports it (after its pin, if any)."""
    ev.numpy = np_random
    ev.pins.apply_numpy(np_random)
    ev.anchors["numpy"] = ev.rng_digest("numpy")
    ev.emit({"type": "state", "when": "numpy-import", "rng": ev.rng_state()})
    _wrap_seed(ev, np_random, "seed", "numpy", "np.random.seed")
    wrap(np_random, "default_rng", lambda original: _default_rng(ev, original))
    wrap(np_random, "RandomState", lambda original: _random_state_class(ev, original))
    for name in BIT_GENERATORS:
        if hasattr(np_random, name):
            wrap(np_random, name, functools.partial(_bit_generator_class, ev, name=name))
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
    wrap(torch, "Generator", lambda original: _torch_generator_class(ev, original))
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
    ev.seen = {key for key in ev.seen if not (isinstance(key, tuple) and len(key) == 4 and key[0] in _DRAW_LABELS)}


def _wrap_restore(ev: Evidence, owner: Any, name: str, lib: str, label: str) -> None:
    """An RNG's state set back, once per call site (`torch.random.fork_rng` does it inside library code, on
    exit: a seeding inside it is undone), with the immediate caller and, for a global RNG, its state after."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def restore(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if not ev.compiling():
                caller = sys._getframe(1)
                after = ev.rng_digest(lib) if lib in GLOBAL_RNGS else None
                if lib in GLOBAL_RNGS:
                    ev.anchors[lib] = after  # drawn since: counted from the state set here, as from a seeding
                if ev.first_time("restore", label, caller.f_code, caller.f_lineno):
                    event = RngRestoreEvent(type="rng-restore", lib=lib, fn=label, loc=ev.where(caller),
                                            library=ev.is_library(caller),
                                            by=f"{ev.site(caller)} ({caller.f_code.co_name})")
                    if lib in GLOBAL_RNGS:
                        event["state"] = after
                    ev.emit(event)
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
                gpu = SeedEvent(type="seed", lib=lib, fn=label, value=short(value), loc=ev.where(caller),
                                library=library, drawn_before=False, state=None, pinned=pinned)
                if library:
                    gpu["by"] = ev.site(caller)
                ev.emit(gpu)
                return result
            after = ev.rng_digest(lib)
            event = SeedEvent(type="seed", lib=lib, fn=label, value=short(value), loc=ev.where(caller),
                              library=library, drawn_before=before is not None and before != ev.anchors.get(lib),
                              state=after, pinned=pinned)
            if library:
                event["by"] = ev.site(caller)
            ev.emit(event)
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
        event = GeneratorEvent(type="generator", lib="numpy", fn="np.random.default_rng", seeded=seed is not None,
                               value=short(seed), loc=ev.where(caller), library=library, state=state, pinned=pinned)
        if not library:  # the script's own: followed to its draws, on the same bit generator
            gen = recording(gen.bit_generator)
            event["obj"] = ev.rng_object(gen)
        ev.emit(event)
        return gen

    recording = _numpy_generator_class(ev, ev.numpy.Generator)
    return default_rng


def _bit_generator_class(ev: Evidence, base: Any, *, name: str) -> Any:
    """A numpy bit generator (`np.random.Generator(np.random.PCG64(os.getpid()))`, a C type): a subclass that
    records its seed as `default_rng` does, so a seed from the outside world is seen whichever way it came in."""
    class BitGenerator(base, metaclass=_instance_check(base)):  # type: ignore[metaclass]
        def __init__(self, seed: Any = None, *args: Any, **kwargs: Any) -> None:
            caller = sys._getframe(1)
            if ev.compiling() or ev.is_library(caller):
                super().__init__(seed, *args, **kwargs)
                return
            (value, *_), _, pinned = ev.pins.seed_args("numpy-generator", (seed,), {}, False, ev.worker_id())
            super().__init__(value, *args, **kwargs)
            ev.emit(GeneratorEvent(type="generator", lib="numpy", fn=f"np.random.{name}", seeded=seed is not None,
                                   value=short(seed), loc=ev.where(caller), library=False,
                                   state=digest_bytes(repr(self.state).encode()), pinned=pinned))

        def __reduce__(self) -> Any:  # pickled as the original type (a DataLoader worker, a checkpoint)
            ctor, args, *rest = base.__reduce__(self)
            return (ctor, tuple(base if a is type(self) else a for a in args), *rest)

    return BitGenerator


NUMPY_GENERATOR_DRAWS = ("random", "integers", "normal", "standard_normal", "uniform", "choice", "shuffle",
                         "permutation", "permuted", "binomial", "poisson", "exponential", "beta", "gamma", "lognormal",
                         "laplace", "bytes", "multivariate_normal", "dirichlet")


def _numpy_generator_class(ev: Evidence, base: Any) -> Any:
    """`np.random.Generator` (a C type) as `default_rng` makes it for the script: a subclass whose draws are
    recorded (`isinstance` holds; pickled or copied, it becomes a plain Generator again)."""
    def make_draw(name: str) -> Any:
        original = getattr(base, name)

        def draw(self: Any, *args: Any, **kwargs: Any) -> Any:
            if drawing or ev.compiling():  # `permutation` calls `shuffle`: one draw, recorded once
                return original(self, *args, **kwargs)
            drawing.append(True)
            try:
                return _object_draw(ev, self, "numpy", f"Generator.{name}", sys._getframe(1),
                                    lambda: digest_bytes(repr(self.bit_generator.state).encode()),
                                    lambda: original(self, *args, **kwargs))
            finally:
                drawing.pop()

        return draw

    drawing: list[bool] = []  # non-empty while a draw method runs
    methods = {name: make_draw(name) for name in NUMPY_GENERATOR_DRAWS if hasattr(base, name)}
    return type("Generator", (base,), {**methods, "__module__": base.__module__})


def _wrap_draw(ev: Evidence, owner: Any, name: str, lib: Lib, label: str) -> None:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def draw(*args: Any, **kwargs: Any) -> Any:
            if ev.compiling():
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            generator = kwargs.get("generator")
            obj = None if generator is None else ev.rng_number(generator)
            # once per call site and RNG object: a library line (nn.init's `uniform_`) draws for every caller, from
            # the global RNG for one and from the script's own Generator for the next
            thread = _thread(ev)
            key = (label, caller.f_code, caller.f_lineno, obj) + (() if thread is None else (thread, ev.where(caller)))
            if key not in ev.seen:
                ev.seen.add(key)
                if label != "dropout" or (args[2] if len(args) > 2 else kwargs.get("training", True)):
                    event = DrawEvent(type="draw", lib=lib, fn=label, loc=ev.where(caller),
                                      generator="global" if generator is None else "explicit")
                    if obj is not None:
                        event["obj"] = obj
                    if thread is not None:
                        event["thread"] = thread
                    if lib == "torch":
                        event["device"] = ev.draw_device(args, kwargs)
                    if label == "dropout":
                        event["library"] = ev.is_library(caller)
                    if _library_import(ev, caller):
                        event["importing"] = True
                    ev.emit(event)
                else:
                    ev.seen.discard(key)
            tracker = draws.tracker
            slot = None if tracker is None else tracker.slot(caller.f_code, caller.f_lineno, label)
            if tracker is None or slot is None or (
                    label == "dropout" and not (args[2] if len(args) > 2 else kwargs.get("training", True))):
                return original(*args, **kwargs)
            state = _global_state(ev, lib, args, kwargs) if generator is None else _torch_state(generator)
            return tracker.observe(slot, caller, lib, label, state, generator is not None, obj,
                                   lambda: original(*args, **kwargs), value=label != "dropout")

        return draw

    wrap(owner, name, make)


def _thread(ev: Evidence) -> str | None:
    """Who draws beside a thread: its target (or name), MAIN_THREAD while a started thread is alive; None when the
    main thread draws alone. Such draws are once per user line too (nn.init's one line draws for a LazyLinear)."""
    current = threading.current_thread()
    if current is threading.main_thread():
        return MAIN_THREAD if ev.threads and any(t.is_alive() for t in list(ev.threads)) else None
    return str(getattr(getattr(current, "_target", None), "__qualname__", None) or current.name)


def _global_state(ev: Evidence, lib: Lib, args: tuple[Any, ...], kwargs: dict[str, Any]) -> draws.State:
    """How to read the state a global RNG draw starts from: torch's CPU generator (a draw on another device
    draws from that device's generator, not read here), NumPy's, Python's."""
    if lib == "torch" and ev.draw_device(args, kwargs) != "cpu":
        return lambda: None
    return lambda: ev.rng_digest(lib)


def _torch_state(generator: Any) -> draws.State:
    return lambda: digest_bytes(generator.get_state().numpy().tobytes()) if generator.device.type == "cpu" else None


def _object_event(ev: Evidence, obj: Any, lib: Lib, fn: str, caller: Any, seed: Any, state: str | None,
                  pinned: int | None, seeded: bool | None = None, entropy: bool = False) -> None:
    """An RNG object the script owns was created or seeded (library code's objects are not followed)."""
    event = GeneratorEvent(type="generator", lib=lib, fn=fn, seeded=seed is not None if seeded is None else seeded,
                           value=short(seed), loc=ev.where(caller), library=False, state=state, pinned=pinned,
                           obj=ev.rng_object(obj))
    if entropy:
        event["entropy"] = True
    ev.emit(event)


def _object_draw(ev: Evidence, obj: Any, lib: Lib, label: str, caller: Any, state: draws.State,
                 call: Callable[[], Any]) -> Any:
    """A draw from an RNG object: the first per call site from one the script owns is reported, and the draw
    is fingerprinted (draws.py); `state` reads the object's state, `call` draws. A library's own objects (sympy's,
    seeded from the OS at import), SystemRandom (the OS's entropy, never the same twice) and detaudit's own calls
    are not fingerprinted."""
    number = ev.rng_number(obj)
    if number is not None and ev.first_time(label, caller.f_code, caller.f_lineno):
        ev.emit(DrawEvent(type="draw", lib=lib, fn=label, loc=ev.where(caller), generator="explicit", obj=number))
    tracker = draws.tracker
    if tracker is None or number is None or isinstance(obj, random.SystemRandom) or ev.own(caller):
        return call()
    slot = tracker.slot(caller.f_code, caller.f_lineno, label)
    if slot is None:
        return call()
    return tracker.observe(slot, caller, lib, label, state, True, number, call)


def _install_python_objects(ev: Evidence) -> None:
    """`random.Random` instances the script makes: their seeding (`__init__` seeds through `self.seed`) and
    draws; SystemRandom, which reads the OS for every draw. The module-level functions are bound to the
    global instance before this runs, so they do not pass through here."""
    own = random.__file__
    init = random.Random.__init__.__code__
    global_instance = getattr(random, "_inst", None)

    def make_seed(original: Callable[..., Any]) -> Callable[..., Any]:
        def seed(self: Any, a: Any = None, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            creating = caller.f_code is init
            if creating:
                caller = caller.f_back or caller
            if self is global_instance or ev.compiling() or ev.is_library(caller):
                return original(self, a, *args, **kwargs)
            given = a
            (a, *_), _, pinned = ev.pins.seed_args("python", (a,), {}, False, ev.worker_id())
            result = original(self, a, *args, **kwargs)
            fn = f"random.{type(self).__name__}" if creating else "Random.seed"
            _object_event(ev, self, "python", fn, caller, given, python_rng_digest(self.getstate()), pinned)
            return result

        return seed

    def make_system_seed(original: Callable[..., Any]) -> Callable[..., Any]:
        def seed(self: Any, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if caller.f_code is init:
                caller = caller.f_back or caller
                if not ev.compiling() and not ev.is_library(caller):
                    _object_event(ev, self, "python", "random.SystemRandom", caller, None, None, None, entropy=True)
            return original(self, *args, **kwargs)

        return seed

    def make_draw(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def draw(self: Any, *args: Any, **kwargs: Any) -> Any:
                caller = sys._getframe(1)
                if caller.f_code.co_filename != own and self is not global_instance and not ev.compiling():
                    return _object_draw(ev, self, "python", f"Random.{name}", caller, _python_state(self),
                                        lambda: original(self, *args, **kwargs))
                return original(self, *args, **kwargs)

            return draw

        return make

    wrap(random.Random, "seed", make_seed)
    wrap(random.SystemRandom, "seed", make_system_seed)
    for name in PYTHON_DRAWS:
        wrap(random.Random, name, make_draw(name))
    for name in ("random", "getrandbits"):  # SystemRandom's own, reading the OS
        wrap(random.SystemRandom, name, make_draw(name))


def _python_state(rng: random.Random) -> draws.State:
    return lambda: python_rng_digest(rng.getstate())


def _instance_check(base: type) -> type:
    """A metaclass for a recording subclass of `base`: `isinstance(x, Sub)` is `isinstance(x, base)`, so
    code that checks against the patched name still accepts objects made elsewhere."""
    meta: Any = type(base)

    class Meta(meta):
        def __instancecheck__(cls, instance: Any) -> bool:
            return bool(meta.__instancecheck__(base, instance))

        def __subclasscheck__(cls, sub: Any) -> bool:
            return bool(meta.__subclasscheck__(base, sub))

    return Meta


def _random_state_class(ev: Evidence, base: Any) -> Any:
    """`np.random.RandomState` (a C type): a subclass that records its seeding and draws."""
    def state(rs: Any) -> str:
        _, keys, pos, has_gauss, cached = rs.get_state()
        return digest_bytes(keys.tobytes() + repr((pos, has_gauss, cached)).encode())

    class RandomState(base, metaclass=_instance_check(base)):  # type: ignore[metaclass]
        def __init__(self, seed: Any = None) -> None:
            self._seeding(base.__init__, seed, "np.random.RandomState", sys._getframe(1))

        def seed(self, seed: Any = None) -> None:
            self._seeding(base.seed, seed, "RandomState.seed", sys._getframe(1))

        def _seeding(self, original: Callable[[Any, Any], None], seed: Any, fn: str, caller: Any) -> None:
            if ev.compiling() or ev.is_library(caller):
                original(self, seed)
                return
            (value, *_), _, pinned = ev.pins.seed_args("numpy-generator", (seed,), {}, False, ev.worker_id())
            original(self, value)
            _object_event(ev, self, "numpy", fn, caller, seed, state(self), pinned)

    def make_draw(name: str) -> Any:
        original = getattr(base, name)

        def draw(self: Any, *args: Any, **kwargs: Any) -> Any:
            if drawing or ev.compiling():  # `rand` calls `random_sample`: one draw, recorded once
                return original(self, *args, **kwargs)
            drawing.append(True)
            try:
                return _object_draw(ev, self, "numpy", f"RandomState.{name}", sys._getframe(1), lambda: state(self),
                                    lambda: original(self, *args, **kwargs))
            finally:
                drawing.pop()

        return draw

    drawing: list[bool] = []  # non-empty while a draw method runs
    for name in NUMPY_DRAWS:
        if hasattr(base, name):
            setattr(RandomState, name, make_draw(name))
    return RandomState


def _torch_generator_class(ev: Evidence, base: Any) -> Any:
    """`torch.Generator` (a C type whose methods cannot be patched): a subclass that records `.seed()`
    (a seed from the OS) and `.manual_seed(value)`; draws with `generator=` name it (`_wrap_draw`). A
    Generator never seeded starts from torch's fixed default seed, the same in every run."""
    def state(gen: Any) -> str | None:
        try:
            return digest_bytes(gen.get_state().numpy().tobytes())
        except Exception:  # another device's state may not be readable on the host
            return None

    class Generator(base, metaclass=_instance_check(base)):  # type: ignore[metaclass]
        def seed(self) -> int:
            caller = sys._getframe(1)
            if ev.compiling() or ev.is_library(caller):
                return int(base.seed(self))
            _, _, pinned = ev.pins.seed_args("torch", (None,), {}, False, ev.worker_id())
            if pinned is None:
                value = int(base.seed(self))
            else:
                base.manual_seed(self, pinned)
                value = pinned
            _object_event(ev, self, "torch", "Generator.seed", caller, value, state(self), pinned, seeded=False)
            return value

        def manual_seed(self, seed: Any) -> Any:
            caller = sys._getframe(1)
            if ev.compiling() or ev.is_library(caller):
                return base.manual_seed(self, seed)
            (value, *_), _, pinned = ev.pins.seed_args("torch", (seed,), {}, False, ev.worker_id())
            result = base.manual_seed(self, value)
            _object_event(ev, self, "torch", "Generator.manual_seed", caller, seed, state(self), pinned)
            return result

    return Generator


def _library_import(ev: Evidence, frame: Any) -> bool:
    """Whether a library module's import-time code made this call (only library frames between it and the
    import system): a draw on the user's `import` line that the script's code did not ask for. A user module
    imported by the script (a model built at module level) is the script's code. Walked once per call site."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        if not ev.is_library(frame):
            return False
        frame = frame.f_back
    return False
