"""Bounded repeats (`--max-steps N`, `--max-time SECONDS`): end a repeat early at a step boundary.

A repeat stops right after its N-th training step (after that step's records), or at the first
step boundary after the wall-clock budget, as if the script had ended there. What counts as a
step: training steps as the recorder counts them (`Hooks._on_step_pre`: one per step of the first
optimizer stepped, the other optimizers stepping right after it included) once the script has built
an optimizer; in a script that never builds one (inference, evaluation, generation), calls of a
root module's forward. With several optimizers alive, a step is over once every one of them has
stepped since the counting one did, or at the next root forward or repeated optimizer step,
whichever comes first: the others' records of that step are kept.

A stop can also be requested while the repeat runs (`stop_file`, written by the audit's live comparison,
compare/live.py, once the repeat diverged from its reference): `{"at_step": N, "diverged_at_step": S}`
in that file ends the repeat after its N-th optimizer step, exactly as --max-steps N would (a script
that builds no optimizer is never stopped so: its records carry no step to aim at). The file is
looked for at each step boundary: one failed `stat` per step while no stop is requested. The ranks of a
torchrun repeat stop at one step they agree on, at or after N (recorder/agree.py).

Stopping unwinds the script with a BaseException its `except Exception` cannot swallow, so its
`finally` blocks and context managers run (DataLoader workers are shut down); the trace is closed
first, with `stopped_at_step` in its footer, so nothing the unwinding does is recorded.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from detaudit.recorder.agree import RankStop
from detaudit.recorder.compiled import compiling
from detaudit.recorder.core import Recorder
from detaudit.recorder.patch import wrap
from detaudit.results import StoppedBy

Counting = Literal["optimizer steps", "root-module forward calls"]


@dataclass(frozen=True)
class Stop:
    """Why and where a repeat was stopped (written to the trace footer)."""

    at_step: int
    by: StoppedBy
    counting: Counting
    diverged_at_step: int | None = None  # by "divergence": the step at which the repeat diverged

    def footer(self) -> dict[str, Any]:
        diverged = {} if self.diverged_at_step is None else {"diverged_at_step": self.diverged_at_step}
        return {"stopped_at_step": self.at_step, "stopped_by": self.by, "counting": self.counting, **diverged}


class Bounds:
    """Watches step boundaries and calls `on_stop` once a bound is reached."""

    def __init__(self, recorder: Recorder, is_root: Callable[[torch.nn.Module], bool], max_steps: int | None,
                 max_time: float | None, started: float, on_stop: Callable[[Stop], None],
                 stop_file: str | None = None, ranks: RankStop | None = None) -> None:
        """`ranks`: in a rank of a torchrun repeat, how the ranks agree on the step at which all stop."""
        self.recorder = recorder
        self.is_root = is_root
        self.max_steps = max_steps
        self.deadline = started + max_time if max_time is not None else None
        self.on_stop = on_stop
        self.stop_file = stop_file
        self.ranks = ranks
        self.optimizer_built = False
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.forwards = 0
        self.stopped = False
        self._due: int | None = None  # a step that ended while other optimizers may still step in it
        self._stepped_since: set[int] = set()

    def install(self) -> None:
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        self.recorder.step_callbacks.append(self._on_step)
        nn_module.register_module_forward_hook(self._on_forward)
        # after the recorder's hooks (installed first), so a step's own records come before a stop
        nn_module.register_module_forward_pre_hook(self._on_forward_pre)
        optim.register_optimizer_step_pre_hook(self._on_optimizer_pre)
        optim.register_optimizer_step_post_hook(self._on_optimizer_post)
        bounds = self

        def make(original: Callable[..., None]) -> Callable[..., None]:
            def init(optimizer: Any, *args: Any, **kwargs: Any) -> None:
                bounds.optimizer_built = True
                bounds.optimizers.add(optimizer)
                original(optimizer, *args, **kwargs)

            return init

        wrap(torch.optim.Optimizer, "__init__", make)

    def _on_step(self, step: int) -> None:
        """A step ended: checked once the other optimizers had their turn in it (`_on_optimizer_post`)."""
        self._step_over()  # the step before, if it was still open (an optimizer took over the counting)
        self._due = step
        self._stepped_since.clear()

    def _on_optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._due is None or compiling():
            return
        self._stepped_since.add(id(optimizer))
        if len(self._stepped_since) >= len(self.optimizers):
            self._step_over()

    def _on_optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._due is not None and id(optimizer) in self._stepped_since and not compiling():
            self._step_over()

    def _on_forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._due is not None and not compiling() and not self.recorder.local.paused and self.is_root(module):
            self._step_over()

    def _step_over(self) -> None:
        step, self._due = self._due, None
        if step is not None:
            self._check(step, "optimizer steps")

    def _on_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if compiling() or self.recorder.local.paused or self.optimizer_built or not self.is_root(module):
            return
        self.forwards += 1
        self._check(self.forwards, "root-module forward calls")

    def _check(self, count: int, counting: Counting) -> None:
        if self.stopped:
            return
        diverged: int | None = None
        by: StoppedBy
        if self.max_steps is not None and count >= self.max_steps:
            by = "max-steps"
        elif self.deadline is not None and time.time() >= self.deadline:
            by = "max-time"
        elif counting == "optimizer steps" and (request := self._requested()) is not None and \
                (count >= request[0] if self.ranks is None else self.ranks.stops(count, request[0])):
            by, diverged = "divergence", request[1]
        else:
            return
        self.stopped = True
        self.on_stop(Stop(count, by, counting, diverged))

    def _requested(self) -> tuple[int, int] | None:
        """(at_step, diverged_at_step) from the stop file, once the audit wrote it (atomically)."""
        if self.stop_file is None:
            return None
        try:  # os.open, not open(): the evidence of files the script reads must not see detaudit's own
            fd = os.open(self.stop_file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                request = json.loads(os.read(fd, 4096))
            finally:
                os.close(fd)
            return int(request["at_step"]), int(request["diverged_at_step"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError):  # not the audit's request: ignored, never fatal
            self.stop_file = None
            return None
