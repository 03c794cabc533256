"""`detaudit watch` end to end on CPU: the real CLI on scripts of its own (tests/watch/scripts)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CliResult, detaudit_command, diverges_within, run_cli
from processes import alive, wait_until

from detaudit.trace import read_footer

pytestmark = pytest.mark.process

WATCH_SCRIPTS = Path(__file__).resolve().parents[1] / "watch" / "scripts"
FLIP = "DETAUDIT_TEST_WATCH_FLIP"


def watch(tmp_path: Path, script: str, *extra: str, env: dict[str, str] | None = None, out: str = "run") -> CliResult:
    return run_cli(["watch", str(WATCH_SCRIPTS / script), "--out", out, "--json", f"{out}.json", *extra],
                   tmp_path, env=env)


@pytest.mark.race
def test_a_racing_index_put_is_named_at_its_line_and_the_job_stops_before_its_update(tmp_path: Path) -> None:
    """index_put_(accumulate=True) with duplicate indices on two threads: the replay disagrees (when the race
    fires) and the job stops before optimizer.step, so that step's checkpoint is never written."""
    folders: list[Path] = []

    def attempt(n: int) -> CliResult:
        folders.append(tmp_path / f"attempt-{n}")
        folders[-1].mkdir()
        return watch(folders[-1], "lookup_race.py", "--every", "1")

    result = diverges_within(5, attempt)
    report = result.report
    assert report is not None
    first = report["mismatches"][0]
    assert first["op"] == "aten.index_put_.default"
    assert first["location"].endswith("lookup_race.py:13")
    assert first["module"] == "BagOfWords"
    assert first["max_ulp"] > 0
    assert report["stopped_before"] == "optimizer.step"
    stopped = first["step"]
    assert sorted(p.name for p in folders[-1].glob("bags-*.pt")) == [f"bags-{s}.pt" for s in range(stopped)]
    assert result.stdout.count("\n") == stopped  # the steps before it printed their loss, nothing else did


def test_a_deterministic_script_runs_as_plain_python_does(tmp_path: Path) -> None:
    plain_dir, watched_dir = tmp_path / "plain", tmp_path / "watched"
    plain_dir.mkdir()
    watched_dir.mkdir()
    plain = subprocess.run([sys.executable, str(WATCH_SCRIPTS / "fit_seeded.py")], cwd=plain_dir,
                           capture_output=True, text=True)
    result = watch(watched_dir, "fit_seeded.py", "--every", "2", "--status-every", "4")
    assert result.returncode == plain.returncode == 0
    assert result.stdout == plain.stdout  # nothing of detaudit's in the script's standard output
    assert (watched_dir / "fitted.pt").read_bytes() == (plain_dir / "fitted.pt").read_bytes()
    assert result.report is not None
    assert result.report["verdict"] == "clean"
    assert result.report["checked_steps"] == [0, 2, 4, 6, 8]  # 8: the evaluation after the last step
    assert result.report["steps"] == 8
    assert "detaudit watch: step 4, 2 checked, 0 mismatches" in result.stderr
    assert result.stderr.count("detaudit watch: step ") == 2  # --status-every 4: after steps 4 and 8


