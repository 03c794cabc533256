"""`detaudit batch` end to end on CPU: the real CLI on the scenario scripts (tests/scripts/MANIFEST.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import SCRIPTS, python_command, run_cli
from decodecases import PLAIN_TOKENS

pytestmark = pytest.mark.process


def batch(scripts: Path, tmp_path: Path, name: str, *extra: str) -> tuple[int, dict, str]:
    result = run_cli(["batch", str(scripts / name), "--out", "run", "--json", "b.json", *extra], tmp_path)
    assert result.report is not None, result.stderr
    return result.returncode, result.report, result.stdout


def test_a_model_of_per_row_ops_is_batch_invariant(scripts: Path, tmp_path: Path) -> None:
    code, report, _ = batch(scripts, tmp_path, "serve_embeddings.py")
    assert (code, report["verdict"], report["probed_calls"]) == (0, "batch-invariant", 3)
    assert all(s["agree"] for s in report["subsets"])
    assert report["first_variant"] is None
    harness = report["harness"]  # every size of the 96-row batches' halving ladder, as PyTorch's harness runs them
    assert (harness["status"], [(k["size"], k["status"]) for k in harness["sizes"]]) == (
        "pass", [(48, "pass"), (24, "pass"), (12, "pass"), (6, "pass"), (3, "pass"), (1, "pass")])


# Which row subsets of serve_mlp.py's first batch give other bits than the whole batch, computed with plain
# torch in an interpreter started as the audit's are: the answer is the CPU's (its matmul blocking, instruction
# set, cache sizes and thread count), so the test derives it on the machine it runs on rather than stating it.
_PLAIN_SUBSETS = """
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("serve_mlp", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
torch.manual_seed(0)
model = script.Scorer().eval()
x = torch.randn(256, 64)
with torch.no_grad():
    whole = model(x)
    differ = {str(k): not torch.equal(model(x[:k]), whole[:k]) for k in (1, 2, 4, 7, 8, 16, 32, 64, 128)}
    differ["reversed"] = not torch.equal(model(x.flip(0)).flip(0), whole)
print(json.dumps(differ))
"""


def plain_torch_sizes(script: Path, cwd: Path) -> tuple[str, str] | None:
    """The probe's `sizes` text and PyTorch's harness's status (its first failing size, in the halving ladder's
    order, largest first; 7 is detaudit's own) as plain torch answers them on this machine; None when every
    subset agrees."""
    done = subprocess.run(python_command(["-c", _PLAIN_SUBSETS, str(script)]), cwd=cwd, capture_output=True,
                          text=True, check=True)
    differs: dict[str, bool] = json.loads(done.stdout)
    differ = [label for label, d in differs.items() if d]
    agree = [label for label, d in differs.items() if not d]
    if not differ:
        return None
    ladder = [k for k in ("128", "64", "32", "16", "8", "4", "2", "1") if differs[k]]
    status = f"fail_batch_invariance_at_{ladder[0]}" if ladder else "pass"

    def words(items: list[str]) -> str:
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

    text = f"batch {words(differ)} {'differs' if len(differ) == 1 else 'differ'} from 256"
    return text + (f"; {words(agree)} {'agrees' if len(agree) == 1 else 'agree'}" if agree else ""), status


MlpAudit = tuple[int, dict, str, tuple[str, str]]  # exit code, JSON, stdout, plain torch's sizes text and status


@pytest.fixture(scope="module")
def mlp_audit(tmp_path_factory: pytest.TempPathFactory) -> MlpAudit:
    """serve_mlp.py audited by `detaudit batch`, and plain torch's answer for its first call's subsets."""
    tmp_path = tmp_path_factory.mktemp("serve_mlp")
    expected = plain_torch_sizes(SCRIPTS / "serve_mlp.py", tmp_path)
    if expected is None:
        pytest.skip("this CPU's addmm gives every row subset of serve_mlp.py the whole batch's bits: no batch "
                    "variance to locate here")
    return (*batch(SCRIPTS, tmp_path, "serve_mlp.py"), expected)


def test_a_linear_mlp_is_variant_at_its_first_linear(mlp_audit: MlpAudit) -> None:
    code, report, _, _ = mlp_audit
    assert (code, report["verdict"]) == (1, "batch-variant")
    first = report["first_variant"]
    assert (first["module"], first["op"]) == ("hidden", "aten.addmm")
    assert first["location"].endswith("serve_mlp.py:16")
    assert not first["large"]
    assert report["causes"][0]["id"] == "batch-matmul"


def test_a_linear_mlp_names_the_subsets_plain_torch_finds_variant(mlp_audit: MlpAudit) -> None:
    _, report, _, (expected, _) = mlp_audit
    assert report["first_variant"]["sizes"] == expected


def test_a_linear_mlp_fails_the_harness_at_the_first_ladder_size_plain_torch_finds_variant(
        mlp_audit: MlpAudit) -> None:
    _, report, _, (_, status) = mlp_audit
    assert report["harness"]["status"] == status


def test_a_linear_mlp_prints_its_variant_subsets(mlp_audit: MlpAudit) -> None:
    _, _, stdout, (expected, _) = mlp_audit
    assert expected.split(";")[0] in stdout


def test_a_linear_mlp_has_every_call_reproduced_and_probed(mlp_audit: MlpAudit) -> None:
    _, report, _, _ = mlp_audit
    assert (report["not_reproduced"], report["not_probed"]) == (0, {})


def test_a_mask_built_over_the_batch_is_flagged_with_its_large_difference(scripts: Path, tmp_path: Path) -> None:
    code, report, stdout = batch(scripts, tmp_path, "serve_padded_classifier.py")
    first = report["first_variant"]
    assert code == 1
    assert first["large"]
    assert first["call"]["max_abs_diff"] > 1e-2
    assert first["op"] == "aten.any"
    assert first["location"].endswith("serve_padded_classifier.py:24")
    assert report["causes"][0]["id"] == "batch-rows-mix"
    assert "LARGE DIFFERENCE" in stdout


def test_batch_norm_and_dropout_in_train_mode_keep_the_plain_runs_results(scripts: Path, tmp_path: Path) -> None:
    script = scripts / "train_bn_dropout.py"
    plain = subprocess.run(python_command([str(script)]), cwd=tmp_path, capture_output=True, text=True, check=True)
    _, report, _ = batch(scripts, tmp_path, "train_bn_dropout.py")
    assert (tmp_path / "run" / "batch-0.stdout").read_text() == plain.stdout  # the probes are harmless
    assert report["not_probed"] == {"batch-statistics": 5}  # the five training calls
    assert "Dropout" in report["not_probed_details"]["batch-statistics"]
    assert report["probed_calls"] == 1  # the held-out batch, in eval mode


def test_repeats_module_and_max_steps(scripts: Path, tmp_path: Path) -> None:
    code, report, _ = batch(scripts, tmp_path, "serve_embeddings.py", "-n", "2", "--module", "norm", "--max-steps", "2")
    assert (code, report["run_to_run"], report["probed_calls"]) == (0, "deterministic", 2)
    assert [r["stopped_at_step"] for r in report["repeats"]] == [2, 2]


_EFFECTS = '''
import logging, sys
import torch
from torch import nn

CALLS = 0
TOTAL = torch.zeros(4)
KEPT = open("kept.log", "w")
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        global CALLS
        CALLS += 1  # a global counter
        TOTAL.add_(x.sum(0))  # a module-level tensor updated in place
        with open("forward.log", "a") as log:  # a file opened and written in the forward
            log.write(f"call {CALLS} rows {len(x)}\\n")
        KEPT.write(f"kept {CALLS}\\n")  # a file the script keeps open
        print(f"forward {CALLS}", flush=True)
        logging.info("logged %d", CALLS)
        return self.fc(x) * CALLS


torch.manual_seed(0)
model = Scorer().eval()
with torch.no_grad():
    outs = [model(torch.randn(n, 4)) for n in (16, 7, 16)]
KEPT.close()
print("calls", CALLS, "total", TOTAL.tolist(), "out", sum(o.sum().item() for o in outs))
'''


def test_a_forwards_effects_outside_its_module_happen_as_often_as_under_python(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "audited").mkdir()
    for where in ("plain", "audited"):
        (tmp_path / where / "effects.py").write_text(_EFFECTS)
    plain = subprocess.run(python_command(["effects.py"]), cwd=tmp_path / "plain", capture_output=True, text=True)
    result = run_cli(["batch", "effects.py", "--out", "run", "--json", "b.json"], tmp_path / "audited")
    assert result.report is not None, result.stderr
    audited = tmp_path / "audited"
    assert (audited / "run" / "batch-0.stdout").read_text() == plain.stdout
    assert [r["exit_code"] for r in result.report["repeats"]] == [plain.returncode]
    for name in ("forward.log", "kept.log"):
        assert (audited / name).read_text() == (tmp_path / "plain" / name).read_text(), name
    assert result.report["probed_calls"] == 3  # the probes ran, in a forked copy of the process


_LOGGED_STATISTIC = '''
import torch
from torch import nn


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(64, 64)
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        self.last_mean = x.mean()  # kept for logging only: never part of a row's result
        return self.head(torch.relu(self.hidden(x)))


torch.manual_seed(0)
model = Scorer().eval()
with torch.no_grad():
    scores = model(torch.randn(256, 64))
print(f"mean {model.last_mean.item():.4f}")
'''


def test_a_statistic_kept_for_logging_is_never_named_where_the_difference_starts(tmp_path: Path) -> None:
    (tmp_path / "logged.py").write_text(_LOGGED_STATISTIC)
    code, report, stdout = batch(tmp_path, tmp_path, "logged.py")
    first = report["first_variant"]
    assert (code, first["op"]) == (1, "aten.addmm")
    assert first["location"].endswith("logged.py:14")
    assert not first["large"]
    assert report["causes"][0]["id"] == "batch-matmul"
    assert "LARGE DIFFERENCE" not in stdout
    assert "aten.mean" in first["note"]


_SEQUENCE_FIRST = '''
import sys
import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 16)  # batch_first=False: input (seq, batch, feature)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


torch.manual_seed(0)
model = Tagger().eval()
x = torch.randn(12, 16, 8)
with torch.no_grad():
    scores = model(x)
    if sys.argv[1:] == ["plain"]:  # does any row subset along the batch (dim 1) differ under plain torch?
        subsets = [model(x[:, :k]) for k in range(1, 16)] + [model(x.flip(1)).flip(1)]
        print(any(not torch.equal(s, scores[:, :s.shape[1]]) for s in subsets))
'''


def test_a_sequence_first_lstm_is_probed_along_its_batch_not_its_time_steps(tmp_path: Path) -> None:
    (tmp_path / "tagger.py").write_text(_SEQUENCE_FIRST)
    plain = subprocess.run(python_command(["tagger.py", "plain"]), cwd=tmp_path, capture_output=True, text=True,
                           check=True)
    _, report, _ = batch(tmp_path, tmp_path, "tagger.py")
    assert [(u["dim"], u["source"]) for u in report["batch_dims"]] == [(1, "declared")]
    assert report["verdict"] == ("batch-variant" if plain.stdout.strip() == "True" else "batch-invariant")
    assert "batch-rows-mix" not in [c["id"] for c in report["causes"]]


@pytest.fixture(scope="module")
def decode_audit(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[list]]:
    """decode_greedy.py under `detaudit batch` (dim 0: its first prompt is as long as the batch is big), and plain
    torch's first divergent tokens for it."""
    tmp_path = tmp_path_factory.mktemp("decode_greedy")
    done = subprocess.run(python_command(["-c", PLAIN_TOKENS, str(SCRIPTS / "decode_greedy.py")]), cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    _, report, _ = batch(SCRIPTS, tmp_path, "decode_greedy.py", "--batch-dim", "0")
    return report, json.loads(done.stdout)


def test_a_greedy_decoders_steps_each_choose_from_a_probed_call(decode_audit: tuple[dict, list[list]]) -> None:
    tokens = decode_audit[0]["tokens"]
    assert (tokens["decode_steps"], tokens["tied_calls"], tokens["untied_calls"]) == (4, 4, 0)


def test_a_greedy_decoders_divergent_tokens_are_those_plain_torch_finds(decode_audit: tuple[dict, list[list]]) -> None:
    report, expected = decode_audit
    found = sorted([t["sequence"], t["position"], t["subset"], t["size"], t["token"], t["other"]]
                   for t in report["tokens"]["divergent"])
    assert found == expected


def test_a_greedy_decoders_origin_names_an_op_wherever_it_names_a_module(
        decode_audit: tuple[dict, list[list]]) -> None:
    first = decode_audit[0]["first_variant"] or {"first_module": None, "first_op": None}
    assert (first["first_module"] is None) == (first["first_op"] is None)
