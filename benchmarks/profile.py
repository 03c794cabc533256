#!/usr/bin/env python
"""Where repeat 0's time goes (issue 47): its recording split by part, against one plain run and a floor.

    python benchmarks/profile.py                    the long early-divergence workload and the many-small one
    python benchmarks/profile.py --only narrow      one of them (`live`: workloads/small.py widened, an unseeded
                                                    draw at step 12; `narrow`: 1,100 small tensors a step)
    python benchmarks/profile.py --steps 300        fewer steps (the default: each workload's own below)

Per workload, interleaved: one plain run, repeat 0 as an audit runs it (a module-granularity child, followed by
the live comparison in this process, as `detaudit run` follows its first repeat) and the same repeat profiled.
The overhead is CPU time (children's user + system, `RUSAGE_CHILDREN`, and this process's thread time in the
live comparison): on a shared machine wall time moves with the other work, CPU time far less. Wall is given too.

The profiled repeat splits detaudit's own time by part, each function's time less the parts it calls
(thread CPU time, less the clock's own cost per call, calibrated in the repeat):
- hook dispatch: detaudit's hooks and the Recorder's bookkeeping around each record (names, locations, the
  digest cache, the step's end and its callbacks: bounds, the stop file);
- fingerprint: xxh3 over the tensors' bytes; sampling: reading the 4 sampled values (plans included);
- trace write: packing rows, interning strings, writing frames;
- live comparison: this process following the repeat's trace (LiveWatch.poll), thread CPU time.
What is left of the overhead (`unattributed`) is detaudit's start-up in the repeat (imports, evidence hooks),
torch's own slower module-call path once global hooks exist, and the profiler's clocks.

The floor: the bytes one step records (an upper bound: a tensor recorded twice in a step is hashed once) at
this CPU's measured xxh3 speed, plus a fixed cost per record: one `fingerprint_cpu` of a 16-byte tensor and
one record packed and queued (`TraceWriter.add`), measured here; the least a record made from Python pays.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads"
PARTS = ("hook dispatch", "fingerprint", "sampling", "trace write")
LIVE = "live comparison"
# taken before the repeat's evidence hooks wrap the clocks (a wrapped clock records a clock read, and the
# profiler's own reads would then be recorded, and timed, without end)
_CLOCK = time.thread_time


@dataclass(frozen=True)
class Workload:
    """One profiled script: its file under workloads/ and its arguments."""

    name: str
    script: str
    args: tuple[str, ...]
    steps: int


WORKLOADS_PROFILED = {
    # the shape of benchmarks/run.py's live row (the held-out case), fewer steps: repeat 0 is the run's whole cost
    "live": Workload("live", "small.py", ("--width", "8192", "--batch", "256", "--python-random-at", "12"), 300),
    "narrow": Workload("narrow", "narrow.py", (), 100),
}


# -- inside the profiled repeat ---------------------------------------------------------------------

class Split:
    """Exclusive time per part: each wrapped call's time less that of the wrapped calls inside it."""

    def __init__(self, clock: Callable[[], float] = _CLOCK) -> None:
        self.clock = clock
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack = [0.0]
        self.bias = 0.0  # seconds one wrapped call adds to its part by the clock reads alone (`calibrate`)

    def calibrate(self, calls: int = 20000) -> None:
        """Measure what a wrapped call of nothing is charged, to take it off every part per call."""
        empty = self.wrap(lambda: None, "calibration")
        for _ in range(calls):
            empty()
        self.bias = self.totals.pop("calibration") / self.calls.pop("calibration")

    def corrected(self) -> dict[str, float]:
        return {part: max(0.0, s - self.bias * self.calls[part]) for part, s in self.totals.items()}

    def wrap(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        clock, stack, totals, calls = self.clock, self._stack, self.totals, self.calls

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack.append(0.0)
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - start
                totals[part] += spent - stack.pop()
                calls[part] += 1
                stack[-1] += spent

        return timed

    def patch(self, owner: Any, names: Sequence[str], part: str) -> None:
        for name in names:
            setattr(owner, name, self.wrap(getattr(owner, name), part))


class _TimedXxhash:
    """xxhash as fingerprint.py and boundary.py call it, each digest timed as `fingerprint`."""

    def __init__(self, split: Split, real: Any) -> None:
        self.xxh3_64_intdigest = split.wrap(real.xxh3_64_intdigest, "fingerprint")


def install_split(split: Split) -> None:
    """Wrap detaudit's recording functions by part (before the child installs its hooks)."""
    import xxhash

    from detaudit.recorder import boundary, fingerprint
    from detaudit.recorder.core import Recorder
    from detaudit.recorder.hooks import Hooks
    from detaudit.trace import writer

    hooks = [n for n in ("_on_forward_pre", "_on_forward", "_on_step_pre", "_on_step_post", "_on_save",
                         "_on_scheduler_step", "_record_buffers", "layout") if hasattr(Hooks, n)]
    split.patch(Hooks, hooks, "hook dispatch")
    split.patch(Recorder, ["record_tensor", "record_group", "digest_now", "location_id", "end_step",
                           "resolve_pending", "root_forward"], "hook dispatch")
    split.patch(boundary.HostGroup, ["rows"], "hook dispatch")
    split.patch(writer.TraceWriter, ["add", "add_block", "flush", "sync", "intern", "event"], "trace write")
    timed = _TimedXxhash(split, xxhash)
    fingerprint.xxhash = timed  # type: ignore[assignment]
    boundary.xxhash = timed  # type: ignore[assignment]
    real_reader = fingerprint._sample_reader
    fingerprint._sample_reader = lambda dtype, numel: split.wrap(real_reader(dtype, numel), "sampling")
    real_layout = boundary.sample_layout

    def timed_layout(dtype: Any, numel: int) -> Any:
        found = real_layout(dtype, numel)
        return found if found.unpack is None else found._replace(unpack=split.wrap(found.unpack, "sampling"))

    boundary.sample_layout = timed_layout
    # fingerprint_cpu's own frame (plan lookup, the ctypes view) is sampling's set-up
    fingerprint.fingerprint_cpu = split.wrap(fingerprint.fingerprint_cpu, "sampling")
    from detaudit.recorder import core

    core.fingerprint_cpu = fingerprint.fingerprint_cpu
    boundary.fingerprint_cpu = fingerprint.fingerprint_cpu


def child_main(argv: list[str]) -> None:
    """Run one repeat as `python -m detaudit.run.child` does, with the split installed once torch is imported."""
    from detaudit.run import child

    split = Split()
    original = child.Session.on_torch_import

    def on_torch_import(session: Any, torch_module: Any) -> None:
        split.calibrate()
        install_split(split)
        original(session, torch_module)

    child.Session.on_torch_import = on_torch_import  # type: ignore[method-assign]
    atexit.register(lambda: print("PROFILE " + json.dumps({"s": split.corrected(), "calls": split.calls,
                                                                     "bias_s": split.bias}),
                                  file=sys.stderr, flush=True))
    child.main(argv)


# -- in this process --------------------------------------------------------------------------------

def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Run:
    """One measured process: CPU seconds (its own, and this process's following it), wall seconds."""

    cpu_s: float
    wall_s: float
    live_s: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    records: int = 0
    steps: int = 0
    trace: Path | None = None


def plain_run(work: Workload, steps: int) -> Run:
    before, start = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, str(WORKLOADS / work.script), *work.args, "--steps", str(steps)],
                   env=_env(), capture_output=True, check=True, cwd=WORKLOADS)
    return Run(_children_cpu() - before, time.perf_counter() - start)


