"""The shapes real training and inference loops take, end to end (issue 8, items 4 and 5).

train_tagger.py holds most shapes in one realistic script: argparse + main(), bf16 autocast with
GradScaler, gradient accumulation, two optimizers with their LR schedulers, zero_grad(set_to_none=True),
a backbone frozen for the first epoch, a no_grad validation pass per epoch, a checkpoint dict per epoch,
and a DataLoader whose two workers augment with NumPy and Python randomness under a seeded generator.
generate_text.py is an inference-mode generation loop (no optimizer); train_budgeted.py trains for a
wall-clock budget. Bugs are seeded by editing one line of a copy (MANIFEST.md says which).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import SCRIPTS, CliResult, run_cli

from detaudit.trace import Kind, read_trace

pytestmark = [pytest.mark.slow, pytest.mark.process]


def seeded_copy(tmp_path: Path, script: str, line: str, replacement: str) -> Path:
    """A copy of a test script with one line changed (the bug), next to the run."""
    source = (SCRIPTS / script).read_text()
    assert source.count(line) == 1, line
    path = tmp_path / script
    path.write_text(source.replace(line, replacement))
    return path


def audit(tmp_path: Path, script: Path, *options: str, script_args: tuple[str, ...] = ()) -> CliResult:
    tmp_path.mkdir(parents=True, exist_ok=True)
    # detaudit's options before SCRIPT: the scripts define some of the same options (--out)
    result = run_cli(["run", "-n", "2", "--out", "run", "--json", "r.json", *options, str(script), "--",
                      *script_args], cwd=tmp_path, timeout=900)
    assert result.report is not None, result.output
    return result


def names(run_dir: Path) -> list[tuple[str, str, int]]:
    trace = read_trace(run_dir / "repeat-0.trace")
    kinds = {int(k): k.name.lower() for k in Kind}
    return [(kinds[int(r["kind"])], trace.strings[r["name"]], int(r["step"])) for r in trace.records]


def first(result: CliResult) -> dict[str, Any]:
    assert result.report is not None
    divergence = result.report["first_divergence"]
    assert divergence is not None, result.output
    return divergence


def test_training_loop_shapes_are_deterministic_and_recorded(tmp_path: Path) -> None:
    result = audit(tmp_path, SCRIPTS / "train_tagger.py", "--granularity", "module", script_args=("--epochs", "2"))
    assert result.returncode == 0, result.output
    records = names(tmp_path / "run")
    steps_with = {kind_name: {s for k, n, s in records if (k, n) == kind_name} for kind_name in
                  [("grad", "backbone.0.weight"), ("grad", "head.weight"), ("optstate", "lr_scheduler StepLR"),
                   ("optstate", "lr_scheduler CosineAnnealingLR")]}
    # 128 windows / 16 per batch / 2 accumulated = 4 steps an epoch; the backbone trains from epoch 1 on.
    # Steps count the first optimizer stepped (the head's): the backbone's, stepped after it in the same
    # iteration, are recorded one step on
    assert steps_with[("grad", "head.weight")] == set(range(8))
    assert steps_with[("grad", "backbone.0.weight")] == set(range(5, 9))
    assert steps_with[("optstate", "lr_scheduler CosineAnnealingLR")] >= set(range(1, 9))
    assert steps_with[("optstate", "lr_scheduler StepLR")] >= set(range(5, 9))
    saves = {n.split("]")[0] + "]" for k, n, _ in records if k == "save"}
    assert saves == {"torch.save[0]", "torch.save[1]"}  # the checkpoint dict of each epoch
    assert any(k == "input" and n == "Tagger.input[0]" for k, n, _ in records)


@pytest.fixture(scope="module")
def unseeded_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    where = tmp_path_factory.mktemp("tagger")
    return where, seeded_copy(where, "train_tagger.py", "rng = np.random.default_rng(seed)",
                              "rng = np.random.default_rng()")


def test_divergent_data_from_workers_is_input_not_an_op(unseeded_dataset: tuple[Path, Path]) -> None:
    where, script = unseeded_dataset
    full = audit(where / "full", script, "--granularity", "auto", script_args=("--epochs", "1"))
    assert full.returncode == 1, full.output
    d = first(full)
    assert (d["step"], d["kind"], d["name"]) == (0, "input", "Tagger.input[0]")
    assert d["index"] == 2  # after the two schedulers' initial state
    assert full.report is not None and full.report["causes"][0]["id"] == "unseeded-numpy-rng"
    finding = d["op_finding"]
    # the batch arrives from a DataLoader worker (aten.set_ in multiprocessing/queues.py): data from
    # outside, like the script's input, never "the op behind" the divergence
    assert finding is None or (finding["op"] != "aten.set_.source_Storage_storage_offset"
                               and "queues.py" not in str(finding["location"]))
    (where / "full.json").write_text(str(d["index"]))


def test_max_steps_bounds_an_endless_run_with_the_same_first_divergence(
        unseeded_dataset: tuple[Path, Path]) -> None:
    where, script = unseeded_dataset
    bounded = audit(where / "bounded", script, "--granularity", "module", "--max-steps", "2",
                    script_args=("--epochs", "100000"))  # about an hour of training unbounded
    assert bounded.returncode == 1, bounded.output
    assert bounded.report is not None
    assert [r["stopped_at_step"] for r in bounded.report["runs"]] == [2, 2]
    d = first(bounded)
    assert (d["step"], d["kind"], d["name"]) == (0, "input", "Tagger.input[0]")
    if (where / "full.json").exists():
        assert d["index"] == int((where / "full.json").read_text())


def test_wall_clock_loop_is_blamed_on_the_clock_with_its_call_site(tmp_path: Path) -> None:
    result = run_cli(["run", "-n", "3", "--granularity", "step", "--out", "run", "--json", "r.json",
                      str(SCRIPTS / "train_budgeted.py"), "--", "--budget", "1.5"], cwd=tmp_path, timeout=900)
    assert result.returncode == 1, result.output
    assert result.report is not None
    assert result.report["first_divergence"]["category"] in ("structure", "outcome")
    top = result.report["causes"][0]
    assert top["id"] == "wall-clock"
    loop_line = next(i for i, line in enumerate((SCRIPTS / "train_budgeted.py").read_text().splitlines(), 1)
                     if line.strip().startswith("while time.time()"))
    assert f"train_budgeted.py:{loop_line}" in top["fix"]
    assert "python-hash-seed" not in [c["id"] for c in result.report["causes"]]


def test_generation_loop(tmp_path: Path) -> None:
    clean = audit(tmp_path / "clean", SCRIPTS / "generate_text.py", "--granularity", "module")
    assert clean.returncode == 0, clean.output
    script = seeded_copy(tmp_path, "generate_text.py", "    np.random.seed(args.seed)\n", "")
    buggy = audit(tmp_path / "bug", script, "--granularity", "module", "--max-steps", "10")
    assert buggy.returncode == 1, buggy.output
    assert buggy.report is not None
    assert [r["stopped_at_step"] for r in buggy.report["runs"]] == [10, 10]  # forward calls: no optimizer
    d = first(buggy)
    # the prompt's forward agrees; the first sampled token is fed back in the second call
    assert (d["step"], d["kind"], d["name"]) == (0, "input", "TinyLM.input[0]")
    assert d["index"] > 0
    assert buggy.report["causes"][0]["id"] == "unseeded-numpy-rng"


def test_max_time_compares_the_steps_every_repeat_completed(tmp_path: Path) -> None:
    result = audit(tmp_path, SCRIPTS / "train_tagger.py", "--granularity", "step", "--max-time", "12",
                   script_args=("--epochs", "100000"))
    assert result.returncode == 0, result.output
    assert result.report is not None and result.report["verdict"] == "deterministic"
    stopped = [r["stopped_at_step"] for r in result.report["runs"]]
    assert all(isinstance(s, int) and s >= 1 for s in stopped), stopped
    assert result.report["spread"]["by_step"][-1]["step"] <= min(stopped)


def test_a_reseed_when_the_backbone_is_unfrozen_is_found_at_that_step(tmp_path: Path) -> None:
    script = seeded_copy(tmp_path, "train_tagger.py", "            set_trainable(model, frozen, True)\n",
                         "            set_trainable(model, frozen, True)\n            torch.seed()\n")
    result = audit(tmp_path / "run-here", script, "--granularity", "module", script_args=("--epochs", "2"))
    assert result.returncode == 1, result.output
    d = first(result)
    # epoch 0 (steps 0-3) and its validation agree; the first draw after the reseed is the backbone's dropout
    assert (d["step"], d["kind"], d["module"]) == (4, "output", "backbone.5")
    assert result.report is not None and result.report["causes"][0]["id"] == "varying-seed"
    seed_line = script.read_text().splitlines().index("            torch.seed()") + 1
    assert f"train_tagger.py:{seed_line}" in " ".join(result.report["causes"][0]["evidence"])
