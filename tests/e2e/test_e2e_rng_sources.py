"""End to end: seeding done by a helper library (the way Lightning's `seed_everything` and HF's `set_seed`
do it) is seeding. The helper is installed into a virtual environment's site-packages, so the child sees
its calls as library calls made on the user's line, as it would the real frameworks' (neither is a
dependency of this project). The RNG objects a script owns and seeding undone by `fork_rng` are scenario
scripts of the cause matrix (train_private_noise.py, train_batch_order.py, train_encoder_init.py)."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.process]

REPO = Path(__file__).resolve().parents[2]
HELPER = """\
import random

import numpy as np
import torch


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    return seed
"""
# seeded through the helper; the divergence is planted in backward (memory never written), unrelated to seeding
SCRIPT = """\
import random

import torch
import torch.nn as nn
from seedhelp import seed_everything


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        scratch = torch.empty(grad.shape[0], 4)
        scratch[:, :2] = 0
        return grad * 2 + 1e-3 * scratch[:, 2:3]


def main():
    seed_everything(42)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 1))
    rows = torch.randn(32, 4)
    order = list(range(32))
    random.shuffle(order)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        batch = order[step * 8:step * 8 + 8]
        loss = Scale.apply(model(rows[batch])).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"loss {loss.item():.6f}")


main()
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment that sees this interpreter's packages, with the helper installed in it.

    Not `--system-site-packages`: run from inside a virtual environment, `venv` builds on the base interpreter,
    whose packages those are, not the running environment's (which holds rich, numpy, torch). A .pth file adds
    the running interpreter's own site directories instead (their .pth files processed, as site does)."""
    root = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    assert purelib != sysconfig.get_paths()["purelib"]
    (Path(purelib) / "seedhelp.py").write_text(HELPER)
    seen = "; ".join(f"site.addsitedir({d!r})" for d in site.getsitepackages())
    (Path(purelib) / "outer-site-packages.pth").write_text(f"import site; {seen}\n")
    return python


def test_seeding_through_a_helper_library_is_seeding(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "120"}
    proc = subprocess.run([str(venv), "-m", "detaudit", "run", "train.py", "-n", "2", "-j", "2", "-q", "--no-explain",
                           "--json", "report.json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    found = [c["id"] for c in report["causes"]]
    assert found[0] == "uninitialized-memory", report["causes"]
    assert not {"unseeded-torch-rng", "unseeded-python-rng", "unseeded-numpy-rng", "varying-seed"} & set(found)
    assert "no torch seeding call" not in json.dumps(report["causes"])
