"""Concurrency evidence: user threads and pools, completion-order iteration, DataLoader settings and
the RNG states inside its workers (causes/order.py, causes/rng.py).

Only forked DataLoader workers inherit the instrumentation; their events go to the side file.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from detaudit.events import ConcurrencyEvent, DataLoaderEvent, WorkerInitDoneEvent, WorkerStartEvent
from detaudit.recorder.evidence import base
from detaudit.recorder.evidence.base import Evidence
from detaudit.recorder.patch import wrap


def install_threads(ev: Evidence) -> None:
    """Thread starts: the script's are events; every started thread is kept (weakly), so a draw of the main
    thread while one runs says so (generators.py)."""
    _wrap_call(ev, threading.Thread, "start", "threading.Thread.start", method=True, started=ev.threads.add)


def install_futures(ev: Evidence, futures: ModuleType) -> None:
    for cls in (futures.ThreadPoolExecutor, futures.ProcessPoolExecutor):
        _wrap_call(ev, cls, "submit", f"{cls.__name__}.submit", method=True)
    _wrap_call(ev, futures, "as_completed", "concurrent.futures.as_completed", method=False)


def install_mp_pool(ev: Evidence, pool: ModuleType) -> None:
    for name in ("__init__", "imap_unordered"):
        _wrap_call(ev, pool.Pool, name, f"multiprocessing.Pool.{name.strip('_') or name}", method=True)


def install_dataloader(ev: Evidence, loader_cls: type) -> None:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def init(loader: Any, *args: Any, **kwargs: Any) -> None:
            original(loader, *args, **kwargs)
            caller = sys._getframe(1)
            if ev.is_library(caller):
                return
            fn = loader.worker_init_fn
            ev.emit(DataLoaderEvent(type="dataloader", loc=ev.where(caller), num_workers=loader.num_workers,
                                    worker_init_fn=getattr(fn, "__qualname__", None) if fn is not None else None,
                                    generator=loader.generator is not None, sampler=type(loader.sampler).__name__))
            if loader.num_workers > 0 and ev.side_path is not None:
                loader.worker_init_fn = WorkerStart(fn)  # the user's own loader: its setting, not a patch

        return init

    wrap(loader_cls, "__init__", make)


def _wrap_call(ev: Evidence, owner: Any, name: str, label: str, method: bool,
               started: Callable[[Any], None] | None = None) -> None:
    """The first call per user call site; `method`: the first argument is the object (its target is
    `_target`, a Thread's, or the first callable argument); `started`: given that object at every call."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if started is not None and args:
                started(args[0])
            caller = sys._getframe(1)
            if not ev.is_library(caller) and ev.first_time(label, caller.f_code, caller.f_lineno):
                target = None
                if method:
                    rest = args[1:]
                    target = getattr(args[0], "_target", None) or (rest[0] if rest and callable(rest[0]) else None)
                ev.emit(ConcurrencyEvent(type="concurrency", what=label, loc=ev.where(caller),
                                         target=getattr(target, "__qualname__", None)))
            return original(*args, **kwargs)

        return call

    wrap(owner, name, make)


class WorkerStart:
    """A DataLoader `worker_init_fn` wrapper: records each worker's RNG states after torch seeded it.

    Picklable (a top-level class holding the user's function), so a spawn-started worker still runs;
    only forked workers (the default on Linux) inherit the instrumentation and record evidence.
    """

    def __init__(self, user_fn: Callable[[int], Any] | None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        ev = base.active
        if ev is not None:
            ev.emit(WorkerStartEvent(type="worker-start", worker_id=worker_id, rng=ev.rng_state()))
        if self.user_fn is not None:
            self.user_fn(worker_id)
            if ev is not None:
                ev.emit(WorkerInitDoneEvent(type="worker-init-done", worker_id=worker_id, rng=ev.rng_state()))
