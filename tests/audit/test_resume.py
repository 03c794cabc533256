"""`detaudit resume` on synthetic traces: compare/resumed_alignment.py (windows, alignment),
causes/resume_causes.py (what the checkpoint forgot), report/resume.py (JSON, HTML), audit/resume_check.py's
checks and cli/resume_command.py's argument split and rendering. The whole pipeline on real scripts:
tests/e2e/test_e2e_resume.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from rich.console import Console
from synthetic import Rec, write_run, write_trace

from detaudit.audit.pipeline import AuditOptions, Recording, Target, load_run
from detaudit.audit.resume_check import ResumeOptions, checkpoint_calls, loaded_at, run_resume
from detaudit.causes.resume_causes import ResumeRuns, diagnose
from detaudit.cli.resume_command import ResumeCommand, render, summary_line
from detaudit.compare.resumed_alignment import Steps, align, compare_resumed, read_steps
from detaudit.errors import ExitCode, UsageError
from detaudit.report.resume import CheckpointCall, ResumeReport, render_html, report_json
from detaudit.trace import Kind

MODEL_PART = {"path": "model", "role": "module"}


def _step(step: int, batch: int, grad: int = 0, lr: int = 0, scheduler: bool = False) -> list[Rec]:
    """One training step as the recorder writes it under `resume`: the batch, an output, the learning rate,
    the gradient, the parameter after the step, a scheduler step (counted in the next step)."""
    recs = [Rec("Net.input[0]", 100 + batch, step, Kind.INPUT, module="Net", loc="train.py:20"),
            Rec("Net", 200 + batch + grad, step, Kind.OUTPUT, module="Net", loc="train.py:20"),
            Rec("optimizer SGD:lr", 300 + lr, step, Kind.OPTSTATE, loc="train.py:22"),
            Rec("w", 400 + batch + grad, step, Kind.GRAD, loc="train.py:22"),
            Rec("w", 500 + batch + grad + lr, step, Kind.PARAM, loc="train.py:22")]
    if scheduler:
        recs.append(Rec("lr_scheduler StepLR", 600 + step + 1, step + 1, Kind.OPTSTATE, loc="train.py:23"))
    return recs


def _initial(digest: int, before: int = 0) -> tuple[int, dict[str, Any]]:
    return before, {"type": "initial-params", "step": 0, "params": ["w"], "digests": [f"{digest:016x}"]}


def _save(step: int, parts: list[dict[str, str]], at: int) -> tuple[int, dict[str, Any]]:
    return at, {"type": "checkpoint-save", "path": "ckpt.pt", "loc": "train.py:30", "step": step,
                "keys": [p["path"] for p in parts], "parts": parts}


def _load(parts: list[dict[str, str]], at: int = 0) -> tuple[int, dict[str, Any]]:
    return at, {"type": "checkpoint-load", "path": "ckpt.pt", "loc": "train.py:12", "step": 0,
                "keys": [p["path"] for p in parts], "parts": parts}


class Runs:
    """A reference of 6 steps, an interrupted run that saved after step 3 and a resumed run of steps 3-5."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.reference = write_trace(tmp_path / "repeat-0.trace",
                                     [r for s in range(6) for r in _step(s, s, scheduler=True)], {"exit_code": 0},
                                     events=[_initial(499), _save(3, [MODEL_PART], 15)])
        self.interrupted = write_trace(tmp_path / "interrupted-0.trace",
                                       [r for s in range(4) for r in _step(s, s, scheduler=True)],
                                       {"exit_code": 0, "stopped_at_step": 4}, events=[_save(3, [MODEL_PART], 15)])

    def resumed(self, steps: list[list[Rec]], events: list[tuple[int, dict[str, Any]]],
                start: int = 502, name: str = "resumed-0") -> Path:
        built = [Rec("lr_scheduler StepLR", 600, 0, Kind.OPTSTATE, loc="train.py:9")]  # before the load
        built += [r.but(step=r.step - 3) for recs in steps for r in recs]
        return write_trace(self.dir / f"{name}.trace", built, {"exit_code": 0},
                           events=[_load([MODEL_PART], 1), _initial(start, 1), *events])

    def diagnose(self, resumed: Path) -> tuple[Any, list[Any]]:
        ref, res = read_steps(self.reference), read_steps(resumed)
        alignment = align(ref, res, {3}, 3)
        start = loaded_at(checkpoint_calls(resumed, "checkpoint-load", "resumed"))
        comparison = compare_resumed(self.reference, resumed, alignment.step, start, [False, False]) \
            if alignment.step is not None else None
        divergence = comparison.first_divergence if comparison is not None else None
        runs = ResumeRuns(self.reference, self.interrupted, resumed, 4, alignment, divergence, ref, res)
        return divergence, diagnose(runs)


def test_steps_hold_the_parameters_after_each_step_and_each_steps_first_batch(tmp_path: Path) -> None:
    steps = read_steps(Runs(tmp_path).reference)
    assert steps.initial == {"w": f"{499:016x}"}
    assert steps.at(0) == steps.initial
    assert steps.at(3) == {"w": f"{502:016x}"}
    assert steps.inputs[0] == f"{100:016x}"
    assert steps.inputs[5] == f"{105:016x}"


