"""Synthetic traces and run directories, written with the real TraceWriter, for tests that need
exact control over what each repeat recorded (compare, report, cli) without running scripts."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from detaudit.recorder.fingerprint import DTYPE_CODES
from detaudit.records import RUN
from detaudit.results import RepeatResult
from detaudit.trace import Kind, TraceWriter
from detaudit.trace.dtypes import OBJECT_CODES

_CODES_BY_NAME = {**{str(dt).removeprefix("torch."): code for dt, code in DTYPE_CODES.items()}, **OBJECT_CODES}


@dataclass(frozen=True)
class Rec:
    """One record as a test writes it (strings instead of string ids)."""

    name: str
    digest: int
    step: int = 0
    kind: Kind = Kind.OUTPUT
    samples: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    dtype: str = "float32"
    shape: str = "4"
    module: str = ""
    loc: str = "train.py:10"
    flags: int = 0

    def but(self, **changes: Any) -> Rec:
        return replace(self, **changes)


def write_trace(path: Path, records: Sequence[Rec], footer: dict[str, Any] | None = None,
                events: Sequence[tuple[int, dict[str, Any]]] = (), header: dict[str, Any] | None = None,
                flush_every: int = 0) -> Path:
    """Write `records` as one repeat's trace; `footer=None` leaves it incomplete.

    `events` are (record index, event) pairs; `flush_every` > 0 writes several record frames.
    """
    writer = TraceWriter(path, header if header is not None else {"repeat": 0})
    pending_events = sorted(events, key=lambda e: e[0])
    for i, r in enumerate(records):
        while pending_events and pending_events[0][0] == i:
            writer.event(pending_events.pop(0)[1])
        module = writer.intern(r.module) if r.module else 0
        writer.add((int(r.kind), _CODES_BY_NAME[r.dtype], r.flags, 0, writer.intern(r.name), module,
                    writer.intern(r.loc), r.step, writer.intern(r.shape), 0, r.digest, 0, 0, r.samples))
        if flush_every and (i + 1) % flush_every == 0:
            writer.flush()
    for _, event in pending_events:
        writer.event(event)
    if footer is None:
        writer.abandon()
    else:
        writer.close(footer)
    return path


def training_records(steps: int = 3, layers: int = 2, seed: int = 0) -> list[Rec]:
    """A plausible training trace: layer outputs, grads, params per step, distinct digests."""
    recs: list[Rec] = []
    for step in range(steps):
        for kind, suffix in ((Kind.OUTPUT, ""), (Kind.GRAD, ".weight"), (Kind.PARAM, ".weight")):
            for layer in range(layers):
                n = len(recs)
                value = float(n + 1 + seed)
                recs.append(Rec(f"net.{layer}{suffix}", digest=1000 * (seed + 1) + n, step=step, kind=kind,
                                samples=(value, value / 2, -value, value * 3), module=f"net.{layer}"))
    return recs


def write_run(run_dir: Path, traces: Sequence[Sequence[Rec] | None], devices: Sequence[str] | None = None,
              exit_codes: Sequence[int] | None = None, timed_out: Sequence[bool] | None = None,
              stdout: Sequence[str] | None = None, script: str = "train.py",
              perturbations: Sequence[dict[str, str]] | None = None,
              events: Sequence[tuple[int, dict[str, Any]]] = ()) -> Path:
    """A finished run directory, as `detaudit run` leaves it (traces, stdout/stderr, run.json).

    A `None` trace writes no trace file (a repeat that died before importing torch). `perturbations`: each
    repeat's settings, as a `run --perturb` run records them (the settings varied: those of repeat 0);
    `events` go into every repeat's trace, as (record index, event) pairs.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    n = len(traces)
    devices = list(devices or ["cpu"] * n)
    exit_codes = list(exit_codes or [0] * n)
    timed_out = list(timed_out or [False] * n)
    stdout = list(stdout or [""] * n)
    results = []
    for i, recs in enumerate(traces):
        trace = run_dir / f"repeat-{i}.trace"
        if recs is not None:
            done = not timed_out[i]
            write_trace(trace, recs, {"exit_code": exit_codes[i], "error": None} if done else None,
                        header={"repeat": i}, events=events)
        (run_dir / f"repeat-{i}.stdout").write_text(stdout[i])
        (run_dir / f"repeat-{i}.stderr").write_text("" if exit_codes[i] == 0 else "RuntimeError: boom\n")
        digest = hashlib.sha256(stdout[i].encode()).hexdigest()[:16]
        results.append(RepeatResult(index=i, device=devices[i], exit_code=exit_codes[i], duration_s=0.5,
                                    timed_out=timed_out[i], trace=trace.name, stdout=f"repeat-{i}.stdout",
                                    stderr=f"repeat-{i}.stderr", stdout_digest=digest,
                                    perturbation=perturbations[i] if perturbations else None))
    record = {
        **RUN.stamp(), "script": script, "script_args": [], "cwd": str(run_dir),
        "repeats": n // len(set(devices)), "devices": sorted(set(devices)), "granularity": "module", "timeout": None,
        "tolerance": {"atol": 1e-5, "rtol": 1.3e-6}, "env": {}, "environment": {"python": "3"},
        "started": time.time(), "results": [r.to_dict() for r in results],
        **({"perturb": list(perturbations[0])} if perturbations else {}),
    }
    (run_dir / "run.json").write_text(json.dumps(record, indent=2))
    return run_dir
