"""Op granularity: one trace record per aten op output, with its inputs' fingerprints.

A TorchDispatchMode sees every aten op below autograd, backward ops included. Each record
holds the op overload (`aten.index_put_.default`), the output's fingerprint, two digests of
the op's inputs (in order, and sorted: equal when only the order differs), the phase (and the
autograd node for backward ops), the innermost running module and the user's `file:line`; a
backward op gets the line of the forward op that created its autograd node.

Each forward op record also names the records that made its inputs (`aux`: their distances back,
`"1,7"`), when they were made by a recorded op since the last step or iteration: the provenance that
oprules.py follows from a divergent record back to the op that produced it. A view carries its base's
maker.

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

import os
import struct
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
import xxhash
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.recorder.core import Recorder, version_of
from detaudit.recorder.evidence import set_order
from detaudit.recorder.evidence.base import never_fatal
from detaudit.recorder.fingerprint import fingerprint_cpu, shape_seed
from detaudit.recorder.location import user_frame
from detaudit.recorder.scratch import is_scratch_argument, scratch_outputs, tensor_indices
from detaudit.trace import Flag, Kind

PASS, VIEW, UNINIT, RECORD = range(4)
_NODE_KEY = "detaudit"
_MASK = (1 << 64) - 1
_DERIVED_LIMIT = 20000
BLANK_CHECK_BYTES = 1 << 16  # never-written memory up to this size is also checked by content (_written_unseen)

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
# c10d's schemas carry no alias annotations (`Tensor[] tensors`, not `Tensor(a!)[]`), so what each collective
# writes is listed here by argument name: its outputs, written without their old contents being read, and
# the tensors it reads and then overwrites in place. A broadcast writes its tensors on every rank but the
# root, which reads them (decided per call: `_OpInfo.root`).
C10D_WRITE_ONLY = {
    "allgather_": "output_tensors", "_allgather_base_": "output_tensor", "allgather_coalesced_": "output_lists",
    "allgather_into_tensor_coalesced_": "outputs", "reduce_scatter_": "output_tensors",
    "_reduce_scatter_base_": "output_tensor", "reduce_scatter_tensor_coalesced_": "outputs",
    "alltoall_": "output_tensors", "alltoall_base_": "output", "scatter_": "output_tensors",
    "gather_": "output_tensors", "recv_": "tensors", "recv_any_source_": "tensors", "broadcast_": "tensors",
}
C10D_UNUSED = {"barrier": "tensor", "monitored_barrier_": "tensor"}  # a placeholder: neither read nor written
C10D_READ_WRITE = {"allreduce_": "tensors", "allreduce_coalesced_": "tensors", "reduce_": "tensors"}
UNINIT_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
PASS_NAMESPACES = frozenset({"profiler", "prim"})
# `t.set_(storage, ...)` points a tensor at existing memory: how a tensor a DataLoader worker (or any
# other process) sent arrives (torch.multiprocessing rebuilds it in shared memory). Its contents were
# made outside this process's ops, so like a script's input it is data entering from outside, never
# "the op behind" a divergence; ops that read it hash it as a fresh input.
STORAGE_ALIAS_OPS = frozenset({"set_"})


class _OpInfo:
    """What the recorder needs to know about one OpOverload, worked out on its first call.

    Each argument is read, written, or both. One that is only written (an `out=` argument, `copy_`'s or
    `fill_`'s target, a collective's output buffers) is no input: its old contents, often from `torch.empty`,
    never reach the result, so they enter the input digest by dtype and shape only and never make the op
    "read never-written memory". Every written argument's cached digest is dropped after the op (the
    version counter is bumped only by schemas that annotate the write, and c10d's do not), and its memory
    is no longer blank; an op that returns no tensor is recorded by what it wrote (`recv`).

    A backward op's workspace or reserve argument counts by dtype and shape too, and the outputs an op makes for
    it (`scratch`: their positions) are recorded as no results (recorder/scratch.py): bytes the kernel need
    not define are no input and no result."""

    __slots__ = ("mode", "names", "random", "arg_names", "blind", "written", "bumped", "root", "collective", "code",
                 "text", "scratch")

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
        arguments = func._schema.arguments
        self.arg_names = [a.name for a in arguments]
        self.collective = func.namespace == "c10d"
        c10d_blind = C10D_WRITE_ONLY.get(packet) if self.collective else None
        c10d_written = C10D_READ_WRITE.get(packet) if self.collective else None
        c10d_unused = C10D_UNUSED.get(packet) if self.collective else None
        self.blind = frozenset(
            a.name for i, a in enumerate(arguments)
            if a.is_out or a.name in (c10d_blind, c10d_unused) or (i == 0 and packet in SELF_BLIND_OPS)
            or is_scratch_argument(a.name))
        self.written = frozenset(
            a.name for a in arguments
            if (a.alias_info is not None and a.alias_info.is_write) or a.is_out or a.name in (c10d_blind, c10d_written))
        # autograd bumps these arguments' version counters after the op returns (the schema annotates the write)
        self.bumped = frozenset(a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write)
        # broadcast_: (process group, root rank) argument positions; its tensors are read on the root
        self.root = (self.arg_names.index("process_group"), self.arg_names.index("root_rank")) \
            if self.collective and packet == "broadcast_" else None
        self.code = xxhash.xxh3_64_intdigest(self.text.encode())
        self.scratch = scratch_outputs(func) if self.mode == RECORD else frozenset()

    def blind_here(self, args: Any) -> frozenset[str]:
        """The arguments this call does not read: a broadcast's root reads its tensors."""
        if self.root is None or not _is_root(args, *self.root):
            return self.blind
        return self.blind - {"tensors"}

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
        # id -> (weakref, version, record index) of the op record that made a tensor (or a view's base): the
        # inputs' makers, within one iteration (cleared with the digests)
        self._made: dict[int, tuple[Any, int, int]] = {}
        recorder.digest_caches.append(self._made)
        self._makers: list[int] = []  # set while reading an op's inputs: the record indices that made them
        # data_ptr -> (weakref to the storage, version) of never-written memory, for tensors that alias
        # it without an op (nn.Parameter(torch.empty(n)) shares the storage and the version counter).
        # The storage check keeps a later tensor at a reused address (torch.from_numpy) from aliasing it.
        # Also the digest of the leftover bytes of a small CPU one (else 0): memory written by code that runs
        # no op (a C++ accessor filling DDP's shape metadata, a NumPy view) is found written by its bytes.
        self._blank: dict[int, tuple[weakref.ref[Any], int, int]] = {}
        recorder.refill = self.refill
        # (weakrefs to the outputs, loc, module) of the last forward op: tagged onto its autograd node at
        # the next op, because autograd attaches grad_fn only after this mode returns. Weak: the outputs
        # must not outlive the user's last reference to them.
        self._untagged: tuple[list[weakref.ref[torch.Tensor]], int, int] | None = None
        self._unknown = False  # set while reading an op's inputs: one has no digest (accelerator)
        self._order_searched: set[int] = set()  # user lines searched for run-ordered sets (evidence/set_order.py)
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
        if rec.polled and not _inside_distributed():  # a collective the script has since waited for (its
            rec.poll_async()  # wait, in torch.distributed, may itself still copy the result in: gloo's reduce_scatter)
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
                self._pass_maker(args, out)
                self._derive_view(info, args, out)
            else:
                for t in tensors_in(out):
                    self._derived[id(t)] = (weakref.ref(t), version_of(t), shape_seed(t), True)
                    self._mark_blank(t)
            if mode == VIEW and node is None and _needs_node(args):
                self._untagged = ([weakref.ref(t) for t in tensors_in(out)], rec.location_id(1), _top(rec))
            return out

        flags = Flag.RANDOM if info.random else 0
        codes: list[int] = []
        self._unknown = self._uninit = False
        makers: list[int] = []
        self._makers = makers
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
            if loc not in self._order_searched:
                self._search_order(loc)
            module = _top(rec)
            aux = 0  # the makers' distances, once this record's index is known
        else:
            flags |= Flag.BACKWARD
            tag = node.metadata.get(_NODE_KEY)
            loc, module = tag if tag is not None else (rec.location_id(1), 0)
            aux = self._node_names.get(type(node), 0) or self._node_name(node)

        out = func(*args, **kwargs)

        outputs = list(tensors_in(out))
        written = [t for name, arg in _named(info, args, kwargs) if name in info.written for t in tensors_in(arg)] \
            if info.written else []
        touched = outputs + written
        if info.written:
            for t in touched:
                rec.forget_digest(t)
        if self._blank:  # memory now holding an op's output is no longer blank
            for t in touched:
                self._blank.pop(t.data_ptr(), None)
        if not outputs:
            outputs = written
        work = _pending_work(out) if info.collective else None
        sync = work is not None and dict(_named(info, args, kwargs)).get("async_op") is False
        bumped = {id(t) for name, arg in _named(info, args, kwargs) if name in info.bumped for t in tensors_in(arg)} \
            if info.bumped and node is None else set()
        aside = tensor_indices(out, info.scratch) if info.scratch else info.scratch
        for i, t in enumerate(outputs):
            name = info.names[0] if i == 0 else info.name(rec, i)
            if node is None:
                aux = self._note_maker(t, makers, id(t) in bumped) if work is None and not rec.local.flag else 0
            if i in aside:
                rec.record_no_result(name, t, module, loc, aux, flags, inputs)
            elif work is None:
                rec.record_tensor(Kind.OP, name, t, module, loc, aux, flags, inputs)
            else:  # hashed when the collective has written it, not while it may still be writing
                rec.record_when_done(work, Kind.OP, name, t, module, loc, aux, flags, inputs, sync)
        if node is None and outputs and torch.is_grad_enabled():
            self._untagged = ([weakref.ref(t) for t in outputs], loc, module)
        return out

    def _search_order(self, loc: int) -> None:
        """Once per user line: the run-ordered sets in scope there, as a `set-order` event."""
        self._order_searched.add(loc)
        with never_fatal():
            found = set_order.event(self.rec.writer.text(loc), user_frame(1))
            if found is not None:
                self.rec.event(found)

    def _input_codes(self, info: _OpInfo, args: Any, kwargs: Any, codes: list[int]) -> None:
        """Append one 64-bit code per input leaf (tensor digest, or the value of a plain argument); an
        argument the op only writes counts by dtype and shape (positional) or not at all (keyword)."""
        blind = info.blind_here(args) if info.blind else info.blind
        names = info.arg_names
        for i, arg in enumerate(args):
            if blind and i < len(names) and names[i] in blind:
                self._blind_leaf(arg, codes)
            else:
                self._leaf(arg, codes)
        for key, arg in kwargs.items():
            if key not in blind:
                codes.append(self._code(key))
                self._leaf(arg, codes)

    def _note_maker(self, t: torch.Tensor, makers: list[int], bumped: bool) -> int:
        """Remember that the next record makes `t` (`bumped`: written in place, its version counter moves on
        when the op returns); the string id of its inputs' makers' distances back (0: none known). Records
        made on other threads are placed at the next sync: no link from or to them."""
        index = self.rec.next_index
        _prune(self._made)
        self._made[id(t)] = (weakref.ref(t), version_of(t) + bumped, index)
        if not makers:
            return 0
        return self.rec.intern(",".join(str(index - m) for m in sorted(set(makers), reverse=True)))

    def _maker(self, t: torch.Tensor) -> int | None:
        hit = self._made.get(id(t))
        return hit[2] if hit is not None and hit[0]() is t and hit[1] == version_of(t) else None

    def _pass_maker(self, args: Any, out: Any) -> None:
        """A view was made by whatever made its base."""
        base = args[0] if args else None
        if not isinstance(base, torch.Tensor) or self.rec.local.flag:
            return
        maker = self._maker(base)
        if maker is not None:
            for t in tensors_in(out):
                self._made[id(t)] = (weakref.ref(t), version_of(t), maker)

    def _blind_leaf(self, value: Any, codes: list[int]) -> None:
        if isinstance(value, torch.Tensor):
            codes.append(shape_seed(value))
        elif isinstance(value, (list, tuple)):
            codes.append(len(value))
            for item in value:
                self._blind_leaf(item, codes)

    def _leaf(self, value: Any, codes: list[int]) -> None:
        if isinstance(value, torch.Tensor):
            maker = self._maker(value)
            if maker is not None:
                self._makers.append(maker)
            hit = self._derived.get(id(value))
            if hit is not None and hit[0]() is value and hit[1] == version_of(value) \
                    and not (hit[3] and self._written_unseen(value)):
                codes.append(hit[2])
                if hit[3]:
                    self._uninit = True
            elif self._blank and self._is_blank(value) and not self._written_unseen(value):
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
        views = list(tensors_in(out))
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
        _prune(derived)
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

        blank[ptr] = (weakref.ref(t.untyped_storage(), forget), version_of(t), _leftover(t))

    def _is_blank(self, t: torch.Tensor) -> bool:
        entry = self._blank.get(t.data_ptr())
        return entry is not None and entry[1] == version_of(t) and entry[0]() is t.untyped_storage()

    def _written_unseen(self, t: torch.Tensor) -> bool:
        """Whether never-written memory has been written without an op: its bytes are no longer the leftover
        ones (small CPU tensors read whole; anything else is taken as still blank)."""
        entry = self._blank.get(t.data_ptr())
        if entry is None or not entry[2] or _leftover(t) in (0, entry[2]):
            return False
        del self._blank[t.data_ptr()]
        self._derived.pop(id(t), None)
        return True

    def refill(self, t: torch.Tensor) -> None:
        """detaudit's own fill of `torch.empty` memory (recorder/evidence/kernels.py): still never written
        by the script, now with other leftover bytes."""
        entry = self._blank.get(t.data_ptr())
        if entry is not None:
            self._blank[t.data_ptr()] = (entry[0], entry[1], _leftover(t))

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


