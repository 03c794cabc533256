"""Shared by the reference workloads: argument parsing, seeding and per-step timing.

Step times go to stderr, never stdout: detaudit compares each repeat's stdout, and timings
differ from run to run by nature.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def parse_args(description: str, default_steps: int = 60, width: int | None = None,
               batch: int | None = None) -> argparse.Namespace:
    """The workloads' options; `width`, `batch`: offer --width (a hidden layer's size) and --batch (samples a
    step) with these defaults."""
    parser = argparse.ArgumentParser(description=description)
    if width is not None:
        parser.add_argument("--width", type=int, default=width, help="the hidden layer's size")
    if batch is not None:
        parser.add_argument("--batch", type=int, default=batch, help="samples per step")
    parser.add_argument("--steps", type=int, default=default_steps, help="training steps to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (benchmarks/run.py --cuda)")
    parser.add_argument("--diverge-at", type=int, default=None, metavar="STEP",
                        help="nudge a weight by an unseeded random amount before this step: a run-to-run "
                             "divergence, to time detaudit's narrowing (--granularity auto)")
    parser.add_argument("--python-random-at", type=int, default=None, metavar="STEP",
                        help="nudge a weight by one draw from Python's unseeded `random` before this step: the "
                             "held-out case of live audits (a long run that diverges early)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    return args


def train_classifier(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                     labels: torch.Tensor, args: argparse.Namespace) -> None:
    """The workloads' shared loop: cross-entropy on batch `i % len(inputs)`, one optimizer step each.

    The model must already be on `args.device` (the optimizer holds its parameters); the data is moved here."""
    inputs, labels = inputs.to(args.device), labels.to(args.device)

    def step(i: int) -> torch.Tensor:
        batch = i % len(inputs)
        loss = F.cross_entropy(model(inputs[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    train(step, model, args)


def train(step: Callable[[int], torch.Tensor], model: torch.nn.Module, args: argparse.Namespace) -> None:
    """Run `step(i)` `args.steps` times; print the final loss (stdout) and per-step seconds (stderr).

    Both wall and CPU seconds (all threads of this process): on a shared machine, CPU time is
    far less disturbed by other processes than wall time.
    """
    wall, cpu = [], []
    loss = torch.zeros(())
    # on a GPU a step's kernels run after its Python returns: wait for them, or only launches are timed
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    for i in range(args.steps):
        if i == args.diverge_at:
            with torch.no_grad():
                weight = next(model.parameters())
                weight.view(-1)[0] += 1e-3 * (int.from_bytes(os.urandom(2), "little") + 1) / 65536
        if i == args.python_random_at:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1e-3 * random.random()
        start, start_cpu = time.perf_counter(), time.process_time()
        loss = step(i)
        sync()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(f"final loss {loss.item():.8f}")
    print("BENCH " + json.dumps({"step_s": wall, "cpu_s": cpu}), file=sys.stderr)
