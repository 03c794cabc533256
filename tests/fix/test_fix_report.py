"""`detaudit fix`'s report: its JSON and exit codes (fix/fix_report.py), the terminal (cli/fix.py), and what the runner
reads from a run directory: step times from the footers, unseeded RNG objects as line edits (fix/trials.py)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from synthetic import training_records, write_run, write_trace

from detaudit.audit.pipeline import load_run
from detaudit.cli import fix as cli_fix
from detaudit.errors import ExitCode
from detaudit.fix import trials
from detaudit.fix.code import Edit
from detaudit.fix.cost import Figure, KnobCost, Sample
from detaudit.fix.fix_report import FixReport, KnobFix, Trial, report_json
from detaudit.pin import Pin
from detaudit.results import Cause
from detaudit.run.rundir import read_run


def _fixed() -> FixReport:
    edit = Edit(Pin.NUMPY_RNG, "train.py", 41, "    rng = np.random.default_rng()",
                "    rng = np.random.default_rng(0)", "seed with a constant at train.py:41", True)
    trials = (Trial((Pin.TORCH_RNG, Pin.NUMPY_RNG), "deterministic", 2, "", "fix-1"),
              Trial((Pin.TORCH_RNG,), "divergent", 2, "still at #3", "fix-2"),
              Trial((Pin.NUMPY_RNG,), "divergent", 2, "still at #0", "fix-3"))
    slow = KnobCost(Figure(0.012, 0.010, True, 0.2, 0.15, 0.25, 3), Figure(10.0, 9.9, False, 0.01, -0.05, 0.08, 3))
    free = KnobCost(Figure(0.010, 0.010, False, 0.0, -0.02, 0.03, 3), Figure(10.0, 10.0, False, 0.0, -0.1, 0.1, 3))
    return FixReport(
        script="train.py", run_dir="/runs/r1", verdict="fixed", audit_exit_code=1,
        knobs=(KnobFix(Pin.TORCH_RNG, ("import torch", "torch.manual_seed(0)"), (), trials[2], slow),
               KnobFix(Pin.NUMPY_RNG, (), (edit,), trials[1], free)),
        prelude=("# detaudit fix: torch-rng", "import torch", "torch.manual_seed(0)"), edits=(edit,), insert_after=1,
        verified=True, verification="2 repeats ran the copy: they agree", trials=trials, repeats_used=6, budget=24)


def test_the_json_carries_each_knob_by_its_pin_name_with_fix_where_and_cost() -> None:
    data = report_json(_fixed())
    assert data["format"] == "detaudit-fix"
    assert data["verdict"] == "fixed"
    assert data["exit_code"] == 1
    assert data["verified"] is True
    assert data["repeats_used"] == 6
    assert data["budget"] == 24
    torch_knob, numpy_knob = data["knobs"]
    assert torch_knob["name"] == "torch-rng"
    assert torch_knob["where"] == "prelude"
    assert torch_knob["fix"] == "import torch\ntorch.manual_seed(0)"
    assert torch_knob["cost"]["summary"] == "+20% CPU per step (+15% … +25% over 3 pairs)"
    assert torch_knob["cost"]["step_time"]["low"] == 0.15
    assert torch_knob["needed"]["verdict"] == "divergent"
    assert numpy_knob["where"] == "line train.py:41"
    assert numpy_knob["fix"] == "train.py:41: rng = np.random.default_rng(0)"
    assert numpy_knob["cost"]["summary"] == ("costs nothing within the spread (CPU per step +0%: -2% … +3% over 3 "
                                             "pairs; whole run +0%: -10% … +10% over 3 pairs)")
    assert numpy_knob["edits"][0]["applied"] is True
    assert [t["knobs"] for t in data["search"]] == [["torch-rng", "numpy-rng"], ["torch-rng"], ["numpy-rng"]]


def test_verdicts_map_to_documented_exit_codes() -> None:
    base = _fixed()
    codes = {verdict: FixReport("s", "r", verdict, 3).exit_code  # type: ignore[arg-type]
             for verdict in ("deterministic", "fixed", "incomplete", "uncontrolled", "failed")}
    assert codes == {"deterministic": ExitCode.DETERMINISTIC, "fixed": ExitCode.DIVERGENT,
                     "incomplete": ExitCode.DIVERGENT, "uncontrolled": ExitCode.UNCONTROLLED, "failed": 3}
    assert base.exit_code == 1


def test_the_terminal_shows_a_ready_to_paste_block_the_proof_and_the_costs() -> None:
    out = io.StringIO()
    cli_fix.render(_fixed(), Console(file=out, width=200))
    text = out.getvalue()
    assert "FIXED: torch-rng, numpy-rng make the repeats agree, and each is needed · verified as written" in text
    assert "Add at the top of train.py (after line 1):\n    # detaudit fix: torch-rng\n    import torch\n" in text
    assert "train.py:41: rng = np.random.default_rng()  ->  rng = np.random.default_rng(0)" in text
    assert "+20% CPU per step (+15% … +25% over 3 pairs)" in text
    assert "costs nothing within the spread" in text
    assert "diverge (fix-3)" in text
    assert "fix-1: torch-rng+numpy-rng: agree (2 repeats)" in text


def test_a_fix_under_perturb_says_which_settings_it_agreed_across() -> None:
    from dataclasses import replace

    perturbed = replace(_fixed(), perturb=("threads",))
    assert report_json(perturbed)["perturb"] == ["threads"]
    assert report_json(_fixed())["perturb"] == []
    assert "make the repeats agree under --perturb threads, and each is needed" in cli_fix.summary_line(perturbed).plain
    assert "under --perturb" not in cli_fix.summary_line(_fixed()).plain
    # the verification: the groups, and the knob variables the perturbation kept its own
    held = trials._under(["threads"], ["MKL_NUM_THREADS", "OMP_NUM_THREADS"])
    assert held.startswith(", across every group of --perturb threads; MKL_NUM_THREADS, OMP_NUM_THREADS stayed as")
    assert "the prelude is what made the groups agree" in held
    assert trials._under(["threads"], []) == ", across every group of --perturb threads"
    assert trials._under([], []) == ""


def test_nothing_to_fix_and_no_knob_read_as_such() -> None:
    out = io.StringIO()
    cli_fix.render(FixReport("train.py", "/r", "deterministic", 0), Console(file=out, width=200))
    assert "DETERMINISTIC: the repeats agree; nothing to fix" in out.getvalue()
    line = cli_fix.summary_line(FixReport("train.py", "/r", "uncontrolled", 1, repeats_used=4, budget=24))
    assert "no knob controls the divergence" in line.plain
    assert "4 of 24 repeats" in line.plain


def test_cpu_step_times_are_read_from_the_footers(tmp_path: Path) -> None:
    records = training_records()
    for i, steps in enumerate(([1.5, 0.01, 0.03], [1.4, 0.03])):
        write_trace(tmp_path / f"r{i}.trace", records, {"exit_code": 0, "error": None, "step_times": [9.0] * 3,
                                                         "step_cpu_times": steps})
    _, results = read_run(write_run(tmp_path / "run", [records, records]))
    results = [r.__class__(**{**r.to_dict(), "trace": f"../r{r.index}.trace"}) for r in results]
    assert trials.timing(tmp_path / "run", results) == [Sample(0.02, 0.5), Sample(0.03, 0.5)]


def test_an_rng_object_created_unseeded_in_the_script_becomes_its_knobs_line_edit(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import numpy as np\nrng = np.random.default_rng()\n")
    first = training_records(seed=0)
    other = [r.but(digest=r.digest + 1) if i == 1 else r for i, r in enumerate(first)]
    run_dir = write_run(tmp_path / "run", [first, other], script=str(script))
    for i in range(2):  # the same records, and the object's creation before record 0
        (run_dir / f"repeat-{i}.trace").unlink()
        made = {"type": "generator", "lib": "numpy", "fn": "np.random.default_rng", "seeded": False, "value": None,
                "loc": "train.py:2", "library": False, "state": f"state-{i}"}
        write_trace(run_dir / f"repeat-{i}.trace", [first, other][i], {"exit_code": 0, "error": None},
                    events=[(0, made)], header={"repeat": i})
    _, results = read_run(run_dir)
    edits, drawn = trials.seed_edits(load_run(run_dir), run_dir, results, script, tmp_path)
    assert drawn == set()
    assert [(e.pin, e.line, e.after, e.applies) for e in edits] == [
        (Pin.NUMPY_RNG, 2, "rng = np.random.default_rng(0)", True)]


def test_a_cause_no_knob_controls_is_shown_with_its_code_fix_on_top() -> None:
    seed = Cause("varying-seed", "confirmed", "a seed from outside", ["Generator.seed() at a.py:13"],
                 "call `.manual_seed(0)` on the Generator instead of `.seed()` at a.py:13", [Pin.TORCH_RNG],
                 "experiment")
    report = FixReport("train.py", "/r", "uncontrolled", 1, causes=(seed,))
    out = io.StringIO()
    cli_fix.render(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "cause: varying-seed (confirmed), fixed in the code" in text
    assert text.index("Fix in the code — varying-seed (confirmed); no setting controls it:") < text.index(
        "Likely causes")
    assert report_json(report)["code_fix"] == {"cause": "varying-seed", "confidence": "confirmed", "fix": seed.fix}


def test_no_code_fix_is_offered_for_a_cause_an_experiment_ruled_out() -> None:
    ruled_out = Cause("python-hash-seed", "ruled-out", "hash order", [], "sorted", [Pin.HASH_SEED], "direct")
    assert FixReport("train.py", "/r", "uncontrolled", 1, causes=(ruled_out,)).code_cause is None