def _prune(cache: dict[int, Any]) -> None:
    """Past _DERIVED_LIMIT entries keyed by id (weakref first), drop the dead ones; all of them when most live."""
    if len(cache) > _DERIVED_LIMIT:
        live = {k: v for k, v in cache.items() if v[0]() is not None}
        cache.clear()
        if len(live) < _DERIVED_LIMIT // 2:
            cache.update(live)


def _named(info: _OpInfo, args: Any, kwargs: Any) -> Any:
    """(argument name, value) of a call, positional and keyword."""
    yield from zip(info.arg_names, args)
    yield from kwargs.items()


def _is_root(args: Any, group_at: int, root_at: int) -> bool:
    """Whether this rank is a broadcast's root (unknown: treated as the root, whose tensors are read)."""
    try:
        from torch._C._distributed_c10d import ProcessGroup

        return bool(ProcessGroup.unbox(args[group_at]).rank() == args[root_at])
    except Exception:
        return True


def _pending_work(out: Any) -> Any:
    """The c10d Work a collective returned, if it has not completed yet (None when done or absent)."""
    found = out[-1] if isinstance(out, tuple) and out else out
    if not isinstance(found, torch.ScriptObject):
        return None
    try:
        from torch._C._distributed_c10d import Work

        work = Work.unbox(found)
        return None if work.is_completed() else work
    except Exception:
        return None