def _env() -> dict[str, str]:
    """Both sides on the CPU, one torch thread: on a loaded 2-core machine torch's idle threads spin and bill CPU
    time that is no work (a 60-step plain run of narrow.py billed 31.6 CPU s under load 10)."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def repeat_zero(work: Workload, steps: int, out: Path, profiled: bool) -> Run:
    """Repeat 0 as `detaudit run` starts and follows it (Launcher + LiveWatch), the watch's poll timed."""
    from detaudit.compare.live import LiveWatch
    from detaudit.results import Tolerance
    from detaudit.run.launcher import Launcher, plan_repeats
    from detaudit.trace import RecordStream

    out.mkdir(parents=True)
    [plan] = plan_repeats(out, 1, ["cpu"], "module", stoppable=True)
    watch = LiveWatch([plan], Tolerance())
    spent = [0.0]
    poll = watch.poll

    def timed_poll(p: Any, final: bool) -> None:
        start = time.thread_time()
        try:
            poll(p, final)
        finally:
            spent[0] += time.thread_time() - start

    watch.poll = timed_poll  # type: ignore[method-assign]

    class ProfiledLauncher(Launcher):
        def _command(self, config_path: Path) -> list[str]:
            return [sys.executable, str(Path(__file__).resolve()), "--child", str(config_path), self.script_arg,
                    *self.script_args]

    kind = ProfiledLauncher if profiled else Launcher
    launcher = kind(WORKLOADS / work.script, [*work.args, "--steps", str(steps)], None, cwd=WORKLOADS, watch=watch)
    env = os.environ.copy()
    os.environ.update(_env())
    before, start = _children_cpu(), time.perf_counter()
    try:
        [result] = launcher.run([plan])
    finally:
        os.environ.clear()
        os.environ.update(env)
    run = Run(_children_cpu() - before, time.perf_counter() - start, spent[0], trace=plan.trace)
    if result.exit_code != 0:
        raise RuntimeError(f"{work.name}: repeat 0 exited {result.exit_code}: {plan.stderr.read_text()[-2000:]}")
    stream = RecordStream(plan.trace)
    stream.drain()
    run.records = int((stream.footer or {}).get("records", 0))
    run.steps = len((stream.footer or {}).get("step_times", []))
    if profiled:
        line = next(x for x in plan.stderr.read_text().splitlines() if x.startswith("PROFILE "))
        run.parts = json.loads(line[8:])["s"]
    return run