@pytest.fixture(scope="module")
def lstm_by_hand(tmp_path_factory: pytest.TempPathFactory) -> tuple[CliResult, Path, Path]:
    """train_lstm_lm.py (an LSTM through oneDNN, updated by hand: no optimizer), plain and under `watch --every
    1`: the watch's result, its folder and the plain run's folder."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "train_lstm_lm.py"
    plain_dir, watched_dir = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("watched")
    subprocess.run([sys.executable, str(script)], cwd=plain_dir, capture_output=True, check=True)
    return run_cli(["watch", str(script), "--every", "1", "--json", "watch.json"], watched_dir), watched_dir, plain_dir


def test_an_lstm_trained_by_hand_is_clean(lstm_by_hand: tuple[CliResult, Path, Path]) -> None:
    result = lstm_by_hand[0]
    assert (result.returncode, result.report and result.report["verdict"]) == (0, "clean"), result.stderr


def test_an_lstm_trained_by_hand_saves_what_a_plain_run_saves(lstm_by_hand: tuple[CliResult, Path, Path]) -> None:
    _, watched_dir, plain_dir = lstm_by_hand
    assert (watched_dir / "model.pt").read_bytes() == (plain_dir / "model.pt").read_bytes()


def test_each_backward_of_a_script_with_no_optimizer_ends_a_step(lstm_by_hand: tuple[CliResult, Path, Path]) -> None:
    report = lstm_by_hand[0].report
    assert report is not None
    assert (report["steps"], report["step_boundary"]) == (3, "backward")


def test_each_step_of_a_script_with_no_optimizer_is_checked(lstm_by_hand: tuple[CliResult, Path, Path]) -> None:
    report = lstm_by_hand[0].report
    assert report is not None
    assert report["checked_steps"] == [0, 1, 2, 3]  # 3: the save after the last backward


def test_the_console_says_each_backward_ends_a_step(lstm_by_hand: tuple[CliResult, Path, Path]) -> None:
    assert "detaudit watch: steps: each backward() (no optimizer was made before the first backward)" \
        in lstm_by_hand[0].stderr


def test_an_lstms_workspace_is_set_aside_in_each_step(lstm_by_hand: tuple[CliResult, Path, Path]) -> None:
    # oneDNN's LSTM workspace holds other bytes in each execution: no result, no mismatch, no stopped save
    report = lstm_by_hand[0].report
    assert report is not None
    assert report["set_aside_outputs"] == {"aten.mkldnn_rnn_layer.default": 3}  # one per step's forward


def test_a_bit_flipped_in_the_replay_is_reported_as_the_odd_one_out(tmp_path: Path) -> None:
    flip = {"op": "aten.addmm.default", "step": 2, "execution": 2}
    result = watch(tmp_path, "fit_seeded.py", "--every", "2", env={FLIP: json.dumps(flip)})
    assert result.returncode == 1
    assert result.report is not None
    (mismatch,) = result.report["mismatches"]
    assert (mismatch["step"], mismatch["op"], mismatch["max_ulp"]) == (2, "aten.addmm.default", 1)
    assert mismatch["third_agrees_with"] == "first"
    assert "the second execution disagrees with the first; a third agrees with the first" in result.stderr
    assert result.report["stopped_before"] == "optimizer.step"
    assert result.stdout.count("\n") == 2  # steps 0 and 1 ran; step 2 was stopped before its update
    assert not (tmp_path / "fitted.pt").exists()


def test_a_bit_flipped_in_the_scripts_own_result_stops_the_save(tmp_path: Path) -> None:
    """The flip lands in what the script computes in its final evaluation: the third execution sides with the
    replay, and the checkpoint the script was about to save is not written."""
    flip = {"op": "aten.addmm.default", "step": 8, "execution": 1}
    result = watch(tmp_path, "fit_seeded.py", "--every", "2", "--html", "run.html", env={FLIP: json.dumps(flip)})
    assert result.returncode == 1
    assert result.report is not None
    assert result.report["mismatches"][0]["third_agrees_with"] == "second"
    assert result.report["stopped_before"] == "torch.save"
    assert result.report["not_written"] == "fitted.pt"
    assert not (tmp_path / "fitted.pt").exists()
    assert "fitted.pt was not written" in result.stderr
    assert "fitted.pt was not written" in (tmp_path / "run.html").read_text()


def test_on_mismatch_continue_records_every_mismatch_and_lets_the_job_finish(tmp_path: Path) -> None:
    flip = {"op": "aten.addmm.default", "step": 2, "execution": 2}
    result = watch(tmp_path, "fit_seeded.py", "--every", "2", "--on-mismatch", "continue",
                   env={FLIP: json.dumps(flip)})
    assert result.returncode == 1
    assert result.report is not None
    assert result.report["stopped_before"] is None
    assert len(result.report["mismatches"]) == 1
    assert (tmp_path / "fitted.pt").is_file()
    assert result.stdout.count("\n") == 9  # eight steps and the final loss


def test_against_a_baseline_a_faithful_run_agrees_and_a_changed_learning_rate_stops_at_step_0(tmp_path: Path) -> None:
    """A faithful run agrees; a changed learning rate differs at step 0 and the job stops, before its save
    when the save comes first."""
    saved = run_cli(["run", str(WATCH_SCRIPTS / "fit_seeded.py"), "-n", "2", "--out", "base-run",
                     "--save-baseline", "base"], tmp_path)
    assert saved.returncode == 0, saved.output
    same = watch(tmp_path, "fit_seeded.py", "--against", "base", out="same")
    assert same.returncode == 0, same.output
    assert same.report is not None
    assert same.report["against"]["changes"] == []
    (tmp_path / "fitted.pt").unlink()
    changed = watch(tmp_path, "fit_seeded.py", "--against", "base", "--", "400", "0.02", out="changed")
    assert changed.returncode == 1, changed.output
    report = changed.report
    assert report is not None
    first = report["mismatches"][0]
    assert (first["check"], first["step"]) == ("against", 0)
    assert report["against"]["changes"][0] == {"field": "script arguments", "reference": "(none)",
                                               "current": "400 0.02"}
    assert report["stopped_at_step"] < 400
    assert not (tmp_path / "fitted.pt").exists()
    assert "differs from the reference at step 0" in changed.stderr
    # three steps, then the save: it waits for the comparison, which found step 0 differs, and never writes (the
    # stop at the last step boundary may come first when the parent is quick: a race, both before the save;
    # the gate's own stop is tested in tests/recorder/test_replay.py and the replica test below)
    short = watch(tmp_path, "fit_seeded.py", "--against", "base", "--", "3", "0.02", out="short")
    assert short.returncode == 1, short.output
    assert not (tmp_path / "fitted.pt").exists()


@pytest.mark.slow
@pytest.mark.skipif(not __import__("torch").distributed.is_available(), reason="torch.distributed is not built")
def test_a_replica_that_drifts_under_torchrun_stops_every_rank_and_leaves_no_process(tmp_path: Path) -> None:
    """Two gloo ranks; rank 0 clamps its head after step 1, outside DDP: its replica differs from step 2 on.
    Every rank stops at one step, long before the 2,000 the script would run, and no rank is left alive."""
    result = watch(tmp_path, "ddp_drift.py", "--nproc-per-node", "2")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    first = report["mismatches"][0]
    assert (first["check"], first["op"], first["step"], first["rank"]) == ("replica", "module.2.weight", 2, 1)
    assert 2 < report["stopped_at_step"] < 2000  # after the drift, long before the script's end (the lag: load)
    footers = [read_footer(path) for path in sorted((tmp_path / "run").glob("watch-0.rank-*.trace"))]
    assert [f["stopped_at_step"] if f else None for f in footers] == [report["stopped_at_step"]] * 2
    pids = [int(p.read_text()) for p in (tmp_path / "run").glob("watch-0.rank-*.pid")]
    assert not [pid for pid in pids if alive(pid)]
    assert "DDP replica module.2.weight differs on rank 1" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not __import__("torch").distributed.is_available(), reason="torch.distributed is not built")
def test_a_checkpoint_saved_right_after_a_drifted_step_is_not_written(tmp_path: Path) -> None:
    """Rank 0's replica drifts after step 1 (its step-2 parameters differ) and it saves right after step 2: the
    save waits for the parent's replica comparison of step 2, which finds the difference, so it never happens."""
    result = watch(tmp_path, "ddp_drift.py", "--nproc-per-node", "2", "--", "200", "2")
    assert result.returncode == 1, result.output
    report = result.report
    assert report is not None
    assert report["stopped_before"] == "torch.save"
    assert report["mismatches"][0]["step"] == 2
    assert not (tmp_path / "checkpoint.pt").exists()


