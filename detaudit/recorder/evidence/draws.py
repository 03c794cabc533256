"""Draw fingerprints: at each user call site of a random function, a digest of what was drawn and of the
generator state it was drawn from, with the context that tells repeats apart (causes/repetition.py reads
them to find randomness that repeats across epochs, DataLoader workers, steps, ranks or samples).

Context of a draw: the epoch (DataLoader iterations started before it, the most by any one loader: a draw
before a loop's first batch and one inside it each keep their numbering epoch after epoch), its index among the site's
draws in that epoch, the optimizer step, the DataLoader worker (side file), the rank, whether grad was
enabled (evaluation under `torch.no_grad()` repeats on purpose), and whether every model the script switched
with `train()`/`eval()` was in eval mode (`evaluating`: an evaluation loop run without `no_grad`).

Cost: every draw pays one dict update (its index in the epoch); only the first DRAWS_PER_STEP draws of a step
and DRAWS_PER_EPOCH of an epoch, in the first EPOCHS epochs, read the generator's state and digest the values
(at most VALUE_BYTES of them), so a site writes at most EPOCHS * DRAWS_PER_EPOCH events per process (a
DataLoader worker, whose step is always -1, DRAWS_PER_STEP per epoch).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable
from typing import Any

from detaudit.events import Lib, RandomDrawEvent
from detaudit.recorder.evidence.base import Evidence, digest_bytes
from detaudit.recorder.patch import wrap

EPOCHS = 6  # epochs whose draws are fingerprinted (later ones are only counted)
DRAWS_PER_EPOCH = 24  # fingerprinted draws per site and epoch, in one process
DRAWS_PER_STEP = 3  # ... and per optimizer step: a site drawing every step is seen over several steps
VALUE_BYTES = 1 << 16  # of what a draw returned, the first this many bytes are digested
MAX_KEPT = 1 << 14  # fingerprints per process, all sites together: other evidence keeps its room in the trace

State = Callable[[], "str | None"]


class Draws:
    """One process's draw counters (a forked DataLoader worker starts its own: Evidence.pid changes)."""

    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        self.epochs: dict[int, int] = {}  # id of a DataLoader -> iterations started
        self.epoch = 0
        self._reset()
        self.rank = _rank()
        # each model the script switched with train()/eval(), and its mode (a forked worker inherits them)
        self.modes: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        self._switching = False  # inside a train() call: its children's train() calls are not the script's

    @property
    def evaluating(self) -> bool:
        """Every model the script switched is in eval mode: an evaluation, seeded alike on purpose or not. A teacher
        kept in eval() beside a student in train() is no evaluation."""
        return bool(self.modes) and not any(self.modes.values())

    def _reset(self) -> None:
        self.pid = self.ev.pid
        self.counts: dict[tuple[Any, ...], int] = {}  # (code, line, label, epoch) -> draws so far
        self.kept: dict[tuple[Any, ...], int] = {}  # ... and (..., step) -> draws fingerprinted
        self.total = 0  # draws fingerprinted in this process

    def slot(self, code: Any, line: int, label: str) -> tuple[Any, ...] | None:
        """The draw's context when this draw is to be fingerprinted, else None (it is only counted)."""
        if self.pid != self.ev.pid:
            self._reset()
        epoch = self.epoch
        key = (code, line, label, epoch)
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        if epoch >= EPOCHS or self.total >= MAX_KEPT or self.kept.get(key, 0) >= DRAWS_PER_EPOCH:
            return None
        step = -1 if self.ev.in_worker else int(getattr(self.ev.recorder, "step", 0))
        in_step = (*key, step)
        if self.kept.get(in_step, 0) >= DRAWS_PER_STEP or self._in_backward():
            return None
        self.kept[key] = self.kept.get(key, 0) + 1
        self.kept[in_step] = self.kept.get(in_step, 0) + 1
        self.total += 1
        return epoch, n, step

    def _in_backward(self) -> bool:
        """A draw made while autograd runs a backward pass: activation checkpointing recomputing a forward,
        which restores the RNG state on purpose so dropout draws the same mask again."""
        torch = self.ev.torch
        task = getattr(getattr(torch, "_C", None), "_current_graph_task_id", None)
        return task is not None and task() != -1

    def observe(self, slot: tuple[Any, ...], caller: Any, lib: Lib, label: str, state: State, explicit: bool,
                obj: int | None, call: Callable[[], Any], value: bool = True) -> Any:
        """Run the draw (`call`), emitting its fingerprint: `state` digests the generator before it; `explicit`:
        drawn from an RNG object (`obj`: its number when it is the script's), not a library's global RNG."""
        ev = self.ev
        try:
            before = state()
        except Exception:  # a generator whose state cannot be read (another device's): values only
            before = None
        result = call()
        epoch, n, step = slot
        torch = ev.torch
        try:
            drawn, size = fingerprint(result, torch) if value else (None, 0)
        except Exception:  # a layout whose bytes cannot be read (sparse, quantized): the state still tells
            drawn, size = None, 0
        event = RandomDrawEvent(type="random-draw", lib=lib, fn=label, loc=ev.where(caller), site=ev.site(caller),
                                source="object" if explicit else "global", state=before, value=drawn, size=size,
                                epoch=epoch, n=n, step=step,
                                grad=True if torch is None else bool(torch.is_grad_enabled()))
        if obj is not None:
            event["obj"] = obj
        if self.evaluating:
            event["evaluating"] = True
        if self.rank is not None:
            event["rank"] = self.rank
        ev.emit(event)
        return result


