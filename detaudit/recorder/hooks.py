"""Automatic checkpoints: global torch hooks that need no change to the audited script.

- every nn.Module forward output, named by qualified name (`encoder.layers.0.attn`);
- every parameter gradient just before optimizer.step (under `step(closure)`, when the closure,
  which runs the backward, first returns), and parameters, optimizer state and the
  registered buffers of the models it trains (running statistics, EMA shadows, counters) just after it;
  before any optimizer has stepped (inference), each buffer a root forward changed;
- everything passed to torch.save: its tensors, and its other values by a stable encoding;
- the inputs of each root module (the batch the model is given).
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from detaudit.recorder.boundary import HostGroup, StepLayout
from detaudit.recorder.compiled import compiling, is_wrapper, plain_name
from detaudit.recorder.compiled import evidence as compile_evidence
from detaudit.recorder.core import Recorder, iter_tensors, version_of
from detaudit.recorder.patch import wrap
from detaudit.trace import Kind

_VERSIONS_LIMIT = 4096


class ModuleNames:
    """Qualified names for modules and parameters, learned lazily as models are first called.

    A module seen for the first time in a forward-pre hook is a root (outer modules run their
    pre hook before their children), so its whole subtree is named from it.
    """

    def __init__(self) -> None:
        self.modules: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        # Tensors compare elementwise, so parameters are keyed by id with a weakref to guard reuse.
        self.params: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
        self._roots: dict[str, int] = {}
        self.roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.holders: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # see add_root

    def add_root(self, root: torch.nn.Module, numbered: bool = True, holder: torch.nn.Module | None = None) -> None:
        """Name a root `Net`, `Net#2`, ... by first call. Not `numbered` (first called on another
        thread): that order is the scheduler's, so all such roots of a class share its name.

        `holder`: a module that holds `root` but whose own forward never ran (a LightningModule calling
        `self.net(x)` from `training_step`): the root and its subtree are named from it (`net`, `net.0`,
        `net.0.weight`), so two `Sequential`s it holds never share names, and so are its other parameters."""
        prefix = ""
        if holder is not None:
            prefix = next((plain_name(q) + "." for q, m in holder.named_modules(remove_duplicate=False) if m is root),
                          "")
            self.holders.add(holder)
            self._name_params(holder, "")
        base = type(root).__name__
        root_name = prefix[:-1] if prefix else base
        if numbered and not prefix:
            count = self._roots.get(base, 0) + 1
            self._roots[base] = count
            root_name = base if count == 1 else f"{base}#{count}"
        self.roots.add(root)
        for qual, module in root.named_modules(remove_duplicate=False):
            if qual and (module not in self.modules or module in self.roots):
                self.modules[module] = prefix + plain_name(qual)
                self.roots.discard(module)
        self.modules[root] = root_name
        self._name_params(root, prefix)

    def _name_params(self, owner: torch.nn.Module, prefix: str) -> None:
        for qual, param in owner.named_parameters(remove_duplicate=False):
            known = self.params.get(id(param))
            if known is None or known[0]() is not param:
                self.params[id(param)] = (weakref.ref(param), prefix + plain_name(qual))

    def param_name(self, param: torch.Tensor, group: int, index: int) -> str:
        """A parameter's qualified name; one no forward showed (its module ran under `torch.func.functional_call`,
        which swaps the parameters out while it runs, and the script assigned `p.grad` itself) is looked up
        in the models seen, as they hold their parameters again; `group0.param1` when none holds it."""
        for _ in range(2):
            known = self.params.get(id(param))
            if known is not None and known[0]() is param:
                return known[1]
            for owner in [*self.holders, *self.roots]:  # a holder names what it holds (add_root)
                self._name_params(owner, "")
        return f"group{group}.param{index}"


class Hooks:
    """Installs the global hooks for one Recorder (for the life of the repeat)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.names = ModuleNames()
        # Training steps (see `_on_step_pre`): the counting optimizer, the optimizers stepped since its last
        # step, the ones stepped right after it (None once the tail closed) and the step a tail step borrows.
        self._primary: weakref.ref[torch.optim.Optimizer] | None = None
        self._stepped: set[int] = set()
        self._tail: set[int] | None = None
        self._lent: int | None = None
        self._borrower: int | None = None  # id of the optimizer whose step borrowed `_lent`
        # the last optimizer that stepped after the counting one in its own part of the iteration (a GAN's
        # generator), and whether the counting has been handed to it: the step ends with the iteration's last update
        self._later: weakref.ref[torch.optim.Optimizer] | None = None
        self._handed = False
        # id(optimizer) -> what its steps record (recorder/boundary.py); `_names_epoch` counts the times the
        # parameters' names may have changed (a new root renames modules), which makes each layout anew
        self._layouts: dict[int, StepLayout] = {}
        self._names_epoch = 0
        self._state_ids: dict[tuple[int, str], int] = {}  # (name id, state key) -> name id of the state record
        self._buffer_group: HostGroup | None = None  # the buffers recorded after the last step
        self._schedulers: dict[int, str] = {}  # id(scheduler) -> record name, in order of first step
        # id(buffer) -> (weakref, version when last recorded): inference records only the buffers a forward changed
        self._buffer_versions: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        self.stopped: str | None = None  # why recording stopped (a hook raised), if it did
        # id(module) -> (weakref, name id, is a root, id of the module a compile wrapper wraps). Keyed by id
        # with a weakref check rather than a WeakKeyDictionary/WeakSet, whose lookups allocate a weakref on
        # every module call.
        self._modules: dict[int, tuple[weakref.ref[torch.nn.Module], int, bool, int]] = {}

    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        nn_module.register_module_forward_pre_hook(self.guard(self._on_forward_pre))
        nn_module.register_module_forward_hook(self.guard(self._on_forward))
        optim.register_optimizer_step_pre_hook(self.guard(self._on_step_pre))
        optim.register_optimizer_step_post_hook(self.guard(self._on_step_post))
        # torch.compile(model) warns that global hooks fire for its wrapper too; these hooks skip
        # the wrapper (recorder/compiled.py), and plain python would print no such warning.
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        def make_save(original_save: Callable[..., Any]) -> Callable[..., Any]:
            def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
                if not compiling():
                    self.guard(self._on_save)(obj)
                return original_save(obj, f, *args, **kwargs)

            return save

        wrap(torch, "save", make_save)
        wrap(torch.serialization, "save", lambda _: torch.save)  # the same wrapper, as `torch.save is` it
        self._wrap_schedulers()

    def _wrap_schedulers(self) -> None:
        """Record each LR scheduler's state after its `step()` (its own step: ReduceLROnPlateau's too)."""
        from torch.optim import lr_scheduler

        for cls in (getattr(lr_scheduler, "LRScheduler", None), getattr(lr_scheduler, "ReduceLROnPlateau", None)):
            if cls is None or "step" not in vars(cls):
                continue

            def make(original: Callable[..., Any]) -> Callable[..., Any]:
                def step(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
                    result = original(scheduler, *args, **kwargs)
                    if not compiling():
                        self.guard(self._on_scheduler_step)(scheduler)
                    return result

                return step

            wrap(cls, "step", make)

    def guard(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """`hook`, made unable to break the script: if recording raises, recording stops for the rest of
        the repeat (the trace keeps what was recorded and its footer says why) and the script runs on.
        What the hook returns is passed on (a step pre-hook's new arguments)."""

        def guarded(*args: Any) -> Any:
            if compiling() or self.stopped is not None or self.recorder.local.paused:
                return None
            try:
                return hook(*args)
            except Exception as exc:
                self.stopped = f"{type(exc).__name__}: {exc}"
                print(f"detaudit: recording stopped, this repeat is recorded only up to here: {self.stopped}",
                      file=sys.stderr)
                return None

        return guarded

    # -- modules ---------------------------------------------------------------------------
    # Every hook returns at once while dynamo traces (recorder/compiled.py): nothing enters the graph.
    # The `OptimizedModule` of `torch.compile(model)` is recorded as `model` (its name, at its
    # boundary, outside the compiled code); `model`'s own hooks, inside that call, are skipped.
    def _module(self, module: torch.nn.Module) -> tuple[weakref.ref[torch.nn.Module], int, bool, int]:
        """(weakref, name id, is a root, id of the wrapped module or 0) of a module, learning its
        name on first sight."""
        entry = self._modules.get(id(module))
        if entry is not None and entry[0]() is module:
            return entry
        key = id(module)
        inner = 0
        named = module
        if is_wrapper(module):
            named = module._orig_mod  # type: ignore[assignment]
            inner = id(named)
        if named not in self.names.modules:
            self.names.add_root(named, numbered=not self.recorder.local.flag, holder=_holder(named))
            self._modules.clear()  # the new root may have renamed modules seen before (former roots)
            self._names_epoch += 1  # and named parameters an optimizer stepped before
        if inner:
            self.recorder.event({**compile_evidence(), "module": self.names.modules[named]})

        def forget(ref: weakref.ref[torch.nn.Module]) -> None:
            if self._modules.get(key, (None,))[0] is ref:
                del self._modules[key]

        entry = (weakref.ref(module, forget), self.recorder.intern(self.names.modules[named]),
                 named in self.names.roots, inner)
        self._modules[key] = entry
        return entry

    def _on_forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if compiling():
            return
        rec = self.recorder
        _, module_id, is_root, inner = self._module(module)
        wrapped = rec.local.wrapped
        if wrapped and wrapped[-1] == id(module):
            return  # called by its torch.compile wrapper, which records this call
        if inner:
            wrapped.append(inner)
        rec.local.module_stack.append(module_id)  # op records name the innermost running module
        if is_root:
            self._close_tail()
            rec.root_forward(module_id)
            if not rec.record_modules:
                return
            # The data a model is given: tells a data-pipeline cause from a model-internal one.
            loc = rec.location_id(1)
            for path, tensor in iter_tensors(args, rec.writer.text(module_id) + ".input"):
                rec.record_tensor(Kind.INPUT, rec.intern(path), tensor, module_id, loc)

    def _on_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if compiling():
            return
        rec = self.recorder
        _, module_id, _, inner = self._module(module)
        wrapped = rec.local.wrapped
        if wrapped and wrapped[-1] == id(module):
            return
        if inner and wrapped and wrapped[-1] == inner:
            wrapped.pop()
        stack = rec.local.module_stack
        if stack and stack[-1] == module_id:
            stack.pop()
        elif module_id in stack:  # entries above it were left by forwards that raised
            del stack[len(stack) - 1 - stack[::-1].index(module_id):]
        if self._primary is None and self._modules[id(module)][2]:  # no optimizer has stepped (inference)
            root: torch.nn.Module = module._orig_mod if inner else module  # type: ignore[assignment]
            self._record_buffers([root], rec.location_id(1), changed_only=True)
        if not rec.record_modules:
            return  # the user's line is looked up only for a record: a walk up the stack at every module's call
        loc = rec.location_id(1)
        if isinstance(output, torch.Tensor):
            rec.record_tensor(Kind.OUTPUT, module_id, output, module_id, loc)
            return
        for path, tensor in iter_tensors(output, rec.writer.text(module_id)):
            rec.record_tensor(Kind.OUTPUT, rec.intern(path), tensor, module_id, loc)

    def module_name(self, module: torch.nn.Module) -> str | None:
        """The name a module's records carry (`Net`, `encoder.layers.0`), once it ran; None before."""
        named: torch.nn.Module = module._orig_mod if is_wrapper(module) else module  # type: ignore[assignment]
        return self.names.modules.get(named)

    def is_root_call(self, module: torch.nn.Module) -> bool:
        """Whether a forward that just ended was a root module's own call (a compiled model's
        once, at its wrapper); for forward hooks registered after this recorder's."""
        if compiling():
            return False
        wrapped = self.recorder.local.wrapped
        return not (wrapped and wrapped[-1] == id(module)) and self._module(module)[2]

    # -- optimizers ------------------------------------------------------------------------
    def layout(self, optimizer: torch.optim.Optimizer) -> StepLayout:
        """What `optimizer`'s steps record, with its parameters' name ids, from a cache: an optimizer step records
        every parameter and its state, so the name lookups were a good part of each small record's fixed cost."""
        layout = self._layouts.get(id(optimizer))
        if layout is None or layout.optimizer() is not optimizer or not layout.matches(optimizer, self._names_epoch):
            rec, key = self.recorder, id(optimizer)

            def forget(ref: weakref.ref[torch.optim.Optimizer]) -> None:
                if self._layouts.get(key) is not None and self._layouts[key].optimizer is ref:
                    del self._layouts[key]

            layout = StepLayout(optimizer, self._names_epoch,
                                lambda p, gi, pi: rec.intern(self.names.param_name(p, gi, pi)), forget)
            self._layouts[key] = layout
        return layout

    def named_params(self, optimizer: torch.optim.Optimizer) -> Any:
        """(name id, parameter) of each parameter of `optimizer`."""
        layout = self.layout(optimizer)
        return zip(layout.names, layout.params, strict=True)

    def _state_id(self, name_id: int, key: str) -> int:
        """String id of `name:key`, the record name of a parameter's optimizer state."""
        sid = self._state_ids.get((name_id, key))
        if sid is None:
            rec = self.recorder
            sid = self._state_ids[(name_id, key)] = rec.intern(f"{rec.writer.text(name_id)}:{key}")
        return sid

    def _on_step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        """A training step is one iteration, however many optimizers step in it. The first optimizer
        stepped counts the steps (`Recorder.end_step` after each of its steps); another one stepping right
        after it (no root forward in between: two optimizers, one per parameter set) belongs to the step
        that just ended and borrows its number; one stepping later (a GAN's generator after the
        discriminator's forward) belongs to the next. If an optimizer steps twice while the counting one
        does not (it was dropped for a new one), it counts the steps from then on."""
        if compiling():
            return
        rec = self.recorder
        key = id(optimizer)
        primary = self._primary() if self._primary is not None else None
        if primary is None:
            self._primary, primary = weakref.ref(optimizer), optimizer
        later = self._later() if self._later is not None else None
        if optimizer is primary and later is not None and id(later) in self._stepped and not self._handed:
            # the first optimizer of the iteration steps again after others that had a forward of their own (a
            # GAN's discriminator, then its generator): the iteration is now known, and its last update ends the
            # step from here on, so the count is one step per iteration and --max-steps stops after whole ones
            self._close_tail()
            self._primary, self._handed = weakref.ref(later), True
            self._stepped = {key}
        elif optimizer is primary:
            self._close_tail()
        elif self._tail is not None and key not in self._tail and rec.step > 0:
            self._tail.add(key)
            self._lent, self._borrower = rec.step, key
            rec.step -= 1
        else:
            self._close_tail()
            if key in self._stepped:
                rec.end_step()
                self._stepped.clear()
                self._primary = weakref.ref(optimizer)
            else:
                self._stepped.add(key)
                self._later = weakref.ref(optimizer)
        rec.local.module_stack.append(rec.intern(f"optimizer {type(optimizer).__name__}"))
        loc = rec.location_id(1)
        rec.internal += 1  # no op records inside the step (see Recorder.internal)
        # `args` holds the optimizer itself first (torch's step wrapper), then step's own arguments
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if callable(closure):  # forward and backward run inside the step (LBFGS, Lightning's training loop)
            return self._after_closure(optimizer, closure, loc, args, kwargs)
        self._record_grads(optimizer, loc)
        return None

    def _record_grads(self, optimizer: torch.optim.Optimizer, loc: int) -> None:
        self.recorder.record_group(*self.layout(optimizer).gradients(), loc)

    def _after_closure(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any], loc: int, args: Any,
                       kwargs: Any) -> tuple[Any, Any]:
        """`step(closure)`: the gradients this step uses exist only once the closure's backward ran, so they
        are recorded when it first returns (the ones present before the step are the previous step's)."""
        pending = [True]

        def closure_then_grads() -> Any:
            result = closure()
            if pending and not compiling():
                pending.clear()
                self.guard(self._record_grads)(optimizer, loc)
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_grads}
        return (args[0], closure_then_grads, *args[2:]), kwargs

    def _on_step_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if compiling():
            return
        rec = self.recorder
        rec.internal -= 1
        if rec.local.module_stack:
            rec.local.module_stack.pop()
        loc = rec.location_id(1)
        layout = self.layout(optimizer)
        rec.record_group(*layout.after_step(optimizer.state, self._state_id), loc)
        trained = layout.ids
        self._record_buffers([r for r in self.names.roots if any(id(p) in trained for p in r.parameters())], loc,
                             changed_only=False)
        if self._lent is not None:
            rec.step, self._lent = self._lent, None
        elif self._primary is not None and self._primary() is optimizer:
            rec.end_step()
            self._stepped.clear()
            self._later = None
            self._tail = set()

    # -- buffers ---------------------------------------------------------------------------
    def _record_buffers(self, roots: Iterable[torch.nn.Module], loc: int, changed_only: bool) -> None:
        """The registered buffers of `roots` (model state as much as the parameters: BatchNorm's running
        statistics, an EMA shadow, a step counter), named like parameters (`bn.running_mean`), roots in
        name order. `changed_only`: just those written since they were last recorded (version counter)."""
        rec, versions = self.recorder, self._buffer_versions
        if len(versions) > _VERSIONS_LIMIT:  # buffers reassigned on every forward leave dead entries
            for key in [k for k, (ref, _) in versions.items() if ref() is None]:
                del versions[key]
        names: list[int] = []
        tensors: list[torch.Tensor] = []
        for name, buf in self._buffers(roots):
            version = version_of(buf)
            known = versions.get(id(buf))
            if changed_only and known is not None and known[0]() is buf and known[1] == version:
                continue
            versions[id(buf)] = (weakref.ref(buf), version)
            names.append(rec.intern(name))
            tensors.append(buf)
        group = self._buffer_group
        if group is None or group.names != names:  # the same buffers at each step, usually
            group = self._buffer_group = HostGroup([Kind.BUFFER] * len(names), names, fresh=True)
        rec.record_group(group, tensors, loc)

    def _buffers(self, roots: Iterable[torch.nn.Module]) -> Iterator[tuple[str, torch.Tensor]]:
        seen: set[int] = set()
        for root in sorted(roots, key=lambda r: self.names.modules.get(r, "")):
            for qual, buf in root.named_buffers():
                if id(buf) not in seen:  # a module shared by two roots
                    seen.add(id(buf))
                    yield plain_name(qual), buf

    def _close_tail(self) -> None:
        """The steps right after the counting optimizer's are over: what comes next is the next step's."""
        self._tail = None
        if self._lent is not None:  # the borrowing step raised before its post hook, or runs a forward itself
            self.recorder.step, self._lent = self._lent, None
            if self._borrower is not None:  # (LBFGS's closure): no partner of the last step, a newcomer
                self._stepped.add(self._borrower)
        self._borrower = None

    # -- LR schedulers ---------------------------------------------------------------------
    def _on_scheduler_step(self, scheduler: Any) -> None:
        """The scheduler's numeric state (epoch counter, base and last learning rates, ...) as one record."""
        rec = self.recorder
        name = self._schedulers.get(id(scheduler))
        if name is None:
            base = f"lr_scheduler {type(scheduler).__name__}"
            count = sum(1 for n in self._schedulers.values() if n.split("#")[0] == base) + 1
            name = base if count == 1 else f"{base}#{count}"
            self._schedulers[id(scheduler)] = name
        values = _numbers({k: v for k, v in scheduler.state_dict().items() if k != "optimizer"})
        rec.record_tensor(Kind.OPTSTATE, rec.intern(name), torch.tensor(values, dtype=torch.float64), 0,
                          rec.location_id(2))

    # -- torch.save ------------------------------------------------------------------------
    def _on_save(self, obj: Any) -> None:
        rec = self.recorder
        rec.record_object(Kind.SAVE, f"torch.save[{rec.saves}]", obj)
        rec.saves += 1


def _holder(module: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose method (not its forward, which would have made it the root) is calling `module`, its
    submodule: a LightningModule's `training_step` calling `self.net(x)`. Looked for once per new root."""
    frame = sys._getframe(2)
    for _ in range(_HOLDER_FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        # torch.compile's wrapper calls the module it wraps from its own methods, and holds it under no name
        if isinstance(owner, torch.nn.Module) and owner is not module and not is_wrapper(owner) and \
                any(m is module for m in owner.modules()):
            return owner
        frame = frame.f_back  # type: ignore[assignment]
    return None


_HOLDER_FRAMES = 32


def _numbers(value: Any) -> list[float]:
    """The numbers in a (nested) state dict, in key order: booleans, ints, floats, tensors' elements."""
    if isinstance(value, bool | int | float):
        return [float(value)]
    if isinstance(value, torch.Tensor):
        return [float(x) for x in value.detach().flatten().tolist()]
    if isinstance(value, dict):
        return [x for key in sorted(value, key=str) for x in _numbers(value[key])]
    if isinstance(value, list | tuple):
        return [x for item in value for x in _numbers(item)]
    return []
