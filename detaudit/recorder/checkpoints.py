"""Checkpoint evidence: what the script saved and loaded, and what it restored (docs/resume.md).

In every repeat: each `torch.save` and `torch.load` as an event (the file, the step, the top-level keys and
which parts are module / optimizer / LR-scheduler / GradScaler state dicts or RNG states), and each
`load_state_dict` call on a module, optimizer, scheduler or GradScaler (RNG restores are the rng
evidence's: recorder/evidence/generators.py). Under `detaudit resume` (child config `resume`) also: the digests
of the parameters just before the first optimizer step (what a resumed run starts from), each optimizer's
learning rates at every step and a GradScaler's state after each `update()`, as records, so a
resumed run's first step can be told apart from the uninterrupted run's by what differs; and each RNG call
site's next draw after a load and after the first step is reported again (evidence/generators.py `draws_again`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from detaudit.events import (
    CheckpointLoadEvent,
    CheckpointPart,
    CheckpointSaveEvent,
    InitialParamsEvent,
    StateRestoreEvent,
)
from detaudit.recorder import evidence
from detaudit.recorder.compiled import compiling
from detaudit.recorder.core import Recorder
from detaudit.recorder.evidence import generators
from detaudit.recorder.hooks import Hooks
from detaudit.recorder.location import display_path, user_frame
from detaudit.recorder.patch import wrap
from detaudit.trace import Kind

MAX_DEPTH = 4  # how deep a checkpoint is searched for state dicts and RNG states
MAX_PARTS = 64
MAX_KEYS = 64
_TORCH_STATE_BYTES = 5056  # torch.get_rng_state(): the CPU generator's Mersenne Twister state
_CUDA_STATE_BYTES = 16  # torch.cuda.get_rng_state(): Philox seed and offset


def role_of(value: Any) -> str | None:
    """What a saved value is, by its type or the shape of its state dict; None: none of the known kinds."""
    if isinstance(value, torch.nn.Module):
        return "module"
    if isinstance(value, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau):
        return "scheduler"
    if isinstance(value, torch.amp.GradScaler):
        return "scaler"
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.uint8 and value.dim() == 1:
            return {_TORCH_STATE_BYTES: "rng-torch", _CUDA_STATE_BYTES: "rng-cuda"}.get(value.numel())
        return None
    if isinstance(value, Mapping):
        return _state_dict_role(value)
    if isinstance(value, list | tuple):
        return _sequence_role(value)
    return None


def _state_dict_role(value: Mapping[Any, Any]) -> str | None:
    """What a saved mapping is, by its keys: a state dict of a known kind."""
    keys = set(value)
    if {"state", "param_groups"} <= keys:
        return "optimizer"
    if "last_epoch" in keys and ({"base_lrs", "_last_lr"} & keys or "best" in keys):
        return "scheduler"
    if {"scale", "growth_factor"} <= keys:
        return "scaler"
    if {"bit_generator", "state"} <= keys:
        return "rng-numpy"  # a NumPy Generator's bit_generator.state
    if value and (hasattr(value, "_metadata") or all(isinstance(v, torch.Tensor) for v in value.values())) \
            and all(isinstance(k, str) for k in keys):
        return "module"
    return None


def _sequence_role(value: list[Any] | tuple[Any, ...]) -> str | None:
    """What a saved list or tuple is: an RNG's state."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == 3 and isinstance(value[1], tuple) \
            and len(value[1]) == 625:
        return "rng-python"  # random.getstate()
    if isinstance(value, tuple) and len(value) == 5 and value[0] == "MT19937":
        return "rng-numpy"  # np.random.get_state()
    if value and all(role_of(v) == "rng-cuda" for v in value):
        return "rng-cuda"  # torch.cuda.get_rng_state_all()
    return None


def describe(value: Any) -> tuple[list[str], list[CheckpointPart]]:
    """(top-level keys, recognised parts) of a saved or loaded object."""
    keys = [str(k) for k in list(value)[:MAX_KEYS]] if isinstance(value, Mapping) else []
    parts = [CheckpointPart(path=path, role=role) for path, role in _parts(value, "", 0)]
    return keys, parts[:MAX_PARTS]


