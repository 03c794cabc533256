"""Issue 2's "Done when" list: the real CLI on the scripts in tests/scripts/ (see MANIFEST.md).

Each divergent case is also checked against the traces themselves: every record before the
reported index is bitwise identical in all repeats, and the record at the index differs. A script
the cause matrix audits too is read from that same run (tests/audits.py: `shared`); the others
are audited here with FAST.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from audits import DETERMINISTIC, SARIF, Audit, Cache, Done
from conftest import SCRIPTS, CliResult, run_cli, start_allowing
from sarif_checks import sarif_errors

import detaudit
from detaudit.trace import MAGIC, read_trace

pytestmark = [pytest.mark.slow, pytest.mark.process]  # every test here runs the real CLI on real scripts

# module-level behaviour (ops: test_e2e_ops.py); causes and their confirmation: test_e2e_causes.py
FAST = ["--repeats", "2", "--jobs", "2", "--granularity", "module", "--no-explain"]


def audit(tmp_path: Path, script: str, *extra: str, out: str = "run") -> CliResult:
    result = run_cli(["run", str(SCRIPTS / script), *FAST, "--out", out, "--json", "report.json", *extra],
                     cwd=tmp_path)
    assert "Traceback" not in result.output or "Traceback" in _repeat_stderr(tmp_path / out), result.output
    assert result.report is not None, result.output
    return result


def shared_audit(shared: Cache, audit: Audit) -> Done:
    done = shared.run(audit)
    assert "Traceback" not in done.result.output or "Traceback" in _repeat_stderr(done.run_dir), done.result.output
    assert done.result.report is not None, done.result.output
    return done


def _repeat_stderr(run_dir: Path) -> str:
    return "".join(p.read_text() for p in run_dir.glob("repeat-*.stderr"))


def assert_exact_first_divergence(run_dir: Path, report: dict[str, Any]) -> None:
    """The reported index is the first record where some repeat's digest differs from repeat 0's."""
    first = report["first_divergence"]
    traces = [read_trace(run_dir / r["trace"]) for r in report["runs"]]
    index = first["index"]
    ref = traces[0].records
    for other in traces[1:]:
        assert np.array_equal(other.records["digest"][:index], ref["digest"][:index])
    assert any(t.records["digest"][index] != ref["digest"][index] for t in traces[1:])
    record = ref[index]
    assert traces[0].strings[record["name"]] == first["name"]
    assert int(record["step"]) == first["step"]


def test_seeded_training_loop_is_deterministic(tmp_path: Path, shared: Cache) -> None:
    done = shared_audit(shared, Audit("train_mlp.py", DETERMINISTIC))
    result = done.result
    assert result.returncode == 0, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "deterministic"
    assert report["first_divergence"] is None
    assert all(r["exit_code"] == 0 and r["complete"] and r["records"] > 20 for r in report["runs"])
    assert report["runs"][0]["records"] == report["runs"][1]["records"]
    done.copy_to(tmp_path)  # this test corrupts a trace: its own copy of the run
    kinds = {k for k in read_trace(tmp_path / "run" / "repeat-0.trace").records["kind"]}
    assert {1, 2, 3, 4} <= kinds  # module outputs, grads, params and optimizer state were all recorded
    assert "DETERMINISTIC" in result.stdout

    # the finished run re-renders to the same verdict, and a corrupted trace in it is refused (exit 4)
    again = run_cli(["report", "run", "--json", "again.json"], cwd=tmp_path)
    assert again.returncode == 0
    assert again.report is not None
    assert again.report["verdict"] == "deterministic"
    trace = tmp_path / "run" / "repeat-1.trace"
    data = bytearray(trace.read_bytes())
    header_len = int.from_bytes(data[len(MAGIC) + 1: len(MAGIC) + 5], "little")
    data[len(MAGIC) + 5 + header_len] = ord("?")  # the frame after the header no longer has a valid tag
    trace.write_bytes(bytes(data))
    corrupt = run_cli(["report", "run"], cwd=tmp_path)
    assert corrupt.returncode == 4
    assert "corrupt" in corrupt.stderr
    assert "Traceback" not in corrupt.output


def test_unseeded_training_diverges_at_first_differing_tensor(shared: Cache) -> None:
    done = shared_audit(shared, Audit("train_cnn.py"))  # fixed inputs, unseeded initial weights
    result = done.result
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    first = report["first_divergence"]
    # the batch the model is given is identical; the first layer's output is the first tensor that differs
    assert first["category"] == "content"
    assert first["kind"] == "output"
    assert first["name"] == "conv1"
    # location: the forward call (train_cnn.py:15), or the random init behind it when ops were recorded
    assert first["step"] == 0
    assert first["location"].rsplit(":", 1)[0].endswith("train_cnn.py")
    assert first["repeats"] == [1]
    assert first["max_abs_diff"] is not None
    assert first["max_abs_diff"] > 0
    assert_exact_first_divergence(done.run_dir, report)


def test_run_sarif_shows_the_first_divergence_on_the_script_s_line(shared: Cache) -> None:
    done = shared_audit(shared, Audit("train_cnn.py"))  # the run above: `--sarif run.sarif` is every audit's
    doc = json.loads((done.cwd / SARIF).read_text())
    first = doc["runs"][0]["results"][0]
    physical = first["locations"][0]["physicalLocation"]
    shown = f"{physical['artifactLocation']['uri'].rsplit('/', 1)[-1]}:{physical['region']['startLine']}"
    assert (sarif_errors(doc), first["ruleId"], first["level"], shown) == \
        ([], "first-divergence", "error", done.report["first_divergence"]["location"].rsplit("/", 1)[-1])


def test_divergence_only_after_some_steps(shared: Cache) -> None:
    done = shared_audit(shared, Audit("train_regressor.py"))  # unseeded numpy jitter once warm-up (3 steps) is over
    result = done.result
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    first = report["first_divergence"]
    assert first["step"] == 3
    assert first["kind"] == "input"
    assert first["category"] == "content"
    steps = {s["step"]: s for s in report["spread"]["by_step"]}
    assert all(steps[s]["differing"] == 0 for s in range(3))
    assert steps[3]["differing"] > 0
    assert_exact_first_divergence(done.run_dir, report)


def test_inference_without_eval_diverges_at_dropout(shared: Cache) -> None:
    done = shared_audit(shared, Audit("predict.py"))
    result = done.result
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    first = report["first_divergence"]
    assert first["kind"] == "output"
    assert first["name"] == "2"
    assert first["module"] == "2"
    assert first["step"] == 0
    assert first["location"].rsplit(":", 1)[0].endswith("predict.py")
    assert_exact_first_divergence(done.run_dir, report)
    trace = read_trace(done.run_dir / "repeat-0.trace")
    names = [trace.strings[i] for i in trace.records["name"][: first["index"]]]
    assert "0" in names
    assert "1" in names


def test_script_that_always_crashes_exits_3_and_shows_its_error(shared: Cache) -> None:
    done = shared_audit(shared, Audit("fit_model.py", DETERMINISTIC))  # validation batch of the wrong width
    result = done.result
    assert result.returncode == 3, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "failed"
    assert all(r["exit_code"] == 1 for r in report["runs"])
    error = "RuntimeError: mat1 and mat2 shapes cannot be multiplied"
    assert error in report["failure"]
    assert error in result.stdout.replace("\n", " ")
    stderr = _repeat_stderr(done.run_dir)
    assert "fit_model.py\", line 22" in stderr  # the script's own traceback, pointing at its own line
    # nothing of detaudit's: no frame of its package (wherever the checkout lives), no message of its own
    package = Path(detaudit.__file__).parent
    frames = [Path(f) for f in re.findall(r'File "([^"]+)", line', stderr)]
    assert frames, frames
    assert not [f for f in frames if f.is_relative_to(package)], frames
    assert "runpy" not in stderr, stderr
    assert not re.search(r"^detaudit\b", stderr, re.M), stderr


def test_script_that_crashes_in_some_repeats_is_divergent(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    claims.mkdir()
    result = audit(tmp_path, "train_sharded.py", "--", str(claims))
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    assert sorted(r["exit_code"] for r in report["runs"]) == [0, 1]
    first = report["first_divergence"]
    assert first["category"] == "outcome"
    assert "exit" in first["detail"]
    assert "shard 1 is missing its label file" in result.output  # the failing repeat's error is shown


def test_hang_times_out_with_exit_5(tmp_path: Path) -> None:
    # the timeout comes once each repeat trained its step and waits (records > 0, checked below)
    result = audit(tmp_path, "train_then_wait.py", "--timeout", start_allowing(5, 10))
    assert result.returncode == 5, result.output
    report = result.report
    assert report is not None
    assert all(r["timed_out"] for r in report["runs"])
    for run in report["runs"]:
        trace = read_trace(tmp_path / "run" / run["trace"])
        assert not trace.complete
        assert len(trace.records) > 0
    assert "timed out" in result.output


def test_missing_script_exits_2(tmp_path: Path) -> None:
    result = run_cli(["run", "missing_script.py", *FAST], cwd=tmp_path)
    assert result.returncode == 2
    assert "missing_script.py" in result.stderr
    assert "Traceback" not in result.output


def test_parity_with_plain_python(tmp_path: Path) -> None:
    args = ["--flag", "two words", "--", "-n", "3"]
    plain = subprocess.run([sys.executable, str(SCRIPTS / "show_env.py"), *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    result = audit(tmp_path, "show_env.py", "--", *args)
    report = result.report
    assert report is not None
    assert [r["exit_code"] for r in report["runs"]] == [plain.returncode] * 2
    assert result.returncode == (6 if plain.returncode == 0 else 3)  # torch-free: nothing to compare
    for run in report["runs"]:
        assert (tmp_path / "run" / run["stdout"]).read_text() == plain.stdout
        assert (tmp_path / "run" / run["stderr"]).read_text() == plain.stderr
    assert json.loads((tmp_path / "report.json").read_text())["script_args"] == args


@pytest.mark.slow
def test_os_exit_after_inference_is_audited_not_waved_through(shared: Cache) -> None:
    """The probe's false DETERMINISTIC: buffered records lost at `os._exit`, three empty repeats "agreeing"."""
    result = shared_audit(shared, Audit("score_batches.py")).result
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    assert all(r["complete"] and r["records"] >= 5 * 4 for r in report["runs"])
    assert report["first_divergence"]["kind"] == "output"
    assert report["first_divergence"]["step"] == 0