def test_a_resumed_run_is_aligned_to_the_step_whose_parameters_it_starts_from() -> None:
    reference = Steps({"w": "a"}, {1: {"w": "b"}, 2: {"w": "c"}, 3: {"w": "c"}})
    assert align(reference, Steps({"w": "c"}), {3}, 3).step == 3  # the step a checkpoint was saved at first
    assert align(reference, Steps({"w": "c"}), set(), 3).matches == [2, 3]
    fresh = align(reference, Steps({"w": "a"}), {3}, 3)  # the initial weights, but nothing was saved before step 1
    assert fresh.step is None
    assert fresh.fresh
    assert fresh.differing == ["w"]
    assert fresh.expected == 3
    assert align(reference, Steps({"w": "a"}), {0, 3}, 3).step == 0
    assert align(reference, Steps(None), {3}, 3).step is None


def test_resumed_step_i_is_compared_with_reference_step_s_plus_i_in_the_references_numbering(tmp_path: Path) -> None:
    runs = Runs(tmp_path)
    same = runs.resumed([_step(3 + i, 3 + i, scheduler=True) for i in range(3)], [])
    divergence, causes = runs.diagnose(same)
    assert divergence is None
    assert causes == []
    changed = runs.resumed([_step(3, 3, scheduler=True), _step(4, 4, grad=7, scheduler=True),
                            _step(5, 5, scheduler=True)], [], name="resumed-1")
    divergence, _ = runs.diagnose(changed)
    assert divergence.record.kind == "output"
    assert divergence.record.step == 4


def test_a_learning_rate_that_differs_is_the_scheduler_and_the_fix_names_the_load(tmp_path: Path) -> None:
    runs = Runs(tmp_path)
    resumed = runs.resumed([_step(3 + i, 3 + i, lr=1, scheduler=True) for i in range(3)], [])
    divergence, causes = runs.diagnose(resumed)
    assert divergence.record.name == "optimizer SGD:lr"
    assert causes[0].id == "resume-scheduler"
    assert causes[0].confidence == "likely"
    assert "holds no scheduler state" in " ".join(causes[0].evidence)
    assert "train.py:12" in causes[0].fix


def test_parameters_that_differ_after_matching_gradients_are_the_optimizer_state(tmp_path: Path) -> None:
    runs = Runs(tmp_path)
    steps = [_step(3 + i, 3 + i, scheduler=True) for i in range(3)]
    steps[0][4] = steps[0][4].but(digest=999)  # the parameter after the first step
    divergence, causes = runs.diagnose(runs.resumed(steps, []))
    assert divergence.record.kind == "param"
    assert causes[0].id == "resume-optimizer-state"
    assert "optimizer.state_dict()" in causes[0].fix
    assert "train.py:30" in causes[0].fix


def test_another_batch_with_an_unrestored_rng_drawn_after_the_load_is_the_rng_state(tmp_path: Path) -> None:
    runs = Runs(tmp_path)
    draw = {"type": "draw", "lib": "torch", "fn": "torch.randint", "loc": "train.py:18", "generator": "global",
            "device": "cpu"}
    early = {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "train.py:3",
             "library": False, "drawn_before": False, "state": "x", "pinned": None}
    steps = [_step(3 + i, 10 + i, scheduler=True) for i in range(3)]
    resumed = write_trace(tmp_path / "resumed-0.trace",
                          [r.but(step=r.step - 3) for s in steps for r in s],
                          {"exit_code": 0}, events=[(0, early), _load([MODEL_PART]), (0, draw), _initial(502)])
    divergence, causes = runs.diagnose(resumed)
    assert divergence.record.kind == "input"
    assert causes[0].id == "resume-rng-state"
    assert "torch's global CPU RNG" in causes[0].summary
    assert "train.py:18" in " ".join(causes[0].evidence)
    assert "torch.set_rng_state" in causes[0].fix


def test_another_batch_with_every_rng_restored_is_the_data_position(tmp_path: Path) -> None:
    runs = Runs(tmp_path)
    restore = {"type": "rng-restore", "lib": "torch", "fn": "torch.set_rng_state", "loc": "train.py:14",
               "library": False}
    draw = {"type": "draw", "lib": "torch", "fn": "Tensor.random_", "loc": "train.py:18", "generator": "global",
            "device": "cpu"}
    resumed = runs.resumed([_step(3 + i, i, scheduler=True) for i in range(3)], [(1, restore), (1, draw)])
    divergence, causes = runs.diagnose(resumed)
    assert causes[0].id == "resume-data-position"
    assert "batch of step 0 (its very first: the data loader restarted from the beginning)" in \
        " ".join(causes[0].evidence)


def test_starting_weights_no_reference_step_had_are_the_weights(tmp_path: Path) -> None:
    runs = Runs(tmp_path)
    resumed = runs.resumed([_step(3 + i, 3 + i, scheduler=True) for i in range(3)], [], start=499)
    divergence, causes = runs.diagnose(resumed)
    assert divergence is None  # not compared: nothing to align with
    assert causes[0].id == "resume-weights"
    assert "starts from the same weights as a fresh run" in " ".join(causes[0].evidence)
    assert "model.load_state_dict" in causes[0].fix


