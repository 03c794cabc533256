"""`detaudit watch`'s step replay: every op of a checked step runs twice, in the process, and must agree bit for bit.

On a checked step (the first optimizer step, then every `every`-th) a TorchDispatchMode executes each aten op
as the script asked (the first execution, whose result the script keeps), then once more on copies of its
inputs (the second), and compares the outputs bit for bit. Inputs an op writes (in-place ops, `out=`) are
copied before the first execution, so the second starts from what the first saw. A random op draws again from
its generator's state as the first execution found it, and the generator is left where the first execution
left it: the script draws exactly what a plain run draws. On a mismatch a third execution tells a flaky result
(it agrees with one of the two) from an op that gives a new answer each time. No fork: it works on CUDA too.

Not re-executed (counted as skipped): ops that allocate uninitialised memory (`empty` and kin: their bytes are
leftovers), collectives (c10d: a second execution would talk to the other ranks), view ops (they compute
nothing), profiler and `set_`-onto-storage ops (bookkeeping, data from another process), and everything inside
`optimizer.step()` (detaudit's own fingerprints run there; the update's inputs, the gradients, are replayed).

A step's window opens when the step before it ended (step 0's: when torch was imported, so model building is
checked with it) and closes at the optimizer step's start. With `on_mismatch == "stop"` the job is stopped at
the first `torch.save` or `optimizer.step()` after a mismatch, before it runs: the checkpoint it was about to
write is not written, the update derived from the step is not applied. A mismatch the watching parent finds
(replicas, --against) stops a torch.save too: the save first waits for the parent to catch up (save_gate.py).

What it finds is appended to the events file (JSON lines, read back by run/watchlog.py) with `os.write`, as
it happens: the watching parent reports mismatches and progress while the job runs.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from _thread import get_ident
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from detaudit.recorder import kept, location, save_gate
from detaudit.recorder.bitwise import INT_OF, agrees, differs
from detaudit.recorder.core import Recorder
from detaudit.recorder.eventlog import EventLog
from detaudit.recorder.opinfo import PASS_NAMESPACES, RANDOM_OPS, STORAGE_ALIAS_OPS, UNINIT_OPS, tensors_in
from detaudit.recorder.patch import wrap
from detaudit.recorder.scratch import scratch_outputs
from detaudit.recorder.steprule import StepRule

# Test-only seam: flip the lowest bit of one op's first output element on one step's `execution` (1: the
# script's own result, 2: the replay's). JSON, e.g. {"op": "aten.mm.default", "step": 0, "execution": 2}.
TEST_FLIP_ENV = "DETAUDIT_TEST_WATCH_FLIP"
REPLAY, PASS, UNINIT, COLLECTIVE = "replay", "pass", "uninitialised", "collective"
# run once, never replayed: they may act outside their tensors (the reason is followed by the op's name)
CUSTOM, EFFECTFUL, SUBCLASS = "custom op", "effectful op", "tensor subclass"
COMPUTE_NAMESPACES = frozenset({"aten", "prims"})  # torch's own computing ops (`prim`: passed through)
_GROUP_ARGUMENTS = frozenset({"group_name", "group"})  # a process group by name (a `str`, or `Any`)
FAILED = "replay failed"  # the second execution raised (out of memory for the copies): that op is unchecked
# a checked step after the first replays at most this many ops run outside autograd (no_grad, inference mode,
# not a backward): a rollout's hundreds of no-grad forwards are not all the step (docs/watch.md)
NO_GRAD_BUDGET = 256
OVER_BUDGET = "no-grad, over the step's budget"


class StepReplay(TorchDispatchMode):
    """Runs each op of a checked step twice (three times on a mismatch) and reports outputs that differ."""

    def __init__(self, recorder: Recorder, log: EventLog, flip: dict[str, Any] | None) -> None:
        super().__init__()
        self.rec = recorder
        self.log = log
        self.flip = flip
        self.kinds: dict[Any, OpPlan] = {}
        self.replayed = 0
        self.skipped: dict[str, int] = {}
        self.set_aside: dict[str, int] = {}  # op -> outputs replayed but not compared: no results (scratch.py)
        self.mismatches = 0
        self.forked = False  # a forked DataLoader worker inherits the mode: it replays nothing
        self.thread: int | None = None  # the thread whose ops are replayed (the mode is entered per thread)
        self.step = 0  # the watcher's step (recorder/steprule.py: optimizer steps, or backward() calls)
        self.budget: int | None = None  # the no-grad ops the window may still replay (None: all of them)
        os.register_at_fork(after_in_child=self._in_forked_child)

    def _in_forked_child(self) -> None:
        self.forked = True

    def __enter__(self) -> StepReplay:
        """Entered on a thread, the mode replays that thread's ops (until `thread` says another's, or none)."""
        super().__enter__()
        self.thread = get_ident()
        return self

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Compiled regions run as compiled (not replayed): the script computes what it computes unwatched."""
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # run for every op of a checked step, views included: kept lean (a checked step's cost over twice a
        # plain one is mostly this method's and the comparison's; benchmarks/watch.py)
        kwargs = kwargs or {}
        kind = self.kinds.get(func)
        if kind is None:
            kind = self.kinds[func] = _kind(func)
        what, written, random, aside = kind
        if what is PASS or self.rec.internal or self.forked or get_ident() != self.thread:
            return func(*args, **kwargs)
        if types and what is REPLAY:  # a tensor subclass's own dispatch comes next: it may communicate (DTensor)
            what = SUBCLASS
        if what is REPLAY and self.budget is not None and not torch.is_grad_enabled() and _current_node() is None:
            if self.budget > 0:
                self.budget -= 1
            else:
                what = OVER_BUDGET  # run once, as the script asked
        if what is not REPLAY:
            self.skipped[what] = self.skipped.get(what, 0) + 1
            return func(*args, **kwargs)
        if aside:
            op = str(func)
            self.set_aside[op] = self.set_aside.get(op, 0) + len(aside)
        if written or random or self.flip is not None:
            return self._replay(func, args, kwargs, kind)
        # an op that only reads its inputs and draws nothing: run again on the same inputs, no copy, no state
        first = func(*args, **kwargs)
        try:
            second = func(*args, **kwargs)
            apart = differs(first, second, aside)
            if apart is not None:
                self._mismatch(func, apart, agrees(first, second, func(*args, **kwargs), aside), depth=2)
            self.replayed += 1
        except Exception:  # the replay's own failure (out of memory) is never the script's
            self.skipped[FAILED] = self.skipped.get(FAILED, 0) + 1
        return first

    def _replay(self, func: Any, args: Any, kwargs: Any, kind: OpPlan) -> Any:
        """The general case: inputs the op writes copied first, the generator's state restored, the test seam."""
        _, written, random, aside = kind
        writes = bool(written)
        try:
            copy = _copier(args, kwargs, written)
            pristine = copy((args, kwargs)) if writes else (args, kwargs)
        except Exception:  # no memory for the copies: the op runs once, unchecked
            self.skipped[FAILED] = self.skipped.get(FAILED, 0) + 1
            return func(*args, **kwargs)
        generator = _generator(args, kwargs) if random else None
        before = generator.get_state() if generator is not None else None
        first = func(*args, **kwargs)
        self._flip(func, first, 1)
        after = generator.get_state() if generator is not None else None
        try:
            second = self._again(func, copy(pristine) if writes else pristine, generator, before, 2)
            apart = differs(first, second, aside)
            if apart is not None:
                third = self._again(func, pristine, generator, before, 3)
                self._mismatch(func, apart, agrees(first, second, third, aside))
            self.replayed += 1
        except Exception:  # the replay's own failure (out of memory for the copies) is never the script's
            self.skipped[FAILED] = self.skipped.get(FAILED, 0) + 1
        finally:
            if generator is not None:
                generator.set_state(after)
        return first

    def _again(self, func: Any, inputs: Any, generator: Any, state: Any, execution: int) -> Any:
        if generator is not None:
            generator.set_state(state)
        out = func(*inputs[0], **inputs[1])
        self._flip(func, out, execution)
        return out

    def _flip(self, func: Any, out: Any, execution: int) -> None:
        """The test seam: one bit of one output element, once."""
        flip = self.flip
        if flip is None or flip.get("execution", 1) != execution or flip["step"] != self.step \
                or flip["op"] != str(func):
            return
        target = next(iter(tensors_in(out)), None)
        if target is None or target.numel() == 0 or target.element_size() not in INT_OF:
            return
        bits = target.reshape(-1)[:1].view(INT_OF[target.element_size()])
        bits.bitwise_xor_(1)
        self.flip = None

    def _mismatch(self, func: Any, differs: tuple[float, int], third: str, depth: int = 3) -> None:
        """`depth`: this frame's distance from the op's caller (through __torch_dispatch__, and _replay)."""
        self.mismatches += 1
        node: Any = torch._C._current_autograd_node()
        frame = location.user_frame(depth)
        where = f"{location.display_path(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else None
        stack = self.rec.local.module_stack
        module = self.rec.writer.text(stack[-1]) if stack and node is None else None
        self.log.write({"event": "mismatch", "step": self.step, "op": str(func), "module": module,
                        "location": where, "backward_of": None if node is None else node.name(),
                        "max_abs_diff": differs[0], "max_ulp": differs[1], "third_agrees_with": third})


