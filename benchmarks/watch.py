"""`detaudit watch`'s cost per step, side by side with plain python (docs/watch.md's table).

Each workload runs plain, under `detaudit watch --every 1000000` (only step 0 replayed: unchecked steps), under
`detaudit watch --every 1` (every step replayed) and under `detaudit watch --every 1000000 --against BASELINE`
(unchecked steps followed live against a baseline the workload saved first with `run --save-baseline`), in
interleaved rounds; the medians of the steps' CPU times (all threads: less disturbed by other processes than wall
time) are compared, warm-up steps excluded. The whole run at the default `--every` K is implied by the rows:
(K-1 unchecked steps + 1 checked) / K, over K plain steps. Not a test: it prints a markdown table.

`--jobs` measures whole jobs instead, whose steps are not alike (a PPO-like rollout before every 16th update, an
LSTM language model updated by hand, with no optimizer), plain and under watch at the default `--every`, in
interleaved rounds: the training loop's CPU time (all its steps, from the job's own BENCH line), the whole process
tree's CPU time (os.wait4's rusage: detaudit's parent and start-up included) and wall time. `--before DIR` also runs
`watch` from another checkout's `detaudit/` (on PYTHONPATH), in the same rounds: before and after side by side.

    python benchmarks/watch.py [--steps 40] [--rounds 3] [--workloads mlp,cnn,transformer] [--device cpu]
    python benchmarks/watch.py --jobs rollout,lstm_lm [--steps 160] [--rounds 2] [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads"
WARMUP = 4
DEFAULT_EVERY = 20  # detaudit/report/watch_model.py WatchSettings.every (not imported: the benchmark runs any detaudit)
UNCHECKED = 1_000_000


def _env(device: str) -> dict[str, str]:
    # one thread: on a shared machine, several threads' CPU time mostly measures their spinning for each other
    return {**os.environ, "OMP_NUM_THREADS": "1", **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}


@dataclass(frozen=True)
class Job:
    """One run of a workload: its steps' CPU seconds (the job's BENCH line), and the whole process tree's CPU and
    wall seconds (detaudit's parent, start-up and imports included)."""

    steps_cpu: list[float]
    cpu: float
    wall: float


def run_job(command: list[str], cwd: Path, device: str, pythonpath: str | None = None) -> Job:
    """Run `command` and wait for it with os.wait4: its rusage counts it and every descendant it waited for."""
    env = _env(device) if pythonpath is None else {**_env(device), "PYTHONPATH": pythonpath}
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    bench = next((line for line in stderr.splitlines() if line.startswith("BENCH ")), None)
    if proc.returncode != 0 or bench is None:
        raise RuntimeError(f"{command} failed ({proc.returncode}):\n{stderr[-2000:]}")
    return Job(list(json.loads(bench[6:])["cpu_s"]), usage.ru_utime + usage.ru_stime, wall)


def step_times(command: list[str], cwd: Path, device: str) -> list[float]:
    return run_job(command, cwd, device).steps_cpu


def save_baseline(script: Path, args: list[str], into: Path, device: str) -> None:
    """The reference `--against` follows: one repeat of the workload recorded at step granularity."""
    command = [sys.executable, "-m", "detaudit", "run", str(script), "-n", "2", "--granularity", "step", "-q",
               "--out", str(into / "run"), "--save-baseline", str(into / "base"), "--", *args]
    proc = subprocess.run(command, cwd=WORKLOADS, env=_env(device), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{command} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")


def measure(workload: str, steps: int, rounds: int, device: str) -> dict[str, float]:
    """Median CPU seconds of a plain step, an unchecked and a checked watched step, an unchecked one --against."""
    script = WORKLOADS / f"{workload}.py"
    args = ["--steps", str(steps), "--device", device]
    times: dict[str, list[float]] = {"plain": [], "unchecked": [], "checked": [], "against": []}
    with tempfile.TemporaryDirectory() as tmp:
        save_baseline(script, args, Path(tmp), device)
        for n in range(rounds):
            times["plain"] += step_times([sys.executable, str(script), *args], WORKLOADS, device)[WARMUP:]
            for name, extra in (("unchecked", ["--every", str(UNCHECKED)]), ("checked", ["--every", "1"]),
                                ("against", ["--every", str(UNCHECKED), "--against", str(Path(tmp) / "base")])):
                times[name] += step_times([sys.executable, "-m", "detaudit", "watch", str(script), *extra,
                                           "--out", str(Path(tmp) / f"watch-{n}-{name}"), "--", *args], WORKLOADS,
                                          device)[WARMUP:]
    return {name: statistics.median(values) for name, values in times.items()}


def measure_job(workload: str, steps: int, rounds: int, device: str, before: str | None) -> dict[str, list[Job]]:
    """Each round: plain, watch at the default --every, watch with unchecked steps only, watch with every step
    checked, and (with `before`) watch at the default from that checkout, one after the other."""
    script = WORKLOADS / f"{workload}.py"
    args = ["--steps", str(steps), "--device", device]
    variants = {"plain": ([], None), "default": (["--every", str(DEFAULT_EVERY)], None),
                "unchecked": (["--every", str(UNCHECKED)], None), "checked": (["--every", "1"], None),
                **({"before": (["--every", str(DEFAULT_EVERY)], before)} if before else {})}
    jobs: dict[str, list[Job]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(rounds):
            for name, (extra, path) in variants.items():
                command = [sys.executable, str(script), *args] if name == "plain" else \
                    [sys.executable, "-m", "detaudit", "watch", str(script), *extra, "--out",
                     str(Path(tmp) / f"watch-{n}-{name}"), "--", *args]
                jobs[name].append(run_job(command, WORKLOADS, device, path))
    return jobs


def job_rows(workload: str, device: str, jobs: dict[str, list[Job]]) -> list[str]:
    """One row per round: the loop's CPU, the process tree's CPU and wall, each over the same round's plain run.
    (The caller adds a row of each variant's least disturbed run: the one with the least loop CPU.)"""
    def ratio(name: str, n: int, plain: Job) -> str:
        if name not in jobs:
            return "—"
        job = jobs[name][n]
        return (f"{sum(job.steps_cpu) / sum(plain.steps_cpu):.2f}× / {job.cpu / plain.cpu:.2f}× / "
                f"{job.wall / plain.wall:.2f}×")

    rows = []
    for n, plain in enumerate(jobs["plain"]):
        unchecked = statistics.median(jobs["unchecked"][n].steps_cpu[WARMUP:])
        checked = statistics.median(jobs["checked"][n].steps_cpu[WARMUP:])
        median = statistics.median(plain.steps_cpu[WARMUP:])
        rows.append(f"| {workload} ({device}), round {n + 1} | {sum(plain.steps_cpu):.2f} s / {plain.cpu:.2f} s / "
                    f"{plain.wall:.2f} s | {ratio('before', n, plain)} | {ratio('default', n, plain)} | "
                    f"{ratio('unchecked', n, plain)} | "
                    f"{unchecked / median:.2f}× | {checked / median:.2f}× |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 40; --jobs: 160)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; --jobs: 2)")
    parser.add_argument("--workloads", default="mlp,cnn,transformer")
    parser.add_argument("--jobs", default=None, help="whole jobs to measure instead (rollout,lstm_lm)")
    parser.add_argument("--before", default=None, metavar="DIR", help="--jobs: also watch with DIR's detaudit/")
    parser.add_argument("--device", default="cpu")
    options = parser.parse_args()
    if options.jobs:
        print(f"| job (loop CPU / process CPU / wall) | plain | watch before, --every {DEFAULT_EVERY} | watch, --every "
              f"{DEFAULT_EVERY} | watch, unchecked steps | unchecked step (median) | checked step (median) |")
        print("|---|---|---|---|---|---|---|")
        for workload in options.jobs.split(","):
            jobs = measure_job(workload, options.steps or 160, options.rounds or 2, options.device, options.before)
            best = {name: [min(runs, key=lambda job: sum(job.steps_cpu))] for name, runs in jobs.items()}
            rows = job_rows(workload, options.device, jobs)
            rows.append(job_rows(workload, options.device, best)[0].replace("round 1", "least loop CPU of each"))
            print("\n".join(rows), flush=True)
        return
    options.steps, options.rounds = options.steps or 40, options.rounds or 3
    print(f"| workload | plain step | unchecked step | checked step (every op twice) | unchecked step --against "
          f"(vs unchecked) | whole run at --every {DEFAULT_EVERY} |")
    print("|---|---|---|---|---|---|")
    for workload in options.workloads.split(","):
        t = measure(workload, options.steps, options.rounds, options.device)
        plain, unchecked, checked, against = t["plain"], t["unchecked"], t["checked"], t["against"]
        whole = ((DEFAULT_EVERY - 1) * unchecked + checked) / DEFAULT_EVERY / plain
        print(f"| {workload} ({options.device}) | {plain * 1e3:.2f} ms | {unchecked * 1e3:.2f} ms "
              f"({unchecked / plain:.2f}×) | {checked * 1e3:.2f} ms ({checked / plain:.2f}×) | {against * 1e3:.2f} ms "
              f"({(against / unchecked - 1) * 100:+.1f}%) | {whole:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
