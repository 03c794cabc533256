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
from collections.abc import Callable, Container
from typing import Any

import torch
import xxhash
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.recorder import loader_batches
from detaudit.recorder.core import Recorder, version_of
from detaudit.recorder.evidence import set_order
from detaudit.recorder.evidence.base import never_fatal
from detaudit.recorder.fingerprint import fingerprint_cpu, shape_seed
from detaudit.recorder.location import user_frame
from detaudit.recorder.opinfo import PASS, RECORD, VIEW, OpInfo, tensors_in
from detaudit.recorder.scratch import tensor_indices
from detaudit.trace import Flag, Kind

_NODE_KEY = "detaudit"
_MASK = (1 << 64) - 1
_DERIVED_LIMIT = 20000
_NONE: frozenset[int] = frozenset()
BLANK_CHECK_BYTES = 1 << 16  # never-written memory up to this size is also checked by content (_written_unseen)


class OpRecorder(TorchDispatchMode):
    """Records every non-view aten op while active; `start()` / `stop()` bound the window."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.rec = recorder
        self.active = False
        self._ops: dict[Any, OpInfo] = {}
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
        if rec.polled:
            self._poll()
        if rec.internal:
            return func(*args, **kwargs)
        info = self._ops.get(func)
        if info is None:
            info = self._ops[func] = OpInfo(func, rec)
        if info.mode != RECORD:
            return func(*args, **kwargs) if info.mode == PASS else self._unrecorded(info, func, args, kwargs)

        node: Any = torch._C._current_autograd_node()  # the autograd Node running this op (backward)
        makers: list[int] = []
        self._makers = makers
        inputs, flags = self._inputs(info, args, kwargs)
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

        if info.effects:
            outputs, work, sync, bumped, aside = self._effects(info, args, kwargs, out, node)
        else:
            outputs, work, sync, bumped, aside = list(tensors_in(out)), None, False, _NONE, _NONE
            if self._blank:
                self._unblank(outputs)
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

    def record_made(self, name: int, t: torch.Tensor, loc: int, makers: list[int], inputs: tuple[int, int]) -> None:
        """Record `t` as the output of a step that is no aten op (recorder/loader_batches.py: a DataLoader's batch),
        made from `makers` (record indices) and from what it made before, if a recorded op made it."""
        made = self._maker(t)
        aux = self._note_maker(t, makers if made is None else [*makers, made], False)
        self.rec.record_tensor(Kind.OP, name, t, _top(self.rec), loc, aux, self.rec.local.flag, inputs)

    def _poll(self) -> None:
        """Hash what the collectives the script has since waited for wrote; not while its wait, in
        torch.distributed, may itself still copy the result in (gloo's reduce_scatter)."""
        if not _inside_distributed():
            self.rec.poll_async()

    def _unblank(self, touched: list[torch.Tensor]) -> None:
        """Memory now holding an op's output (or an argument it wrote) is no longer blank."""
        for t in touched:
            self._blank.pop(t.data_ptr(), None)

    def _unrecorded(self, info: OpInfo, func: Any, args: Any, kwargs: Any) -> Any:
        """A view (its digest derived from its base's, its maker its base's) or an op that returns never-written
        memory: run, not recorded."""
        node: Any = torch._C._current_autograd_node()
        out = func(*args, **kwargs)
        if info.mode == VIEW:
            self._pass_maker(args, out)
            self._derive_view(info, args, out)
            if node is None and _needs_node(args):
                self._untagged = ([weakref.ref(t) for t in tensors_in(out)], self.rec.location_id(2), _top(self.rec))
        else:
            for t in tensors_in(out):
                self._derived[id(t)] = (weakref.ref(t), version_of(t), shape_seed(t), True)
                self._mark_blank(t)
        return out

    def _effects(self, info: OpInfo, args: Any, kwargs: Any, out: Any, node: Any) -> tuple[
            list[torch.Tensor], Any, bool, Container[int], Container[int]]:
        """What an op that writes an argument, runs a collective or returns a workspace made: (the tensors to
        record: its outputs, else the arguments it wrote; the collective's pending work; whether the script
        waits for it; the ids of the arguments whose version counters move on when it returns; the positions of
        its workspace outputs). The written arguments' digests are forgotten, and their memory is no longer
        blank."""
        outputs = list(tensors_in(out))
        written = [t for name, arg in _named(info, args, kwargs) if name in info.written for t in tensors_in(arg)] \
            if info.written else []
        touched = outputs + written
        if info.written:
            for t in touched:
                self.rec.forget_digest(t)
        if self._blank:
            self._unblank(touched)
        work = _pending_work(out) if info.collective else None
        sync = work is not None and dict(_named(info, args, kwargs)).get("async_op") is False
        bumped = {id(t) for name, arg in _named(info, args, kwargs) if name in info.bumped for t in tensors_in(arg)} \
            if info.bumped and node is None else set()
        aside = tensor_indices(out, info.scratch) if info.scratch else info.scratch
        return outputs or written, work, sync, bumped, aside

    def _search_order(self, loc: int) -> None:
        """Once per user line: the run-ordered sets in scope there, as a `set-order` event."""
        self._order_searched.add(loc)
        with never_fatal():
            found = set_order.event(self.rec.writer.text(loc), user_frame(1))
            if found is not None:
                self.rec.event(found)

    def _inputs(self, info: OpInfo, args: Any, kwargs: Any) -> tuple[tuple[int, int], int]:
        """The op's input digests (in order, and sorted; (0, 0): unknown, an input has no digest) and its flags
        (RANDOM; UNINIT when an input was never written), from one 64-bit code per input leaf (tensor digest,
        or the value of a plain argument); an argument the op only writes counts by dtype and shape
        (positional) or not at all (keyword)."""
        self._unknown = self._uninit = False
        codes: list[int] = []
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
        flags = info.flags | Flag.UNINIT if self._uninit else info.flags
        if self._unknown:
            return (0, 0), flags
        ordered = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(codes)}Q", *codes), info.code)
        codes.sort()
        unordered = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(codes)}Q", *codes), info.code)
        return (ordered or 1, unordered or 1), flags  # 0 means "unknown"

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

    def _derive_view(self, info: OpInfo, args: Any, out: Any) -> None:
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


def _named(info: OpInfo, args: Any, kwargs: Any) -> Any:
    """(argument name, value) of a call, positional and keyword."""
    yield from zip(info.arg_names, args)
    yield from kwargs.items()


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
    frame = sys._getframe(3)  # the caller of OpRecorder.__torch_dispatch__ (through _poll)
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
    loader_batches.install(ops)
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