_current_node = torch._C._current_autograd_node  # not None while a backward pass runs


# the arguments an op writes (in place, `out=`), by position in its schema and by name
Written = tuple[tuple[int, str], ...]
# what the replay does with an op, the inputs it writes, whether it draws random numbers, and the positions of
# its outputs that are no results (recorder/scratch.py: never compared)
OpPlan = tuple[str, Written, bool, frozenset[int]]
_NONE: frozenset[int] = frozenset()


def _kind(func: Any) -> OpPlan:
    """What the replay does with an op: replay it, pass it through, or skip it (and why); the inputs it writes;
    whether it draws random numbers; its outputs that are no results (a workspace for its backward). Only torch's
    own computing ops are replayed, and of them only those with no registered effect: any other op may act outside
    its tensors (a custom op's Python writing a file), so it runs once, as the script asked, named in the report."""
    packet = func.overloadpacket.__name__
    if func.namespace in PASS_NAMESPACES or func.is_view or \
            (packet in STORAGE_ALIAS_OPS and "Storage" in func._overloadname):
        return PASS, (), False, _NONE
    if packet in UNINIT_OPS:
        return UNINIT, (), False, _NONE
    if communicates(func):
        return COLLECTIVE, (), False, _NONE
    if func.namespace not in COMPUTE_NAMESPACES:
        return f"{CUSTOM} {func}", (), False, _NONE
    if _effect(func) is not None:
        return f"{EFFECTFUL} {func}", (), False, _NONE
    written = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                    if a.is_out or (a.alias_info is not None and a.alias_info.is_write))
    random = packet in RANDOM_OPS or torch.Tag.nondeterministic_seeded in func.tags
    return REPLAY, written, random, scratch_outputs(func)


