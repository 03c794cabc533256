"""End to end: `detaudit run --granularity op|auto|step` names the op and the user's line (real CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from audits import Audit, Cache
from conftest import diverges_within, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.process]  # every test here runs the real CLI on real scripts


def line_of(script: Path, text: str) -> str:
    """`name.py:N` of the only line of `script` containing `text`."""
    hits = [i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, hits
    return f"{script.name}:{hits[0]}"


def op_of(report: dict[str, Any] | None) -> dict[str, Any]:
    assert report is not None, report and report["verdict"]
    assert report["verdict"] == "divergent", report and report["verdict"]
    finding = report["first_divergence"]["op_finding"]
    assert finding is not None, report["first_divergence"]
    return finding


def test_auto_names_the_random_op_behind_a_dropout_left_in_training_mode(tmp_path: Path, scripts: Path,
                                                                         shared: Cache) -> None:
    script = scripts / "predict.py"
    done = shared.run(Audit("predict.py"))  # granularity auto, the default: the cause matrix's run of the script
    result = done.result
    assert result.returncode == 1, result.output
    first = result.report["first_divergence"] if result.report else {}
    assert first["kind"] == "output"
    assert first["op"].startswith("aten.bernoulli")
    finding = op_of(result.report)
    assert finding["verdict"] == "random-op"
    assert finding["random"]
    assert finding["phase"] == "forward"
    assert finding["location"].endswith(line_of(script, "model(inputs)"))
    assert finding["traces"] == "ops"
    assert finding["window"] == [0, 0]
    chosen = [n for n in finding["neighbours"] if n["chosen"]]
    assert chosen
    assert chosen[0]["inputs"] == "match"
    assert chosen[0]["output"] == "differ"
    assert "The op behind it" in result.stdout
    assert "random-op" in result.stdout
    assert sorted(p.name for p in done.run_dir.glob("ops-*.trace")) == ["ops-0.trace", "ops-1.trace"]

    again = run_cli(["report", str(done.run_dir), "--json", "again.json"], tmp_path)
    assert again.returncode == 1, again.output
    assert again.report is not None
    assert again.report["first_divergence"]["op_finding"] == finding


@pytest.mark.race
def test_op_granularity_names_index_put_in_the_backward_of_an_indexing_lookup(tmp_path: Path, scripts: Path) -> None:
    script = scripts / "rate_items.py"
    # one repeat at a time: the race shows only when both of a repeat's threads run at once
    result = diverges_within(3, lambda attempt: run_cli(["run", str(script), "-n", "3", "-j", "1", "--granularity",
                                                         "op", "--json", f"report-{attempt}.json"], tmp_path))
    assert result.returncode == 1, result.output
    finding = op_of(result.report)
    assert finding["verdict"] == "nondeterministic-op"
    assert finding["op"].startswith("aten.index_put")
    assert (finding["phase"], finding["node"]) == ("backward", "IndexBackward0")
    # a backward op is placed at the forward line that created its autograd node
    assert finding["location"].endswith(line_of(script, "self.item_vectors[item_ids]"))


def test_auto_names_an_op_whose_inputs_arrive_in_set_order(tmp_path: Path, scripts: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)  # each repeat draws its own hash seed, as plain python does
    script = scripts / "blend_features.py"
    result = run_cli(["run", str(script), "-n", "3", "-j", "2", "--json", "report.json", "--granularity", "auto"],
                     tmp_path)
    assert result.returncode == 1, result.output
    finding = op_of(result.report)
    assert finding["verdict"] == "input-order"
    assert finding["op"] == "aten.stack.default"
    assert finding["location"].endswith(line_of(script, "torch.stack("))
    assert [n["inputs"] for n in finding["neighbours"] if n["chosen"]] == ["reordered"]


def test_step_granularity_records_only_optimizer_steps(tmp_path: Path, scripts: Path) -> None:
    result = run_cli(["run", str(scripts / "train_custom_layer.py"), "-n", "2", "-j", "2", "--granularity", "step",
                      "--json", "report.json"], tmp_path)
    assert result.returncode == 1, result.output
    assert result.report is not None
    first = result.report["first_divergence"]
    assert first["kind"] in ("grad", "param", "optstate")
    assert first["op_finding"] is None


def test_an_lstms_workspace_at_op_level_is_set_aside_not_a_divergence(tmp_path: Path, scripts: Path) -> None:
    # The important thing is that oneDNN's LSTM workspace, whose bytes differ in every run of this deterministic
    # script, is neither a divergence nor a cause: it is reported as set aside
    result = run_cli(["run", str(scripts / "train_lstm_lm.py"), "-n", "2", "-j", "2", "--granularity", "op",
                      "--json", "report.json"], tmp_path)
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert [line.split(" (")[0] for line in result.report["match"]["not_observed"] if "not results" in line] == \
        ["not results: 3 workspace outputs of aten.mkldnn_rnn_layer.default[3]"]


@pytest.fixture(scope="module")
def adder(shared: Cache) -> dict[str, Any]:
    """minGPT's adder with its seeding call removed (tests/scripts/train_adder.py): the batch of token ids is the
    first divergence, chosen by the unseeded RandomSampler; the weights' init, drawn before it, differs too."""
    result = shared.run(Audit("train_adder.py")).result
    return op_of(result.report)


def test_a_sampler_made_batch_names_the_samplers_draw_not_the_weights_init(adder: dict[str, Any],
                                                                          scripts: Path) -> None:
    line = line_of(scripts / "train_adder.py", "batch = next(data_iter)")
    assert (adder["op"], adder["location"].endswith(line)) == ("aten.random_.default", True)


def test_a_sampler_made_batch_says_the_chain_left_torch_at_the_batch(adder: dict[str, Any], scripts: Path) -> None:
    line = line_of(scripts / "train_adder.py", "batch = next(data_iter)")
    assert [(v["op"], v["location"].endswith(line)) for v in adder["via"]] == [("DataLoader.__next__", True)]


@pytest.mark.race  # two runs may place the tied Parameters alike (the set then iterates alike): retried
def test_tied_parameters_de_duplicated_with_a_set_get_the_fix_where_the_set_is_made(scripts: Path,
                                                                                   shared: Cache) -> None:
    """The first divergence is at `opt.step()`'s records; the order was made where the Parameters went through a
    set, on the line before the optimizer's."""
    options = ("-n", "3", "--no-explain", "--granularity", "module")
    result = diverges_within(3, lambda attempt: shared.run(Audit("train_tied_lm.py", options,
                                                                 attempt=attempt)).result)
    assert result.report is not None
    fix = result.report["causes"][0]["fix"]
    assert fix.startswith(f"give the optimizer its parameters in a fixed order at {scripts / 'train_tied_lm.py'}:"
                          f"{line_of(scripts / 'train_tied_lm.py', 'set(model.parameters())').split(':')[1]}: ")
