"""Gold files for the JSON report and the JUnit XML (tests/gold/): a change to either rendering shows
up as a diff of a checked-in file, and the files carry the literal schema name and version.

Each case is a small Report read from a synthetic run directory (tests/synthetic.py: no
interpreter), rendered with report.write_json and junit.to_junit. Only what is volatile is
normalised: the run directory's temporary path, written as `<run_dir>`; everything else (repeat
durations and the environment included) is fixed by the synthetic run.

An intended change: regenerate with `DETAUDIT_REGEN_GOLD=1 python -m pytest tests/report/test_gold.py`
(the cases then skip, saying which files they wrote), review `git diff tests/gold/`, and bump
report.SCHEMA_VERSION (docs/report-schema.md) if a reader of the old JSON would break.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from synthetic import Rec, training_records, write_run

from detaudit.audit.pipeline import load_run
from detaudit.report.junit import to_junit
from detaudit.report.model import Report, write_json

GOLD = Path(__file__).parents[1] / "gold"
REGENERATE = os.environ.get("DETAUDIT_REGEN_GOLD") == "1"


def divergent(run_dir: Path) -> Report:
    """Three repeats; the third differs at one layer's output in step 1 and prints another loss."""
    recs = training_records(steps=3)
    other = list(recs)
    k = next(i for i, r in enumerate(recs) if r.name == "net.1" and r.step == 1)
    other[k] = other[k].but(digest=1, samples=(other[k].samples[0] + 0.5, *other[k].samples[1:]))
    return load_run(write_run(run_dir, [recs, recs, other], stdout=["loss 0.25\n", "loss 0.25\n", "loss 0.26\n"]))


def failed_and_timed_out(run_dir: Path) -> Report:
    """Three repeats that agree as far as they got: one failed after its records, one timed out."""
    recs: list[Rec] = training_records(steps=2)
    return load_run(write_run(run_dir, [recs, recs, recs[:4]], exit_codes=[0, 1, 0], timed_out=[False, False, True]))


def stdout_differs(run_dir: Path) -> Report:
    """Identical records; the repeats print another result (a timing beside it is masked)."""
    recs = training_records(steps=1)
    printed = ["epoch 1 took 1.2s loss 0.25\n", "epoch 1 took 3.4s loss 0.25\n", "epoch 1 took 1.0s loss 0.31\n"]
    return load_run(write_run(run_dir, [recs, recs, recs], stdout=printed))


CASES: dict[str, Callable[[Path], Report]] = {"divergent": divergent, "failed-and-timed-out": failed_and_timed_out,
                                              "stdout-differs": stdout_differs}


def normalised(text: str, run_dir: Path) -> str:
    return text.replace(str(run_dir), "<run_dir>")


def check_gold(name: str, text: str) -> None:
    path = GOLD / name
    if REGENERATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.skip(f"DETAUDIT_REGEN_GOLD=1: wrote {path}")
    assert path.is_file(), f"no gold file {path}: run with DETAUDIT_REGEN_GOLD=1 to write it"
    gold = path.read_text(encoding="utf-8")
    if text != gold:
        diff = difflib.unified_diff(gold.splitlines(), text.splitlines(), f"gold/{name}", "now", lineterm="")
        pytest.fail(f"{name} differs from its gold file (to accept: see the module docstring)\n" + "\n".join(diff))


@pytest.mark.parametrize("case", CASES)
def test_json_report_matches_its_gold_file(tmp_path: Path, case: str) -> None:
    run_dir = tmp_path / "run"
    out = tmp_path / "report.json"
    write_json(CASES[case](run_dir), out)
    check_gold(f"{case}.json", normalised(out.read_text(encoding="utf-8"), run_dir))


@pytest.mark.parametrize("case", CASES)
def test_junit_matches_its_gold_file(tmp_path: Path, case: str) -> None:
    run_dir = tmp_path / "run"
    check_gold(f"{case}.junit.xml", normalised(to_junit(CASES[case](run_dir)), run_dir))


def test_gold_files_name_the_schema_literally() -> None:
    """The version is written out in the gold file, not read from the code: bumping SCHEMA_VERSION
    without regenerating (and so without looking at the diff) fails here and above."""
    for case in CASES:
        data = json.loads((GOLD / f"{case}.json").read_text(encoding="utf-8"))
        assert (data["schema"], data["schema_version"]) == ("detaudit-report", 2)


@pytest.mark.parametrize("case", CASES)
def test_a_real_report_reads_back_what_it_writes(tmp_path: Path, case: str) -> None:
    """Beside the drawn values of test_roundtrip.py: reports as the pipeline builds them."""
    report = CASES[case](tmp_path / "run")
    assert Report.from_dict(json.loads(json.dumps(report.to_dict()))) == report