tracker: Draws | None = None  # this process's, once installed


def install(ev: Evidence) -> Draws:
    global tracker
    tracker = Draws(ev)
    return tracker


def install_loader(draws: Draws, loader_cls: type) -> None:
    """Count each DataLoader's iterations: a draw's epoch (a worker forked for it inherits the count)."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def iterate(loader: Any) -> Any:
            started = draws.epochs.get(id(loader), 0) + 1
            draws.epochs[id(loader)] = started
            draws.epoch = max(draws.epoch, started)
            return original(loader)

        return iterate

    wrap(loader_cls, "__iter__", make)


def install_modes(draws: Draws, module_cls: type) -> None:
    """Follow `train()`/`eval()` (which calls `train(False)`) on the script's models; one dict update per call,
    nothing per forward. The outermost call names the model; a parent's calls into its children are not kept."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def train(module: Any, mode: bool = True) -> Any:
            if draws._switching:
                return original(module, mode)
            draws._switching = True
            try:
                return original(module, mode)
            finally:
                draws._switching = False
                with contextlib.suppress(TypeError):  # a module that cannot be weakly referenced: not followed
                    draws.modes[module] = bool(mode)

        return train

    wrap(module_cls, "train", make)


def fingerprint(result: Any, torch: Any) -> tuple[str | None, int]:
    """A digest of what a draw returned (its first VALUE_BYTES) and how many values it holds."""
    if result is None:
        return None, 0
    if isinstance(result, (bool, int, float, str)):
        return digest_bytes(repr(result).encode()), 1
    if torch is not None and isinstance(result, torch.Tensor):
        if result.device.type != "cpu":  # a device's values are not copied to the host for this
            return None, result.numel()
        part = result.detach().reshape(-1)[: max(1, VALUE_BYTES // result.element_size())].contiguous()
        return digest_bytes(part.view(torch.uint8).numpy().tobytes()), result.numel()
    if hasattr(result, "tobytes") and hasattr(result, "reshape"):  # a NumPy array or scalar
        flat = result.reshape(-1)
        return digest_bytes(flat[: max(1, VALUE_BYTES // max(1, flat.itemsize))].tobytes()), int(flat.size)
    if isinstance(result, (list, tuple)):
        return digest_bytes(repr(result[:4096]).encode()), len(result)
    return None, 0


def _rank() -> int | None:
    """The torchrun rank of this process, None outside torchrun."""
    value = os.environ.get("RANK")
    return int(value) if value is not None and value.isdigit() else None
