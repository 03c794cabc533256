"""End to end: randomness that repeats where it should differ (causes/repetition.py, docs/causes.md) is found in
`detaudit run`'s report, at the line that drew, with the line that made or seeded the state and the fix; the same
scripts seeded correctly, and an evaluation loop seeded on purpose, give nothing. It never changes the verdict;
`--fail-on-repeated-randomness` makes a finding exit 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCRIPTS, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.process]

# a Dataset holding an RNG object made in the main process; `{make}` builds it, `{draw}` draws from it
WORKERS = """\
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __init__(self):
        self.rng = {make}

    def __len__(self):
        return 16

    def __getitem__(self, i):
        noise = {draw}
        return torch.full((8,), float(i)) + torch.tensor(noise, dtype=torch.float32)


def reseed(worker_id):
    loader.dataset.rng = {reseed}


torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Noisy(), batch_size=4, num_workers=2{init})
for epoch in range(2):
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
"""
NUMPY = {"make": "np.random.default_rng(0)", "draw": "self.rng.random(8)",
         "reseed": "np.random.default_rng(torch.initial_seed() % 2**32)"}
PYTHON = {"make": "random.Random(0)", "draw": "[self.rng.random() for _ in range(8)]",
          "reseed": "random.Random(torch.initial_seed())"}

# the global RNG seeded at each epoch's start, before a random augmentation; `{seed}` is the seeding
EPOCHS = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.arange(64.0).reshape(8, 8)
for epoch in range(3):
    {seed}
    for step in range(4):
        x = data + torch.randn(8, 8)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
"""

# a seeding inside the step loop, with dropout in training; `{seed}` is the seeding
STEPS = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.ones(4, 8)
for step in range(5):
    {seed}
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
"""

# training seeded once; an evaluation seeded on purpose at each epoch so it draws the same noise each time
EVALUATION = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    model.train()
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    model.eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1234)
        probe = torch.randn(16, 8)
        print(float(model(probe).sum()))
"""


