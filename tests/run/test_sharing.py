"""run/sharing.py: parallel repeats that wrote one file in their shared working directory are re-run
one after another (issue 27 C7: detaudit's parallelism is never reported as the script's nondeterminism)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import run_cli
from synthetic import training_records, write_run, write_trace

from detaudit.run.launcher import plan_repeats
from detaudit.run.rundir import read_run
from detaudit.run.sharing import discard, shared_writes


def _wrote(*paths: str) -> list[tuple[int, dict[str, object]]]:
    return [(0, {"type": "file-write", "path": p, "loc": "train.py:9"}) for p in paths]


def test_only_repeats_that_wrote_a_file_another_wrote_are_named(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    run_dir = write_run(tmp_path / "run", [recs, recs, recs])
    shared, own = str(tmp_path / "ckpt.pt"), str(tmp_path / "own-2.log")
    for i, paths in enumerate([(shared, str(tmp_path / "own-0.log")), (shared,), (own,)]):
        (run_dir / f"repeat-{i}.trace").unlink()
        write_trace(run_dir / f"repeat-{i}.trace", recs, {"exit_code": 0}, events=_wrote(*paths))
    _, results = read_run(run_dir)
    reasons = shared_writes(results, run_dir)
    assert sorted(reasons) == [0, 1]
    assert "repeat(s) 1" in reasons[0]
    assert "ckpt.pt" in reasons[0]
    assert "own-0.log" not in reasons[0]


def test_a_repeat_with_no_trace_or_no_writes_shares_nothing(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    run_dir = write_run(tmp_path / "run", [recs, None])
    _, results = read_run(run_dir)
    assert shared_writes(results, run_dir) == {}


def test_discarding_a_repeat_removes_its_files_and_never_follows_a_link(tmp_path: Path) -> None:
    [plan] = plan_repeats(tmp_path, 1, ["cpu"])
    victim = tmp_path / "users-file"
    victim.write_text("precious\n")
    plan.trace.write_bytes(b"")
    plan.stdout.symlink_to(victim)
    discard(plan)
    assert not plan.trace.exists()
    assert not plan.stdout.is_symlink()
    assert victim.read_text() == "precious\n"


CHECKPOINTING = """
    import time
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.save(model.state_dict(), "ckpt.pt")  # a fixed name in the working directory
        time.sleep(0.2)
        model.load_state_dict(torch.load("ckpt.pt"))
    print("done")
"""


@pytest.mark.process
@pytest.mark.slow
def test_parallel_repeats_writing_one_checkpoint_are_not_divergent(tmp_path: Path) -> None:
    (tmp_path / "ckpt_train.py").write_text(textwrap.dedent(CHECKPOINTING))
    result = run_cli(["run", "ckpt_train.py", "-n", "2", "-j", "2", "--granularity", "module", "--no-explain",
                      "--out", "run", "--json", "r.json"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.report is not None
    assert result.report["verdict"] == "deterministic"
    assert all("ckpt.pt" in (run["rerun_alone"] or "") for run in result.report["runs"])
    assert "re-run one after another" in result.stdout
