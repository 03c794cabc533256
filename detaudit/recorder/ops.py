"""Op granularity: one trace record per aten op output, with its inputs' fingerprints.

A TorchDispatchMode sees every aten op below autograd, backward ops included. Each record
holds the op overload (`aten.index_put_.default`), the output's fingerprint, two digests of
the op's inputs (in order, and sorted: equal when only the order differs), the phase (and the
autograd node for backward ops), the innermost running module and the user's `file:line`; a
backward op gets the line of the forward op that created its autograd node.

Input digests reuse what is already known: a tensor recorded earlier in the step (an op's
output, a module output) is looked up by identity and version, and a view's digest is derived
from its base's digest and the view's geometry, so only tensors never seen before are hashed.

Skipped (docs/granularity.md): view and alias ops (they cannot diverge unless their base
does), ops with no tensor output (metadata queries, `item()`), profiler bookkeeping ops, `set_` onto
a storage (a tensor sent by another process, e.g. a DataLoader worker: data from outside), and
the outputs of `torch.empty` and kin (uninitialised memory; an op that reads it before anything
writes it is flagged UNINIT instead).
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Callable
from typing import Any

import torch
import xxhash
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.recorder.core import Recorder, version_of
from detaudit.recorder.fingerprint import shape_seed
from detaudit.trace import Flag, Kind

PASS, VIEW, UNINIT, RECORD = range(4)
_NODE_KEY = "detaudit"
_MASK = (1 << 64) - 1
_DERIVED_LIMIT = 20000

# Ops that draw from an RNG. Most carry torch.Tag.nondeterministic_seeded; these names cover
# the ones that do not (and older releases).
RANDOM_OPS = frozenset({
    "bernoulli", "bernoulli_", "native_dropout", "dropout", "feature_dropout", "alpha_dropout",
    "feature_alpha_dropout", "_fused_dropout", "randperm", "normal", "normal_", "uniform_", "rand",
    "rand_like", "randn", "randn_like", "randint", "randint_like", "random_", "multinomial",
    "exponential_", "geometric_", "cauchy_", "log_normal_", "poisson", "binomial", "_standard_gamma",
    "_sample_dirichlet", "rrelu_with_noise", "rrelu_with_noise_",
})
# Ops whose first argument's contents are never read: it is overwritten, or only its shape,
# dtype and device are used. Its digest would only report leftover bytes.
SELF_BLIND_OPS = frozenset({
    "fill_", "zero_", "copy_", "bernoulli_", "uniform_", "normal_", "random_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "empty_like", "zeros_like", "ones_like", "full_like",
    "rand_like", "randn_like", "randint_like", "new_empty", "new_empty_strided", "new_zeros",
    "new_ones", "new_full", "resize_",
})
UNINIT_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
PASS_NAMESPACES = frozenset({"profiler", "prim"})
# `t.set_(storage, ...)` points a tensor at existing memory: how a tensor a DataLoader worker (or any
# other process) sent arrives (torch.multiprocessing rebuilds it in shared memory). Its contents were
# made outside this process's ops, so like a script's input it is data entering from outside, never
# "the op behind" a divergence; ops that read it hash it as a fresh input.
STORAGE_ALIAS_OPS = frozenset({"set_"})


class _OpInfo:
    """What the recorder needs to know about one OpOverload, worked out on its first call."""

    __slots__ = ("mode", "names", "random", "self_blind", "blind_kwargs", "mutated", "writes", "code", "text")

    def __init__(self, func: Any, rec: Recorder) -> None:
        packet = func.overloadpacket.__name__
        self.text = str(func)
        if func.namespace in PASS_NAMESPACES or packet in STORAGE_ALIAS_OPS and "Storage" in func._overloadname:
            self.mode = PASS
        elif func.is_view:
            self.mode = VIEW
        elif packet in UNINIT_OPS:
            self.mode = UNINIT
        else:
            self.mode = RECORD
        self.names = [rec.intern(self.text)]
        self.random = packet in RANDOM_OPS or torch.Tag.nondeterministic_seeded in func.tags
        self.self_blind = packet in SELF_BLIND_OPS
        arguments = func._schema.arguments
        self.blind_kwargs = frozenset(a.name for a in arguments if a.is_out)
        # Positions of arguments written in place, for ops that return nothing (`_foreach_add_`).
        self.mutated = [i for i, a in enumerate(arguments)
                        if a.alias_info is not None and a.alias_info.is_write and not a.is_out]
        # Writes an argument in place (`index_add_`, `out=`): autograd bumps the version counter only
        # after this mode returns, so a digest cached for the argument would still look current.
        self.writes = any(a.alias_info is not None and a.alias_info.is_write for a in arguments)
        self.code = xxhash.xxh3_64_intdigest(self.text.encode())

    def name(self, rec: Recorder, index: int) -> int:
        while len(self.names) <= index:
            self.names.append(rec.intern(f"{self.text}[{len(self.names)}]"))
        return self.names[index]


class OpRecorder(TorchDispatchMode):
    """Records every non-view aten op while active; `start()` / `stop()` bound the window."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.rec = recorder
        self.active = False
        self._ops: dict[Any, _OpInfo] = {}
        self._node_names: dict[type, int] = {}
        self._codes: dict[Any, int] = {}
        # id -> (weakref, version, digest, uninitialised): views' derived digests and empty outputs
        self._derived: dict[int, tuple[Any, int, int, bool]] = {}
        recorder.digest_caches.append(self._derived)  # trusted for one iteration, as the recorder's own
        # data_ptr -> (weakref to the storage, version) of never-written memory, for tensors that alias
        # it without an op (nn.Parameter(torch.empty(n)) shares the storage and the version counter).
        # The storage check keeps a later tensor at a reused address (torch.from_numpy) from aliasing it.
        self._blank: dict[int, tuple[weakref.ref[Any], int]] = {}
        # (weakrefs to the outputs, loc, module) of the last forward op: tagged onto its autograd node at
        # the next op, because autograd attaches grad_fn only after this mode returns. Weak: the outputs
        # must not outlive the user's last reference to them.
        self._untagged: tuple[list[weakref.ref[torch.Tensor]], int, int] | None = None
        self._unknown = False  # set while reading an op's inputs: one has no digest (accelerator)
        self._uninit = False  # ... one was never written

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let torch.compile run compiled code while this mode is active (the default would make
        dynamo fall back to eager, changing what a compiled script computes): ops inside compiled
        regions are not recorded."""
        return True

    def start(self) -> None:
        if not self.active:
            self.rec.eager_device = True
            self.__enter__()
            self.active = True

    def stop(self) -> None:
        if self.active:
            self._untagged = None
            self.__exit__(None, None, None)
            self.active = False
            self.rec.eager_device = False

    # -- the hot path ----------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._untagged is not None:
            self._tag_node()
        rec = self.rec
        if rec.internal:
            return func(*args, **kwargs)
        info = self._ops.get(func)
        if info is None:
            info = self._ops[func] = _OpInfo(func, rec)
        mode = info.mode
        if mode == PASS:
            return func(*args, **kwargs)
        node: Any = torch._C._current_autograd_node()  # the autograd Node running this op (backward)
        if mode != RECORD:
            out = func(*args, **kwargs)
            if mode == VIEW:
                self._derive_view(info, args, out)
            else:
                for t in _tensors(out):
                    self._derived[id(t)] = (weakref.ref(t), version_of(t), shape_seed(t), True)
                    self._mark_blank(t)
            if mode == VIEW and node is None and _needs_node(args):
                self._untagged = ([weakref.ref(t) for t in _tensors(out)], rec.location_id(1), _top(rec))
            return out

        flags = Flag.RANDOM if info.random else 0
        codes: list[int] = []
        self._unknown = self._uninit = False
        self._input_codes(info, args, kwargs, codes)
        if self._uninit:
            flags |= Flag.UNINIT
        if self._unknown:
            inputs = (0, 0)
        else:
            ordered = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(codes)}Q", *codes), info.code)
            codes.sort()
            unordered = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(codes)}Q", *codes), info.code)
            inputs = (ordered or 1, unordered or 1)  # 0 means "unknown"
        if node is None:
            loc = rec.location_id(1)
            module = _top(rec)
            aux = 0
        else:
            flags |= Flag.BACKWARD
            tag = node.metadata.get(_NODE_KEY)
            loc, module = tag if tag is not None else (rec.location_id(1), 0)
            aux = self._node_names.get(type(node), 0) or self._node_name(node)

        out = func(*args, **kwargs)

        outputs = list(_tensors(out))
        if not outputs and out is None:
            outputs = [t for i in info.mutated if i < len(args) for t in _tensors(args[i])]
        if self._blank:  # memory now holding an op's output is no longer blank
            for t in outputs:
                self._blank.pop(t.data_ptr(), None)
        if info.writes:
            for t in outputs:
                rec.forget_digest(t)
        for i, t in enumerate(outputs):
            rec.record_tensor(Kind.OP, info.names[0] if i == 0 else info.name(rec, i), t, module, loc,
                              aux, flags, inputs)
        if node is None and outputs and torch.is_grad_enabled():
            self._untagged = ([weakref.ref(t) for t in outputs], loc, module)
        return out

    def _input_codes(self, info: _OpInfo, args: Any, kwargs: Any, codes: list[int]) -> None:
        """Append one 64-bit code per input leaf (tensor digest, or the value of a plain argument)."""
        for i, arg in enumerate(args):
            if i == 0 and info.self_blind and isinstance(arg, torch.Tensor):
                codes.append(shape_seed(arg))
            else:
                self._leaf(arg, codes)
        for key, arg in kwargs.items():
            if key not in info.blind_kwargs:
                codes.append(self._code(key))
                self._leaf(arg, codes)

    def _leaf(self, value: Any, codes: list[int]) -> None:
        if isinstance(value, torch.Tensor):
            hit = self._derived.get(id(value))
            if hit is not None and hit[0]() is value and hit[1] == version_of(value):
                codes.append(hit[2])
                if hit[3]:
                    self._uninit = True
            elif self._blank and self._is_blank(value):
                codes.append(shape_seed(value))
                self._uninit = True
            elif value.device.type == "cpu" or (self.rec.eager_device and value.device.type != "meta"):
                codes.append(self.rec.digest_now(value)[0])
            else:
                self._unknown = True
            return
        if isinstance(value, (list, tuple)):
            codes.append(len(value))
            for item in value:
                self._leaf(item, codes)
            return
        if isinstance(value, bool) or value is None:
            codes.append(3 if value is None else int(value) + 1)
        elif isinstance(value, int):
            codes.append(value & _MASK)
        elif isinstance(value, float):
            codes.append(struct.unpack("<Q", struct.pack("<d", value))[0])
        else:
            codes.append(self._code(value))

    def _code(self, value: Any) -> int:
        """A stable code for a non-numeric argument (dtype, device, string); generators by type only."""
        try:
            code = self._codes.get(value)
        except TypeError:
            return xxhash.xxh3_64_intdigest(type(value).__name__.encode())
        if code is None:
            text = type(value).__name__ if isinstance(value, torch.Generator) else f"{type(value).__name__}:{value}"
            code = self._codes[value] = xxhash.xxh3_64_intdigest(text.encode())
        return code

    def _derive_view(self, info: _OpInfo, args: Any, out: Any) -> None:
        """A view's digest from its base's and its geometry, so a transposed weight is never copied to be
        hashed. A small contiguous slice of a large base (a batch of a dataset held in one tensor) is
        left to be hashed itself if an op reads it: cheaper than hashing the whole base every step."""
        base = args[0] if args else None
        if not isinstance(base, torch.Tensor):
            return
        views = list(_tensors(out))
        if any(v.is_nested or v.layout != torch.strided for v in views):
            return  # no plain geometry (ragged sizes, no strides): such a view is hashed itself when read
        if base.numel() > 4 * sum(v.numel() for v in views) and all(v.is_contiguous() for v in views):
            return
        codes: list[int] = []
        self._unknown = self._uninit = False
        self._leaf(base, codes)
        if self._unknown:
            return
        derived = self._derived
        if len(derived) > _DERIVED_LIMIT:
            live = {k: v for k, v in derived.items() if v[0]() is not None}
            derived.clear()
            if len(live) < _DERIVED_LIMIT // 2:
                derived.update(live)
        for t in views:
            geometry = (*t.shape, *t.stride(), t.storage_offset(), info.code & 0x7FFFFFFFFFFFFFFF)
            digest = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(geometry)}q", *geometry), codes[0])
            derived[id(t)] = (weakref.ref(t), version_of(t), digest, self._uninit)

    def _mark_blank(self, t: torch.Tensor) -> None:
        ptr = t.data_ptr()
        blank = self._blank

        def forget(ref: weakref.ref[Any]) -> None:  # the storage was freed: its address may be reused
            if blank.get(ptr, (None,))[0] is ref:
                del blank[ptr]

        blank[ptr] = (weakref.ref(t.untyped_storage(), forget), version_of(t))

    def _is_blank(self, t: torch.Tensor) -> bool:
        entry = self._blank.get(t.data_ptr())
        return entry is not None and entry[1] == version_of(t) and entry[0]() is t.untyped_storage()

    def _tag_node(self) -> None:
        refs, loc, module = self._untagged  # type: ignore[misc]
        self._untagged = None
        for ref in refs:
            t = ref()
            if t is None:
                continue
            fn: Any = t.grad_fn
            if fn is not None:
                fn.metadata.setdefault(_NODE_KEY, (loc, module))
                return

    def _node_name(self, node: Any) -> int:
        sid = self._node_names[type(node)] = self.rec.intern(node.name())
        return sid


def _needs_node(args: Any) -> bool:
    """Whether autograd will give a view op's output a node (worth finding the user's line for)."""
    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].requires_grad and torch.is_grad_enabled()


def _top(rec: Recorder) -> int:
    stack = rec.local.module_stack
    return stack[-1] if stack else 0


def _tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def install(recorder: Recorder, config: dict[str, Any], on_window_end: Callable[[], None]) -> OpRecorder | None:
    """Set up the child's granularity: `step` drops module records; `op` records ops, everywhere or
    only in `config["op_window"]` = [first_step, last_step], calling `on_window_end` after the last."""
    granularity = config.get("granularity", "module")
    if granularity == "step":
        recorder.record_modules = False
    if granularity != "op":
        return None
    ops = OpRecorder(recorder)
    window = config.get("op_window")
    if not window:
        ops.start()
        return ops
    first, last = int(window[0]), int(window[1])

    def on_step(step: int) -> None:
        if step == first:
            ops.start()
        elif step > last:
            ops.stop()
            on_window_end()

    recorder.step_callbacks.append(on_step)
    if recorder.step == first:
        ops.start()
    return ops
