"""Kernel and flag evidence: calls of the ops the running torch lists as nondeterministic (with
device), `torch.empty`-family calls from user code (with the digest of what they returned),
determinism flag setters and assignments (and misspelt flags), collectives, and the listed and
matmul-heavy module classes of the first model (causes/device.py, flags.py, collective.py).

Cost: only the wrapped functions pay; the autograd graph is walked for the first few backward calls.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from types import FrameType, ModuleType
from typing import Any, Literal, NamedTuple

from detaudit.events import (
    EmptyState,
    EmptyWritesEvent,
    FlagEvent,
    FlagTypoEvent,
    LatentOpEvent,
    ModuleEntry,
    ModulesEvent,
    OpEvent,
)
from detaudit.recorder import oplist
from detaudit.recorder.evidence.base import Evidence, never_fatal, short
from detaudit.recorder.patch import wrap

BACKWARD_WALKS = 4           # autograd graphs inspected (the first backward calls)
MAX_GRAPH_NODES = 20000
MAX_EMPTY_EVENTS = 256
FILL_MAX = 1 << 20  # elements of one `empty` tensor filled (a larger contiguous one: this prefix)
MAX_FLAG_EVENTS = 64
EMPTY_FUNCTIONS = ("empty", "empty_like", "empty_strided")
FLAG_SETTERS = ("use_deterministic_algorithms", "set_float32_matmul_precision")
# flag attributes of torch.backends.cudnn / torch.backends.cuda.matmul: assignments are recorded with their
# call site; any other public name assigned there is a typo torch silently keeps (flag-typo)
MODULE_FLAGS = {"torch.backends.cudnn": ("benchmark", "deterministic", "enabled", "allow_tf32"),
                "torch.backends.cuda.matmul": ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                                               "allow_bf16_reduced_precision_reduction")}
COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "reduce", "all_gather",
               "reduce_scatter")
# positional index of condition arguments, counting `self` for Tensor methods (same for torch.X(input, ...))
_POSITIONAL = {"indexput": {"accumulate": 3}, "put": {"accumulate": 3}, "scatterreduce": {"reduce": 4},
               "embeddingbag": {"mode": 4}}
MATMUL_CLASSES = ("Linear", "Bilinear", "MultiheadAttention", "LSTM", "GRU", "RNN")


class Counters:
    """Per-process budgets: events past them are dropped, the calls still run."""

    def __init__(self) -> None:
        self.walks = 0
        self.empty = 0
        self.flags = 0


def install(ev: Evidence, torch: ModuleType) -> None:
    counters = Counters()
    for name in EMPTY_FUNCTIONS:
        _wrap_empty(ev, counters, torch, name, f"torch.{name}")
    _wrap_empty(ev, counters, torch.Tensor, "new_empty", "Tensor.new_empty")
    for name in FLAG_SETTERS:
        _wrap_flag_setter(ev, counters, torch, name)
    _watch_module(ev, counters, torch.backends.cudnn, "torch.backends.cudnn", "cudnn.")
    _watch_module(ev, counters, torch.backends.cuda.matmul, "torch.backends.cuda.matmul", "matmul.")
    if torch.distributed.is_available():
        _wrap_collectives(ev, torch.distributed)
    _wrap_listed_ops(ev, torch)
    wrap(torch.autograd, "backward", lambda original: _backward(ev, counters, original))


def modules_event(ev: Evidence, root: Any) -> ModulesEvent:
    """Listed module classes (Conv2d, MaxUnpool2d, ...) and matmul-heavy layers in the first model."""
    listed: list[ModuleEntry] = []
    linear: list[ModuleEntry] = []
    device = "cpu"
    for p in root.parameters():
        device = ev.device(p)
        break
    root_name = type(root).__name__
    for qual, module in root.named_modules():
        cls = type(module).__name__
        name = qual or root_name
        for entry in ev.op_entries.get(oplist.op_key(cls), []):
            if oplist.applies(entry, device, True, _module_values(module, entry)):
                listed.append({"module": name, "class": cls, "entry": entry.text})
                break
        if cls in MATMUL_CLASSES or cls.startswith("Conv"):
            linear.append({"module": name, "class": cls})
    return ModulesEvent(type="modules", root=root_name, device=device, listed=listed, matmul=linear)


def _emit_listed(ev: Evidence, op: str, device: str, entries: list[oplist.OpEntry], grad: bool, values: dict[str, str],
                 loc: str, node: bool = False) -> None:
    """An `op` event for the first entry that makes this call nondeterministic here; on the CPU, failing that,
    a `latent-op` event for one that would make it nondeterministic on CUDA (the same script on a GPU).
    `node`: an autograd node found by the backward walk (its phase is backward whatever the entry says)."""
    for entry in entries:
        if oplist.applies(entry, device, grad, values):
            ev.emit(_op_event(ev, op, device, entry, "backward" if node or entry.backward else "forward", loc))
            return
    if device != "cpu":
        return
    for entry in entries:
        if oplist.applies(entry, "cuda", grad, values):
            ev.emit(LatentOpEvent(type="latent-op", op=op, entry=entry.text, loc=loc,
                                  phase="backward" if node or entry.backward else "forward",
                                  deterministic=ev.torch.are_deterministic_algorithms_enabled()))
            return


def _op_event(ev: Evidence, op: str, device: str, entry: oplist.OpEntry, phase: Literal["forward", "backward"],
              loc: str) -> OpEvent:
    torch = ev.torch
    return OpEvent(type="op", op=op, device=device, entry=entry.text, phase=phase, loc=loc,
                   threads=torch.get_num_threads(), deterministic=torch.are_deterministic_algorithms_enabled())


def _wrap_empty(ev: Evidence, counters: Counters, owner: Any, name: str, label: str) -> None:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def empty(*args: Any, **kwargs: Any) -> Any:
            t = original(*args, **kwargs)
            if ev.compiling():
                return t
            caller = sys._getframe(1)
            if ev.is_library(caller):
                return t
            pinned = ev.pins.active("zero-empty")
            if pinned:
                with ev.torch.no_grad():
                    t.zero_()
            if counters.empty < MAX_EMPTY_EVENTS:
                counters.empty += 1
                with never_fatal():
                    filled = None if pinned or _torch_fills(ev.torch) else _fill(ev, t)
                    digest = _tensor_digest(t) if filled is None or t.device.type == "cpu" else filled
                    ev.emit({"type": "empty", "fn": label, "loc": ev.where(caller), "shape": list(t.shape),
                             "dtype": str(t.dtype).removeprefix("torch."), "device": ev.device(t),
                             "digest": digest, "pinned": pinned})
                    if ev.empties is not None and not ev.in_worker:
                        ev.empties.append(_Watched.of(t, digest))
            return t

        return empty

    wrap(owner, name, make)


class _Watched(NamedTuple):
    """Where an `empty` tensor's memory is, without keeping it alive: the tensor object itself is often
    gone by the first forward (`nn.Parameter(torch.empty(n))` keeps only its storage)."""

    storage: Any  # a weak reference to the untyped storage (torch keeps one Python object per storage)
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any
    digest: str | None  # of the fill, on the host; None: not comparable (device memory, too large)

    @classmethod
    def of(cls, t: Any, digest: str | None) -> _Watched | None:
        """None where the memory cannot be read back on the host (device memory, sparse layouts, functorch's
        wrapped tensors): its state is `unknown`."""
        if digest is None or t.device.type != "cpu":
            return None
        try:
            return cls(weakref.ref(t.untyped_storage()), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype,
                       digest)
        except Exception:  # no plain storage (vmap's BatchedTensor, a subclass): nothing to watch
            return None

    def state(self, torch: ModuleType) -> EmptyState:
        storage = self.storage()
        if storage is None:
            return "freed"
        now = torch.tensor([], dtype=self.dtype).set_(storage, self.offset, self.shape, self.stride)  # not `empty`:
        # that is wrapped
        return "unwritten" if _tensor_digest(now) == self.digest else "written"


def empty_writes_event(ev: Evidence) -> EmptyWritesEvent | None:
    """At the first forward: which earlier `empty` tensors still hold their fill (then stop watching).
    By content, not by version counter: writes through `.data` or a NumPy view count too."""
    watched, ev.empties = ev.empties, None
    if not watched:
        return None
    states: list[EmptyState] = []
    with _own_work(ev):
        for w in watched:
            if w is None:
                states.append("unknown")
                continue
            try:
                states.append(w.state(ev.torch))
            except Exception:  # a storage resized or of a kind `set_` refuses: nothing known
                states.append("unknown")
    return EmptyWritesEvent(type="empty-writes", states=states)


def _torch_fills(torch: Any) -> bool:
    """torch fills `empty*` memory itself (NaN, the largest integer): the script turned on
    `torch.use_deterministic_algorithms(True)` with its fill of uninitialized memory (`detaudit fix`'s
    zero-empty knob). That memory is no longer leftover bytes, and refilling it would undo the script's fix."""
    return bool(torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory)


