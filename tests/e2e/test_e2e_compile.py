"""torch.compile under audit: a compiled model computes exactly what it computes under plain python.

train_char_gpt.py compiles a small character GPT (user-defined modules, dropout, AdamW) with the
default inductor backend; with `--deterministic` its compiled kernels are reproducible, so every
granularity must give the same stdout (which includes dynamo's graph and graph-break counts: no
graph break, no extra graph) and the same saved weights as `python train_char_gpt.py`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, python_command, run_cli

SCRIPT = str(SCRIPTS / "train_char_gpt.py")
ARGS = ["--deterministic", "--steps", "4"]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, torch.Tensor]]:
    cwd = tmp_path_factory.mktemp("plain")
    proc = subprocess.run(python_command([SCRIPT, *ARGS, "--out", "plain.pt"]), cwd=cwd, capture_output=True,
                          text=True, timeout=600, check=True)
    assert "graph breaks: 0" in proc.stdout
    return proc.stdout, _weights(cwd / "plain.pt")


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("granularity", ["step", "module", "op", "auto"])
def test_compiled_model_trains_as_under_python(tmp_path: Path, granularity: str,
                                               plain: tuple[str, dict[str, torch.Tensor]]) -> None:
    result = run_cli(["run", "-n", "2", "--granularity", granularity, "--out", "run", "--json", "r.json", SCRIPT,
                      "--", *ARGS, "--out", "w.pt"], cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["verdict"] == "deterministic"
    stdout, weights = plain
    for i in range(2):
        assert (tmp_path / "run" / f"repeat-{i}.stdout").read_text() == stdout
        assert "could not" not in (tmp_path / "run" / f"repeat-{i}.stderr").read_text()
    saved = _weights(tmp_path / "w.pt")
    assert saved.keys() == weights.keys()
    assert all(torch.equal(saved[k], weights[k]) for k in weights)
    # recorded at the compiled module's boundary (by the model's own name) and at every optimizer step
    names = {r["name"] for r in _records(tmp_path / "run" / "repeat-0.trace")}
    if granularity != "step":
        assert {"CharGPT", "CharGPT.input[0]"} <= names
    assert "blocks.0.attn.in_proj_weight" in names  # parameter names without torch.compile's `_orig_mod.`


def _records(path: Path) -> list[dict[str, str]]:
    from detaudit.trace import read_trace

    trace = read_trace(path)
    return [{"name": trace.strings[r["name"]]} for r in trace.records]


@pytest.mark.process
@pytest.mark.slow
def test_max_steps_stops_a_compiled_run(tmp_path: Path) -> None:
    result = run_cli(["run", "-n", "2", "--granularity", "module", "--max-steps", "2", "--out", "run", "--json",
                      "r.json", SCRIPT, "--", "--deterministic", "--steps", "100000"], cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["verdict"] == "deterministic"
    assert [r["stopped_at_step"] for r in result.report["runs"]] == [2, 2]
    # stopped inside the second optimizer.step(), before the script printed that step
    assert (tmp_path / "run" / "repeat-0.stdout").read_text() == "step 0 loss 3.394834\n"