def communicates(func: Any) -> bool:
    """Whether an op talks to other processes, by its namespace or its schema: torch.distributed's namespaces
    (`c10d`, `_c10d_functional` with its `wait_tensor`, `_c10d_functional_autograd`, ...), or an argument or
    result that is a process group, a work handle or a group's name (`_dtensor`'s, `symm_mem`'s ops)."""
    if "c10d" in func.namespace:
        return True
    schema = func._schema
    return any("c10d" in str(a.type) or (a.name in _GROUP_ARGUMENTS and str(a.type) in ("str", "Any"))
               for a in (*schema.arguments, *schema.returns))


def _effect(func: Any) -> Any:
    """The effect torch registered for an op (`aten._print`: it prints), None for a pure one."""
    try:
        return torch._library.simple_registry.singleton.find(func.name()).effect.effect
    except Exception:  # a torch without the registry: nothing registered
        return None


def _copier(args: Any, kwargs: Any, written: Written) -> Callable[[Any], Any]:
    """How the call's (args, kwargs) are copied for another execution: the inputs the op writes cloned, those it
    only reads shared (the first execution leaves them as they were), unless a read input shares memory with a
    written one (`add_(x, x.t())`): then every tensor is cloned."""
    positions = {i for i, _ in written}
    names = {name for _, name in written}
    try:
        writes = {_storage(t) for i, a in enumerate(args) if i in positions for t in tensors_in(a)} | \
            {_storage(t) for k, v in kwargs.items() if k in names for t in tensors_in(v)}
        reads = [_storage(t) for i, a in enumerate(args) if i not in positions for t in tensors_in(a)] + \
            [_storage(t) for k, v in kwargs.items() if k not in names for t in tensors_in(v)]
    except Exception:  # a tensor with no storage to compare (a subclass, a sparse one): clone them all
        return _copy
    if any(r in writes for r in reads):
        return _copy

    def copy_written(call: Any) -> Any:
        memo: dict[int, Any] = {}  # one clone per tensor: written aliases stay aliases
        call_args, call_kwargs = call
        return (tuple(_copy(a, memo) if i in positions else a for i, a in enumerate(call_args)),
                {k: _copy(v, memo) if k in names else v for k, v in call_kwargs.items()})

    return copy_written