RAISES_AT_STEP_3 = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    if step == 3:
        raise RuntimeError("the data loader broke")
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_script_that_fails_without_a_mismatch_is_script_failed_in_every_output(tmp_path: Path) -> None:
    """Issue 43: exit 3 and `script failed` on the terminal, but the JSON said `clean` (with the script's own
    status as `exit_code`) and the HTML title `detaudit watch: clean`."""
    (tmp_path / "train.py").write_text(RAISES_AT_STEP_3)
    result = run_cli(["watch", "train.py", "--out", "run", "--json", "run.json", "--html", "run.html"], tmp_path)
    assert result.report is not None
    title = (tmp_path / "run.html").read_text().split("<title>")[1].split(" —")[0]
    assert (result.returncode, result.report["verdict"], result.report["exit_code"], title,
            result.stderr.strip().splitlines()[-1].split(":")[0]) == \
        (3, "script-failed", 3, "detaudit watch: script-failed", "script failed")


@pytest.mark.slow
@pytest.mark.skipif(not __import__("torch").distributed.is_available(), reason="torch.distributed is not built")
def test_functional_collectives_are_never_executed_twice(tmp_path: Path) -> None:
    """Gradients averaged with `_functional_collectives.all_reduce` (and its `wait_tensor`) on two gloo ranks: a
    second execution of either killed a rank (SIGSEGV); they run once, counted as collectives."""
    result = watch(tmp_path, "functional_allreduce.py", "--nproc-per-node", "2", "--every", "1")
    assert result.returncode == 0, result.output
    assert result.report is not None
    assert result.report["skipped_ops"]["collective"] > 0


