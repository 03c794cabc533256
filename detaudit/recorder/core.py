"""The Recorder: one per repeat. Turns tensors (and containers of them) into trace records.

Hooks (recorder/hooks.py) call `record`; this module owns naming, the optimizer step count,
the user-code location, a per-step digest cache and the device-side fingerprint batching.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

import torch
from torch.utils._python_dispatch import _disable_current_modes

from detaudit.events import DeviceDigestEvent, Event, UnobservedEvent
from detaudit.recorder.boundary import HostGroup
from detaudit.recorder.devicehash import DeviceReducer, Payload, Reduced, batchable, fingerprint
from detaudit.recorder.fingerprint import (
    DTYPE_CODES,
    fingerprint_cpu,
    is_plain,
    logical_shape,
    parts,
    shape_seed,
)
from detaudit.recorder.location import describe_frames, user_caller, user_frame
from detaudit.recorder.objects import Encoded, PythonNumber
from detaudit.recorder.objects import walk as walk_object
from detaudit.trace import N_SAMPLES, Flag, Kind, TraceWriter

_NAN4 = (float("nan"),) * N_SAMPLES
_PYTHON_VALUE = int(Flag.PYTHON_VALUE)  # a plain int, as the other flags here
_CACHE_LIMIT = 20000
_PENDING_LIMIT = 1 << 16  # device records per host sync; normally one sync per step
MAX_STEP_TIMES = 100_000  # step times kept in the footer (8 bytes of JSON or so each)
ASYNC_CLOSE_WAIT_S = 10.0  # at the end, how long collectives still writing recorded tensors are waited for


class DeviceRecord(NamedTuple):
    """A pending record whose fingerprint is still on the device (made whole at the next host sync).

    Keeps the reduction's device values, not the tensor: pending records must not hold activations alive.
    """

    partial: tuple[Any, ...]  # the record's fields up to `aux` (trace.Record)
    reduced: Reduced  # where its values are (still on the device) and how to read them
    inputs: tuple[int, int]


class AsyncRecord:
    """A pending record of a tensor an asynchronous collective is still writing: fingerprinted by the
    callback of the collective's future, the moment the work completes (before any `wait()` returns to
    the script, so what is hashed is exactly what the collective wrote), and written in record order."""

    __slots__ = ("tensor", "work", "sync", "row", "_partial", "_inputs")

    def __init__(self, tensor: torch.Tensor, partial: tuple[Any, ...], inputs: tuple[int, int]) -> None:
        self.tensor: torch.Tensor | None = tensor
        self.work: Any = None  # a Work without a future (gloo's send/recv): polled, see Recorder.poll_async
        self.sync = False  # ... called without async_op: the caller has waited by the next op
        self.row: tuple[Any, ...] | None = None
        self._partial = partial  # the row's fields up to `aux`
        self._inputs = inputs

    def complete(self) -> None:
        """Fingerprint the tensor now (any thread; detaudit's own work, so no dispatch mode sees it)."""
        t, self.tensor, self.work = self.tensor, None, None
        if t is None:
            return
        flags = 0
        try:
            with _disable_current_modes():
                found = fingerprint(t)
            digest, samples = found.digest, found.samples
            if t.device.type != "cpu":
                flags = int(Flag.DEVICE)
        except Exception:  # unreadable: dtype and shape only
            digest, samples, flags = shape_seed(t), _NAN4, int(Flag.NO_DATA)
        kind, dtype, base, *rest = self._partial
        self.row = (kind, dtype, base | flags, *rest, digest, self._inputs[0], self._inputs[1], samples)

    def abandon(self) -> None:
        """The work never completed: the record keeps dtype and shape, its contents unread."""
        t, self.tensor, self.work = self.tensor, None, None
        if self.row is None:
            kind, dtype, base, *rest = self._partial
            seed = shape_seed(t) if t is not None else 0
            self.row = (kind, dtype, base | int(Flag.NO_DATA), *rest, seed, self._inputs[0], self._inputs[1], _NAN4)


class ThreadState(threading.local):
    """Per-thread recorder state: threads running models at once must not share a module stack."""

    def __init__(self, owner: int) -> None:
        self.module_stack: list[int] = []  # string ids of the modules whose forward is running
        self.wrapped: list[int] = []  # ids of modules whose torch.compile wrapper is running (hooks.py)
        self.paused = False  # `detaudit batch` re-evaluating a call (recorder/batchprobe.py): hooks record nothing
        # Flag.THREAD off the recorder's own thread: those records arrive in scheduling order (TraceWriter.sync)
        self.flag = 0 if threading.get_ident() == owner else int(Flag.THREAD)  # int: IntFlag `|` is slow


class Recorder:
    """Records fingerprints into one trace; cheap enough to call from every module's forward."""

    def __init__(self, writer: TraceWriter, device_path_on_cpu: bool = False) -> None:
        self.writer = writer
        # Fingerprint CPU tensors the way accelerator tensors are (batched, deferred): lets the
        # CUDA code path run, and be tested, on a machine without a GPU.
        self._host_is_cpu = not device_path_on_cpu  # `t.is_cpu` is several times cheaper than `t.device.type`
        self.step = 0
        self._shape_ids: dict[tuple[int | str, ...], int] = {}
        self._loc_ids: dict[tuple[Any, ...], int] = {}
        # id(tensor) -> (weakref, version, digest, samples): a tensor recorded twice in one iteration
        # (a container's output is its last child's output; op granularity: an op's output read by the
        # next op, a saved activation read in backward) is hashed once. The version counter misses
        # writes through a NumPy alias or `.data`, so a digest is trusted for one iteration only: the
        # cache is cleared at each optimizer step and when a root module that already ran since the
        # last clear runs again (`root_forward`): one clear per training/inference iteration, which
        # keeps the forward-to-backward reuse that makes op granularity affordable.
        self._cache: dict[int, tuple[Any, int, int, tuple[float, ...]]] = {}
        self._roots_run: set[int] = set()
        self.digest_caches: list[dict[Any, Any]] = [self._cache]  # cleared together (ops.py adds its own)
        # records waiting for device fingerprints or for a collective to complete, in record order:
        # DeviceRecords, AsyncRecords and the whole rows (plain tuples, trace.Record's order) recorded after
        # the first of them
        self._pending: list[DeviceRecord | AsyncRecord | tuple[Any, ...]] = []
        self.polled: list[AsyncRecord] = []  # those of works without a future (record_when_done)
        # set by the op recorder: told when detaudit itself refills `torch.empty` memory (still never written)
        self.refill: Callable[[torch.Tensor], None] | None = None
        self._reducer: DeviceReducer | None = None
        # True while the op recorder's window is open: accelerator tensors are fingerprinted at once
        # (one sync each) instead of at the step's end, so each op's input digests are known and the
        # root-cause rule can prove "inputs match, output differs" on a GPU too. Outside op windows
        # the batched, one-sync-per-step path stays.
        self.eager_device = False
        self.saves = 0
        self.record_modules = True  # False at step granularity: no module input/output records
        self.local = ThreadState(threading.get_ident())
        # >0 while the op recorder (recorder/ops.py) must ignore ops: detaudit's own tensor work, and
        # optimizer.step (its effect is recorded as parameters and state after the step; recording each
        # in-place update op roughly doubled op-granularity cost on a 1.7M-parameter MLP)
        self.internal = 0
        self.step_callbacks: list[Callable[[int], None]] = []  # called with the new step after each step
        self.perturb_at: int | None = None  # --self-check: the record index whose tensor gets a one-ULP change
        # seconds each optimizer step took (from the recorder's start, then from the step before), for `detaudit
        # fix`'s cost table; the first MAX_STEP_TIMES steps
        self.step_times: list[float] = []
        self._step_started = time.perf_counter()
        # the same steps' CPU time (this process, all its threads): what a knob costs per step, which the machine's
        # load barely moves, where wall time moves with it
        self.step_cpu_times: list[float] = []
        self._step_cpu_started = time.process_time()

    # -- names and places ---------------------------------------------------------------
    def intern(self, text: str) -> int:
        return self.writer.intern(text)

    def location_id(self, depth: int = 2) -> int:
        """String id of the user's `file:line` that led to this call."""
        frame = user_frame(depth + 1)
        if frame is None:
            return 0
        user = user_caller(frame)  # library code (an installed package): the user's line that led to it first
        key = (frame.f_code, frame.f_lineno) if user is None else (frame.f_code, frame.f_lineno, user.f_code,
                                                                   user.f_lineno)
        lid = self._loc_ids.get(key)
        if lid is None:
            lid = self.intern(describe_frames(frame, user))
            self._loc_ids[key] = lid
        return lid

    def _shape_id(self, shape: tuple[int | str, ...]) -> int:
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self.intern("x".join(str(d) for d in shape) if len(shape) else "scalar")
            self._shape_ids[shape] = sid
        return sid

    # -- recording ----------------------------------------------------------------------
    def record_tensor(
        self, kind: Kind, name: int, t: torch.Tensor, module: int = 0, loc: int = 0,
        aux: int = 0, flags: int = 0, inputs: tuple[int, int] = (0, 0),
    ) -> int:
        """Record one tensor; returns its digest (0 while a device digest is pending)."""
        if self.perturb_at is not None and self.next_index == self.perturb_at \
                and not self.local.flag:
            self.perturb_at = None
            self.internal += 1  # the copy is detaudit's own work: the op recorder must not add it
            try:
                t = one_ulp(t)
            finally:
                self.internal -= 1
        shape_id = self._shape_id(logical_shape(t) if t.is_nested else t.shape)
        dtype = DTYPE_CODES.get(t.dtype, 0)
        flags |= self.local.flag
        on_host = self._host_is_cpu and t.is_cpu
        device = "cpu" if on_host else t.device.type
        if on_host or (self.eager_device and device != "meta"):
            digest, samples = self.digest_now(t)
            if samples is _NAN4:
                flags |= Flag.NO_DATA
            if not on_host:
                flags |= Flag.DEVICE
            row = (kind, dtype, flags, 0, name, module, loc, self.step, shape_id, aux,
                   digest, inputs[0], inputs[1], samples)
            if self._pending:
                self._pending.append(row)
            else:
                self.writer.add(row)
            return digest
        if device == "meta":
            digest = shape_seed(t)
            self._emit((kind, dtype, flags | Flag.NO_DATA, 0, name, module, loc, self.step, shape_id, aux,
                        digest, inputs[0], inputs[1], _NAN4))
            return digest
        partial = (kind, dtype, flags | Flag.DEVICE, 0, name, module, loc, self.step, shape_id, aux)
        self.internal += 1
        try:
            reduced = self._device_reducer().reduce(t)
        except (RuntimeError, NotImplementedError, TypeError):  # no readable contents: dtype and shape only
            self._emit((kind, dtype, flags | Flag.NO_DATA, 0, name, module, loc, self.step, shape_id, aux,
                        shape_seed(t), inputs[0], inputs[1], _NAN4))
            return 0
        finally:
            self.internal -= 1
        self._pending.append(DeviceRecord(partial, reduced, inputs))
        if len(self._pending) >= _PENDING_LIMIT:
            self.resolve_pending()
        return 0

    def record_no_result(self, name: int, t: torch.Tensor, module: int, loc: int, aux: int, flags: int,
                         inputs: tuple[int, int]) -> None:
        """Record an op output that is no result (recorder/scratch.py: a workspace, a reserve) by its dtype and
        shape: its bytes are never read."""
        shape_id = self._shape_id(logical_shape(t) if t.is_nested else t.shape)
        self._emit((Kind.OP, DTYPE_CODES.get(t.dtype, 0), flags | self.local.flag | Flag.NOT_RESULT, 0, name, module,
                    loc, self.step, shape_id, aux, shape_seed(t), inputs[0], inputs[1], _NAN4))

    @property
    def next_index(self) -> int:
        """Index the next record will get (records of other threads are placed at the next sync)."""
        return self.writer.position + len(self._pending)

    def record_group(self, group: HostGroup, tensors: list[torch.Tensor], loc: int) -> None:
        """Record the optimizer step boundary's tensors (gradients; parameters, their state, buffers), one per
        name of `group`, in record order, as `record_tensor` would one by one, at a lower cost: host tensors
        are hashed by the group's plan (recorder/boundary.py; no per-iteration digest cache: nothing reads them
        again before it is cleared) and written as one block; accelerator tensors are copied into the device's
        batch (`DeviceBatch`: a constant number of launches for all of them) and reduced with it before the
        step's one transfer."""
        if not tensors:
            return
        ahead = self.writer.position + len(self._pending) + len(tensors)  # --self-check's record may be among them
        if self.eager_device or self.local.flag or (self.perturb_at is not None and self.perturb_at < ahead):
            for kind, name, t in zip(group.kinds, group.names, tensors, strict=True):
                self.record_tensor(kind, name, t, 0, loc)
            return
        if self._host_is_cpu and not self._pending:  # the CPU's common case
            block = group.rows(tensors, self._describe, self.step, loc)
            if block is not None:
                self.writer.add_block(block)
                return
        step, host_is_cpu = self.step, self._host_is_cpu
        batched: dict[torch.device, list[int]] = {}
        done: list[DeviceRecord | None] = [None] * len(tensors)
        for i, t in enumerate(tensors):
            if (not host_is_cpu or not t.is_cpu) and batchable(t):
                batched.setdefault(t.device, []).append(i)
        if batched:
            self.internal += 1
            try:
                for device, which in batched.items():
                    slots = self._device_reducer().batch(device).add([tensors[i] for i in which])
                    for i, reduced in zip(which, slots, strict=True):
                        t = tensors[i]
                        partial = (group.kinds[i], DTYPE_CODES.get(t.dtype, 0), int(Flag.DEVICE), 0, group.names[i], 0,
                                   loc, step, self._shape_id(t.shape), 0)
                        done[i] = DeviceRecord(partial, reduced, (0, 0))
            finally:
                self.internal -= 1
        for i, item in enumerate(done):  # in record order: the rest one by one (pending behind any device record)
            if item is None:
                self.record_tensor(group.kinds[i], group.names[i], tensors[i], 0, loc)
            else:
                self._pending.append(item)
        if len(self._pending) >= _PENDING_LIMIT:
            self.resolve_pending()

    def _describe(self, t: torch.Tensor) -> tuple[int, int]:
        """(shape string id, dtype code) of a tensor: what a HostGroup's plan keeps with it."""
        return self._shape_id(logical_shape(t) if t.is_nested else t.shape), DTYPE_CODES.get(t.dtype, 0)

    def digest_now(self, t: torch.Tensor) -> tuple[int, tuple[float, ...]]:
        """(digest, samples) of a tensor now, from the cache when this exact version was seen: xxh3 in
        place on the host; on an accelerator, the device reduction and one transfer (a sync).

        Unreadable contents give a dtype/shape seed and NaN samples (the `_NAN4` object itself).
        """
        hit = self._cache.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == version_of(t):
            return hit[2], hit[3]
        self.internal += 1
        try:
            if self._host_is_cpu and t.is_cpu:
                digest, samples = fingerprint_cpu(t)
            else:
                digest, samples = self._device_reducer().digest_now(t)
        except (RuntimeError, NotImplementedError, TypeError):
            digest, samples = shape_seed(t), _NAN4
        finally:
            self.internal -= 1
        if len(self._cache) > _CACHE_LIMIT:  # drop dead tensors first: op granularity caches every output
            live = {k: v for k, v in self._cache.items() if v[0]() is not None}
            self._cache.clear()
            if len(live) < _CACHE_LIMIT // 2:
                self._cache.update(live)
        self._cache[id(t)] = (weakref.ref(t), version_of(t), digest, samples)
        return digest, samples

    def _emit(self, row: tuple[Any, ...]) -> None:
        if self._pending:
            self._pending.append(row)
        else:
            self.writer.add(row)

    def resolve_pending(self) -> None:
        """Bring pending device fingerprints to the host in one transfer (one sync), and write every record
        up to the first whose collective is still running."""
        if not self._pending:
            return
        if self.polled:
            self.poll_async()
        values: list[int] = []
        bases: dict[int, int] = {}  # id(Payload) -> where its values start
        if self._reducer is not None:
            self.internal += 1  # the reductions, concatenation and copy are detaudit's own ops: no op records
            try:
                self._reducer.close_batches()
                tensors: list[torch.Tensor] = []
                at = 0  # in int64 values: a payload holds an even number of int32s
                for p in self._pending:
                    payload: Payload | None = p.reduced.payload if isinstance(p, DeviceRecord) else None
                    if payload is not None and payload.tensor is not None and id(payload) not in bases:
                        bases[id(payload)] = at
                        at += payload.tensor.numel() // 2
                        tensors.append(payload.tensor)
                if tensors:
                    joined = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
                    values = joined.cpu().view(torch.int64).tolist()
            finally:
                self.internal -= 1
        kept: list[DeviceRecord | AsyncRecord | tuple[Any, ...]] = []
        for item in self._pending:
            row: tuple[Any, ...] | None
            if isinstance(item, DeviceRecord):
                payload = item.reduced.payload
                digest, samples = item.reduced.slot.read(values, bases.get(id(payload), 0))
                row = (*item.partial, digest, item.inputs[0], item.inputs[1], samples)
            elif isinstance(item, AsyncRecord):
                row = item.row
            else:
                row = item
            if kept or row is None:
                kept.append(item if row is None else row)
            else:
                self.writer.add(row)
        self._pending = kept

    def record_when_done(self, work: Any, kind: Kind, name: int, t: torch.Tensor, module: int, loc: int, aux: int,
                         flags: int, inputs: tuple[int, int], sync: bool = False) -> None:
        """Record a tensor an asynchronous collective (`work`, a c10d Work) is writing, once it has written
        it: hashing it now would read whatever part of it the collective has not written yet. `sync`: the
        collective was called with `async_op=False`, so its caller waits before the script goes on."""
        partial = (kind, DTYPE_CODES.get(t.dtype, 0), flags | self.local.flag, 0, name, module, loc, self.step,
                   self._shape_id(logical_shape(t) if t.is_nested else t.shape), aux)
        item = AsyncRecord(t, partial, inputs)
        self._pending.append(item)
        try:
            future = work.get_future()
        except Exception:  # gloo's send/recv: no future, and a second `wait()` would block for ever
            item.work, item.sync = work, sync
            self.polled.append(item)
            return
        future.add_done_callback(lambda _: item.complete())

    def poll_async(self) -> None:
        """Fingerprint the tensors of works without a future that have completed, or whose synchronous
        call has returned (gloo's reduce_scatter never reports completion): the script waited for them.
        Called before each op the op recorder sees, so before anything reads or rewrites them."""
        done = [item for item in self.polled if item.sync or item.work is None or item.work.is_completed()]
        for item in done:
            item.complete()
            self.polled.remove(item)

    def _finish_async(self) -> None:
        """At the end: give collectives still writing recorded tensors a moment, then record the rest unread
        (never by waiting for a work: the script did not, and it may never complete)."""
        deadline = time.monotonic() + ASYNC_CLOSE_WAIT_S
        for item in self._pending:
            if isinstance(item, AsyncRecord):
                while item.row is None and time.monotonic() < deadline:
                    self.poll_async()
                    time.sleep(0.005)
                item.abandon()
        self.polled.clear()

    def record_object(self, kind: Kind, name: str, value: Any, loc: int | None = None) -> None:
        """Record everything inside `value` (torch.save's argument): its tensors, and its other values by
        a stable encoding (recorder/objects.py); a value that cannot be encoded becomes an `unobserved`
        event, listed under "not observed" in the report."""
        if loc is None:
            loc = self.location_id(2)
        for path, leaf in walk_object(value, name):
            if isinstance(leaf, torch.Tensor):
                self.record_tensor(kind, self.intern(path), leaf, 0, loc)
            elif isinstance(leaf, PythonNumber):
                self.record_tensor(kind, self.intern(path), leaf.tensor, 0, loc, flags=_PYTHON_VALUE)
            elif isinstance(leaf, Encoded):
                self._emit((kind, leaf.dtype, self.local.flag, 0, self.intern(path), 0, loc, self.step,
                            self._shape_id(torch.Size()), 0, leaf.digest, 0, 0, leaf.samples))
            else:
                self.event(UnobservedEvent(type="unobserved", what=path, name=leaf.type_name,
                                           loc=self.writer.text(loc)))

    def end_step(self) -> None:
        """Called after each primary optimizer step: flush, and forget per-step caches."""
        self.step += 1
        now, cpu = time.perf_counter(), time.process_time()
        if len(self.step_times) < MAX_STEP_TIMES:
            self.step_times.append(round(now - self._step_started, 6))
            self.step_cpu_times.append(round(cpu - self._step_cpu_started, 6))
        self._step_started, self._step_cpu_started = now, cpu
        self.forget_digests()
        self.resolve_pending()
        self.writer.sync()
        self.writer.flush()
        for callback in self.step_callbacks:
            callback(self.step)

    def root_forward(self, module_id: int) -> None:
        """A root module's forward starts: a second one since the last clear is a new iteration."""
        if module_id in self._roots_run:
            self.forget_digests()
        self._roots_run.add(module_id)

    def forget_digest(self, t: torch.Tensor) -> None:
        """Drop what is cached for one tensor: it was just written in place."""
        for cache in self.digest_caches:
            cache.pop(id(t), None)

    def forget_digests(self) -> None:
        self._roots_run.clear()
        for cache in self.digest_caches:
            cache.clear()

    def event(self, event: Event) -> None:
        self.resolve_pending()
        self.writer.event(cast(dict[str, Any], event))

    def _device_reducer(self) -> DeviceReducer:
        """The reducer of device tensors, made on first use (a CPU-only run never builds one)."""
        if self._reducer is None:
            self._reducer = DeviceReducer(notify=self._device_digest_failed)
        return self._reducer

    def _device_digest_failed(self, detail: str) -> None:
        """Told by the reducer, maybe while it resolves pending records: written at once, not behind them."""
        self.writer.event(cast(dict[str, Any], DeviceDigestEvent(type="device-digest", detail=detail)))

    def flush_safely(self) -> None:
        """Flush from a signal handler: skipped if the interrupted code was mid-flush."""
        if not self.writer.busy:
            self.writer.flush()

    def close(self, footer: dict[str, Any]) -> None:
        self._finish_async()
        self.resolve_pending()
        self.writer.close({**footer, "step_times": self.step_times, "step_cpu_times": self.step_cpu_times}
                          if self.step_times else footer)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def one_ulp(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` with the lowest bit of its first element flipped (one ULP for a float): the
    `--self-check` negative control. The script's own tensor is untouched. A sparse or nested tensor
    gets the change in its first element (fingerprint.parts); one without values (meta, quantized:
    --self-check never picks those) is returned as it is."""
    if t.device.type == "meta":
        return t
    with torch.no_grad():
        if is_plain(t):
            copy = t.detach().clone(memory_format=torch.contiguous_format)
            held: tuple[torch.Tensor, ...] = (copy,)
        else:
            copy = t.detach().clone()
            p = parts(copy)  # views into the copy
            held = () if p.values is None else p.tensors[p.values:]
        return copy if any(_flip_first(x) for x in held) else t


def _flip_first(x: torch.Tensor) -> bool:
    """Flip the lowest bit of `x`'s first element in place; False when it has none to flip."""
    bits = _BITS.get(x.element_size())
    if bits is None or x.numel() == 0:
        return False
    words = x.view(bits)
    words[(0,) * words.dim()] ^= 1
    return True


_uncounted = itertools.count(-1, -1)


def version_of(t: torch.Tensor) -> int:
    """The tensor's version counter; a never-repeated negative number for one that has none (made under
    `torch.inference_mode()`), so no digest cached for it is ever trusted again."""
    try:
        return t._version
    except RuntimeError:
        return next(_uncounted)


def iter_tensors(value: Any, name: str, depth: int = 0) -> Any:
    """Yield (path, tensor) for every tensor in a (possibly nested) value, in a stable order."""
    if isinstance(value, torch.Tensor):
        yield name, value
        return
    if depth > 8:
        return
    if isinstance(value, torch.nn.Module):
        for key, t in value.state_dict(keep_vars=True).items():
            yield f"{name}.{key}", t
    elif isinstance(value, torch.optim.Optimizer):
        for gi, group in enumerate(value.param_groups):
            for pi, p in enumerate(group["params"]):
                for key, t in sorted(value.state.get(p, {}).items()):
                    if isinstance(t, torch.Tensor):
                        yield f"{name}.group{gi}.param{pi}.{key}", t
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from iter_tensors(item, f"{name}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from iter_tensors(item, f"{name}[{i}]", depth + 1)