def _fill(ev: Evidence, t: Any) -> str | None:
    """Fill memory from an `empty*` call with values of this process's own; return the fill's digest
    when it covers the tensor. Leftover bytes are often the same in every fresh process (new pages are
    zeros; the heap's history repeats), so a script that reads them could agree by chance and pass as
    deterministic. Random values from a private generator with a per-process seed: their max, min and
    sum differ too, and two runs compared later (`compare`, baselines) get different fills. Bounded:
    the first MAX_EMPTY_EVENTS calls, at most FILL_MAX elements (a larger contiguous tensor gets
    that prefix: an arena touched lazily is not paged in). Done as detaudit's own work (`_own_work`, and
    through `.data`, whose version counter is its own): the op recorder still knows the memory as never
    written. Any failure leaves the leftover bytes, and the script never notices."""
    torch = ev.torch
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided \
            or t.device.type == "meta" or t.numel() == 0:
        return None
    whole = t.numel() <= FILL_MAX
    if not whole and not t.is_contiguous():
        return None
    count = min(t.numel(), FILL_MAX)
    rec = ev.recorder
    with _own_work(ev), contextlib.suppress(Exception):
        if ev.fill_generator is None:  # private: the script's RNGs are never touched
            ev.fill_generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))
        g = ev.fill_generator
        if t.dtype == torch.bool:
            values = torch.randint(0, 2, (count,), generator=g).bool()
        elif t.dtype.is_floating_point or t.dtype.is_complex:
            values = (torch.rand(count, generator=g, dtype=torch.float64) * 2 - 1).to(t.dtype)
        else:
            values = torch.randint(1, 127, (count,), generator=g).to(t.dtype)
        if not whole:
            t.data.view(-1)[:count].copy_(values)
            return None
        values = values.view(t.shape)
        t.data.copy_(values)
        if getattr(rec, "refill", None) is not None:
            rec.refill(t)  # the op recorder still knows this memory as never written by the script
        return _tensor_digest(values)
    return None