def _parts(value: Any, path: str, depth: int) -> Iterator[tuple[str, str]]:
    role = role_of(value)
    if role is not None:
        yield path, role
        return
    if depth >= MAX_DEPTH:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _parts(item, f"{path}.{key}" if path else str(key), depth + 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _parts(item, f"{path}[{i}]", depth + 1)


def _file(f: Any) -> str:
    """The file a save or load names, as the script named it (relative to the working directory inside it)."""
    name = f if isinstance(f, str | os.PathLike) else getattr(f, "name", None)
    if not isinstance(name, str | os.PathLike):
        return f"<{type(f).__name__}>"
    text = os.fspath(name)
    text = text.decode(errors="replace") if isinstance(text, bytes) else text
    absolute = os.path.abspath(text)
    here = os.getcwd().rstrip(os.sep) + os.sep
    return absolute[len(here):] if absolute.startswith(here) else text


def _where() -> str:
    frame = user_frame(3)
    return "" if frame is None else f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


class Checkpoints:
    """Installs the checkpoint evidence for one Recorder (after its hooks: a save is still recorded whole)."""

    def __init__(self, recorder: Recorder, hooks: Hooks, resume: bool) -> None:
        self.recorder = recorder
        self.hooks = hooks
        self.resume = resume
        self._restored: set[tuple[str, str]] = set()
        self._first_step_seen = False
        self._lr_ids: dict[int, int] = {}

    def install(self) -> None:
        def make_save(original: Callable[..., Any]) -> Callable[..., Any]:
            def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
                if not compiling():
                    self.hooks.guard(self._on_save)(obj, f)
                return original(obj, f, *args, **kwargs)

            return save

        def make_load(original: Callable[..., Any]) -> Callable[..., Any]:
            def load(f: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(f, *args, **kwargs)
                if not compiling():
                    self.hooks.guard(self._on_load)(result, f)
                return result

            return load

        wrap(torch, "save", make_save)
        wrap(torch.serialization, "save", lambda _: torch.save)
        wrap(torch, "load", make_load)
        wrap(torch.serialization, "load", lambda _: torch.load)
        from torch.optim import lr_scheduler

        for cls, what in ((torch.nn.Module, "module"), (torch.optim.Optimizer, "optimizer"),
                          (lr_scheduler.LRScheduler, "scheduler"), (lr_scheduler.ReduceLROnPlateau, "scheduler"),
                          (torch.amp.GradScaler, "scaler")):
            wrap(cls, "load_state_dict", self._restoring(what))
        if self.resume:
            from torch.optim import optimizer as optim

            optim.register_optimizer_step_pre_hook(self.hooks.guard(self._on_step_pre))
            wrap(torch.amp.GradScaler, "update", self._scaler_update)

    def _on_save(self, obj: Any, f: Any) -> None:
        keys, parts = describe(obj)
        self.recorder.event(CheckpointSaveEvent(type="checkpoint-save", path=_file(f), loc=_where(),
                                                step=self.recorder.step, keys=keys, parts=parts))

    def _on_load(self, obj: Any, f: Any) -> None:
        keys, parts = describe(obj)
        self.recorder.event(CheckpointLoadEvent(type="checkpoint-load", path=_file(f), loc=_where(),
                                                step=self.recorder.step, keys=keys, parts=parts))
        found = evidence.active()
        if self.resume and found is not None:
            generators.draws_again(found)

    def _restoring(self, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def load_state_dict(owner: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(owner, *args, **kwargs)
                if not compiling():
                    self.hooks.guard(self._on_restore)(what, owner, sys._getframe(1))
                return result

            return load_state_dict

        return make

    def _on_restore(self, what: str, owner: Any, caller: Any) -> None:
        found = evidence.active()
        library = found is not None and found.is_library(caller)
        loc = found.where(caller) if found is not None else _where()
        if (what, loc) in self._restored:
            return
        self._restored.add((what, loc))
        self.recorder.event(StateRestoreEvent(type="state-restore", what=what, name=type(owner).__name__, loc=loc,
                                              library=library))

    # -- detaudit resume only ----------------------------------------------------------------
    def _on_step_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """The learning rates this step uses (one record per optimizer), and before the first step the
        parameters the run starts from (an event: the resumed run's are matched to the reference's)."""
        rec = self.recorder
        rec.internal += 1  # detaudit's own tensors: no op records
        try:
            if not self._first_step_seen:
                self._first_step_seen = True
                names, digests = [], []
                for name_id, p in self.hooks.named_params(optimizer):
                    names.append(rec.writer.text(name_id))
                    digests.append(f"{rec.digest_now(p.detach())[0]:016x}")
                rec.event(InitialParamsEvent(type="initial-params", step=rec.step, params=names, digests=digests))
                found = evidence.active()
                if found is not None:  # the draws of training, told apart from those that set the run up
                    generators.draws_again(found)
            lr_id = self._lr_ids.get(id(optimizer))
            if lr_id is None:
                lr_id = self._lr_ids[id(optimizer)] = rec.intern(f"optimizer {type(optimizer).__name__}:lr")
            rates = [float(group["lr"]) for group in optimizer.param_groups]
            rec.record_tensor(Kind.OPTSTATE, lr_id, torch.tensor(rates, dtype=torch.float64), 0, rec.location_id(2))
        finally:
            rec.internal -= 1

    def _scaler_update(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def update(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(scaler, *args, **kwargs)
            if not compiling() and scaler.is_enabled():
                self.hooks.guard(self._on_scaler_update)(scaler)
            return result

        return update

    def _on_scaler_update(self, scaler: Any) -> None:
        rec = self.recorder
        state = scaler.state_dict()
        values = [float(state.get("scale", 0.0)), float(state.get("_growth_tracker", 0))]
        rec.internal += 1
        try:
            rec.record_tensor(Kind.OPTSTATE, rec.intern(f"grad_scaler {type(scaler).__name__}"),
                              torch.tensor(values, dtype=torch.float64), 0, rec.location_id(2))
        finally:
            rec.internal -= 1


def install(recorder: Recorder, hooks: Hooks, config: Mapping[str, Any]) -> None:
    Checkpoints(recorder, hooks, bool(config.get("resume"))).install()