def test_loaded_at_is_the_load_before_the_first_step() -> None:
    calls = [CheckpointCall("resumed", "a.pt", "t.py:1", 0, [], [], 5), CheckpointCall("resumed", "b.pt", "t.py:2", 0,
                                                                                        [], [], 9),
             CheckpointCall("resumed", "c.pt", "t.py:3", 2, [], [], 40)]
    assert loaded_at(calls) == 9


def test_stop_at_past_the_bound_is_refused_before_anything_runs(tmp_path: Path) -> None:
    options = AuditOptions(Target(tmp_path / "train.py"), recording=Recording(max_steps=3))
    with pytest.raises(UsageError, match="--stop-at 3 must be below --max-steps 3"):
        run_resume(ResumeOptions(options, 3, ["--resume"]))


def _report(tmp_path: Path, verdict: str = "resume-divergent") -> ResumeReport:
    tmp_path.mkdir(exist_ok=True)
    runs = Runs(tmp_path)
    resumed = runs.resumed([_step(3 + i, 3 + i, lr=1, scheduler=True) for i in range(3)], [])
    divergence, causes = runs.diagnose(resumed)
    reference = load_run(write_run(tmp_path / "ref", [[Rec("x", 1)], [Rec("x", 1)]]))
    saved = [CheckpointCall("interrupted", "ckpt.pt", "train.py:30", 3, ["model"], [MODEL_PART])]  # type: ignore[list-item]
    return ResumeReport("train.py", ["--steps", "6"], ["--resume"], str(tmp_path), 4, verdict,  # type: ignore[arg-type]
                        3, divergence, None, causes, saved, [], reference, [reference.runs[0], reference.runs[1]])


def test_the_json_report_has_the_documented_fields_with_the_step_in_reference_numbering(tmp_path: Path) -> None:
    data = report_json(_report(tmp_path))
    assert {"verdict", "stop_at", "aligned_step", "first_divergence", "causes", "checkpoint"} <= set(data)
    assert data["verdict"] == "resume-divergent"
    assert data["exit_code"] == ExitCode.DIVERGENT
    assert data["first_divergence"]["step"] == 3
    assert data["aligned_step"] == 3
    assert data["causes"][0]["id"] == "resume-scheduler"
    assert data["checkpoint"]["saved"][0]["parts"] == [MODEL_PART]
    assert data["checkpoint"]["loaded"] == []
    assert "resume-scheduler" in render_html(_report(tmp_path / "h"))


def test_the_terminal_shows_verdict_first_difference_causes_and_checkpoint(tmp_path: Path) -> None:
    out = io.StringIO()
    render(_report(tmp_path), Console(file=out, width=200))
    text = out.getvalue()
    assert text.startswith("RESUME-DIVERGENT")
    assert "resume-scheduler" in text
    assert "First difference: optstate `optimizer SGD:lr` at step 3" in text
    assert "saved by the interrupted" in text
    assert summary_line(_report(tmp_path / "e", "resume-equivalent")).plain.startswith("RESUME-EQUIVALENT")


def test_stop_at_and_resume_args_after_the_scripts_arguments_are_detaudits() -> None:
    @click.command(cls=ResumeCommand)
    @click.argument("script")
    @click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
    @click.option("--stop-at", type=int)
    @click.option("--resume-args")
    def command(script: str, script_args: tuple[str, ...], stop_at: int, resume_args: str) -> None:
        click.echo(repr((script, script_args, stop_at, resume_args)))

    runner = CliRunner()
    out = runner.invoke(command, ["train.py", "--steps", "8", "--stop-at", "4", "--resume-args", "--resume"]).output
    assert out.strip() == repr(("train.py", ("--steps", "8"), 4, "--resume"))
    out = runner.invoke(command, ["train.py", "--stop-at=2", "--resume-args=--resume", "--", "--stop-at", "1"]).output
    assert out.strip() == repr(("train.py", ("--stop-at", "1"), 2, "--resume"))


def test_a_gradscaler_state_that_differs_is_the_grad_scaler(tmp_path: Path) -> None:
    runs = Runs(tmp_path)
    steps = [_step(3 + i, 3 + i, scheduler=True) for i in range(3)]
    steps[0].insert(5, Rec("grad_scaler GradScaler", 700, 3, Kind.OPTSTATE, loc="train.py:24"))
    reference_steps = [r for s in range(6) for r in _step(s, s, scheduler=True)]
    reference_steps.insert(3 * 6 + 5, Rec("grad_scaler GradScaler", 701, 3, Kind.OPTSTATE, loc="train.py:24"))
    runs.reference.unlink()
    runs.reference = write_trace(runs.reference, reference_steps, {"exit_code": 0},
                                 events=[_initial(499), _save(3, [MODEL_PART], 15)])
    divergence, causes = runs.diagnose(runs.resumed(steps, []))
    assert divergence.record.name == "grad_scaler GradScaler"
    assert causes[0].id == "resume-grad-scaler"
    assert "scaler.load_state_dict" in causes[0].fix