def test_the_thread_that_steps_the_optimizer_is_the_one_replayed(tmp_path: Path) -> None:
    """The model is built on the main thread and trained on another: the training thread's step 2 is replayed (a
    bit flipped in its replay is found), and the stop there ends the job before the main thread's save."""
    flip = {"op": "aten.addmm.default", "step": 2, "execution": 2}
    result = watch(tmp_path, "threaded_fit.py", "--every", "2", env={FLIP: json.dumps(flip)})
    assert result.returncode == 1, result.output
    assert result.report is not None
    assert result.report["mismatches"][0]["step"] == 2
    assert "Exception in thread" not in result.stderr
    assert not (tmp_path / "threaded.pt").exists()


@pytest.mark.fresh_interpreters  # detaudit itself killed, not a warm server's client standing for it
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_job_dies_with_detaudit_even_by_sigkill(tmp_path: Path) -> None:
    """SIGKILL to detaudit (no handler runs): the job it watches must not live on, unwatched, writing ckpt.pt."""
    guard = subprocess.Popen([*detaudit_command(), "watch", str(WATCH_SCRIPTS / "endless_fit.py"), "--out", "run"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = tmp_path / "job.pid"
    try:
        assert wait_until(lambda: pid_file.is_file() and pid_file.read_text() != "", 120)
        job = int(pid_file.read_text())
        assert alive(job)
    finally:
        guard.send_signal(signal.SIGKILL)
        guard.wait()
    assert wait_until(lambda: not alive(job), 10)


def test_a_save_through_a_handle_that_is_stopped_leaves_the_last_good_checkpoint(tmp_path: Path) -> None:
    """`with open("ckpt.pt", "wb") as f: torch.save(state, f)`: the open empties the file before torch.save is
    stopped; the checkpoint of the step before is put back, whole, and the report says so."""
    import torch

    flip = {"op": "aten.addmm.default", "step": 2, "execution": 1}  # the evaluation after step 1
    result = watch(tmp_path, "save_by_handle.py", "--every", "1", env={FLIP: json.dumps(flip)})
    assert result.returncode == 1, result.output
    assert result.report is not None
    assert (result.report["stopped_before"], result.report["not_written"]) == ("torch.save", "ckpt.pt")
    assert torch.load(tmp_path / "ckpt.pt")["step"] == 0
    assert "ckpt.pt was not written (its previous" in " ".join(result.stderr.split())  # however the console wrapped
