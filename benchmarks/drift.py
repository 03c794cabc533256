"""`detaudit drift`'s cost, side by side with two plain runs of the same script (the cheapest way to look at a
difference by hand): CPU seconds of all the processes each starts (user + system, children included: less
disturbed by other processes than wall time), and wall seconds. Not a test: it prints a markdown row.

    python benchmarks/drift.py [--steps 2] [--rounds 1]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "train_drift.py"


def cost(command: list[str], cwd: Path) -> tuple[float, float]:
    """(CPU seconds of the command and everything it started, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{command} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def measure(steps: int, rounds: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """Median (CPU, wall) of two plain runs (A, then B with --lr 0.2) and of one drift check of the same (without
    the op window, which adds two interpreters on a drift)."""
    plain: list[tuple[float, float]] = []
    checked: list[tuple[float, float]] = []
    args = ["--steps", str(steps)]
    for n in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            a = cost([sys.executable, str(SCRIPT), *args], Path(tmp))
            b = cost([sys.executable, str(SCRIPT), *args, "--lr", "0.2"], Path(tmp))
            plain.append((a[0] + b[0], a[1] + b[1]))
            checked.append(cost([sys.executable, "-m", "detaudit", "drift", str(SCRIPT), "--b-args", "--lr 0.2",
                                 "--out", str(Path(tmp) / f"drift-{n}"), "-q", "--no-op-window", "--", *args],
                                Path(tmp)))
    return ((statistics.median(c for c, _ in plain), statistics.median(w for _, w in plain)),
            (statistics.median(c for c, _ in checked), statistics.median(w for _, w in checked)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    options = parser.parse_args()
    (plain_cpu, plain_wall), (drift_cpu, drift_wall) = measure(options.steps, options.rounds)
    print("| workload | two plain runs: CPU s / wall s | `detaudit drift` (4 interpreters): CPU s / wall s | "
          "CPU ratio |")
    print("|---|---|---|---|")
    print(f"| train_drift.py, {options.steps} steps | {plain_cpu:.1f} / {plain_wall:.1f} | "
          f"{drift_cpu:.1f} / {drift_wall:.1f} | {drift_cpu / plain_cpu:.2f}x |")


if __name__ == "__main__":
    main()