_DISTRIBUTED_DIR = f"{os.sep}torch{os.sep}distributed{os.sep}"


def _inside_distributed() -> bool:
    """Whether torch.distributed's Python code is running (a collective's call, its `wait()`)."""
    frame = sys._getframe(2)
    while frame is not None:
        if _DISTRIBUTED_DIR in frame.f_code.co_filename:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _leftover(t: torch.Tensor) -> int:
    """The digest of a small contiguous CPU tensor's bytes (0: not checked by content)."""
    if t.is_nested or t.device.type != "cpu" or t.layout != torch.strided or not t.is_contiguous() or \
            t.numel() * t.element_size() > BLANK_CHECK_BYTES:
        return 0
    try:
        return fingerprint_cpu(t)[0] or 1
    except Exception:
        return 0


def _needs_node(args: Any) -> bool:
    """Whether autograd will give a view op's output a node (worth finding the user's line for)."""
    return bool(args) and isinstance(args[0], torch.Tensor) and args[0].requires_grad and torch.is_grad_enabled()


def _top(rec: Recorder) -> int:
    stack = rec.local.module_stack
    return stack[-1] if stack else 0


def tensors_in(value: Any) -> Any:
    """The tensors in an op's argument or result (nested lists and tuples), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


def install(recorder: Recorder, config: dict[str, Any],
            on_window_end: Callable[[], None] | None) -> OpRecorder | None:
    """Set up the child's granularity: `step` drops module records; `op` records ops, everywhere or
    only in `config["op_window"]` = [first_step, last_step], calling `on_window_end` after the last
    (None: the repeat runs on, recording modules only, as an op-windowed repeat of `auto` does)."""
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
            if on_window_end is not None:
                on_window_end()

    recorder.step_callbacks.append(on_step)
    if recorder.step == first:
        ops.start()
    return ops