def audit(tmp_path: Path, text: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    (tmp_path / "train.py").write_text(text)
    result = run_cli(["run", "train.py", "-n", "2", "--no-explain", "--json", "report.json", *extra], tmp_path)
    assert result.report is not None, result.stderr
    return result.returncode, result.report, result.stdout


def findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return list(report["repeated_randomness"])


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("rng", [NUMPY, PYTHON], ids=["numpy-generator", "python-random"])
def test_a_generator_copied_into_each_worker_is_found_across_workers_at_its_draw_line(tmp_path: Path,
                                                                                       rng: dict[str, str]) -> None:
    # The important thing is the draw line, the line that made the generator, and a fix for that line
    text = WORKERS.format(init="", **rng)
    code, report, _ = audit(tmp_path, text)
    found = findings(report)
    assert [(f["site"], f["across"], f["created_at"]) for f in found] == \
        [(f"train.py:{line_of(text, 'noise =')}", "workers", f"train.py:{line_of(text, 'self.rng =')}")]
    assert "worker_init_fn" in found[0]["fix"]
    assert code == 0  # the repeats agree: the verdict is unchanged


@pytest.mark.parametrize("rng", [NUMPY, PYTHON], ids=["numpy-generator", "python-random"])
def test_a_generator_made_anew_in_each_worker_is_not_reported(tmp_path: Path, rng: dict[str, str]) -> None:
    code, report, _ = audit(tmp_path, WORKERS.format(init=", worker_init_fn=reseed", **rng))
    assert findings(report) == []


def test_seeding_at_each_epoch_start_is_found_across_epochs_with_the_seeding_line(tmp_path: Path) -> None:
    text = EPOCHS.format(seed="torch.manual_seed(0)")
    code, report, stdout = audit(tmp_path, text)
    seeded = f"train.py:{line_of(text, '    torch.manual_seed(0)')}"
    assert [(f["site"], f["across"], f["created_at"]) for f in findings(report)] == \
        [(f"train.py:{line_of(text, 'torch.randn')}", "epochs", seeded)]
    assert "Randomness that repeats" in stdout


def test_seeding_from_the_epoch_is_not_reported(tmp_path: Path) -> None:
    code, report, stdout = audit(tmp_path, EPOCHS.format(seed="torch.manual_seed(epoch)"))
    assert findings(report) == []


def test_seeding_inside_the_step_loop_is_found_across_steps_at_the_dropout(tmp_path: Path) -> None:
    text = STEPS.format(seed="torch.manual_seed(0)")
    code, report, _ = audit(tmp_path, text)
    assert [(f["across"], f["created_at"]) for f in findings(report)] == \
        [("steps", f"train.py:{line_of(text, '    torch.manual_seed(0)')}")]


def test_a_generator_recreated_alike_in_each_training_step_is_found_across_steps(tmp_path: Path) -> None:
    """A noise helper that builds `torch.Generator().manual_seed(42)` at every call adds the same noise every step
    (once excluded as objects made alike by design)."""
    text = (SCRIPTS / "train_denoise.py").read_text()
    code, report, _ = audit(tmp_path, text)
    assert [(f["site"], f["across"], f["created_at"]) for f in findings(report)] == \
        [(f"train.py:{line_of(text, 'torch.randn(x.shape')}", "steps", f"train.py:{line_of(text, 'manual_seed(42)')}")]
    assert code == 0


def test_seeding_once_before_the_step_loop_is_not_reported(tmp_path: Path) -> None:
    code, report, _ = audit(tmp_path, STEPS.format(seed="pass"))
    assert findings(report) == []


@pytest.mark.parametrize("context", ["torch.no_grad(), torch.random.fork_rng()", "torch.random.fork_rng()"],
                         ids=["no-grad", "eval-mode-only"])
def test_an_evaluation_seeded_on_purpose_under_no_grad_or_in_eval_mode_is_not_reported(tmp_path: Path,
                                                                                      context: str) -> None:
    """Under `no_grad`, or in `model.eval()` with grad still on (the recorder follows train()/eval())."""
    code, report, _ = audit(tmp_path, EVALUATION.replace("torch.no_grad(), torch.random.fork_rng()", context))
    assert findings(report) == []


def test_fail_on_repeated_randomness_exits_1_on_a_finding_that_every_output_names(tmp_path: Path) -> None:
    """Issue 43: the gate's outcome is the verdict (it was `deterministic`, exit_code 0, in the JSON)."""
    code, report, line = audit(tmp_path, STEPS.format(seed="torch.manual_seed(0)"), "--fail-on-repeated-randomness",
                               "-q")
    assert (code, report["verdict"], report["exit_code"], line.split(" ·")[0]) == \
        (1, "repeated-randomness", 1, "REPEATED-RANDOMNESS")


def test_a_silenced_site_is_not_reported(tmp_path: Path) -> None:
    text = EPOCHS.format(seed="torch.manual_seed(0)")
    (tmp_path / "train.py").write_text(text)
    result = run_cli(["run", "train.py", "-n", "2", "--no-explain", "--json", "report.json"], tmp_path,
                     env={"DETAUDIT_REPEATS_OK": f"train.py:{line_of(text, 'torch.randn')}"})
    assert result.report is not None
    assert findings(result.report) == []


# n samples of one step, each drawn after the same seeding (the n completions of one prompt, alike)
SAMPLES = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
prompt = torch.ones(1, 8)
for step in range(3):
    completions = []
    for sample in range(4):
        {seed}
        completions.append(model(prompt + torch.randn(1, 8)))
    opt.zero_grad()
    torch.cat(completions).var(0).sum().backward()
    opt.step()
"""


def test_samples_of_one_step_seeded_alike_are_found_across_samples(tmp_path: Path) -> None:
    text = SAMPLES.format(seed="torch.manual_seed(0)")
    code, report, _ = audit(tmp_path, text)
    assert [(f["site"], f["across"]) for f in findings(report)] == [(f"train.py:{line_of(text, 'torch.randn')}",
                                                                     "samples")]


def test_samples_seeded_by_step_and_index_are_not_reported(tmp_path: Path) -> None:
    code, report, _ = audit(tmp_path, SAMPLES.format(seed="torch.manual_seed(step * 4 + sample)"))
    assert findings(report) == []
