"""`detaudit batch` inside the repeat: is a row's result the same whatever else is in its batch?

At each call of the outermost module (or of the modules `--module` names), after the script's own
forward returned, the call is re-evaluated on row subsets of its batch (a prefix of one row, an odd-sized
prefix, other prefixes, the batch reversed, its rows mixed with another call's) and each row's output is
compared bit for bit with the same row of the whole batch re-evaluated alike. When rows differ, the
smallest differing subset is run once more beside the whole batch with every submodule and every aten op
watched, to name the first module and the first op whose rows differ while their inputs' rows agree.

Harmless by construction: probes run on a copy of the module (its parameters shared, its buffers and other
state copied, so BatchNorm statistics and caches of the real module never move), under `torch.no_grad()`,
with the RNG states (CPU, CUDA when initialised) restored afterwards, and with every other hook of the
recorder paused, so the script computes and records exactly what a plain run would. Results reach the
trace as evidence events (`batch-call`, `batch-skip`, `batch-origin`: docs/trace-format.md, docs/batch.md).

Its parts: the row arithmetic and comparison (recorder/batchrows.py), the origin search (recorder/batchorigin.py),
a call's batch dim (recorder/batchdim.py), probing outside the script's process (recorder/batchisolation.py).
"""

from __future__ import annotations

import contextlib
import copy
import random
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from detaudit.batch_events import BatchSubset, SkipReason, SubsetKind
from detaudit.events import BatchCallEvent, BatchOriginEvent, BatchSkipEvent, Event
from detaudit.recorder import batchchoice, batchisolation, batchorigin
from detaudit.recorder.batchdim import Declared, decide, declared_batch
from detaudit.recorder.batchorigin import CAPTURE_LIMIT, Flow
from detaudit.recorder.batchrows import (
    Batch,
    RowDiff,
    Rows,
    aggregates,
    batch_rows,
    compare_values,
    default_sizes,
    halving_ladder,
    mixable,
    rebuild,
    storage,
    tensors,
)
from detaudit.recorder.batchrows import compare_rows as compare_rows  # the probe's module names its comparison
from detaudit.recorder.compiled import compiling
from detaudit.recorder.core import Recorder
from detaudit.recorder.location import display_path, user_frame
from detaudit.recorder.scratch import results, scratch_outputs

CONFIG_KEY = "batch"  # the child config's entry that turns the probe on
_DROPOUT = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
            torch.nn.FeatureAlphaDropout)


@dataclass(frozen=True)
class ProbeSettings:
    """What `detaudit batch` asked for (the child config's `batch` entry)."""

    module: str | None = None  # --module: a qualified name or class name; None: the outermost modules
    batch_dim: int | None = None  # --batch-dim; None: decided per call (recorder/batchdim.py)
    sizes: tuple[int, ...] = ()  # --sizes: prefix sizes; empty: `default_sizes`
    locate: int = 1  # how many variant calls get an origin search

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> ProbeSettings:
        dim = raw.get("batch_dim")
        return cls(module=raw.get("module"), batch_dim=None if dim is None else int(dim),
                   sizes=tuple(int(k) for k in raw.get("sizes", ())), locate=int(raw.get("locate", 1)))


class _State:
    """The module's state a forward could change: a token that differs when any of it did."""

    @staticmethod
    def token(module: torch.nn.Module) -> tuple[Any, ...]:
        parts: list[Any] = []
        for sub in module.modules():
            for key, value in vars(sub).items():
                if key in ("_parameters", "_modules", "_forward_hooks", "_forward_pre_hooks"):
                    continue
                if key == "_buffers":
                    parts.extend((name, id(b), b._version if b is not None else None) for name, b in value.items())
                elif isinstance(value, torch.Tensor):
                    parts.append((key, id(value), value._version))
                elif isinstance(value, (int, float, str, bool)) or value is None:
                    parts.append((key, value))
                elif isinstance(value, (list, dict, set)):
                    parts.append((key, id(value), len(value)))
                else:
                    parts.append((key, id(value)))
        return tuple(parts)


