"""End to end, through the real CLI: what a user sees — printed timings, the script's own options, the demo."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import SCRIPTS, detaudit_command, run_cli

TIMED = "train_timed.py"


@pytest.fixture
def timed(tmp_path: Path) -> Path:
    shutil.copy(SCRIPTS / TIMED, tmp_path / TIMED)
    return tmp_path


@pytest.mark.process
@pytest.mark.slow
def test_a_seeded_script_that_prints_timings_is_deterministic_in_ten_repeats(timed: Path) -> None:
    """One audit of 10 repeats: each repeat's stdout differs byte for byte from every other (timestamps,
    step times, rates, a carriage-return progress bar), so all 45 pairs needed the masking, and a 2-repeat
    audit of any pair of them is `deterministic` too (masked equality is an equivalence)."""
    result = run_cli(["run", "-n", "10", "--granularity", "step", "-q", "--json", "r.json", "--out", "run",
                      TIMED, "--", "--epochs", "1"], cwd=timed, timeout=900)
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["verdict"] == "deterministic"
    assert result.report["stdout_mode"] == "masked"
    assert len({r["stdout_digest"] for r in result.report["runs"]}) == 10
    records = result.report["spread"]["records_compared"]
    assert result.stdout.strip().splitlines()[-1] == (f"DETERMINISTIC · 10 repeats agree on {records} records · "
                                                     f"run: {(timed / 'run').resolve()}")

    strict = run_cli(["report", "run", "--stdout", "strict", "--json", "strict.json"], cwd=timed)
    assert strict.returncode == 1, strict.output
    assert strict.report is not None
    first = strict.report["first_divergence"]
    assert (first["kind"], first["name"], first["stdout"]["line"]) == ("stdout", "line 1", 1)
    assert first["stdout"]["lines"]["0"].endswith("INFO config: {'epochs': 1, 'batch_size': 32, 'lr': 0.05, "
                                                  "'device': 'cpu', 'log_every': 4, 'seed': 1234}")
    assert f"all {records} recorded tensor records agree" in first["detail"]
    assert [c["id"] for c in strict.report["causes"]] == ["stdout-differs"]


@pytest.mark.process
def test_an_option_the_script_defines_too_is_refused_with_the_spelling_to_use(timed: Path) -> None:
    result = run_cli(["run", "-n", "2", TIMED, "--device=cpu", "--epochs", "1"], cwd=timed)
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output
    assert not (timed / ".detaudit").exists()
    message = " ".join(result.stderr.split())
    assert f"--device=cpu is an option of both detaudit and {TIMED}" in message
    assert f"`detaudit run -n 2 {TIMED} -- --device=cpu --epochs 1`" in message
    assert f"`detaudit run -n 2 --device=cpu {TIMED} --epochs 1`" in message


@pytest.mark.process
@pytest.mark.slow
def test_options_after_the_script_reach_it_and_strict_stdout_shows_the_first_differing_line(timed: Path) -> None:
    script_argv = [TIMED, "--epochs", "1", "--device=cpu", "--log-every", "8", "--seed", "7"]
    result = run_cli(["run", "-n", "2", "--granularity", "step", "--stdout", "strict", "--json", "r.json",
                      "--out", "run", *script_argv], cwd=timed, env={"COLUMNS": "400"})
    assert result.returncode == 1, result.output
    assert result.report is not None
    assert result.report["argv"] == script_argv
    assert f"script argv: {' '.join(script_argv)}" in result.stdout
    printed = (timed / "run" / "repeat-0.stdout").read_text()
    assert "'device': 'cpu', 'log_every': 8, 'seed': 7" in printed  # the script parsed the options itself
    first = result.report["first_divergence"]
    assert first["kind"] == "stdout"
    assert first["stdout"]["mode"] == "strict"
    line = first["stdout"]["line"]
    shown = [first["stdout"]["lines"]["0"], first["stdout"]["lines"]["1"]]
    assert shown == [printed.split("\n")[line - 1],
                     (timed / "run" / "repeat-1.stdout").read_text().split("\n")[line - 1]]
    assert shown[0] in result.stdout
    assert shown[1] in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith(
        f"DIVERGENT · first divergence: stdout line {line} · top cause: stdout-differs (likely) · "
        f"run: {(timed / 'run').resolve()}")


@pytest.mark.process
@pytest.mark.slow
def test_the_demo_exits_0_and_ends_with_a_summary_that_a_pipe_does_not_wrap(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a CI log: no terminal, no COLUMNS
    proc = subprocess.run([*detaudit_command(), "demo", "-n", "2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    note = " ".join(" ".join(lines[-4:-1]).split())  # prose wraps at session.PROSE_WIDTH off a terminal
    assert "diverges on purpose" in note
    assert "`detaudit run` on your own script exits 1" in note
    assert lines[-1].startswith("DIVERGENT · first divergence: input ")
    assert "top cause: unseeded-numpy-rng (confirmed)" in lines[-1]
    assert "/.detaudit/runs/" in lines[-1]
    assert max(len(line) for line in lines) > 120  # laid out whole, not wrapped at 80 columns
    assert (tmp_path / ".detaudit" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert "explain-numpy-rng-0 (cpu): exit 0" in proc.stderr  # --explain shows its progress
    runs = list((tmp_path / ".detaudit" / "runs").iterdir())
    report = json.loads((runs[0] / "report.json").read_text())
    assert report["verdict"] == "divergent"
    assert report["first_divergence"]["location"] in lines[-1]


@pytest.mark.process
@pytest.mark.slow
def test_a_seeded_script_printing_framework_style_metrics_and_a_progress_bar_is_deterministic(tmp_path: Path) -> None:
    """HF Trainer-style log dicts and closing metrics (measurements quoted, keyed by name), a tqdm-style bar
    with a `{:5.2f}` rate, a fixed-width `time: {:5.2f}ms` line and a table with a `time` column: every
    repeat prints other timings, of other widths (issue 25: each of these was a false divergence)."""
    shutil.copy(SCRIPTS / "train_hf_style.py", tmp_path)
    result = run_cli(["run", "-n", "3", "--granularity", "step", "--no-explain", "-q", "--json", "r.json",
                      "--out", "run", "train_hf_style.py"], cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["verdict"] == "deterministic"
    assert len({r["stdout_digest"] for r in result.report["runs"]}) == 3  # the timings differ
    assert "carried_output" not in result.report
    # the metrics are compared: the closing dict's train_loss, the per-step losses
    printed = (tmp_path / "run" / "repeat-0.stdout").read_text()
    assert "'train_loss': '" in printed
    assert "'train_runtime': '" in printed


@pytest.mark.process
@pytest.mark.slow
def test_a_log_directory_numbered_by_earlier_repeats_is_reported_but_no_divergence(tmp_path: Path) -> None:
    """Lightning's default logger: each repeat lists `logs/` and takes the next `version_N`, so `v_num`
    differs while every tensor agrees. The listing is direct evidence (path, line): reported, exit 0."""
    shutil.copy(SCRIPTS / "train_versioned_logs.py", tmp_path)
    result = run_cli(["run", "-n", "3", "--no-explain", "--json", "r.json", "--out", "run",
                      "train_versioned_logs.py"], cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.output
    report = result.report
    assert report is not None
    assert report["verdict"] == "deterministic"
    assert report["first_divergence"] is None
    carried = report["carried_output"]
    assert carried["repeats"] == [1, 2]
    assert carried["stdout"]["field"] == "v_num"
    assert carried["stdout"]["lines"]["1"].startswith("Epoch 0: 100%|██████████| 1/4")
    assert "v_num=1" in \
        carried["stdout"]["lines"]["1"]
    assert carried["evidence"][0] == ("repeat 1 listed directory logs/, holding version_0, which an earlier repeat "
                                      "of this audit created or changed, at train_versioned_logs.py:10")
    assert "Output that follows state carried between repeats" in result.stdout

    # the same state carried into the tensors: divergent, and the read is named as the cause
    (tmp_path / "resume.py").write_text(
        "import os\nimport torch\n\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\n"
        "if os.path.exists('last.pt'):\n    model.load_state_dict(torch.load('last.pt'))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nx, y = torch.randn(8, 4), torch.randn(8, 1)\n"
        "loss = torch.nn.functional.mse_loss(model(x), y)\nloss.backward()\nopt.step()\n"
        "torch.save(model.state_dict(), 'last.pt')\n")
    resumed = run_cli(["run", "-n", "3", "--no-explain", "--json", "r2.json", "--out", "run2", "resume.py"],
                      cwd=tmp_path, timeout=900)
    assert resumed.returncode == 1, resumed.output
    assert resumed.report is not None
    assert resumed.report["causes"][0]["id"] == "carried-state"
    assert resumed.report["causes"][0]["evidence"][0].startswith(
        "repeat 1 read last.pt, which an earlier repeat of this audit wrote, at resume.py:7")


@pytest.mark.process
def test_steps_per_second_printed_as_cleanrl_prints_them_never_fail_the_gate(tmp_path: Path) -> None:
    # The important thing is that `SPS: N`, different in every repeat, is a measurement, not a result
    result = run_cli(["run", "-n", "2", "-j", "2", "--granularity", "step", "--json", "r.json", "--out", "run",
                      str(SCRIPTS / "train_policy.py")], cwd=tmp_path)
    assert result.returncode == 0, result.output


@pytest.mark.process
def test_a_printed_return_that_really_differs_beside_them_is_a_divergence(tmp_path: Path) -> None:
    result = run_cli(["run", "-n", "2", "-j", "2", "--granularity", "step", "--json", "r.json", "--out", "run",
                      str(SCRIPTS / "train_policy.py"), "--", "--eval-episodes", "4"], cwd=tmp_path)
    assert result.report is not None
    stdout = result.report["first_divergence"]["stdout"]
    assert stdout["lines"][str(stdout["reference"])].startswith("eval returns")
