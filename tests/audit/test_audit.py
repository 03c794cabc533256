"""audit.py without running repeats: the error excerpt, reading run directories and `compare` of recordings."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from synthetic import Rec, training_records, write_run, write_trace

from detaudit.audit.pipeline import compare_recorded, load_run
from detaudit.errors import TraceError
from detaudit.report.model import report_json
from detaudit.results import Tolerance
from detaudit.run.excerpt import error_excerpt


def _frame(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("<I", len(payload)) + payload


def _traceback(user_frames: list[str], library_frames: int, error: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for frame in user_frames:
        lines += [f'  File "{frame}", line 22, in main', "    model(x)"]
    for i in range(library_frames):
        lines += [f'  File "/venv/lib/python3.11/site-packages/torch/nn/m{i}.py", line {i}, in f', "    g()"]
    return "\n".join(["some output", *lines, error])


def test_long_traceback_keeps_user_frames_and_the_error() -> None:
    text = _traceback(["/work/fit_model.py"], 12, "RuntimeError: shapes cannot be multiplied")
    excerpt = error_excerpt(text, lines=15)
    assert 'File "/work/fit_model.py", line 22' in excerpt
    assert excerpt.endswith("RuntimeError: shapes cannot be multiplied")
    assert "m0.py" not in excerpt
    assert "m11.py" in excerpt
    assert "  ..." in excerpt


def test_short_stderr_is_returned_as_is() -> None:
    text = _traceback(["/work/a.py"], 1, "ValueError: bad")
    assert error_excerpt(text, lines=15) == text
    assert error_excerpt("just a line\n", lines=15) == "just a line"


def _listing(run_dir: Path) -> dict[str, float]:
    return {p.name: p.stat().st_mtime for p in run_dir.iterdir()}


def test_reading_a_run_with_a_missing_trace_writes_nothing(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    run_dir = write_run(tmp_path / "run", [recs, None])
    before = _listing(run_dir)
    report = load_run(run_dir)
    assert _listing(run_dir) == before
    assert not (run_dir / "repeat-1.trace").exists()
    assert report.comparison.complete == [True, False]
    assert report.comparison.records == [len(recs), 0]


def test_compare_reads_no_explain_record_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recs = training_records(steps=1)
    other = [recs[0].but(digest=99), *recs[1:]]
    paths = [write_trace(tmp_path / "a.trace", recs, {"exit_code": 0}),
             write_trace(tmp_path / "b.trace", other, {"exit_code": 0})]
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "explain.json").write_text("{not an experiment record")
    monkeypatch.chdir(work)
    report = compare_recorded(paths)
    assert report.verdict == "divergent"
    assert report.experiments == []


def test_compare_is_bitwise_across_recorded_devices_unless_given_a_tolerance(tmp_path: Path) -> None:
    recs = [Rec("a", 1, samples=(1.0, 2.0, 3.0, 4.0))]
    near = [recs[0].but(digest=2, samples=(1.0, 2.0, 3.0, 4.0 + 1e-7))]
    paths = [write_trace(tmp_path / "cpu.trace", recs, {"exit_code": 0}, header={"device_request": "cpu"}),
             write_trace(tmp_path / "gpu.trace", near, {"exit_code": 0}, header={"device_request": "cuda"})]
    bitwise = compare_recorded(paths)
    assert bitwise.verdict == "divergent"
    assert bitwise.bitwise
    assert [r.device for r in bitwise.runs] == ["cpu", "cuda"]  # shown, not used to loosen the comparison
    assert compare_recorded(paths, Tolerance()).verdict == "deterministic"


def test_compare_refuses_a_footer_that_is_not_an_object(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    good = write_trace(tmp_path / "a.trace", recs, {"exit_code": 0})
    for name, footer, needle in (("list", b"[1, 2]", "footer is not a JSON object"),
                                 ("text", b'{"exit_code": "x"}', "field `exit_code` must be an integer")):
        bad = write_trace(tmp_path / f"{name}.trace", recs, None)  # no footer yet: append our own
        bad.write_bytes(bad.read_bytes() + _frame(b"F", footer))
        with pytest.raises(TraceError, match=needle):
            compare_recorded([good, bad])


def test_compare_treats_incomplete_recordings_as_incomplete_not_failed(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    paths = [write_trace(tmp_path / "a.trace", recs, None), write_trace(tmp_path / "b.trace", recs, None)]
    same = compare_recorded(paths)
    # agreement of recordings cut short proves nothing about the rest: inconclusive, never deterministic
    assert same.verdict == "inconclusive"
    assert same.exit_code == 6
    assert [r.exit_code for r in same.runs] == [None, None]
    assert same.comparison.complete == [False, False]
    paths.append(write_trace(tmp_path / "c.trace", recs[:4], None))
    cut = compare_recorded([paths[0], paths[2]])  # an equal prefix, one shorter: compared as far as it goes
    assert cut.verdict == "inconclusive"
    assert cut.first_divergence is None
    assert cut.comparison.records_compared == 4
    assert "incomplete" in cut.inconclusive_reason
    assert report_json(cut)["runs"][1]["exit_code"] is None
    changed = write_trace(tmp_path / "d.trace", [recs[0], recs[1].but(digest=77), *recs[2:4]], None)
    assert compare_recorded([paths[0], changed]).verdict == "divergent"  # a difference inside the prefix counts


def test_stdout_mode_is_honoured_from_the_run_record(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    run_dir = write_run(tmp_path / "run", [recs, recs], stdout=["epoch 1\ntook 1.2s\n", "epoch 1\ntook 1.3s\n"])
    assert load_run(run_dir).verdict == "deterministic"  # masked by default: a timing is not a result
    strict = load_run(run_dir, stdout="strict").first_divergence
    assert strict is not None
    assert strict.stdout is not None
    assert strict.stdout.line == 2
    assert strict.stdout.lines == {0: "took 1.2s", 1: "took 1.3s"}
    assert f"all {len(recs)} recorded tensor records agree" in strict.detail
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, "stdout": "strict"}))
    assert load_run(run_dir).verdict == "divergent"
    assert load_run(run_dir, stdout="ignore").verdict == "deterministic"
    record.pop("stdout", None)  # a run recorded before --stdout existed said only ignore_stdout
    (run_dir / "run.json").write_text(json.dumps({**record, "ignore_stdout": True}))
    assert load_run(run_dir, stdout="strict").verdict == "divergent"
    assert load_run(run_dir).verdict == "deterministic"


def test_compare_honours_the_mode_the_runs_were_recorded_with(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    a = write_run(tmp_path / "a", [recs, recs], stdout=["took 1.2s\n"] * 2)
    b = write_run(tmp_path / "b", [recs, recs], stdout=["took 1.5s\n"] * 2)
    assert compare_recorded([a, b]).verdict == "deterministic"
    assert compare_recorded([a, b], stdout="strict").verdict == "divergent"
    for run in (a, b):
        record = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**record, "stdout": "strict"}))
    found = compare_recorded([a, b])
    assert found.verdict == "divergent"
    assert found.stdout_mode == "strict"


def test_a_repeat_detaudit_could_not_record_is_an_error_not_a_deterministic_verdict(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [[], []])
    write_trace(run / "repeat-1.trace.tmp", [], {"exit_code": 0, "error": None,
                                                 "recording_failed": "instrumenting torch: boom"})
    (run / "repeat-1.trace.tmp").replace(run / "repeat-1.trace")
    with pytest.raises(TraceError, match="could not record this repeat .instrumenting torch: boom"):
        load_run(run)


# -- issue 10: no false verdicts, no shared run directory, safe error paths --------------------------------
def test_a_traceback_followed_by_lines_without_frames_is_excerpted_not_crashed() -> None:
    text = "Traceback (most recent call last):\n" + "\n".join(f"    noise {i}" for i in range(20)) + "\nError: x\n"
    excerpt = error_excerpt(text, lines=15)
    assert excerpt.endswith("Error: x")
    assert len(excerpt.splitlines()) == 15


def _abandoned_run(tmp_path: Path, lengths: list[int], footers: list[bool]) -> Path:
    """Repeats that exited 0 but whose traces lost their end (the writer failed, or was cut off)."""
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs] * len(lengths))
    for i, (n, footer) in enumerate(zip(lengths, footers)):
        path = run_dir / f"repeat-{i}.trace"
        path.unlink()
        write_trace(path, recs[:n], {"exit_code": 0} if footer else None)
    return run_dir


def test_lost_recordings_are_inconclusive_never_deterministic(tmp_path: Path) -> None:
    report = load_run(_abandoned_run(tmp_path, [0, 0, 0], [False, False, False]))  # three empty "agreeing" repeats
    assert report.verdict == "inconclusive"
    assert report.exit_code == 6
    assert "incomplete" in report.inconclusive_reason
    assert report_json(report)["inconclusive"] == report.inconclusive_reason


def test_one_cut_recording_makes_an_agreeing_run_inconclusive(tmp_path: Path) -> None:
    report = load_run(_abandoned_run(tmp_path, [18, 5, 18], [True, False, True]))
    assert report.verdict == "inconclusive"
    assert "repeat(s) 1" in report.inconclusive_reason
    assert report.comparison.records_compared == 5


def test_no_tensor_recorded_is_nothing_to_compare(tmp_path: Path) -> None:
    report = load_run(_abandoned_run(tmp_path, [0, 0], [True, True]))
    assert report.verdict == "inconclusive"
    assert report.inconclusive_reason.startswith("nothing to compare")


def test_a_lost_recording_never_hides_a_divergence_it_holds(tmp_path: Path) -> None:
    run_dir = _abandoned_run(tmp_path, [18, 6], [True, False])
    recs = training_records(steps=2)
    (run_dir / "repeat-1.trace").unlink()
    write_trace(run_dir / "repeat-1.trace", [*recs[:3], recs[3].but(digest=1), *recs[4:6]], None)
    assert load_run(run_dir).verdict == "divergent"


def test_compare_refuses_one_recording_given_twice(tmp_path: Path) -> None:
    """`compare RUN RUN` said DETERMINISTIC: a recording agrees with itself, which proves nothing."""
    import os

    from detaudit.errors import UsageError

    recs = training_records(steps=1)
    run = write_run(tmp_path / "run", [recs, recs])
    trace = run / "repeat-0.trace"
    os.symlink(trace, tmp_path / "link.trace")
    for paths, said in (([run, run], "is given twice"), ([trace, trace], "is given twice"),
                        ([run, trace], "are the same recording"),
                        ([trace, tmp_path / "link.trace"], "are the same recording"),
                        ([run, run / "repeat-1.trace", trace], "are the same recording")):
        with pytest.raises(UsageError, match=said):
            compare_recorded(paths)
    assert compare_recorded([trace, run / "repeat-1.trace"]).verdict == "deterministic"  # two repeats: fine


@pytest.mark.parametrize(("found", "runs"), [(True, [(2, 0)]), (False, [(2, 0), (2, 2)])])
def test_the_op_level_re_run_makes_two_repeats_and_the_rest_only_if_they_hold_no_divergent_op(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: bool, runs: list[tuple[int, int]]) -> None:
    from dataclasses import replace

    from detaudit.audit import pipeline
    from detaudit.audit.pipeline import AuditOptions, Schedule, Target, narrow
    from detaudit.results import RepeatResult

    made: list[tuple[int, int]] = []

    def execute(options: AuditOptions, run_dir: Path, *args: object, first: int = 0, **kwargs: object
                ) -> list[RepeatResult]:
        made.append((options.schedule.repeats, first))
        indices = range(first, first + options.schedule.repeats)
        for i in indices:
            (run_dir / f"ops-{i}.trace").write_bytes(b"")
        return [RepeatResult(i, "cpu", 0, 1.0, False, f"ops-{i}.trace", "", "", "") for i in indices]

    monkeypatch.setattr(pipeline, "execute", execute)
    monkeypatch.setattr(pipeline, "find_op_source", lambda paths, devices: object() if found else None)
    options = AuditOptions(Target(tmp_path / "s.py"), Schedule(repeats=4))
    assert [r.index for r in narrow(options, tmp_path)] == list(range(sum(n for n, _ in runs)))
    assert made == runs
    made.clear()
    narrow(replace(options, schedule=Schedule(repeats=4, jobs=2)), tmp_path)  # -j: all at once
    assert made == [(4, 0)]


@pytest.mark.parametrize(("repeats", "ahead", "found", "runs", "indices"), [
    (3, [2], True, [(1, 0)], [0, 2]),  # one repeat recorded ahead: one fresh re-run makes the pair
    (3, [2], False, [(1, 0), (1, 1)], [0, 1, 2]),  # no divergent op in the pair: the rest as before
    (5, [2, 3, 4], True, [], [2, 3, 4]),  # three recorded ahead: no re-run at all
    (5, [3, 4], False, [(3, 0)], [0, 1, 2, 3, 4]),  # a pair already, no divergent op in it: the other three
])
def test_repeats_that_recorded_ops_ahead_count_among_the_op_level_re_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repeats: int, ahead: list[int], found: bool,
        runs: list[tuple[int, int]], indices: list[int]) -> None:
    from detaudit.audit import pipeline
    from detaudit.audit.pipeline import AuditOptions, Schedule, Target, narrow
    from detaudit.results import RepeatResult

    made: list[tuple[int, int]] = []

    def execute(options: AuditOptions, run_dir: Path, *args: object, first: int = 0, **kwargs: object
                ) -> list[RepeatResult]:
        made.append((options.schedule.repeats, first))
        span = range(first, first + options.schedule.repeats)
        for i in span:
            (run_dir / f"ops-{i}.trace").write_bytes(b"")
        return [RepeatResult(i, "cpu", 0, 1.0, False, f"ops-{i}.trace", "", "", "") for i in span]

    early = [RepeatResult(i, "cpu", 0, 1.0, False, f"ops-{i}.trace", f"repeat-{i}.stdout", "", "") for i in ahead]
    for result in early:
        (tmp_path / result.trace).write_bytes(b"")
    monkeypatch.setattr(pipeline, "execute", execute)
    seen: list[list[str]] = []
    monkeypatch.setattr(pipeline, "find_op_source",
                        lambda paths, devices: seen.append([p.name for p in paths]) or (object() if found else None))
    got = narrow(AuditOptions(Target(tmp_path / "s.py"), Schedule(repeats=repeats)), tmp_path, ahead=early)
    assert [r.index for r in got] == indices
    assert made == runs
    assert seen[0] == sorted({*[f"ops-{i}.trace" for i in ahead], *[f"ops-{i}.trace" for i in range(
        max(0, 2 - len(ahead)))]}, key=lambda n: int(n[4:-6]))  # the pair's traces, by number
    assert {r.index: r.stdout for r in got if r.index in ahead} == {i: f"repeat-{i}.stdout" for i in ahead}


def test_an_op_windowed_repeat_leaves_its_trace_to_the_op_level_re_run_and_a_module_copy_as_its_own(
        tmp_path: Path) -> None:
    from synthetic import Rec, training_records, write_trace

    from detaudit.audit.pipeline import recorded_ahead, split_op_windowed
    from detaudit.results import RepeatResult
    from detaudit.run.launcher import plan_repeats
    from detaudit.trace import Kind, read_trace

    plans = plan_repeats(tmp_path, 4, ["cpu"], stoppable=True)
    module = training_records(steps=4)
    def ops_before(r: Rec) -> list[Rec]:
        return [Rec("aten.mm", digest=r.digest + 1, step=r.step, kind=Kind.OP)] if r.step in (1, 2) else []

    mixed = [x for r in module for x in [*ops_before(r), r]]
    write_trace(plans[2].trace, mixed, {"exit_code": 0}, header={"repeat": 2, "granularity": "op", "op_window": [1, 2]})
    write_trace(plans[3].trace, mixed, {"exit_code": 0}, header={"repeat": 3, "granularity": "op", "op_window": [0, 1]})
    plans[0].trace.write_bytes(b"not a trace")
    split_op_windowed(tmp_path, [plans[2], plans[3], plans[1], plans[0]])  # repeat 1 left no trace: left so
    assert plans[0].trace.read_bytes() == b"not a trace"
    assert not (tmp_path / "ops-0.trace").exists()
    own = read_trace(plans[2].trace)
    assert own.header["granularity"] == "module"
    assert own.header["op_window"] is None
    assert len(own.records) == len(module)
    assert Kind.OP not in set(own.records["kind"].tolist())
    assert len(read_trace(tmp_path / "ops-2.trace").records) == len(mixed)
    results = [RepeatResult(i, "cpu", 0, 1.0, False, f"repeat-{i}.trace", f"repeat-{i}.stdout", "", "")
               for i in range(4)]
    # repeat 3 recorded another window than the report's: not counted, and its ops trace is gone, so that the
    # op-level re-run can write ops-3.trace (it collided once: a later repeat diverged earlier than repeat 2)
    assert [(r.index, r.trace, r.stdout) for r in recorded_ahead(tmp_path, results, [1, 2])] == \
        [(2, "ops-2.trace", "repeat-2.stdout")]
    assert not (tmp_path / "ops-3.trace").exists()
    assert read_trace(plans[3].trace).header["op_window"] is None


def test_report_of_a_run_made_with_fail_on_repeated_randomness_keeps_its_gate(tmp_path: Path) -> None:
    """`detaudit report RUN_DIR` renders the verdict the run's own outputs named: the gate lives in run.json."""
    run_dir = write_run(tmp_path / "run", [training_records(steps=1)] * 2)
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, "fail_on_repeated_randomness": True}))
    assert load_run(run_dir).fail_on_repeats