def hash_gbs() -> float:
    """xxh3's speed on this CPU: fingerprint_cpu over 256 MB of float32, median of 5."""
    import torch

    from detaudit.recorder.fingerprint import fingerprint_cpu

    t = torch.randn(64 << 20)
    fingerprint_cpu(t)
    times = []
    for _ in range(5):
        start = time.thread_time()
        fingerprint_cpu(t)
        times.append(time.thread_time() - start)
    return t.nbytes / statistics.median(times) / 1e9


def record_fixed_us(tmp: Path) -> float:
    """The least a record made from Python pays: fingerprint_cpu of a 16-byte tensor, one row packed and queued."""
    import torch

    from detaudit.recorder.fingerprint import fingerprint_cpu
    from detaudit.trace import TraceWriter

    writer = TraceWriter(tmp / "fixed.trace", {"repeat": 0})
    t = torch.ones(4)
    n, best = 20000, []
    for _ in range(5):
        start = time.thread_time()
        for _ in range(n):
            digest, samples = fingerprint_cpu(t)
            writer.add((1, 1, 0, 0, 1, 0, 0, 0, 0, 0, digest, 0, 0, samples))
        best.append((time.thread_time() - start) / n)
    writer.close({})
    return statistics.median(best) * 1e6


def bytes_per_step(trace: Path) -> float:
    """MB of tensor contents one (middle) step records: benchmarks/run.py's `hashed_mb_per_step`."""
    sys.path.insert(0, str(HERE))
    try:
        from run import hashed_mb_per_step  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(HERE))
    return float(hashed_mb_per_step(trace))