class _RngGuard:
    """The global RNG states (torch CPU; CUDA when initialised; Python's `random`; NumPy's when imported),
    saved when made, put back by `restore`."""

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.python = random.getstate()
        numpy_random = sys.modules.get("numpy.random")
        self.numpy = numpy_random.get_state() if numpy_random is not None else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy.random"].set_state(self.numpy)

    def drawn_since(self) -> bool:
        """Whether an RNG was drawn from since these states were taken."""
        if not torch.equal(torch.get_rng_state(), self.cpu) or random.getstate() != self.python:
            return True
        if self.numpy is not None:
            now = sys.modules["numpy.random"].get_state()
            if now[2:] != self.numpy[2:] or (now[1] != self.numpy[1]).any():
                return True
        if self.cuda is not None:
            return any(not torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), self.cuda, strict=False))
        return False


class _Watch(TorchDispatchMode):
    """An origin search's run: each submodule call and each aten op as (what, module, loc, inputs, outputs),
    handed to `on_call` (the subset run keeps them; the whole batch's run compares them at once)."""

    def __init__(self, on_call: Callable[..., None], stack: list[str],
                 keep: Callable[[torch.Tensor], torch.Tensor], flow: Flow | None = None) -> None:
        super().__init__()
        self.on_call = on_call
        self.stack = stack
        self.keep = keep
        self.flow = flow
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.calls += 1
        if self.calls > CAPTURE_LIMIT:
            return func(*args, **kwargs)
        # an op that writes into an argument overwrites what its inputs were: those are copied first
        before = rebuild((args, kwargs), self.keep) if func._schema.is_mutable else (args, kwargs)
        out = func(*args, **kwargs)
        if self.flow is not None:
            self.flow.op((args, kwargs), out)
        name = ".".join(str(func).split(".")[:2])  # aten.addmm (the overload is not shown)
        # a workspace the op keeps for its backward is no result of its rows (recorder/scratch.py)
        self.on_call("op", name, self.stack[-1] if self.stack else "", _loc(), before,
                     results(out, scratch_outputs(func)))
        return out


_probed_call = threading.local()  # .loc: the script's line that made the call being probed


def _loc() -> str:
    """The user's line running now; in a forked copy's thread, whose frames hold no line of the script's when the
    model is torch's own (an `nn.Sequential` of torch layers), the line that made the probed call."""
    frame = user_frame(3)
    if frame is None or frame.f_code.co_filename == threading.__file__:
        return str(getattr(_probed_call, "loc", ""))
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