@pytest.mark.slow
def test_a_script_that_closes_every_descriptor_keeps_its_file_and_the_trace(shared: Cache) -> None:
    done = shared_audit(shared, Audit("export_scores.py", DETERMINISTIC))
    result = done.result
    assert result.returncode == 0, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "deterministic"
    assert all(r["complete"] and r["records"] >= 7 * 4 for r in report["runs"])
    saved = json.loads((done.cwd / "scores.json").read_text())  # only the script's JSON: no trace frame in it
    assert saved["warmup"] == 3
    assert len(saved["scores"]) == 4


# -- issue 27 class A: no verdict resting on content that was never compared -------------------------
@pytest.mark.parametrize("layout", ["csr", "jagged"])
def test_sparse_and_nested_tensors_that_differ_per_run_are_divergent(tmp_path: Path, layout: str) -> None:
    """Their contents were "not observed" (dtype and shape only): differing values were DETERMINISTIC."""
    result = audit(tmp_path, "score_sparse_features.py", "--", "--layout", layout)
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    first = report["first_divergence"]
    assert (first["kind"], first["name"], first["index"]) == ("input", "Features.input[0]", 0), first
    assert first["shape"] == ("3x4" if layout == "csr" else "2xjx1")
    assert report["match"]["records_without_contents"] == 0
    assert not any("contents of" in line for line in report["match"]["not_observed"])
    assert_exact_first_divergence(tmp_path / "run", report)


