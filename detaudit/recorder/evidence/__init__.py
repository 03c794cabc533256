"""Evidence for the cause detectors, recorded cheaply in every repeat (docs/causes.md).

Recorded, by topic (the events are typed in detaudit/events.py):
- generators.py: seeding calls (value, call site, RNG state digest before and after), numpy Generator
  creation, the first draw from each RNG per call site;
- draws.py: the first few draws per call site, step and epoch fingerprinted (what was drawn, the
  generator's state before), with epoch, step, worker, rank and grad mode;
- kernels.py: calls of the ops the running torch lists as nondeterministic (with device),
  `torch.empty`-family calls from user code, determinism flags and their typos, collectives, the
  listed and matmul-heavy modules of the first model;
- concurrency.py: user threads and pools, DataLoader settings and what happens inside its workers;
- writes.py: the files the script opens for writing (what `-j` repeats would share);
- environment.py: PYTHONHASHSEED, an environment fingerprint (allow-listed variables only, never
  secrets), thread-count settings, wall-clock reads per call site, reads of the pid, OS entropy, uuids;
- set_order.py: under op-level recording, the sets in scope at each user line's first op whose iteration
  order varies between runs (called by recorder/ops.py);
- file_access.py: files read and directories listed that an earlier repeat of this audit changed (state
  carried between repeats);
- tokens.py: the token each sequence got at each step of a decode loop (`argmax`/`multinomial`/`topk` choices
  the script feeds back to its model), with the top-2 scores of a choice by maximum;
- here: RNG states and torch flags at import, the first forward, the first optimizer step and the end.

Cost: only the wrapped functions pay (seeding, RNG draws, listed ops, empty allocations, thread
starts; a dict lookup per call once a call site is known) and one audit-hook call per audited
event (writes.py: a string compare unless it is an `open` or a rename). Nothing runs per module call: the
first-forward and first-step hooks remove themselves. Every wrapper is put in place by
recorder/patch.py's `wrap`, so all behave the same under `torch.jit.script`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from detaudit.events import StateEvent
from detaudit.recorder import location
from detaudit.recorder.evidence import (
    base,
    concurrency,
    draws,
    environment,
    file_access,
    generators,
    kernels,
    set_order,
    tokens,
    writes,
)
from detaudit.recorder.evidence.base import Evidence, never_fatal, python_rng_digest

__all__ = ["Evidence", "active", "attach", "finish", "install", "python_rng_digest"]


class Installer:
    """Wires the topics into one process: at child start, as modules are imported, and at the end."""

    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        self._stepped = False
        self._first_forward: Any = None
        self.writes: writes.Writes | None = None
        self.draws = draws.install(ev)

    def install_early(self) -> None:
        """At child start, before the script: Python's RNG, threads, clocks, hash seed, fork handling."""
        ev = self.ev
        location.skip_paths(*location.own_code())
        generators.install_python(ev)
        concurrency.install_threads(ev)
        environment.install_clocks(ev)
        environment.install_hash(ev)
        file_access.install(ev)
        ev.emit(environment.hash_event())
        self.writes = writes.install(ev)
        os.register_at_fork(after_in_child=ev.after_fork)

    def import_callbacks(self) -> dict[str, Callable[[ModuleType], None]]:
        """Modules to instrument as soon as the script imports them (see child._AfterImport)."""
        ev = self.ev
        callbacks: dict[str, Callable[[ModuleType], None]] = {
            "numpy.random": self.on_numpy_random, "concurrent.futures": lambda m: concurrency.install_futures(ev, m),
            "multiprocessing.pool": lambda m: concurrency.install_mp_pool(ev, m),
            "secrets": lambda m: environment.install_secrets(ev, m)}
        for name in list(callbacks):
            if name in sys.modules:
                callbacks.pop(name)(sys.modules[name])
        return callbacks

    def on_numpy_random(self, np_random: ModuleType) -> None:
        location.skip_paths(location.package_dir(sys.modules["numpy"]))
        generators.install_numpy(self.ev, np_random)

    def on_torch(self, torch: ModuleType) -> None:
        """Right after `import torch` (before the script sees it) and before the recorder's hooks."""
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        from detaudit.recorder import compiled, faults

        ev = self.ev
        ev.compiling = compiled.compiling
        ev.torch = torch
        if "numpy.random" in sys.modules and ev.numpy is None:
            self.on_numpy_random(sys.modules["numpy.random"])
        ev.pins.apply_torch(torch)
        # first: the draws' wrapper of multinomial stays outermost, so the call site it keys draws by is the script's
        tokens.install(ev, torch)
        generators.install_torch(ev, torch)
        environment.install_torch(ev, torch)
        kernels.install(ev, torch)
        concurrency.install_dataloader(ev, torch.utils.data.DataLoader)
        set_order.install_optimizer(ev, torch.optim.Optimizer)
        draws.install_loader(self.draws, torch.utils.data.DataLoader)
        draws.install_modes(self.draws, torch.nn.Module)
        faults.install(ev, torch)
        if self.writes is not None:
            writes.install_torch(self.writes, torch)
        ev.emit(environment.environment(ev))
        ev.emit(StateEvent(type="state", when="import", rng=ev.rng_state(), flags=ev.flags()))
        self._first_forward = nn_module.register_module_forward_pre_hook(self._on_first_forward)
        optim.register_optimizer_step_pre_hook(self._on_first_step)

    def finish(self) -> None:
        """At the end of the repeat (also on timeout): the final flags and RNG states."""
        ev = self.ev
        if os.getpid() != ev.pid or ev.in_worker:
            return
        reads = environment.clock_reads(ev)
        if reads is not None:
            ev.emit(reads)
        event = StateEvent(type="state", when="end", rng=ev.rng_state())
        if ev.torch is not None:
            from detaudit.recorder import compiled

            if compiled.was_used():
                ev.emit(compiled.evidence())
            event["flags"] = ev.flags()
            cuda = ev.torch.cuda
            if cuda.is_initialized():
                event["gpu"] = [cuda.get_device_name(i) for i in range(cuda.device_count())]
        ev.emit(event)

    # -- one-shot hooks ---------------------------------------------------------------------------
    def _on_first_forward(self, module: Any, args: Any) -> None:
        ev = self.ev
        if ev.compiling():
            return
        self._first_forward.remove()
        ev.pins.apply_torch_flags(ev.torch)
        with never_fatal():
            ev.emit(StateEvent(type="state", when="first-forward", rng=ev.rng_state(), flags=ev.flags()))
            ev.emit(kernels.modules_event(ev, module))
            writes = kernels.empty_writes_event(ev)
            if writes is not None:
                ev.emit(writes)

    def _on_first_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # torch iterates the live hook dict here, so the hook cannot remove itself: one check per step
        ev = self.ev
        if self._stepped or ev.compiling():
            return
        self._stepped = True
        ev.pins.apply_torch_flags(ev.torch)
        with never_fatal():
            ev.emit(StateEvent(type="state", when="first-step", rng=ev.rng_state(), flags=ev.flags()))


_installer: Installer | None = None


def active() -> Evidence | None:
    return base.active


def install(config: dict[str, Any]) -> Installer:
    """Called once at child start, before the script runs (after a pinned re-exec, if any)."""
    global _installer
    base.active = Evidence(config)
    _installer = Installer(base.active)
    _installer.install_early()
    return _installer


def attach(recorder: Any, torch: ModuleType) -> None:
    """When torch is imported: events now go to the trace; instrument torch before the script sees it."""
    if _installer is not None:
        _installer.ev.attach_recorder(recorder)
        _installer.on_torch(torch)


def finish(recorder: Any) -> None:
    """Before the trace is closed (also a script that never imported torch gets its evidence)."""
    if _installer is None:
        return
    try:
        if _installer.ev.recorder is None:
            _installer.ev.attach_recorder(recorder)
        _installer.finish()
    except Exception as exc:  # the script's outcome matters more than the last evidence
        print(f"detaudit: could not record the final evidence: {exc}", file=sys.stderr)
