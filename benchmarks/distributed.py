#!/usr/bin/env python
"""Overhead of a 2-rank audit against the same torchrun job run plainly (issue 12).

    python benchmarks/distributed.py [--pairs 3] [--steps 3 200]

For each step count, `pairs` times, interleaved so machine load shifts both sides alike:
two plain launches (`python -m torch.distributed.run --standalone --nproc-per-node 2
tests/scripts/train_ddp.py --steps S`) against one `detaudit run -n 2 --nproc-per-node 2` of the
same job (two launches, recorded, then compared). Prints medians and their ratio; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "train_ddp.py"


def timed(cmd: list[str], cwd: Path, ok: tuple[int, ...]) -> float:
    """Wall time of one command. A plain gloo launch may exit 1 after the job finished (an abort in
    interpreter teardown, pytorch PR #179291): that still times the job, so it is accepted."""
    started = time.perf_counter()
    code = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    if code not in ok:
        raise SystemExit(f"{' '.join(cmd)} exited {code}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, nargs="+", default=[3, 200])
    args = parser.parse_args()
    plain_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT)]
    print(f"{'steps':>6} {'2 plain torchrun launches (s)':>30} {'detaudit run -n 2 (s)':>22} {'ratio':>6}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for steps in args.steps:
            plain, audit = [], []
            for i in range(args.pairs):
                plain.append(sum(timed([*plain_cmd, "--steps", str(steps)], cwd, (0, 1)) for _ in range(2)))
                audit.append(timed([sys.executable, "-m", "detaudit", "run", str(SCRIPT), "-n", "2",
                                    "--nproc-per-node", "2", "--granularity", "module", "--quiet",
                                    "--out", str(cwd / f"run-{steps}-{i}"), "--", "--steps", str(steps)], cwd, (0,)))
            p, a = statistics.median(plain), statistics.median(audit)
            print(f"{steps:>6} {p:>30.2f} {a:>22.2f} {a / p:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
