"""`detaudit watch`'s cost per step, side by side with plain python (docs/watch.md's table).

Each workload runs plain, under `detaudit watch --every 1000000` (only step 0 replayed: unchecked steps), under
`detaudit watch --every 1` (every step replayed) and under `detaudit watch --every 1000000 --against BASELINE`
(unchecked steps followed live against a baseline the workload saved first with `run --save-baseline`), in
interleaved rounds; the medians of the steps' CPU times (all threads: less disturbed by other processes than wall
time) are compared, warm-up steps excluded. The whole run at the default `--every` K is implied by the rows:
(K-1 unchecked steps + 1 checked) / K, over K plain steps. Not a test: it prints a markdown table.

    python benchmarks/watch.py [--steps 40] [--rounds 3] [--workloads mlp,cnn,transformer] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = HERE / "workloads"
WARMUP = 4
DEFAULT_EVERY = 20  # detaudit/report/watch_model.py WatchSettings.every (not imported: the benchmark runs any detaudit)
UNCHECKED = 1_000_000


def _env(device: str) -> dict[str, str]:
    # one thread: on a shared machine, several threads' CPU time mostly measures their spinning for each other
    return {**os.environ, "OMP_NUM_THREADS": "1", **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}


def step_times(command: list[str], cwd: Path, device: str) -> list[float]:
    proc = subprocess.run(command, cwd=cwd, env=_env(device), capture_output=True, text=True)
    bench = next((line for line in proc.stderr.splitlines() if line.startswith("BENCH ")), None)
    if proc.returncode != 0 or bench is None:
        raise RuntimeError(f"{command} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return list(json.loads(bench[6:])["cpu_s"])


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="mlp,cnn,transformer")
    parser.add_argument("--device", default="cpu")
    options = parser.parse_args()
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
