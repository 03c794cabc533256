"""End to end, through the real CLI: the faults a hostile probe found (issue 35), each with a script of its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli

# like Lightning's Trainer with its defaults: the next free `logs/version_N`, printed as `v_num`, and the
# checkpoint's `best_model_path` inside it; `SCALE` decides whether a tensor follows the version too
VERSIONED_CHECKPOINT = """\
import os
import torch

root = "logs"
os.makedirs(root, exist_ok=True)
taken = [int(name.split("_")[1]) for name in os.listdir(root) if name.startswith("version_")]
version = max(taken, default=-1) + 1
folder = os.path.join(root, f"version_{version}", "checkpoints")
os.makedirs(folder)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for step in range(2):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    print(f"Epoch 0: step {step}, v_num={version}")
path = os.path.join(folder, "epoch=0-step=2.ckpt")
state = {"state_dict": model.state_dict(), "callbacks": {"ModelCheckpoint": {"best_model_path": path}},
         "scaled": torch.ones(2) * (1 + SCALE * version)}
torch.save(state, path)
"""


@pytest.mark.process
@pytest.mark.slow
def test_a_checkpoint_path_numbered_by_earlier_repeats_is_reported_but_no_divergence(tmp_path: Path) -> None:
    """The saved path differs (`version_0`, `version_1`) while every tensor agrees; the listing of `logs/` is the
    evidence: reported as carried state, exit 0. A tensor that follows the version stays DIVERGENT."""
    (tmp_path / "ckpt.py").write_text(VERSIONED_CHECKPOINT.replace("SCALE", "0"))
    result = run_cli(["run", "-n", "2", "--no-explain", "--json", "r.json", "--out", "run", "ckpt.py"],
                     cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.output
    assert result.report is not None
    carried = result.report["carried_output"]
    assert carried["repeats"] == [1]
    assert "saved value torch.save[0].callbacks.ModelCheckpoint.best_model_path (str) differs" in carried["detail"]
    assert carried["evidence"] == ["repeat 1 listed directory logs/, holding version_0, which an earlier repeat "
                                   "of this audit created or changed, at ckpt.py:6"]
    assert "Output that follows state carried between repeats" in result.stdout

    (tmp_path / "tensor.py").write_text(VERSIONED_CHECKPOINT.replace("SCALE", "1").replace('"logs"', '"logs2"'))
    divergent = run_cli(["run", "-n", "2", "--no-explain", "--json", "r2.json", "--out", "run2", "tensor.py"],
                        cwd=tmp_path, timeout=900)
    assert divergent.returncode == 1, divergent.output
    assert divergent.report is not None
    assert "carried_output" not in divergent.report
    assert divergent.report["causes"][0]["id"] == "carried-state"


# a global step carried on from the checkpoint the previous run left, saved beside weights trained afresh
RESUMED_STEP = """\
import os
import torch

step = torch.load("last.pt")["step"] if os.path.exists("last.pt") else 0
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
for _ in range(2):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    step += 1
torch.save({"state_dict": model.state_dict(), "step": step}, "last.pt")
"""


@pytest.mark.process
@pytest.mark.slow
def test_a_saved_python_int_read_from_an_earlier_repeats_file_is_carried_state_not_a_divergence(
        tmp_path: Path) -> None:
    """The saved step differs (2, then 4) while every tensor agrees: the read of the file repeat 0 wrote is the
    evidence, as for a saved `version_N` path: reported as carried state, exit 0."""
    (tmp_path / "steps.py").write_text(RESUMED_STEP)
    result = run_cli(["run", "-n", "2", "--no-explain", "--json", "r.json", "--out", "run", "steps.py"],
                     cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.output
    assert result.report is not None
    carried = result.report["carried_output"]
    assert carried["repeats"] == [1]
    assert carried["detail"].startswith("saved value torch.save[0].step (int64) differs in repeat(s) 1")
    assert carried["evidence"][0].startswith("repeat 1 read last.pt, which an earlier repeat of this audit wrote, "
                                             "at steps.py:4")


@pytest.mark.process
def test_an_error_raised_by_the_users_op_names_the_users_line_not_the_recorders_wrapper(tmp_path: Path) -> None:
    """`index_add_` is wrapped by the recorder (its nondeterminism evidence) and raises in C: the excerpt
    names the script's line, and no detaudit file."""
    (tmp_path / "bad.py").write_text("import torch\n\nx = torch.zeros(3)\n"
                                     "x.index_add_(0, torch.tensor([7]), torch.ones(1))\n")
    result = run_cli(["run", "-n", "2", "--no-explain", "--json", "r.json", "--out", "run", "bad.py"], cwd=tmp_path)
    assert result.returncode == 3, result.output
    assert result.report is not None
    assert result.report["failure"] == ("bad.py:4, in <module>\n    x.index_add_(0, torch.tensor([7]), torch.ones(1))\n"
                                        "IndexError: index out of range in self")


