"""`detaudit watch`'s cost per step, side by side with plain python (docs/watch.md's table).

Each workload runs plain, under `detaudit watch --every 1000000` (only step 0 replayed: unchecked steps) and
under `detaudit watch --every 1` (every step replayed), in interleaved rounds; the medians of the steps' CPU
times (all threads: less disturbed by other processes than wall time) are compared, warm-up steps excluded.
Not a test: it prints a markdown table.

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


def step_times(command: list[str], cwd: Path, device: str) -> list[float]:
    # one thread: on a shared machine, several threads' CPU time mostly measures their spinning for each other
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    bench = next((line for line in proc.stderr.splitlines() if line.startswith("BENCH ")), None)
    if proc.returncode != 0 or bench is None:
        raise RuntimeError(f"{command} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return list(json.loads(bench[6:])["cpu_s"])


def measure(workload: str, steps: int, rounds: int, device: str) -> tuple[float, float, float]:
    """Median CPU seconds of a plain step, an unchecked watched step and a checked watched step."""
    script = WORKLOADS / f"{workload}.py"
    args = ["--steps", str(steps), "--device", device]
    plain: list[float] = []
    unchecked: list[float] = []
    checked: list[float] = []
    for n in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            plain += step_times([sys.executable, str(script), *args], WORKLOADS, device)[WARMUP:]
            for every, into in ((1_000_000, unchecked), (1, checked)):
                into += step_times([sys.executable, "-m", "detaudit", "watch", str(script), "--every", str(every),
                                    "--out", str(Path(tmp) / f"watch-{n}-{every}"), *args], WORKLOADS,
                                   device)[WARMUP:]
    return statistics.median(plain), statistics.median(unchecked), statistics.median(checked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="mlp,cnn,transformer")
    parser.add_argument("--device", default="cpu")
    options = parser.parse_args()
    print("| workload | plain step | unchecked step | checked step (every op twice) |")
    print("|---|---|---|---|")
    for workload in options.workloads.split(","):
        plain, unchecked, checked = measure(workload, options.steps, options.rounds, options.device)
        print(f"| {workload} ({options.device}) | {plain * 1e3:.2f} ms | {unchecked * 1e3:.2f} ms "
              f"({unchecked / plain:.2f}×) | {checked * 1e3:.2f} ms ({checked / plain:.2f}×) |", flush=True)


if __name__ == "__main__":
    main()
