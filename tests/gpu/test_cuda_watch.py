"""On a real GPU: `detaudit watch` catches CUDA atomics in the replay, in the process (docs/watch.md).

Skipped where torch sees no CUDA device; run by `scripts/gpu-check.sh` on the GPU machine. Not run yet: no
device was lent when it was written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_cli

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.slow,
    pytest.mark.process,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run scripts/gpu-check.sh on a GPU)"),
]

GPU_SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.parametrize(("flag", "op", "line"), [((), "aten.index_add_.default", 21),
                                                  (("--scatter",), "aten.scatter_add_.default", 19)],
                         ids=["index_add_", "scatter_add_"])
def test_atomic_accumulation_is_caught_at_its_line_and_the_update_is_not_applied(
        tmp_path: Path, flag: tuple[str, ...], op: str, line: int) -> None:
    result = run_cli(["watch", str(GPU_SCRIPTS / "segment_pool.py"), "--every", "1", "--out", "run", "--json",
                      "w.json", "--", *flag, "--steps", "6"], tmp_path)
    assert result.returncode == 1, result.output
    assert result.report is not None
    first = result.report["mismatches"][0]
    assert first["op"] == op
    assert first["location"].endswith(f"segment_pool.py:{line}")
    assert result.report["stopped_before"] == "optimizer.step"
    assert result.stdout == ""  # stopped before the script printed its final loss


def test_deterministic_algorithms_make_the_replay_agree(tmp_path: Path) -> None:
    result = run_cli(["watch", str(GPU_SCRIPTS / "segment_pool.py"), "--every", "1", "--out", "run", "--json",
                      "w.json", "--", "--reproducible"], tmp_path)
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["verdict"] == "clean"
