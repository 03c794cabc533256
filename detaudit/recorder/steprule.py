"""Which event ends a step under `detaudit watch`: an optimizer's step, or each backward() in a script with none.

A script that trains with no optimizer updates its parameters by hand (pytorch/examples' word_language_model:
`p.data.add_(p.grad, alpha=-lr)` after each backward), and with optimizer steps as the only boundary it was one
step: every op replayed, at several times a plain run. Each backward() is the boundary every such training has,
and watching it costs a Python call per backward (an in-place update of a parameter would have to be seen op by op,
on every step). So the first backward() to return decides: with no optimizer made by then, each backward() that
returns ends a step, from that one on; with one, optimizer steps do, as before. An optimizer that steps later
takes over for good. Torch-free: the watcher (recorder/replay.py) reports the events to it.
"""

from __future__ import annotations

from typing import Literal

Boundary = Literal["optimizer.step", "backward"]


class StepRule:
    """The step boundary a run has, learned from what it does."""

    def __init__(self) -> None:
        self.boundary: Boundary | None = None  # None until the first backward() returns or an optimizer steps
        self.optimizer_made = False

    def optimizer_built(self) -> None:
        self.optimizer_made = True

    def backward_returned(self) -> bool:
        """A backward() returned: whether it ends a step."""
        if self.boundary is None:
            self.boundary = "optimizer.step" if self.optimizer_made else "backward"
        return self.boundary == "backward"

    def optimizer_stepped(self) -> None:
        """An optimizer step ended: from now on optimizer steps end the steps, and backward() none."""
        self.boundary = "optimizer.step"
