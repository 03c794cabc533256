"""On a real GPU: the real CLI on CUDA scripts, for every CUDA cause and the CUDA recording path.

Each test states what real hardware must show. They run where torch sees a CUDA device (the GPU
machine: `scripts/gpu-check.sh`) and are skipped, with that reason, everywhere else (CI).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import SCRIPTS, CliResult, run_cli

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.slow,
    pytest.mark.process,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run scripts/gpu-check.sh on a GPU)"),
]

GPU_SCRIPTS = Path(__file__).parent / "scripts"


def audit(tmp_path: Path, script: Path, *extra: str, name: str = "run", args: tuple[str, ...] = (),
          env: dict[str, str] | None = None) -> CliResult:
    return run_cli(["run", str(script), "-q", "--out", str(tmp_path / name), "--json", f"{name}.json", *extra,
                    "--", *args], cwd=tmp_path, env=env)


def cause_ids(report: dict[str, Any]) -> list[str]:
    return [c["id"] for c in report["causes"]]


def test_cudnn_benchmark_is_named_and_confirmed(tmp_path: Path) -> None:
    result = audit(tmp_path, GPU_SCRIPTS / "conv_classifier.py", "-n", "3", "--explain")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    assert report["runs"][0]["device"] == "cuda"
    top = report["causes"][0]
    assert top["id"] == "cudnn-benchmark", [(c["id"], c["confidence"]) for c in report["causes"]]
    assert top["confidence"] == "confirmed"
    assert any(e["pin"] == "cudnn" and e["verdict"] == "deterministic" for e in report["experiments"])


@pytest.mark.parametrize("flag,op", [((), "index_add"), (("--scatter",), "scatter_add")],
                         ids=["index_add_", "scatter_add_"])
def test_atomic_accumulation_is_named_at_the_op_and_line(tmp_path: Path, flag: tuple[str, ...], op: str) -> None:
    result = audit(tmp_path, GPU_SCRIPTS / "segment_pool.py", "-n", "3", args=flag)
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert cause_ids(report)[0] == "nondeterministic-op", cause_ids(report)
    first = report["first_divergence"]
    finding = first["op_finding"]
    assert finding is not None, finding
    assert finding["verdict"] == "nondeterministic-op", finding
    assert op in finding["op"], finding
    line = 19 if op == "scatter_add" else 21
    assert finding["location"].endswith(f"segment_pool.py:{line}"), finding
    assert f"segment_pool.py:{line}" in " ".join(report["causes"][0]["evidence"]) + report["causes"][0]["fix"]


@pytest.mark.parametrize("flag", [(), ("--scatter",)], ids=["index_add_", "scatter_add_"])
def test_deterministic_algorithms_make_atomic_accumulation_agree(tmp_path: Path, flag: tuple[str, ...]) -> None:
    result = audit(tmp_path, GPU_SCRIPTS / "segment_pool.py", "-n", "3", "--granularity", "module",
                   args=(*flag, "--reproducible"), env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["verdict"] == "deterministic"


def test_seeded_cuda_training_loop_is_deterministic(tmp_path: Path) -> None:
    result = audit(tmp_path, GPU_SCRIPTS / "train_regressor_cuda.py", "-n", "3")
    assert result.returncode == 0, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "deterministic"
    assert all(r["device"] == "cuda" and r["records"] > 0 for r in report["runs"])


def test_cpu_against_cuda_within_tolerance_with_figures(tmp_path: Path) -> None:
    script = GPU_SCRIPTS / "train_regressor_cuda.py"
    loose = audit(tmp_path, script, "-n", "2", "--device", "cpu", "--device", "cuda", "--granularity", "module",
                  "--atol", "1e-3", "--rtol", "1e-3", name="loose")
    assert loose.returncode == 0, loose.output
    assert loose.report is not None
    assert sorted({r["device"] for r in loose.report["runs"]}) == ["cpu", "cuda"]
    tight = audit(tmp_path, script, "-n", "2", "--device", "cpu", "--device", "cuda", "--granularity", "module",
                  "--atol", "0", "--rtol", "0", name="tight")
    assert tight.returncode == 1, tight.output
    first = tight.report["first_divergence"] if tight.report else None
    assert first is not None
    assert first["category"] == "content"
    assert first["max_abs_diff"] is not None
    assert 0 < first["max_abs_diff"] < 1e-2
    assert first["max_ulp_diff"] is not None
    assert first["max_ulp_diff"] >= 1


def test_tf32_on_against_off_is_named(tmp_path: Path) -> None:
    script = GPU_SCRIPTS / "train_regressor_cuda.py"
    for name, args in (("off", ()), ("on", ("--tf32",))):
        made = audit(tmp_path, script, "-n", "2", "--granularity", "module", name=name, args=args)
        assert made.returncode == 0, made.output
    result = run_cli(["compare", "off", "on", "--json", "compare.json"], cwd=tmp_path)
    assert result.returncode == 1, result.output
    assert result.report is not None
    assert "tf32" in cause_ids(result.report)[:2], cause_ids(result.report)


def test_at_most_one_host_sync_per_optimizer_step(tmp_path: Path) -> None:
    script = GPU_SCRIPTS / "count_syncs.py"
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    # the script alone makes no sync inside its steps: every one counted below is detaudit's
    assert [int(k) for k in re.findall(r"step \d+ syncs (\d+)", plain.stdout)] == [0] * 6, plain.stdout
    per_granularity = {}
    for granularity in ("step", "module"):
        out = tmp_path / granularity
        result = run_cli(["run", str(script), "-n", "2", "--granularity", granularity, "-q", "--out", str(out)],
                         cwd=tmp_path)
        assert result.returncode == 0, result.output
        stdout = (out / "repeat-0.stdout").read_text()
        per_granularity[granularity] = [int(k) for k in re.findall(r"step \d+ syncs (\d+)", stdout)]
    print(json.dumps(per_granularity))
    for granularity, counts in per_granularity.items():
        assert len(counts) == 6
        # steps 0-1 also carry one-off evidence events (first forward, first step); from then on the
        # only sync is the batched transfer of the step's fingerprints
        assert all(k <= 1 for k in counts[2:]), (granularity, counts)


@pytest.mark.parametrize("script,fault,cause", [
    ("train_denoiser.py", {"op": "torch.nn.functional.conv2d", "when": "cudnn-benchmark"}, "cudnn-benchmark"),
    ("pool_graphs.py", {"op": "torch.Tensor.index_add_", "when": "nondeterministic"}, "nondeterministic-op"),
    ("train_mlp.py", {"op": "torch.nn.functional.linear", "when": "cublas"}, "cublas-workspace"),
], ids=["cudnn", "index_add", "cublas"])
def test_fault_injector_cases_on_the_real_device(tmp_path: Path, script: str, fault: dict[str, str],
                                                 cause: str) -> None:
    """The CPU suite's injected CUDA faults, with the scripts now really on CUDA (device fingerprints)."""
    result = audit(tmp_path, SCRIPTS / script, "-n", "2", "--granularity", "module", "--explain",
                   env={"DETAUDIT_TEST_FAULT": json.dumps(fault)})
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["runs"][0]["device"] == "cuda"
    assert report["causes"][0]["id"] == cause, [(c["id"], c["confidence"]) for c in report["causes"]]