def profile(work: Workload, steps: int, rounds: int, tmp: Path, gbs: float, fixed_us: float,
            log: Callable[[str], None]) -> dict[str, Any]:
    plains, audits = [], []
    for rnd in range(rounds):
        log(f"  {work.name}: round {rnd + 1} of {rounds}")
        plains.append(plain_run(work, steps))
        audits.append(repeat_zero(work, steps, tmp / f"{work.name}-{rnd}", profiled=False))
    profiled = repeat_zero(work, steps, tmp / f"{work.name}-profiled", profiled=True)
    plain_cpu = statistics.median(r.cpu_s for r in plains)
    audit_cpu = statistics.median(r.cpu_s + r.live_s for r in audits)
    live_s = statistics.median(r.live_s for r in audits)
    mb = bytes_per_step(audits[0].trace) if audits[0].trace else 0.0
    run_steps = audits[0].steps or steps
    per_step = audits[0].records / run_steps
    floor_s = run_steps * (mb * (1 << 20) / (gbs * 1e9) + per_step * fixed_us / 1e6)
    return {
        "workload": work.name, "script": work.script, "args": list(work.args), "steps": run_steps,
        "records": audits[0].records, "records_per_step": per_step, "mb_per_step": mb,
        "plain_cpu_s": [r.cpu_s for r in plains], "plain_wall_s": [r.wall_s for r in plains],
        "repeat0_cpu_s": [r.cpu_s for r in audits], "repeat0_wall_s": [r.wall_s for r in audits],
        "live_cpu_s": [r.live_s for r in audits], "plain_cpu": plain_cpu, "repeat0_cpu": audit_cpu,
        "overhead_s": audit_cpu - plain_cpu, "parts_s": {**profiled.parts, LIVE: live_s},
        "profiled_cpu_s": profiled.cpu_s, "floor_s": floor_s,
    }


def table(found: dict[str, Any]) -> list[str]:
    """The split as markdown: seconds, per step, per record, share of the overhead; then the totals."""
    steps, records, overhead = found["steps"], found["records"], found["overhead_s"]
    parts = found["parts_s"]
    lines = [f"**{found['workload']}** (`workloads/{found['script']} {' '.join(found['args'])} --steps {steps}`: "
             f"{found['records_per_step']:.0f} records, {found['mb_per_step']:.1f} MB a step)", "",
             "| part | s | ms/step | µs/record | share of the overhead |", "|---|---|---|---|---|"]
    for part in (*PARTS, LIVE):
        s = float(parts.get(part, 0.0))
        lines.append(f"| {part} | {s:.2f} | {s / steps * 1e3:.3f} | {s / max(records, 1) * 1e6:.2f} | "
                     f"{s / overhead:.0%} |" if overhead > 0 else f"| {part} | {s:.2f} | | | |")
    rest = overhead - sum(float(parts.get(p, 0.0)) for p in (*PARTS, LIVE))
    lines.append(f"| unattributed | {rest:.2f} | {rest / steps * 1e3:.3f} | | {rest / overhead:.0%} |"
                 if overhead > 0 else f"| unattributed | {rest:.2f} | | | |")
    plain = found["plain_cpu"]
    ratio, floor = found["repeat0_cpu"] / plain, (plain + found["floor_s"]) / plain
    lines += ["", f"plain run {plain:.1f} CPU s (runs {_list(found['plain_cpu_s'])}; wall "
              f"{_list(found['plain_wall_s'])}), repeat 0 {found['repeat0_cpu']:.1f} CPU s with the live "
              f"comparison's {_list(found['live_cpu_s'])} (runs {_list(found['repeat0_cpu_s'])}; wall "
              f"{_list(found['repeat0_wall_s'])}): **{ratio:.2f}×** one plain run in CPU; floor "
              f"{found['floor_s']:.2f} s ({floor:.2f}×), overhead / floor {overhead / max(found['floor_s'], 1e-9):.1f}"]
    return lines


def _list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        del sys.path[0]  # this file's directory: the child starts from the interpreter's own path
        child_main(args[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(WORKLOADS_PROFILED), help="workloads: live, narrow")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: each workload's)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved plain / repeat-0 pairs")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    opts = parser.parse_args(args)
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    load = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="detaudit-profile-"))
    gbs, fixed_us = hash_gbs(), record_fixed_us(tmp)
    found = []
    for name in opts.only.split(","):
        work = WORKLOADS_PROFILED[name]
        found.append(profile(work, opts.steps or work.steps, opts.rounds, tmp, gbs, fixed_us, log))
    head = (f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} CPUs, load average {load[0]:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after; xxh3 {gbs:.1f} GB/s, fixed cost {fixed_us:.2f} µs/record")
    print(head + "\n")
    for item in found:
        print("\n".join(table(item)) + "\n")
    if opts.json is not None:
        opts.json.write_text(json.dumps({"head": head, "hash_gbs": gbs, "fixed_us": fixed_us, "workloads": found},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