@contextlib.contextmanager
def _own_work(ev: Evidence) -> Iterator[None]:
    """detaudit's own tensor work: the op recorder must not record it (Recorder.internal)."""
    rec = ev.recorder
    if rec is not None:
        rec.internal += 1
    try:
        yield
    finally:
        if rec is not None:
            rec.internal -= 1


def _wrap_listed_ops(ev: Evidence, torch: ModuleType) -> None:
    """Wrap the functions and methods the running torch lists as nondeterministic."""
    for entry in oplist.parse(torch.use_deterministic_algorithms.__doc__ or ""):
        ev.op_entries.setdefault(entry.key, []).append(entry)
    hot = {"getitem", "resize", "bmm"}  # hot paths or conditions only the autograd walk can see
    for key, entries in ev.op_entries.items():
        api = entries[0].api
        if key in hot or api.startswith("torch.nn.") and not api.startswith("torch.nn.functional."):
            continue
        base = api.rsplit(".", 1)[1].rstrip("_")
        if api.startswith("torch.nn.functional."):
            targets = [(torch.nn.functional, base)]
        else:
            targets = [(o, n) for o in (torch, torch.Tensor) for n in (base, base + "_")]
        for owner, name in targets:
            wrap(owner, name, functools.partial(_op, ev, name=name, key=key, entries=entries))


