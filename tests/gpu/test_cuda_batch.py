"""On a real GPU: `detaudit batch` answers in tokens for a greedy decoder in bfloat16 (issue 46 item 4).

On this project's CPU the first prompt of tests/scripts/decode_greedy.py gets another first token decoded alone
than in its batch of 6 (docs/batch.md, "A reproduction on CPU"); in bfloat16 on a GPU, where one rounding step is
2^-8 of a logit and cuBLAS picks its kernel by the row count, flips should be commoner, but this was not verified in
the session that wrote it (no GPU was lent). The expectation is derived with plain torch on the same device.
Skipped without CUDA.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, python_command, run_cli
from decodecases import PLAIN_TOKENS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.slow,
    pytest.mark.process,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run scripts/gpu-check.sh on a GPU)"),
]


def test_a_bfloat16_greedy_decoders_divergent_tokens_are_those_plain_torch_finds(tmp_path: Path) -> None:
    script = SCRIPTS / "decode_greedy.py"
    done = subprocess.run(python_command(["-c", PLAIN_TOKENS, str(script), "cuda", "bfloat16"]), cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    result = run_cli(["batch", str(script), "--batch-dim", "0", "--out", "run", "--json", "b.json", "--",
                      "--device", "cuda", "--dtype", "bfloat16"], tmp_path)
    assert result.report is not None, result.stderr
    found = sorted([t["sequence"], t["position"], t["subset"], t["size"], t["token"], t["other"]]
                   for t in result.report["tokens"]["divergent"])
    assert found == json.loads(done.stdout)