@pytest.mark.process
def test_a_repeat_whose_disk_filled_up_makes_the_audit_inconclusive_not_divergent(tmp_path: Path) -> None:
    """The second repeat's write fails with ENOSPC (/dev/full: a real one) and it exits 1: that end says nothing
    about the script, so `run` and `report` say inconclusive (exit 6), naming the full disk, and no cause."""
    (tmp_path / "full.py").write_text(
        "import os\nimport torch\n\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\n"
        "model(torch.randn(8, 4)).sum().backward()\n"
        "if os.path.exists('first-done'):  # the disk is full by the second repeat\n"
        "    with open('/dev/full', 'w') as log:\n        log.write('step 1\\n')\n        log.flush()\n"
        "open('first-done', 'w').close()\n")
    result = run_cli(["run", "-n", "2", "--no-explain", "--json", "r.json", "--out", "run", "full.py"], cwd=tmp_path)
    assert result.returncode == 6, result.output
    assert result.report is not None
    assert result.report["inconclusive"].startswith(
        "repeat(s) 1 ran out of disk space: OSError: [Errno 28] No space left on device; ")
    assert result.report["causes"] == []
    again = run_cli(["report", "run", "--json", "again.json"], cwd=tmp_path)
    assert again.returncode == 6, again.output
    assert result.stdout.strip().splitlines()[-1] == ("INCONCLUSIVE · repeat(s) 1 ran out of disk space · "
                                                     f"run: {(tmp_path / 'run').resolve()}")


@pytest.mark.process
@pytest.mark.slow
def test_fix_writes_a_patch_that_applies_to_a_crlf_script(tmp_path: Path) -> None:
    """A script with Windows line endings: the patch keeps them (context lines are the file's bytes, added lines
    end as the file's do), `git apply` and `patch -p1` take it, and what they make is what was verified."""
    script = tmp_path / "noisy.py"
    script.write_bytes(b"import torch\r\n\r\nmodel = torch.nn.Linear(4, 1)\r\n"
                       b"print(model(torch.ones(1, 4)).item())\r\n")
    result = run_cli(["fix", "-n", "2", "--json", "fix.json", "--write-patch", "fix.patch", script.name],
                     cwd=tmp_path, timeout=600)
    assert result.report is not None, result.output
    assert result.report["verified"] is True, result.output
    original = script.read_bytes()
    applied = []
    for command in (["git", "apply", "fix.patch"], ["patch", "-p1", "-s", "-i", "fix.patch"]):
        subprocess.run(command, cwd=tmp_path, check=True)
        applied.append(script.read_bytes())
        script.write_bytes(original)
    assert applied[0] == applied[1]
    assert applied[0].startswith(
        b"# detaudit fix: torch-rng\r\nimport torch\r\ntorch.manual_seed(0)\r\nimport torch\r\n")


@pytest.mark.process
@pytest.mark.slow
def test_a_script_that_exits_early_under_one_thread_count_ended_differently_not_changed_bits(tmp_path: Path) -> None:
    """With more than one thread the script exits after its second step: no record both groups made differs,
    so `--perturb threads` reports the groups ending differently, never a bit change at a record the
    early-exiting repeats never made."""
    (tmp_path / "early.py").write_text(
        "import sys\n\nimport torch\n\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\nfor step in range(3):\n"
        "    model(torch.ones(2, 4)).sum().backward()\n"
        "    if step == 1 and torch.get_num_threads() > 1:\n        sys.exit(0)\n")
    result = run_cli(["run", "-n", "2", "--perturb", "threads", "--no-explain", "--json", "r.json", "--out", "run",
                      "early.py"], cwd=tmp_path, timeout=900)
    assert result.report is not None, result.output
    [setting] = result.report["perturbation"]["settings"]
    assert setting["first_divergence"]["category"] == "outcome"
    assert setting["first_divergence"]["detail"].startswith("repeat(s) 1, 3 ended by themselves after ")
    evidence = result.report["causes"][0]["evidence"]
    assert not any(line.startswith("first divergence between the two") for line in evidence)


@pytest.mark.process
def test_a_perturb_name_that_is_no_setting_and_a_version_that_is_a_bool_are_refused(tmp_path: Path) -> None:
    """`all` does not excuse a typo beside it (exit 2, the setting named), and run.json's `"version": true` is no
    version 1 (exit 4), though python's `True == 1`."""
    (tmp_path / "s.py").write_text("print('hi')\n")
    bogus = run_cli(["run", "--perturb", "all,bogus", "s.py"], cwd=tmp_path)
    assert bogus.returncode == 2, bogus.output
    assert "unknown setting 'bogus' for --perturb" in bogus.output
    assert not (tmp_path / ".detaudit").exists()
    ran = run_cli(["run", "-n", "2", "--no-explain", "--out", "run", "s.py"], cwd=tmp_path)
    assert ran.returncode == 6, ran.output  # nothing recorded: a torch-free script
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    (tmp_path / "run" / "run.json").write_text(json.dumps({**record, "version": True}))
    again = run_cli(["report", "run"], cwd=tmp_path)
    assert again.returncode == 4, again.output
    assert "run record version True is not supported" in again.output