class BatchProbe:
    """Installs the probe for one repeat; `paused` keeps the recorder's own hooks out of the probes' calls."""

    def __init__(self, recorder: Recorder, names: Callable[[torch.nn.Module], str | None],
                 settings: ProbeSettings) -> None:
        self.recorder = recorder
        self.names = names  # a module's name as the recorder's hooks name it (roots `Net`, children `fc.0`)
        self.settings = settings
        self.local = threading.local()
        self.calls: dict[str, int] = {}  # module name -> calls seen
        self.others: dict[str, Batch | None] = {}  # module name -> the last call's batch
        self.located = 0
        self.handles: list[Any] = []
        self.stopped: str | None = None  # why probing stopped (one of its hooks raised), if it did

    def install(self) -> None:
        from torch.nn.modules import module as nn_module

        self.handles = [nn_module.register_module_forward_pre_hook(self._on_pre),
                        nn_module.register_module_forward_hook(self._on_forward, with_kwargs=True, always_call=True)]

    def remove(self) -> None:
        """Stop probing (a repeat never does; in-process tests do)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    # -- which calls are probed -----------------------------------------------------------------
    def _stack(self) -> list[tuple[int, _Entered | None]]:
        stack: list[tuple[int, _Entered | None]] | None = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def _is_target(self, module: torch.nn.Module, name: str | None) -> bool:
        wanted = self.settings.module
        if wanted is None:
            return True
        return name == wanted or type(module).__name__ == wanted

    def _on_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self.stopped is None and not compiling() and not getattr(self.local, "probing", False):
            self._safely(self._enter, module, args)

    def _on_forward(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any = None) -> None:
        """After each forward; `output` absent when the forward raised (`always_call`: the stack stays right)."""
        if self.stopped is None and not compiling() and not getattr(self.local, "probing", False):
            self._safely(self._leave, module, args, kwargs, output)

    def _safely(self, hook: Callable[..., None], *args: Any) -> None:
        """A hook of the probe's that raises stops the probing for the rest of the repeat; never the script."""
        try:
            hook(*args)
        except Exception as exc:
            self.stopped = f"{type(exc).__name__}: {exc}"
            print(f"detaudit: batch probing stopped: {self.stopped}", file=sys.stderr)
            with contextlib.suppress(Exception):  # the trace itself failed: the footer says so
                self._skip("", 0, "probe-failed", f"probing stopped here: {self.stopped}")

    def _enter(self, module: torch.nn.Module, args: Any) -> None:
        stack = self._stack()
        probed = next((entered for _, entered in reversed(stack) if entered is not None), None)
        if probed is not None or not self._is_target(module, self.names(module)):
            declared = declared_batch(module, args, self.names(module)) if probed is not None else None
            if probed is not None and declared is not None:  # a layer inside the call says where its batch is
                probed.declared.append(declared)
            stack.append((id(module), None))
            return
        # the RNG states before the call: a re-evaluation of the whole batch draws what the call drew; where
        # the probes cannot run in a forked copy, the call itself is watched for effects outside its module
        watch = None if batchisolation.forkable(module, args) else batchisolation.Watch.start()
        stack.append((id(module), _Entered(_RngGuard(), watch, [])))

    def _leave(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        stack = self._stack()
        if not stack or stack[-1][0] != id(module):
            if any(entry[0] == id(module) for entry in stack):  # forwards above it raised
                while stack and stack[-1][0] != id(module):
                    stack.pop()
            else:
                return
        _, entered = stack.pop()
        if entered is None:
            return
        effects = entered.watch.effects() if entered.watch is not None else None
        if output is None:
            return
        name = self.names(module) or type(module).__name__
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        now = _RngGuard()
        self.local.probing = True
        self.recorder.local.paused = True
        self.recorder.internal += 1
        try:
            for event in self._isolated(module, name, call, (args, kwargs, output), entered, effects):
                self.recorder.event(event)
        except Exception as exc:  # a probe never breaks the script: the call is reported as not probed
            self._skip(name, call, "probe-failed", f"{type(exc).__name__}: {exc}")
        finally:
            now.restore()
            self.recorder.internal -= 1
            self.recorder.local.paused = False
            self.local.probing = False

    def _isolated(self, module: torch.nn.Module, name: str, call: int, seen: tuple[Any, Any, Any],
                  entered: _Entered, effects: list[str] | None) -> list[Event]:
        """The call's probe events, from probes that cannot touch the script's state or files: in a forked copy
        (CPU), else in the process when the call showed no effect outside its module (recorder/batchisolation.py).
        Effects the probes attempted there are refused, and the call reported `side-effects` instead."""
        args, kwargs, output = seen
        where = _loc()  # the script's line that made the call (a forked copy's thread has no frames of it)
        if effects is None and not batchisolation.forkable(module, (args, kwargs)):
            return [_skip_event(name, call, "side-effects", "CUDA was initialised during the call (a forked copy "
                                "cannot use it), and the call was not watched for effects outside its module: a "
                                "probe in the script's process could repeat them")]
        if effects:
            return [_skip_event(name, call, "side-effects", f"the forward acts outside its module "
                                f"({'; '.join(effects[:3])}): a probe would do it again in the script's process, "
                                "which cannot be forked on this device")]

        def work() -> list[Event]:
            self.local.probing = True
            self.recorder.local.paused = True
            return self._probe(module, name, call, args, kwargs, output, entered, where)

        if effects is None:  # forkable
            result = batchisolation.in_fork(work, self._after_fork)
            refused, error, events = list(result.refused), result.error, result.value
        else:
            with batchisolation.quiet() as refused:
                try:
                    events, error = work(), None
                except Exception as exc:
                    events, error = [], f"{type(exc).__name__}: {exc}"
        if refused:
            return [_skip_event(name, call, "side-effects", f"the forward acts outside its module "
                                f"({'; '.join(dict.fromkeys(refused))}): refused in its probes, so it was not probed")]
        if error is not None:
            return [_skip_event(name, call, "probe-failed", error)]
        for event in events:
            if event["type"] == "batch-call":
                self.others[name] = batch_rows(args, kwargs, event["batch_dim"], event["rows"])
        self.located += sum(e["type"] == "batch-origin" for e in events)
        return events

    def _after_fork(self) -> None:
        """In the forked copy: the trace writer's lock afresh (another of the script's threads may have held it
        at the fork; what the copy writes goes to /dev/null anyway)."""
        self.recorder.writer._lock = threading.RLock()

    def _skip(self, name: str, call: int, why: SkipReason, detail: str) -> None:
        self.recorder.event(_skip_event(name, call, why, detail))

    # -- one probed call --------------------------------------------------------------------------
    def _probe(self, module: torch.nn.Module, name: str, call: int, args: Any, kwargs: Any, output: Any,
               entered: _Entered, where: str) -> list[Event]:
        """The call's events: its probes' results (and where a difference starts), or why it was not probed."""
        _probed_call.loc = where
        before = entered.guard
        dim = decide([tuple(t.shape) for t in tensors((args, kwargs))], self.settings.batch_dim, entered.declared)
        if dim.dim is None:
            return [_skip_event(name, call, "batch-dim-unknown", dim.detail)]
        d = dim.dim
        found = batch_rows(args, kwargs, d, dim.size)
        if found is None:
            return [_skip_event(name, call, "no-batch", f"no tensor argument has a dim {d}")]
        n = found.n
        if n < 2:
            return [_skip_event(name, call, "no-batch", f"a batch of {n} row{'s' if n != 1 else ''}: nothing to "
                                                         "compare")]
        reason = _not_comparable(module)
        if reason is not None:
            return [_skip_event(name, call, *reason)]
        try:
            pristine = self._copy(module)
        except Exception as exc:
            return [_skip_event(name, call, "uncopyable", f"its state cannot be copied to probe it safely "
                                                          f"({type(exc).__name__}: {exc})")]
        runner = _Runner(self, module, pristine, args, kwargs, found.dims, d)
        before.restore()  # the whole batch again, drawing what the call drew
        with torch.no_grad():
            control = runner.run(None)
        if before.drawn_since():
            return [_skip_event(name, call, "random", "the call draws random numbers (sampling, or dropout in a "
                                                      "functional call): its rows cannot be compared between batches")]
        whole = Rows(n, torch.arange(n), torch.arange(n))
        not_compared = aggregates(control, n, d)
        if len(not_compared) == len(tensors(control)):
            return [_skip_event(name, call, "aggregate-output", f"no output has a dim of the batch's {n} rows, so "
                                f"no row's result can be compared ({', '.join(not_compared[:3])}): an aggregate "
                                "such as a batch's mean loss is no row's result")]
        reproduced = compare_values(output, control, n, whole, d, whole=False).agree
        subsets = self._subsets(name, found)
        ladder = set(self.settings.sizes or halving_ladder(n))  # the harness's sizes (--sizes: those)
        half = (n + 1) // 2
        results: list[BatchSubset] = []
        variant: tuple[SubsetKind, Rows, Any] | None = None
        choices = batchchoice.Choices(control, n, d)
        with torch.no_grad():
            for kind, rows, mix in subsets:
                before.restore()  # each size from the call's RNG states, as the harness reseeds per size
                got = runner.run(rows, mix, half)
                diff = compare_values(control, got, n, rows, d, whole=False)
                results.append(_subset(kind, rows.size, diff, kind == "prefix" and rows.size in ladder))
                if not diff.agree and (variant is None or (variant[0] != "prefix" and kind == "prefix")):
                    variant = (kind, rows, mix)
                if not diff.agree:
                    choices.probe(got, kind, rows.size, rows.ref, rows.got)
        event = BatchCallEvent(
            type="batch-call", module=name, call=call, rows=n, batch_dim=d, reproduced=reproduced,
            subsets=results, loc=where, batch_dim_from=dim.source, batch_dim_detail=dim.detail,
            not_compared=not_compared, training=module.training)
        if choices.whole is not None:
            event["choice"] = choices.whole
        events: list[Event] = [event]
        if variant is not None and self.located < self.settings.locate:
            with torch.no_grad():
                events.append(runner.locate(name, call, n, variant))
        return events

    def _subsets(self, name: str, batch: Batch) -> list[tuple[SubsetKind, Rows, Any]]:
        """The subsets a call of `n` rows is probed on: prefixes of the asked (or default) sizes, the batch reversed,
        and its first half filled up with the rows of the module's previous call when they fit."""
        n = batch.n
        sizes = sorted({k for k in (self.settings.sizes or default_sizes(n)) if 1 <= k < n})
        subsets: list[tuple[SubsetKind, Rows, Any]] = [("prefix", Rows(k, torch.arange(k), torch.arange(k)), None)
                                                       for k in sizes]
        subsets.append(("reversed", Rows(n, torch.arange(n - 1, -1, -1), torch.arange(n)), None))
        other = self.others.get(name)
        half = (n + 1) // 2
        if other is not None and mixable(other, batch, n - half):
            subsets.append(("mixed", Rows(n, torch.arange(half), torch.arange(half)), [t for t, _ in other.rows]))
        return subsets

    def _copy(self, module: torch.nn.Module) -> torch.nn.Module:
        """A copy that shares the parameters and owns everything else (buffers, caches, counters)."""
        memo: dict[int, Any] = {id(p): p for p in module.parameters()}
        copied: torch.nn.Module = copy.deepcopy(module, memo)
        return copied


@dataclass(frozen=True)
class _Entered:
    """A probed module's call in progress: the RNG states before it, and its watch where the probes cannot
    run in a forked copy."""

    guard: _RngGuard
    watch: batchisolation.Watch | None
    declared: list[Declared]  # the layers inside the call that declare where their batch is (recorder/batchdim.py)


def _skip_event(name: str, call: int, why: SkipReason, detail: str) -> BatchSkipEvent:
    return BatchSkipEvent(type="batch-skip", module=name, call=call, why=why, detail=detail)


def _subset(kind: SubsetKind, size: int, diff: RowDiff, ladder: bool) -> BatchSubset:
    return BatchSubset(subset=kind, size=size, rows_compared=diff.rows, rows_differ=diff.differ,
                       max_abs_diff=diff.max_abs, max_ulp=diff.max_ulp, scale=diff.scale, dtype=diff.dtype,
                       nan_mismatch=diff.nan_mismatch, across_rows=diff.whole_differs,
                       shape_changed=diff.shape_differs, ladder=ladder)


def _not_comparable(module: torch.nn.Module) -> tuple[SkipReason, str] | None:
    """Why rows of this module cannot be compared between batches, by design: train-mode batch
    statistics (named first), active dropout; each such submodule is listed."""
    norms, drops = [], []
    for qual, sub in module.named_modules():
        what = f"`{qual or type(module).__name__}` ({type(sub).__name__}"
        if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and sub.training:
            norms.append(what + ")")
        elif isinstance(sub, _DROPOUT) and sub.training and sub.p > 0:
            drops.append(what + f", p={sub.p})")
    parts = []
    if norms:
        parts.append(f"{', '.join(norms)} in train mode normalise with the batch's own statistics, so every row "
                     "depends on the others by design")
    if drops:
        parts.append(f"{', '.join(drops)} in train mode draw random masks whose rows change with the batch's shape")
    if not parts:
        return None
    return ("batch-statistics" if norms else "dropout"), "; ".join(parts)


class _Runner:
    """Evaluates one call's module on row subsets of its batch, each on a copy in the call's state."""

    def __init__(self, probe: BatchProbe, module: torch.nn.Module, pristine: torch.nn.Module, args: Any,
                 kwargs: Any, batch: list[int | None], d: int) -> None:
        self.probe = probe
        self.module = module
        self.pristine = pristine
        self.args, self.kwargs = args, kwargs
        self.batch = batch  # each tensor argument's batch dim (None: passed whole; batchrows.batch_rows)
        self.d = d
        self.token = _State.token(pristine)
        self.live: torch.nn.Module | None = None
        self.weights = {storage(p) for p in module.parameters()}  # shared by every copy

    def _keep(self, t: torch.Tensor) -> torch.Tensor:
        """A watched tensor as kept for comparison: a copy, but the model's parameters (and views of them:
        a forward never writes them) by reference, so an origin search never copies the weights."""
        return t if storage(t) in self.weights else t.detach().clone()

    def _model(self) -> torch.nn.Module:
        """A copy in the call's state: reused while forwards leave its state alone, copied again otherwise."""
        if self.live is None or _State.token(self.live) != self.token:
            self.live = self.probe._copy(self.pristine)
            self.token = _State.token(self.live)
        return self.live

    def inputs(self, rows: Rows | None, mix: list[torch.Tensor] | None = None, half: int = 0) -> tuple[Any, Any]:
        """The call's arguments with each batch tensor cut to `rows` (None: the whole batch; `mix`: filled up
        with another call's rows). Every tensor is a copy: a forward that writes into its arguments writes
        into the probe's, never into the script's."""
        dims = iter(self.batch)
        mixed = iter(mix or [])

        def cut(t: torch.Tensor) -> torch.Tensor:
            d = next(dims)
            if d is None or rows is None:
                return t.detach().clone()
            mine = t.index_select(d, rows.ref.to(t.device) if mix is None else torch.arange(half, device=t.device))
            if mix is None:
                return mine
            fill = next(mixed)
            return torch.cat([mine, fill.index_select(d, torch.arange(t.shape[d] - half, device=t.device))], d)

        return rebuild((self.args, self.kwargs), cut)

    def run(self, rows: Rows | None, mix: list[torch.Tensor] | None = None, half: int = 0) -> Any:
        args, kwargs = self.inputs(rows, mix, half)
        return self._model()(*args, **kwargs)

    # -- where it starts ----------------------------------------------------------------------------
    def locate(self, name: str, call: int, n: int, variant: tuple[SubsetKind, Rows, Any]) -> BatchOriginEvent:
        """Run the variant subset, then the whole batch, with submodules and ops watched: where the rows'
        difference starts (recorder/batchorigin.py)."""
        _, rows, mix = variant
        search = batchorigin.Search(n, variant, self.d, self._keep)
        self.live = None  # a fresh copy
        self._watched(self.inputs(rows, mix, (n + 1) // 2), search.keep)
        search.pair()
        self.live = None
        calls, output = self._watched(self.inputs(None), search.compare, search.flow)
        return search.event(name, call, calls, output)

    def _watched(self, inputs: tuple[Any, Any], on_call: Callable[..., None],
                 flow: Flow | None = None) -> tuple[int, Any]:
        """Run the module on `inputs` with every submodule's call and every op handed to `on_call`."""
        model = self._model()
        stack: list[str] = []
        handles = []
        for qual, sub in model.named_modules():
            if not qual:
                continue

            def pre(sub_: torch.nn.Module, args_: Any, kwargs_: Any, qual_: str = qual) -> None:
                stack.append(qual_)

            def post(sub_: torch.nn.Module, args_: Any, kwargs_: Any, out_: Any, qual_: str = qual) -> None:
                if stack and stack[-1] == qual_:
                    stack.pop()
                with _disable_current_modes():  # the watch's own tensor work is no op of the model's
                    on_call("module", qual_, qual_, _loc(), (args_, kwargs_), out_, type(sub_).__name__)

            handles.append(sub.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(sub.register_forward_hook(post, with_kwargs=True))
        watch = _Watch(on_call, stack, self._keep, flow)
        try:
            args, kwargs = inputs
            with watch:
                output = model(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        return watch.calls, output


def install(recorder: Recorder, names: Callable[[torch.nn.Module], str | None], raw: dict[str, Any]) -> BatchProbe:
    """Start probing every call the settings select (run/child.py, when the config asks for `batch`)."""
    probe = BatchProbe(recorder, names, ProbeSettings.from_config(raw))
    probe.install()
    return probe