def _op(ev: Evidence, original: Callable[..., Any], name: str, key: str,
        entries: list[oplist.OpEntry]) -> Callable[..., Any]:
    torch = ev.torch
    positions = _POSITIONAL.get(key, {})

    def op(*args: Any, **kwargs: Any) -> Any:
        if ev.compiling():
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
            _emit_listed(ev, name, device, entries, grad, values, ev.where(caller))
        return original(*args, **kwargs)

    return op


def _backward(ev: Evidence, counters: Counters, original: Callable[..., Any]) -> Callable[..., Any]:
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if counters.walks < BACKWARD_WALKS:
            counters.walks += 1
            with never_fatal():
                _walk_graph(ev, tensors, sys._getframe(1))
        return original(tensors, *args, **kwargs)

    return backward


def _walk_graph(ev: Evidence, tensors: Any, caller: FrameType) -> None:
    torch = ev.torch
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    roots = [t for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    if not roots:
        return
    device = ev.device(roots[0])
    stack = [t.grad_fn for t in roots]
    seen: set[int] = set()
    loc = ev.where(caller)
    while stack and len(seen) < MAX_GRAPH_NODES:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(fn for fn, _ in node.next_functions)
        node_name = node.name()
        for key in _node_keys(node, node_name):
            entries = ev.op_entries.get(key, [])
            if not entries:
                continue
            values = {**_node_layout(torch, node), **_node_mode(node)}
            if ev.first_time("node", node_name, device, *values.values()):
                _emit_listed(ev, node_name, device, entries, True, values, loc, node=True)


def _module_values(module: Any, entry: oplist.OpEntry) -> dict[str, str]:
    """The module's own values of the arguments an entry's condition names (an EmbeddingBag's `mode`): a bag
    summing or averaging is not the `mode='max'` entry's."""
    values = {arg: getattr(module, arg, None) for arg, _ in entry.conditions}
    return {arg: value for arg, value in values.items() if isinstance(value, str)}


def _node_keys(node: Any, node_name: str) -> tuple[str, ...]:
    """The docstring keys a node stands for; a convolution's by its saved weight's dimensionality and
    whether it is transposed (ConvolutionBackward0 serves every Conv and ConvTranspose class)."""
    try:
        dims, transposed = node._saved_weight.dim() - 2, bool(node._saved_transposed)
    except (AttributeError, RuntimeError):  # not a convolution, or its saved tensors freed already
        return oplist.node_keys(node_name)
    return (oplist.conv_key(dims, transposed),)


_BAG_MODES = ("sum", "mean", "max")  # EmbeddingBagBackward0 saves its mode as this index


def _node_mode(node: Any) -> dict[str, str]:
    """`{"mode": "mean"}` for an EmbeddingBag's node (its `_saved_mode`), nothing for others."""
    mode = getattr(node, "_saved_mode", None)
    return {"mode": _BAG_MODES[mode]} if isinstance(mode, int) and 0 <= mode < len(_BAG_MODES) else {}


def _node_layout(torch: ModuleType, node: Any) -> dict[str, str]:
    """`{"layout": "sparse"}` when a tensor the node saved for backward is sparse, `"strided"` when it saved
    tensors and none is (an entry listed for sparse inputs only, BmmBackward0's, then does not apply); nothing
    when it saved none (the entry's condition is then taken to hold)."""
    layouts = set()
    for name in dir(node):
        if name.startswith("_saved_") and not name.endswith("_raw"):
            try:
                value = getattr(node, name)
            except RuntimeError:  # freed already (a graph walked after its backward)
                continue
            if isinstance(value, torch.Tensor):
                layouts.add("strided" if value.layout == torch.strided else "sparse")
    if not layouts:
        return {}
    return {"layout": "sparse" if "sparse" in layouts else "strided"}


# -- determinism flags and collectives -----------------------------------------------------------
def _flag_event(ev: Evidence, counters: Counters, event: FlagEvent | FlagTypoEvent, caller: FrameType) -> None:
    if ev.own(caller) or counters.flags >= MAX_FLAG_EVENTS:
        return
    counters.flags += 1
    event["loc"] = ev.where(caller)
    event["by"] = ev.site(caller)
    ev.emit(event)


def _wrap_flag_setter(ev: Evidence, counters: Counters, torch: ModuleType, name: str) -> None:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def setter(*args: Any, **kwargs: Any) -> Any:
            value = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
            _flag_event(ev, counters, FlagEvent(type="flag", flag=name, value=value, loc="", by=""),
                        sys._getframe(1))
            return original(*args, **kwargs)

        return setter

    wrap(torch, name, make)


def _watch_module(ev: Evidence, counters: Counters, module: ModuleType, label: str, prefix: str) -> None:
    """Record assignments to a torch.backends flag module (its class is torch's own, so patchable)."""
    cls = type(module)
    if cls is ModuleType:
        return
    flags = MODULE_FLAGS[label]
    known = set(dir(module)) | set(flags)

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __setattr__(obj: Any, name: str, value: Any) -> None:
            if obj is module:
                caller = sys._getframe(1)
                if name in flags:
                    _flag_event(ev, counters, FlagEvent(type="flag", flag=prefix + name, value=repr(value),
                                                        loc="", by=""), caller)
                elif name not in known and not name.startswith("_") and not isinstance(value, ModuleType):
                    meant = next(iter(difflib.get_close_matches(name, flags, 1)), None)
                    _flag_event(ev, counters, FlagTypoEvent(type="flag-typo", module=label, name=name,
                                                            value=short(value), meant=meant, loc="", by=""),
                                caller)
            original(obj, name, value)

        return __setattr__

    wrap(cls, "__setattr__", make)


def _wrap_collectives(ev: Evidence, dist: ModuleType) -> None:
    """Runs that use collectives: the backend, and the first call of each collective per call site."""
    def make_init(init: Callable[..., Any]) -> Callable[..., Any]:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = init(*args, **kwargs)
            caller = sys._getframe(1)
            with never_fatal():
                ev.emit({"type": "collective", "what": "init_process_group", "backend": str(dist.get_backend()),
                         "world_size": dist.get_world_size(), "loc": ev.where(caller)})
            return result

        return init_process_group

    wrap(dist, "init_process_group", make_init)
    for name in COLLECTIVES:
        wrap(dist, name, functools.partial(_collective, ev, name=name))


def _collective(ev: Evidence, original: Callable[..., Any], name: str) -> Callable[..., Any]:
    def collective(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        if ev.first_time("collective", name, caller.f_code, caller.f_lineno):
            tensor = args[0] if args else None
            ev.emit({"type": "collective", "what": name, "loc": ev.where(caller),
                     "device": ev.device(tensor) if hasattr(tensor, "device") else None})
        return original(*args, **kwargs)

    return collective


def _tensor_digest(t: Any) -> str | None:
    if t.device.type != "cpu" or t.numel() > (1 << 22):
        return None
    from detaudit.recorder.fingerprint import fingerprint_cpu

    try:
        return f"{fingerprint_cpu(t)[0]:016x}"
    except (RuntimeError, NotImplementedError, TypeError):
        return None
