"""Run one detaudit repeat with a stopwatch around the recorder's hooks.

    python benchmarks/hooktimer.py CONFIG SCRIPT [ARGS...]     (as `python -m detaudit.run.child`)

Prints `HOOKS {"hook_s": [...]}` on stderr: the seconds spent inside detaudit's module and
optimizer hooks in each training step. Divided by the rest of the same step, this overhead
figure is self-normalising: a busy machine slows the step and the hooks alike, where comparing
two separate processes' step times is at the mercy of whatever else runs meanwhile.
"""

from __future__ import annotations

import atexit
import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from detaudit.run import child

per_step: list[float] = []
pending = [0.0]


def timed(method: Callable[..., Any], ends_step: bool = False) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            pending[0] += time.perf_counter() - start
            if ends_step:
                per_step.append(pending[0])
                pending[0] = 0.0

    return wrapper


def on_torch_import(session: child.Session, torch_module: Any, original: Any = child.Session.on_torch_import) -> None:
    """Time the hooks, then install them as the child does. Not before: importing the recorder
    imports torch, and the child must see that import happen."""
    from detaudit.recorder.hooks import Hooks

    for name in ("_on_forward_pre", "_on_forward", "_on_step_pre"):
        setattr(Hooks, name, timed(getattr(Hooks, name)))
    Hooks._on_step_post = timed(Hooks._on_step_post, ends_step=True)  # type: ignore[method-assign]
    original(session, torch_module)


child.Session.on_torch_import = on_torch_import  # type: ignore[method-assign,assignment]
atexit.register(lambda: print("HOOKS " + json.dumps({"hook_s": per_step}), file=sys.stderr))

if __name__ == "__main__":
    del sys.path[0]  # this file's directory: the child starts from the interpreter's own path (launcher.child_command)
    child.main(sys.argv[1:])