def test_a_save_in_an_atexit_handler_that_differs_per_run_is_divergent(tmp_path: Path) -> None:
    """Work after the script's body returns was not recorded: a per-run export was DETERMINISTIC."""
    result = audit(tmp_path, "finalize_export.py")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "divergent"
    first = report["first_divergence"]
    assert (first["kind"], first["name"]) == ("save", "torch.save[0].calibration"), first
    assert first["location"].endswith("finalize_export.py:12"), first  # the save in the handler
    assert all(r["complete"] and r["exit_code"] == 0 for r in report["runs"])
    assert_exact_first_divergence(tmp_path / "run", report)


def test_running_statistics_that_differ_make_a_divergence_at_a_buffer(tmp_path: Path) -> None:
    """Parameters, gradients and outputs agree (batch statistics in training); BatchNorm's running
    statistics, updated with another momentum in each repeat, do not."""
    result = audit(tmp_path, "train_bn_tuned.py")
    assert result.returncode == 1, result.output
    first = result.report["first_divergence"]  # type: ignore[index]
    assert (first["kind"], first["name"], first["step"]) == ("buffer", "1.running_mean", 0)


def test_a_checkpoint_whose_rng_states_differ_names_the_path_inside_it(tmp_path: Path) -> None:
    """The model, optimizer and torch RNG state agree; NumPy's and Python's RNG states, never seeded, do not:
    torch.save's non-tensor values are compared too."""
    result = audit(tmp_path, "train_resumable.py")
    assert result.returncode == 1, result.output
    first = result.report["first_divergence"]  # type: ignore[index]
    assert (first["kind"], first["name"]) == ("save", "torch.save[0].rng.numpy[1]")
