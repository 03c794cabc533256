"""The run directory: claiming it, and reading its versioned records back strictly."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from synthetic import training_records, write_run

from detaudit.errors import TraceError, UsageError
from detaudit.records import RUN, RunRecord, StoredExperiment
from detaudit.results import Experiment, Tolerance
from detaudit.run.rundir import (
    REDACTED,
    claim_run,
    free_prefix,
    new_run_dir,
    read_experiments,
    read_run,
    stored_args,
    write_experiments,
    write_record,
)


def test_out_naming_a_file_is_a_usage_error(tmp_path: Path) -> None:
    taken = tmp_path / "afile"
    taken.write_text("precious")
    with pytest.raises(UsageError, match="is a file"):
        new_run_dir(tmp_path / "x.py", taken)
    assert taken.read_text() == "precious"


def test_an_existing_empty_out_dir_is_claimed_by_one_run_only(tmp_path: Path) -> None:
    """Two runs that both found `--out` empty: creating run.json exclusively decides, whatever the timing."""
    out = tmp_path / "shared"
    out.mkdir()
    first, second = new_run_dir(Path("t.py"), out), new_run_dir(Path("t.py"), out)
    assert first == second == out
    claim_run(first, RunRecord("first.py"))
    with pytest.raises(UsageError, match="taken by another detaudit run"):
        claim_run(second, RunRecord("second.py"))
    assert json.loads((out / "run.json").read_text())["script"] == "first.py"
    with pytest.raises(UsageError, match="not empty"):
        new_run_dir(Path("t.py"), out)


def test_default_run_dirs_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    made = {new_run_dir(Path("train.py"), None) for _ in range(3)}
    assert len(made) == 3
    assert all(d.stat().st_mode & 0o777 == 0o700 for d in made)


def _edited(run_dir: Path, **fields: object) -> Path:
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, **fields}))
    return run_dir


def test_a_record_written_is_read_back_whole(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", [training_records(steps=1)] * 2)
    record, _ = read_run(run_dir)
    write_record(run_dir, replace(record, granularity="step"))
    again, results = read_run(run_dir)
    assert again == replace(record, granularity="step")
    assert [r.trace for r in results] == ["repeat-0.trace", "repeat-1.trace"]
    assert (run_dir / "run.json").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("fields, message", [
    ({"version": RUN.version + 1}, "version 2 is not supported"),
    ({"format": "something-else"}, "not a detaudit run record"),
    ({"results": None}, "did not finish"),
    ({"repeats": "three"}, "repeats"),
])
def test_a_run_record_this_release_cannot_trust_is_refused(tmp_path: Path, fields: dict[str, object],
                                                           message: str) -> None:
    run_dir = write_run(tmp_path / "run", [training_records(steps=1)] * 2)
    with pytest.raises(TraceError, match=message):
        read_run(_edited(run_dir, **fields))


def _results_kept(run_dir: Path, keep: list[int], **fields: object) -> Path:
    record = json.loads((run_dir / "run.json").read_text())
    return _edited(run_dir, results=[record["results"][i] for i in keep], **fields)


@pytest.mark.parametrize("keep, fields, message", [
    ([0], {}, r"lists 1 result\(s\) for the 2 repeat\(s\) it declares"),
    ([0], {"repeats": 1}, r"holds the files of repeat\(s\) 1, which it does not list"),
    ([1, 1], {}, r"its results are repeats 1, 1, not 0 to 1"),
])
def test_a_record_that_lists_fewer_repeats_than_it_ran_is_corrupt(tmp_path: Path, keep: list[int],
                                                                  fields: dict[str, object], message: str) -> None:
    """Issue 43: run.json cut down to results[0] of a divergent run was reported DETERMINISTIC (1 repeat)."""
    run_dir = write_run(tmp_path / "run", [training_records(steps=1), training_records(steps=1, seed=1)])
    with pytest.raises(TraceError, match=message):
        read_run(_results_kept(run_dir, keep, **fields))


def test_results_on_several_devices_count_per_device(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", [training_records(steps=1)] * 4, devices=["cpu", "cpu", "cuda", "cuda"])
    assert len(read_run(run_dir)[1]) == 4


@pytest.mark.parametrize("name", ["../elsewhere.trace", "/etc/passwd", "sub/repeat-0.trace", "..", ""])
def test_files_a_record_names_must_be_plain_names_inside_the_directory(tmp_path: Path, name: str) -> None:
    run_dir = write_run(tmp_path / "run", [training_records(steps=1)] * 2)
    record = json.loads((run_dir / "run.json").read_text())
    record["results"][1]["trace"] = name
    with pytest.raises(TraceError, match=r"results\[1\]\.trace` must name a file inside the run directory"):
        read_run(_edited(run_dir, results=record["results"]))


def test_no_run_directory_is_a_usage_error_and_no_run_json_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such run directory"):
        read_run(tmp_path / "missing")
    with pytest.raises(TraceError, match="no run.json"):
        read_run(tmp_path)


def test_experiments_round_trip_and_a_foreign_version_is_refused(tmp_path: Path) -> None:
    assert read_experiments(tmp_path) == []
    entries = [StoredExperiment(Experiment("hash-seed", "d", "divergent", 3), "explain-hash-seed", ()),
               StoredExperiment(Experiment("cudnn", "c", "skipped", None, "over the budget"))]
    write_experiments(tmp_path, entries)
    assert read_experiments(tmp_path) == entries
    data = json.loads((tmp_path / "explain.json").read_text())
    assert data["experiments"][1] == {"pin": "cudnn", "description": "c", "verdict": "skipped",
                                      "first_divergence_index": None, "note": "over the budget"}
    (tmp_path / "explain.json").write_text(json.dumps({**data, "version": 2}))
    with pytest.raises(TraceError, match="experiment record version 2 is not supported"):
        read_experiments(tmp_path)


def test_a_later_experiment_with_the_same_pin_gets_its_own_prefix(tmp_path: Path) -> None:
    assert free_prefix(tmp_path, "explain-hash-seed") == "explain-hash-seed"
    (tmp_path / "explain-hash-seed-0.trace").write_bytes(b"")
    assert free_prefix(tmp_path, "explain-hash-seed") == "explain-hash-seed.2"
    (tmp_path / "explain-hash-seed.2-0.trace").write_bytes(b"")
    assert free_prefix(tmp_path, "explain-hash-seed") == "explain-hash-seed.3"


def test_redacted_arguments_keep_their_count_only() -> None:
    assert stored_args(["--token", "s3cret"], redact=True) == [REDACTED, REDACTED]
    assert stored_args(["--epochs", "1"], redact=False) == ["--epochs", "1"]


def test_tolerance_ignores_keys_it_does_not_know(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", [training_records(steps=1)] * 2)
    record, _ = read_run(_edited(run_dir, tolerance={"atol": 0.5, "rtol": 0, "future": 1}))
    assert record.tolerance == Tolerance(0.5, 0.0)
    record, _ = read_run(_edited(run_dir, tolerance={"atol": 0.5}))
    assert record.tolerance == Tolerance(0.5, Tolerance().rtol)
