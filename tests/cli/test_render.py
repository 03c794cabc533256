"""Terminal rendering details that the e2e tests don't pin down."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from synthetic import training_records, write_run

from detaudit.audit.pipeline import load_run
from detaudit.causes.context import finding
from detaudit.causes.repetition import RepeatedRandomness
from detaudit.cli.render import argv_line, op_panel, render, verdict_line
from detaudit.compare.baseline_diff import BaselineCheck
from detaudit.compare.oprules import OpFinding
from detaudit.compare.tokens import TokenComparison, TokenDivergence
from detaudit.report.model import Report
from detaudit.results import Divergence, RecordInfo
from detaudit.trace import Flag


def _record(kind: str, name: str, op: str = "") -> RecordInfo:
    return RecordInfo(index=4, kind=kind, name=name, module="Net", location="train.py:21", step=0, shape="4x4",
                      dtype="float32", op=op, backward=False)


def test_data_that_entered_from_outside_torch_gets_a_note_not_an_op_table() -> None:
    finding = OpFinding(verdict="inputs-differ", record=_record("op", "aten.addmm.default", op="aten.addmm.default"),
                        repeats=[1], reference=0, origin=_record("input", "Net.input[0]"), window=[0, 0],
                        traces="ops")
    report = SimpleNamespace(first_divergence=SimpleNamespace(), op_finding=finding)
    console = Console(record=True, width=200)
    panel = op_panel(report)  # type: ignore[arg-type]
    assert panel is not None
    console.print(panel)
    text = console.export_text()
    assert "No op recorded in steps 0–0 produced the differing data" in text
    assert "Net.input[0] (train.py:21)" in text
    assert "aten.addmm.default" in text
    assert "phase" not in text  # no input/output match table


def test_an_environment_change_is_not_called_nondeterminism(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    report = load_run(write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]]))
    report = replace(report, causes=[finding("environment-change", 0.9, "the environment changed between the "
                                             "recordings (torch, GPU): a difference between setups", [], "fix",
                                             basis="direct").cause])
    line = verdict_line(report).plain
    assert line.startswith("DIVERGENT: the environment changed between the recordings")
    assert "(torch, GPU differ)" in line


def _rendered(report: object) -> str:
    from detaudit.cli.render import render

    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 - devnull, test only
    render(report, console)  # type: ignore[arg-type]
    return console.export_text()


def test_repeats_that_all_failed_alike_are_not_said_to_end_differently(tmp_path: Path) -> None:
    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, recs], exit_codes=[3, 3])
    (run_dir / "repeat-0.stderr").write_text("")  # the script failed without a word
    text = _rendered(load_run(run_dir))
    assert "The script's error" in text
    assert "(no output on stderr)" in text
    assert "ended differently" not in text
    late = write_run(tmp_path / "late", [recs, recs, recs], exit_codes=[0, 1, 1], timed_out=[True, False, False])
    text = _rendered(load_run(late))
    assert "Repeat 1 exited 1" in text
    assert "ended differently" not in text


def test_inconclusive_verdict_line_says_why(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", [[], []])
    text = _rendered(load_run(run_dir))
    assert text.startswith("INCONCLUSIVE: nothing to compare")
    assert "agree bit for bit" not in text
def _finished(tmp_path: Path, stdout: list[str], mode: str = "masked") -> Report:
    run = write_run(tmp_path / "run", [training_records(2)] * 2, stdout=stdout)
    return load_run(run, stdout=mode)  # type: ignore[arg-type]


def _text(report: Report, notes: tuple[str, ...] = ()) -> str:
    console = Console(record=True, width=200)
    render(report, console, notes)
    return console.export_text()


def test_the_summary_line_comes_last_with_verdict_divergence_cause_and_run_directory(tmp_path: Path) -> None:
    report = _finished(tmp_path, ["loss 0.5\nstep 2 time 3.1ms\n", "loss 0.5\nstep 2 time 4.2ms\n"], "strict")
    lines = _text(report, ("a note before the summary",)).strip().splitlines()
    assert lines[-2] == "a note before the summary"
    assert lines[-1] == (f"DIVERGENT · first divergence: stdout line 2 · top cause: stdout-differs (likely) · "
                         f"run: {report.run_dir}")
    assert lines[1] == "script argv: train.py"


def test_a_stdout_divergence_shows_the_line_of_each_repeat(tmp_path: Path) -> None:
    report = _finished(tmp_path, ["loss 0.5\nloss 0.25\n", "loss 0.5\nloss 0.26\n"])
    text = _text(report)
    assert re.search(r"line +2 of stdout \(masked comparison\)", text)
    assert re.search(r"repeat 0 +'loss 0.25'", text)
    assert re.search(r"repeat 1 +'loss 0.26'", text)
    assert "all 12 recorded tensor records agree" in text
    assert "python-hash-seed" not in text
    assert "object-order" not in text


def test_a_deterministic_summary_says_how_much_agreed(tmp_path: Path) -> None:
    report = _finished(tmp_path, ["epoch 1 12.5 it/s\n", "epoch 1 13.1 it/s\n"])
    assert _text(report).strip().splitlines()[-1] == (f"DETERMINISTIC · 2 repeats agree on 12 records · "
                                                      f"run: {report.run_dir}")


def test_a_stdout_divergence_counts_the_agreeing_records_compared_by_dtype_and_shape_only_apart(
        tmp_path: Path) -> None:
    recs = [r.but(flags=int(Flag.NO_DATA)) if i % 2 else r for i, r in enumerate(training_records(2))]
    run = write_run(tmp_path / "run", [recs, recs], stdout=["loss 0.5\n", "loss 0.6\n"])
    assert "all 12 recorded tensor records agree (6 of them by dtype and shape only)" in _text(load_run(run))


def test_a_deterministic_summary_counts_records_compared_by_dtype_and_shape_only_apart(tmp_path: Path) -> None:
    """Vmapped or meta tensors (NO_DATA) and op outputs that are no result (NOT_RESULT) prove nothing about values:
    the count names the records compared by content (issue 45: 229 records claimed where 220 had no content)."""
    recs = [r.but(flags=int(Flag.NO_DATA if i % 3 else Flag.NOT_RESULT)) if i % 2 else r
            for i, r in enumerate(training_records(2))]
    report = load_run(write_run(tmp_path / "run", [recs, recs]))
    assert _text(report).strip().splitlines()[-1] == (
        f"DETERMINISTIC · 2 repeats agree on 6 records compared by content (6 more by dtype and shape only) · "
        f"run: {report.run_dir}")


def test_a_summary_of_agreeing_repeats_that_differ_from_the_baseline_says_so(tmp_path: Path) -> None:
    """Exit 1 with a last line that read DETERMINISTIC and nothing else would send a CI user hunting."""
    report = _finished(tmp_path, ["done\n", "done\n"])
    moved = Divergence(3, "content", _record("param", "fc.weight"), [1], 0)
    report = replace(report, baseline=BaselineCheck("base", moved, []))
    last = _text(report).strip().splitlines()[-1]
    assert report.exit_code == 1
    assert last.startswith(
        "DETERMINISTIC · 2 repeats agree on 12 records · but DIFFER FROM THE BASELINE: param fc.weight at step 0 "
        "(train.py:21) · run:")


def test_the_argv_line_quotes_arguments_as_a_shell_would() -> None:
    report = SimpleNamespace(argv=["train.py", "data dir/x.txt", "--device=cpu"])
    line = argv_line(report)  # type: ignore[arg-type]
    assert line is not None
    assert line.plain == "script argv: train.py 'data dir/x.txt' --device=cpu"
    assert argv_line(SimpleNamespace(argv=None)) is None  # type: ignore[arg-type]


def test_a_self_check_that_could_not_run_and_content_less_records_are_shown(tmp_path: Path) -> None:
    import json

    from detaudit.trace import Flag

    recs = [r.but(flags=int(Flag.NO_DATA)) for r in training_records(steps=2)]
    run_dir = write_run(tmp_path / "run", [recs, recs])
    record = json.loads((run_dir / "run.json").read_text())
    record["self_check"] = {"record": None, "step": None, "name": None, "detected_at": None,
                            "not_run": "no recorded tensor could carry the one-ULP change"}
    (run_dir / "run.json").write_text(json.dumps(record))
    console = Console(record=True, width=300)
    render(load_run(run_dir), console)
    text = console.export_text()
    assert text.startswith("INCONCLUSIVE")
    assert "compared records is content-less" in text
    assert "self-check NOT RUN: no recorded tensor could carry the one-ULP change" in text
    assert f"the contents of {len(recs)} records" in text  # under "not observed"


def test_causes_an_experiment_ruled_out_are_shown_below_a_line() -> None:
    from detaudit.cli.render import causes_block
    from detaudit.results import Cause

    causes = [Cause("unseeded-torch-rng", "confirmed", "s", ["e"], "f", basis="experiment"),
              Cause("object-order", "not-needed", "s", ["e"], "f"), Cause("python-hash-seed", "ruled-out", "s", ["e"],
                                                                         "f")]
    block = causes_block(SimpleNamespace(causes=causes))  # type: ignore[arg-type]
    assert block is not None
    console = Console(record=True, width=200)
    console.print(block)
    lines = console.export_text().splitlines()
    assert "confirmed by experiment: unseeded-torch-rng; inferred from the evidence: none; ruled out or not needed: " \
           "object-order, python-hash-seed" in lines[0]
    line = next(i for i, text in enumerate(lines) if "ruled out by their own experiment" in text)
    assert "unseeded-torch-rng" in "".join(lines[:line])
    assert "object-order" in lines[line + 1]
    assert sum("ruled out by their own experiment" in text for text in lines) == 1


def test_a_ruled_out_cause_without_evidence_is_not_labelled_not_ruled_out() -> None:
    """A background candidate (basis no-evidence) that its experiment ruled out: its label must not contradict
    itself ("ruled-out · not ruled out", as a time-driven learning rate showed)."""
    from detaudit.cli.render import causes_block
    from detaudit.results import Cause

    causes = [Cause("python-hash-seed", "ruled-out", "s", ["e"], "f", basis="no-evidence")]
    block = causes_block(SimpleNamespace(causes=causes))  # type: ignore[arg-type]
    assert block is not None
    console = Console(record=True, width=200)
    console.print(block)
    assert "[ruled-out · no evidence] python-hash-seed" in console.export_text()


def test_a_guess_its_experiment_ruled_out_is_one_line_without_its_fix() -> None:
    from detaudit.cli.render import causes_block
    from detaudit.results import Cause

    tested = "--explain: with the string hash seed (PYTHONHASHSEED=0) pinned alone, the repeats still diverge"
    causes = [Cause("python-hash-seed", "ruled-out", "hash order", ["hash probe differs", tested],
                    "iterate sorted(...)", basis="no-evidence")]
    block = causes_block(SimpleNamespace(causes=causes))  # type: ignore[arg-type]
    assert block is not None
    console = Console(record=True, width=300)
    console.print(block)
    lines = [line for line in console.export_text().splitlines() if "python-hash-seed" in line or "fix" in line
             or "probe" in line]
    assert lines[1:] == [f"1. [ruled-out · no evidence] python-hash-seed: hash order — {tested}"]


def test_randomness_that_repeats_is_shown_beside_an_unchanged_verdict(tmp_path: Path) -> None:
    found = RepeatedRandomness("data.py:31", "workers", "data.py:12", ["workers 0 and 1 drew the same 8 values"],
                               "make it in a worker_init_fn")
    report = replace(_finished(tmp_path, ["x\n"] * 3), repeated_randomness=[found])
    text = _text(report)
    assert "Randomness that repeats" in text
    assert "data.py:31: repeats across workers (state from data.py:12)" in text
    assert report.verdict == "deterministic"


def test_where_auto_named_no_op_the_report_says_why_in_one_line(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    report = replace(load_run(write_run(tmp_path / "run", [recs, [*recs[:4], recs[4].but(digest=77), *recs[5:]]])),
                     op_level="no op-level re-run: parameter net.0.weight is the first record to differ")
    assert "no op-level re-run: parameter net.0.weight is the first record to differ" in _rendered(report)


def _with_tokens(tmp_path: Path, at: int, divergences: bool = True) -> Report:
    """A run whose record #4 differs, with a token answer: repeat 1's sequence 0 differs at token 7 (chosen when
    record `at` was next)."""
    recs = training_records(steps=2)
    report = load_run(write_run(tmp_path / "run", [recs, [*recs[:4], recs[4].but(digest=77), *recs[5:]], recs]))
    first = TokenDivergence(sequence=0, position=7, fn="torch.argmax", loc="gen.py:9", reference=0, repeat=1,
                            token=1523, other=88, margin=0.0031, other_margin=0.002, at=at)
    return replace(report, tokens=TokenComparison(repeats=3, distinct=2 if divergences else 1, sequences=2, tokens=10,
                                                  groups=((0, 2), (1,)), divergences=(first,) if divergences else ()))


def test_the_console_leads_with_the_token_answer(tmp_path: Path) -> None:
    lines = _rendered(_with_tokens(tmp_path, at=9)).splitlines()
    assert lines[1] == ("tokens: 2 distinct outputs among 3 repeats; sequence 0 first differs at token 7: 1523 vs 88 "
                        "in repeat 1 (margin 0.0031)")


def test_the_console_ties_a_token_chosen_after_the_first_divergent_record_to_it(tmp_path: Path) -> None:
    lines = _rendered(_with_tokens(tmp_path, at=9)).splitlines()
    assert lines[2].strip() == "token 7 was chosen after record #4 already differed, the first divergence"


def test_the_console_says_when_the_choice_itself_is_the_first_difference(tmp_path: Path) -> None:
    lines = _rendered(_with_tokens(tmp_path, at=4)).splitlines()
    assert lines[2].strip() == ("token 7 differs before any recorded tensor does: the choice itself is the first "
                                "difference")


def test_the_console_counts_one_distinct_output_when_the_tokens_agree(tmp_path: Path) -> None:
    lines = _rendered(_with_tokens(tmp_path, at=9, divergences=False)).splitlines()
    assert lines[1] == "tokens: 1 distinct output among 3 repeats (2 sequence(s) of up to 10 tokens)"