def _storage(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def _copy(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """The call's arguments with every tensor cloned (one clone per tensor: aliases stay aliases)."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            memo[id(value)] = value.clone()
        return memo[id(value)]
    if isinstance(value, tuple):
        return tuple(_copy(item, memo) for item in value)
    if isinstance(value, list):
        return [_copy(item, memo) for item in value]
    if isinstance(value, dict):
        return {key: _copy(item, memo) for key, item in value.items()}
    return value


def _generator(args: Any, kwargs: Any) -> Any:
    """The generator a random op draws from: the one it was given, else its device's default."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Generator):
            return value
    device = kwargs.get("device")
    if device is None:
        device = next((t.device for t in tensors_in(list(args)) if isinstance(t, torch.Tensor)), None)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return torch.default_generator


def _target(f: Any) -> str:
    """Where a torch.save call writes, for the report."""
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    return str(getattr(f, "name", "a file object"))


class Watcher:
    """Opens and closes the checked steps' windows, logs each step, and stops the job when it must."""

    def __init__(self, recorder: Recorder, config: dict[str, Any], stop: Callable[[str], None]) -> None:
        self.rec = recorder
        self.every = int(config["every"])
        self.stop_job = stop if config.get("on_mismatch", "stop") == "stop" else None
        self.log = EventLog(config["events"])
        flip = os.environ.get(TEST_FLIP_ENV)
        self.mode = StepReplay(recorder, self.log, json.loads(flip) if flip else None)
        self.rule = StepRule()
        self.step = 0  # steps ended, by the rule's boundary (the recorder counts optimizer steps only)
        self.entered: set[int] = set()  # the threads that entered the mode (dispatch modes are per thread)
        self.watched = False  # whether the open window's ops are those of the thread that steps the optimizer
        self.owed: int | None = None  # a step checked in place of one whose window was on another thread
        self.stopped = False
        self.handshake: str | None = config.get("handshake")  # the parent's checks' progress (recorder/save_gate.py)
        self.patience = float(config.get("save_patience_s", 0.0))
        self.parent_mismatch = False
        # while a stop before a save can come, the files the script truncates are kept (recorder/kept.py)
        self.kept = kept.KeptFiles(os.path.dirname(os.path.abspath(config["events"])), self._stop_may_come)

    def install(self) -> None:
        from torch.optim import optimizer as optim

        self.rec.step_callbacks.append(self._on_step)
        # the window closes in the first of the global pre-hooks, before the recorder fingerprints the gradients
        # (its own ops, not replayed, each would still pass through the mode's Python dispatch); the stop comes
        # in the last, once the recorder has taken the step in (its count, the gradients the update would use)
        handle = optim.register_optimizer_step_pre_hook(lambda *_: self._update_starts())
        pre_hooks = getattr(optim, "_global_optimizer_pre_hooks", None)
        if isinstance(pre_hooks, OrderedDict) and handle.id in pre_hooks:
            pre_hooks.move_to_end(handle.id, last=False)
        optim.register_optimizer_step_pre_hook(self._before_update)
        watcher = self

        def make_save(original: Callable[..., Any]) -> Callable[..., Any]:
            def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
                watcher._await_parent(_target(f))
                watcher._halt_if_mismatched("torch.save", _target(f), f)
                result = original(obj, f, *args, **kwargs)
                watcher.kept.forget()
                return result

            return save

        wrap(torch, "save", make_save)
        wrap(torch.serialization, "save", lambda _: torch.save)
        self._watch_backward()
        if self.stop_job is not None:
            kept.install(self.kept)
        atexit.register(self._at_exit)  # after the child's footer handler: runs before it
        self._open(self.step)

    def _watch_backward(self) -> None:
        """Tell the step rule (recorder/steprule.py) of each optimizer made and each backward() that returns."""
        rule, watcher = self.rule, self

        def make_init(original: Callable[..., None]) -> Callable[..., None]:
            def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
                rule.optimizer_built()
                original(optimizer, *args, **kwargs)

            return init

        def make_backward(original: Callable[..., Any]) -> Callable[..., Any]:
            def backward(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                if not watcher.rec.internal:  # not a closure's, inside optimizer.step
                    watcher.backward_returned()
                return result

            return backward

        wrap(torch.optim.Optimizer, "__init__", make_init)
        wrap(torch.autograd, "backward", make_backward)

    def backward_returned(self) -> None:
        """A backward() returned: in a script that made no optimizer before its first one, it ends the step (its
        window closes, the next step's opens); after a mismatch the job is stopped here, before the update the
        script derives from this backward."""
        first = self.rule.boundary is None
        if not self.rule.backward_returned() or self.stopped:
            return
        if first:
            self.log.write({"event": "boundary", "boundary": "backward", "step": self.step})
        self._update_starts()
        self._halt_if_mismatched("update", None)
        self._step_ended()

    def _stop_may_come(self) -> bool:
        """Whether a torch.save may be stopped: after a replay mismatch, or while the parent's checks may find one."""
        return self.stop_job is not None and bool(self.mode.mismatches or self.parent_mismatch or self.handshake)

    def _checked(self, step: int) -> bool:
        return step % self.every == 0 or step == self.owed

    def _open(self, step: int) -> None:
        """Open step `step`'s window on this thread (the one that ended the step before it), if it is checked."""
        # once a step ended (the run's boundary is known), a window's no-grad work is bounded; step 0's is whole
        self.mode.budget = NO_GRAD_BUDGET if step > 0 else None
        if self._checked(step) and not self.stopped:
            here = get_ident()
            if here not in self.entered:
                self.entered.add(here)
                self.mode.__enter__()
            self.mode.thread = here

    def _close(self) -> None:
        """Leave the mode on this thread. Dispatch modes are per thread: a window opened on another thread (step
        0's, on the thread that imported torch, when the training runs on a thread of its own) cannot be left
        from here; it stays entered there but replays nothing (`StepReplay.thread`), and is left at exit."""
        here = get_ident()
        if self.mode.thread == here:
            self.mode.thread = None
        if here in self.entered:
            self.mode.__exit__(None, None, None)
            self.entered.discard(here)

    def _update_starts(self) -> None:
        """An optimizer step starts: its step's window closes. The step counts as checked only when the window
        replayed this thread's ops, the training's: one that replayed another thread's (step 0's, opened where
        torch was imported, while the training runs on a thread of its own) does not."""
        window = self.mode.thread
        if window is not None:
            self.watched = window == get_ident()
            self.mode.thread = None
        self._close()

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._close()
        self._halt_if_mismatched("optimizer.step", None)

    def _on_step(self, step: int) -> None:
        """The recorder's optimizer step ended (on this thread): the step rule's boundary from now on."""
        self.rule.optimizer_stepped()
        self._step_ended()

    def _step_ended(self) -> None:
        """The step ended: log it, open the next checked step's window here (this thread). A checked step whose
        window was on another thread is owed: the next one is checked."""
        self._close()
        self.kept.forget()
        ended = self.step
        self.step = self.mode.step = ended + 1
        checked = self._checked(ended) and self.watched
        if self._checked(ended) and not self.watched:
            self.owed = self.step
        self._log_step(ended, checked=checked, thread=threading.current_thread().name)
        self.watched = False
        self._open(self.step)

    def _log_step(self, step: int, **event: Any) -> None:
        """One event for step `step` (by default: it ended), with what its replay did; the counts restart."""
        mode = self.mode
        self.log.write({"event": "step", "step": step, "checked": self._checked(step), **event,
                        "replayed": mode.replayed, "skipped": dict(mode.skipped), "set_aside": dict(mode.set_aside)})
        mode.replayed = 0
        mode.skipped.clear()
        mode.set_aside.clear()

    def _await_parent(self, target: str) -> None:
        """Before a torch.save: wait until the parent compared every step that ended (save_gate.py)."""
        if self.stop_job is None or self.handshake is None or self.stopped:
            return
        gate = save_gate.await_check(self.handshake, self.rec.step - 1, self.patience)
        if gate is save_gate.Gate.MISMATCH:
            self.parent_mismatch = True
        elif gate is save_gate.Gate.TIMED_OUT:
            self.log.write({"event": "unchecked_save", "step": self.rec.step, "target": target,
                            "waited_s": self.patience})

    def _halt_if_mismatched(self, before: str, target: str | None, f: Any = None) -> None:
        """Stop the job before `before` after a mismatch; a torch.save's file (`f`) is left as it was."""
        if self.stop_job is None or not (self.mode.mismatches or self.parent_mismatch):
            return
        restored = self.kept.restore(f) if f is not None else None
        if not self.stopped:  # a save in the script's `finally` while it unwinds is stopped too, unlogged
            self.stopped = True
            self.mode.thread = None  # nothing is replayed any more, on any thread
            self._close()
            self._log_step(self.step, event="stopped", before=before, target=target, kept=restored)
        self.stop_job(before)

    def _at_exit(self) -> None:
        self._close()
        self.kept.forget()
        if not self.stopped:
            self._log_step(self.step, event="end")


def install(recorder: Recorder, config: dict[str, Any], stop: Callable[[str], None]) -> Watcher:
    """Start watching: `config` is the child config's `watch` entry; `stop(before)` ends the job (it raises)."""
    watcher = Watcher(recorder, config, stop)
    watcher.install()
    return watcher
