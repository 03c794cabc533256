"""The command line as a user meets it: exit codes, one-line errors without tracebacks, option
placement, `--` pass-through, report files, `report RUN_DIR` and `show TRACE`."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from conftest import CliResult, run_cli, run_in_process
from synthetic import Rec, training_records, write_run, write_trace

from detaudit.trace import MAGIC

ARGV_SCRIPT = """
    import json, sys
    print(json.dumps(sys.argv[1:]))
"""


def assert_clean_error(result: CliResult, code: int, *needles: str) -> None:
    """Exit `code`, a short error naming the problem, and never a traceback."""
    assert result.returncode == code, result.output
    assert "Traceback" not in result.output
    err_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert 1 <= len(err_lines) <= 3, result.stderr
    for needle in needles:
        assert needle in result.stderr.replace("\n", " "), result.stderr


@pytest.fixture
def argv_script(tmp_path: Path) -> Path:
    path = tmp_path / "echo_args.py"
    path.write_text(textwrap.dedent(ARGV_SCRIPT))
    return path


@pytest.mark.process
def test_missing_script_is_usage_error(tmp_path: Path) -> None:
    result = run_cli(["run", "no_such_script.py", "--repeats", "2"], cwd=tmp_path)
    assert_clean_error(result, 2, "no_such_script.py")
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
    assert not (tmp_path / ".detaudit").exists()  # nothing was created for a run that never started


@pytest.mark.process
@pytest.mark.parametrize("args", [["run", "x.py", "--repeats", "1"], ["run", "--bogus", "x.py"], ["run"],
                                  ["nonsense-command"], ["run", "x.py", "--device", "tpu"]])
def test_bad_usage_exits_2(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "x.py").write_text("print(1)\n")
    result = run_cli(args, cwd=tmp_path)
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output


@pytest.mark.process
def test_help_documents_exit_codes(tmp_path: Path) -> None:
    result = run_cli(["run", "--help"], cwd=tmp_path)
    assert result.returncode == 0
    for code in ("0", "1", "2", "3", "4", "5"):
        assert f"  {code}  " in result.stdout


def test_out_dir_that_is_not_empty_is_refused(tmp_path: Path, argv_script: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    result = run_in_process(["run", str(argv_script), "--repeats", "2", "--out", str(out)], capsys)
    assert_clean_error(result, 2, "taken")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


@pytest.mark.process
@pytest.mark.parametrize("placement", ["before", "after", "mixed"])
def test_options_before_or_after_script_and_args_after_double_dash(
        tmp_path: Path, argv_script: Path, placement: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    script_args = ["--repeats", "7", "--json", "not-ours.json", "-n", "9", "--", "plain", "--quiet"]
    opts = ["--repeats", "2", "--json", "report.json", "--out", "run"]
    if placement == "before":
        args = ["run", *opts, argv_script.name, "--", *script_args]
    elif placement == "after":
        args = ["run", argv_script.name, *opts, "--", *script_args]
    else:
        args = ["run", "-n", "2", argv_script.name, "--json", "report.json", "--out", "run", "--", *script_args]
    result = run_in_process(args, capsys)
    assert result.returncode == 6, result.output  # a torch-free script: nothing to compare, never "deterministic"
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["runs"]) == 2
    assert report["script_args"] == script_args
    for run in report["runs"]:
        assert json.loads((tmp_path / "run" / run["stdout"]).read_text()) == script_args
    assert not (tmp_path / "not-ours.json").exists()


@pytest.mark.process
def test_json_and_junit_written_and_report_rerenders_the_same_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "coin.py"  # differs between repeats without any torch
    script.write_text("import os\nprint(os.urandom(4).hex())\n")
    result = run_cli(["run", script.name, "--repeats", "2", "--jobs", "2", "--out", "run",
                      "--json", "out/r.json", "--junit", "out/r.xml"], cwd=tmp_path)
    assert result.returncode == 1, result.output
    assert result.report is not None
    assert result.report["verdict"] == "divergent"
    assert result.report["first_divergence"]["kind"] == "stdout"
    assert ET.parse(tmp_path / "out" / "r.xml").getroot().get("failures") == "1"
    assert "DIVERGENT" in result.stdout

    again = run_in_process(["report", str(tmp_path / "run"), "--json", str(tmp_path / "again.json")], capsys)
    assert again.returncode == 1
    assert "DIVERGENT" in again.stdout
    again_report = json.loads((tmp_path / "again.json").read_text())
    for key in ("verdict", "exit_code", "first_divergence", "runs", "spread"):
        assert again_report[key] == result.report[key], key
    quiet = run_in_process(["report", str(tmp_path / "run"), "--quiet"], capsys)
    assert quiet.returncode == 1
    assert len(quiet.stdout.strip().splitlines()) == 1


def test_report_of_synthetic_runs_exits_with_the_verdict(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    recs = training_records()
    other = list(recs)
    other[5] = other[5].but(digest=123)
    assert run_in_process(["report", str(write_run(tmp_path / "same", [recs, recs]))], capsys).returncode == 0
    diverged = run_in_process(["report", str(write_run(tmp_path / "diff", [recs, other])),
                               "--json", str(tmp_path / "d.json")], capsys)
    assert diverged.returncode == 1
    assert json.loads((tmp_path / "d.json").read_text())["first_divergence"]["index"] == 5
    failed = run_in_process(["report", str(write_run(tmp_path / "fail", [recs, recs], exit_codes=[1, 1]))],
                            capsys)
    assert failed.returncode == 3
    assert "boom" in failed.stdout


def _corrupt(path: Path) -> None:
    """Garbage where the frame after the header should start."""
    data = bytearray(path.read_bytes())
    header_len = struct.unpack_from("<I", data, len(MAGIC) + 1)[0]
    data[len(MAGIC) + 5 + header_len] = ord("Z")
    path.write_bytes(bytes(data))


@pytest.mark.process
def test_corrupt_foreign_or_unknown_version_run_dirs_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = training_records()
    corrupt = write_run(tmp_path / "corrupt", [recs, recs])
    _corrupt(corrupt / "repeat-1.trace")
    foreign_file = tmp_path / "notes.txt"
    foreign_file.write_text("hello")
    no_record = tmp_path / "empty_dir"
    no_record.mkdir()
    future = write_run(tmp_path / "future", [recs, recs])
    record = json.loads((future / "run.json").read_text())
    (future / "run.json").write_text(json.dumps({**record, "version": 99}))
    garbled = write_run(tmp_path / "garbled", [recs, recs])
    (garbled / "run.json").write_text("{not json")
    foreign_trace = write_run(tmp_path / "foreign", [recs, recs])
    (foreign_trace / "repeat-0.trace").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    for run_dir, needle in ((corrupt, "corrupt"), (foreign_file, "notes.txt"), (no_record, "empty_dir"),
                            (future, "99"), (garbled, "run.json"), (foreign_trace, "not a detaudit trace")):
        assert_clean_error(run_in_process(["report", str(run_dir)], capsys), 4, needle)
    assert_clean_error(run_in_process(["report", str(tmp_path / "missing")], capsys), 2, "missing")  # a typo
    assert_clean_error(run_cli(["report", str(corrupt)], cwd=tmp_path), 4, "corrupt")  # as a user runs it


def test_show_prints_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    recs = training_records(steps=2)
    path = write_trace(tmp_path / "t.trace", recs, {"exit_code": 0}, events=[(2, {"type": "rng"})],
                       header={"repeat": 1, "script": "train.py"})
    result = run_in_process(["show", str(path), "--limit", "0"], capsys)
    assert result.returncode == 0, result.output
    out = result.stdout
    assert "train.py" in out
    assert "net.0.weight" in out
    assert f"{recs[3].digest:016x}" in out
    assert "rng" in out
    assert "exit_code" in out
    assert "incomplete" not in out
    limited = run_in_process(["show", str(path), "--limit", "3"], capsys)
    assert f"{len(recs) - 3} more records" in limited.stdout


def test_show_marks_incomplete_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_trace(tmp_path / "t.trace", training_records(), footer=None)
    result = run_in_process(["show", str(path)], capsys)
    assert result.returncode == 0
    assert "incomplete" in result.stdout


def test_show_tells_a_trace_still_being_written_from_one_whose_repeat_died(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`show` on a running repeat's trace said it was "killed or crashed hard"."""
    import detaudit.run.distributed

    path = write_trace(tmp_path / "repeat-0.trace", training_records(), footer=None, header={"repeat": 0, "pid": 4242})
    asked: list[tuple[int, Path]] = []

    def running(pid: int, run_dir: Path) -> bool:
        asked.append((pid, run_dir))
        return True

    monkeypatch.setattr(detaudit.run.distributed, "runs_our_child", running)
    live = run_in_process(["show", str(path)], capsys)
    text = " ".join(live.stdout.split())  # wrapped to the terminal: where depends on the length of tmp_path
    assert live.returncode == 0
    assert "still running and writing this trace" in text
    assert "killed" not in text
    assert asked == [(4242, tmp_path.resolve())]
    monkeypatch.setattr(detaudit.run.distributed, "runs_our_child", lambda pid, run_dir: False)
    dead = " ".join(run_in_process(["show", str(path)], capsys).stdout.split())
    assert "killed or crashed hard" in dead
    assert "still running" not in dead


def test_a_live_pid_that_runs_no_repeat_of_this_run_is_not_taken_for_one(tmp_path: Path) -> None:
    from detaudit.run.distributed import runs_our_child

    assert not runs_our_child(os.getpid(), tmp_path)  # alive, but pytest, not a repeat writing into tmp_path


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("extra", [[], ["--json", "-"], ["--quiet"]])
def test_a_full_disk_behind_stdout_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, extra: list[str]) -> None:
    """Output to a full disk said "cannot write None"."""
    run = write_run(tmp_path / "run", [training_records()] * 2)
    trace = write_trace(tmp_path / "t.trace", training_records(), {"exit_code": 0})
    full = open("/dev/full", "w")  # noqa: SIM115 (closed below: its buffered bytes can never be flushed)
    monkeypatch.setattr(sys, "stdout", full)
    for args in (["report", str(run), *extra], ["show", str(trace)]):
        result = run_in_process(args, capsys)
        assert_clean_error(result, 7, "cannot write standard output: No space left on device (ENOSPC)")
    monkeypatch.undo()
    with contextlib.suppress(OSError):
        full.close()


def test_show_of_a_run_directory_is_a_usage_error_naming_its_traces(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", [training_records()] * 2)
    assert_clean_error(run_in_process(["show", str(run)], capsys), 2, "repeat-0.trace, repeat-1.trace")


@pytest.mark.process
def test_show_refuses_bad_traces_with_exit_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = write_trace(tmp_path / "c.trace", training_records(), {"exit_code": 0})
    _corrupt(corrupt)
    foreign = tmp_path / "f.trace"
    foreign.write_text("just text")
    future = tmp_path / "v.trace"
    payload = json.dumps({"format": "detaudit-trace", "version": 7}).encode()
    future.write_bytes(MAGIC + b"H" + struct.pack("<I", len(payload)) + payload)
    for path, needle in ((corrupt, "corrupt"), (foreign, "not a detaudit trace"), (future, "version 7")):
        assert_clean_error(run_in_process(["show", str(path)], capsys), 4, needle)
    # a path that does not exist is a usage error, as in `compare` and `report`
    assert_clean_error(run_in_process(["show", str(tmp_path / "absent.trace")], capsys), 2, "absent.trace")
    assert_clean_error(run_cli(["show", str(corrupt)], cwd=tmp_path), 4, "corrupt")


def test_out_naming_a_file_exits_2(tmp_path: Path, argv_script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "afile"
    taken.write_text("precious")
    result = run_in_process(["run", str(argv_script), "--repeats", "2", "--out", str(taken)], capsys)
    assert_clean_error(result, 2, "afile", "is a file")
    assert taken.read_text() == "precious"


@pytest.mark.process
def test_help_names_every_usage_error(tmp_path: Path) -> None:
    assert "usage error (bad option, missing script, --out not empty)" in run_cli(["--help"], cwd=tmp_path).stdout


def test_a_timeout_is_rendered_as_a_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = training_records()
    run_dir = write_run(tmp_path / "run", [recs, recs[:4]], exit_codes=[0, -15], timed_out=[False, True])
    result = run_in_process(["report", str(run_dir)], capsys)
    assert result.returncode == 5, result.output
    assert "TIMEOUT" in result.stdout
    assert "timed out" in result.stdout
    for wrong in ("DIVERGENT", "ended differently", "every repeat", "First divergence", "Likely causes"):
        assert wrong not in result.stdout, wrong


COIN = "import os\nprint(os.urandom(4).hex())\n"  # differs between repeats on stdout only, without torch


@pytest.mark.process
def test_ignore_stdout_is_kept_for_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "coin.py").write_text(COIN)
    made = run_cli(["run", "coin.py", "-n", "2", "-j", "2", "--ignore-stdout", "--out", "run"], cwd=tmp_path)
    assert made.returncode == 6, made.output  # stdout ignored, no tensor: nothing left to compare
    assert json.loads((tmp_path / "run" / "run.json").read_text())["stdout"] == "ignore"
    assert run_in_process(["report", str(tmp_path / "run")], capsys).returncode == 6  # not 1: stdout still ignored
    strict = run_in_process(["report", str(tmp_path / "run"), "--stdout", "strict"], capsys)
    assert strict.returncode == 1
    assert "stdout line 1" in strict.stdout
    both = run_in_process(["report", str(tmp_path / "run"), "--stdout", "strict", "--ignore-stdout"], capsys)
    assert_clean_error(both, 2, "--ignore-stdout")


def test_compare_takes_the_stdout_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recs = training_records(steps=1)
    a = write_run(tmp_path / "a", [recs, recs], stdout=["seed 1\n"] * 2)
    b = write_run(tmp_path / "b", [recs, recs], stdout=["seed 2\n"] * 2)
    assert run_in_process(["compare", str(a), str(b)], capsys).returncode == 1
    assert run_in_process(["compare", str(a), str(b), "--ignore-stdout"], capsys).returncode == 0
    assert run_in_process(["compare", str(a), str(b), "--stdout", "ignore", "-q"], capsys).returncode == 0


@pytest.mark.process
def test_jobs_that_oversubscribe_the_cores_warn(tmp_path: Path) -> None:
    (tmp_path / "coin.py").write_text("print('heads')\n")
    busy = run_cli(["run", "coin.py", "-n", "2", "-j", "2"], cwd=tmp_path, env={"OMP_NUM_THREADS": "4096"})
    assert busy.returncode == 6
    assert "warning: --jobs 2 runs 2 repeats at once" in " ".join(busy.stderr.split())
    assert (tmp_path / ".detaudit" / ".gitignore").read_text().strip().endswith("*")
    alone = run_cli(["run", "coin.py", "-n", "2", "-j", "1"], cwd=tmp_path, env={"OMP_NUM_THREADS": "4096"})
    assert alone.returncode == 6
    assert "warning" not in alone.stderr


@pytest.mark.process
def test_explain_a_run_from_another_directory(tmp_path: Path) -> None:
    (tmp_path / "coin.py").write_text(COIN)
    made = run_cli(["run", "coin.py", "-n", "2", "-j", "2", "--out", "run"], cwd=tmp_path)
    assert made.returncode == 1, made.output
    assert "--stdout ignore" in made.stdout, made.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_cli(["explain", "../run", "-j", "2", "--json", "e.json"], cwd=elsewhere)
    assert result.returncode == 1, result.output
    assert "Traceback" not in result.output
    experiments = result.report["experiments"] if result.report is not None else []
    assert experiments
    assert all(e["verdict"] == "divergent" for e in experiments)
    assert len(list((tmp_path / "run").glob("explain-*.trace"))) == 2 * len(experiments)
    progress = [line for line in result.stderr.splitlines() if line.startswith("explain-")]
    assert len(progress) == 2 * len(experiments)
    assert all("exit 0 in" in line for line in progress)


# -- outputs that cannot be written, concurrent runs, hostile inputs (issue 10) ----------------------------
def leftovers(*dirs: Path) -> list[Path]:
    return [p for d in dirs if d.is_dir() for p in d.rglob("*.tmp")]


def test_unwritable_report_files_fail_before_any_repeat_runs(tmp_path: Path, argv_script: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "adir").mkdir()
    for option in ("--json", "--junit"):
        result = run_in_process(["run", str(argv_script), option, str(tmp_path / "adir")], capsys)
        assert_clean_error(result, 7, "adir", "directory")
    assert not (tmp_path / "adir").joinpath("run.json").exists()
    run_dir = write_run(tmp_path / "run", [training_records(), training_records()])
    full = run_in_process(["report", str(run_dir), "--json", "/dev/full"], capsys)  # a real ENOSPC
    assert_clean_error(full, 7, "/dev/full", "No space left on device", "ENOSPC")
    assert not leftovers(tmp_path, run_dir)


def test_out_under_a_file_is_an_output_error(tmp_path: Path, argv_script: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    result = run_in_process(["run", str(argv_script), "--out", str(tmp_path / "afile" / "run")], capsys)
    assert_clean_error(result, 7, "afile", "not a directory")


@pytest.mark.process
@pytest.mark.slow
def test_two_runs_with_one_out_never_share_it(tmp_path: Path, argv_script: Path) -> None:
    """Started together: one run owns the directory, the other is refused, whichever wins the race."""
    cmd = [sys.executable, "-m", "detaudit", "run", str(argv_script), "-n", "2", "--out", "shared", "-q"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outcomes = sorted((p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs)
    assert [code for code, _ in outcomes] == [2, 6], outcomes  # 6: a torch-free script has nothing to compare
    assert "shared" in outcomes[0][1]
    assert "Traceback" not in outcomes[0][1]
    run_dir = tmp_path / "shared"
    assert sorted(p.name for p in run_dir.iterdir() if p.suffix == ".trace") == ["repeat-0.trace", "repeat-1.trace"]
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in run_dir.iterdir())
    assert not leftovers(run_dir)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0"])
def test_timeout_must_be_a_finite_positive_number(tmp_path: Path, argv_script: Path, value: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    result = run_in_process(["run", str(argv_script), "--timeout", value], capsys)
    assert result.returncode == 2
    assert "--timeout" in result.stderr


def test_json_to_stdout_leaves_only_the_document_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run", [training_records(), training_records()])
    for extra in ([], ["-q"]):
        result = run_in_process(["report", str(run_dir), "--json", "-", *extra], capsys)
        assert result.returncode == 0
        assert json.loads(result.stdout)["verdict"] == "deterministic"  # nothing else on stdout
        assert "DETERMINISTIC" in result.stderr
    junit = run_in_process(["report", str(run_dir), "--junit", "-"], capsys)
    assert ET.fromstring(junit.stdout).tag == "testsuite"


def test_show_never_passes_terminal_control_sequences_through(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    osc = "\x1b]0;owned\x07\x1b]52;c;Y3VybCBldmlsfHNo\x07\x9b2J"
    path = write_trace(tmp_path / "foreign.trace", [Rec(osc, 1, module=osc, loc=osc + ":1")],
                       {"exit_code": 0, "error": osc}, events=[(0, {"type": "draw", "loc": osc})],
                       header={"repeat": 0, "script": osc})
    result = run_in_process(["show", str(path)], capsys)
    assert result.returncode == 0
    assert "\x1b" not in result.output
    assert "\x07" not in result.output
    assert "\x9b" not in result.output
    assert "\\x1b]52" in result.output  # shown, escaped


def test_missing_paths_are_usage_errors_in_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "a.trace", training_records(), {"exit_code": 0})
    for args in (["show", "nope.trace"], ["compare", str(trace), "nope.trace"], ["report", "no_run_dir"]):
        assert_clean_error(run_in_process(args, capsys), 2, "no")
    (tmp_path / "pkg").mkdir()
    assert_clean_error(run_in_process(["run", str(tmp_path / "pkg")], capsys), 2, "is a directory")


def test_run_record_paths_stay_inside_the_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = hunter2\n")
    run_dir = write_run(tmp_path / "run", [training_records(), training_records()], exit_codes=[0, 1])
    record = json.loads((run_dir / "run.json").read_text())
    for escape_to in (str(secret), "../credentials"):
        record["results"][1]["stderr"] = escape_to
        (run_dir / "run.json").write_text(json.dumps(record))
        result = run_in_process(["report", str(run_dir), "--json", str(tmp_path / "r.json")], capsys)
        assert_clean_error(result, 4, "results[1].stderr", "inside the run directory")
        assert "hunter2" not in result.output
    record["results"][1]["stderr"] = "repeat-1.stderr"  # a plain name again, but planted as a symlink
    (run_dir / "run.json").write_text(json.dumps(record))
    (run_dir / "repeat-1.stderr").unlink()
    (run_dir / "repeat-1.stderr").symlink_to(secret)
    other = write_run(tmp_path / "other", [training_records(), training_records()])  # compare refuses RUN RUN
    for args in (["report", str(run_dir), "--json", "-"], ["compare", str(run_dir), str(other), "--json", "-"]):
        result = run_in_process(args, capsys)
        assert result.returncode in (0, 1)
        assert "hunter2" not in result.output


def test_a_fifo_where_stderr_belongs_never_hangs_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = write_run(tmp_path / "run", [training_records(), training_records()], exit_codes=[0, 1])
    (run_dir / "repeat-1.stderr").unlink()
    os.mkfifo(run_dir / "repeat-1.stderr")
    result = run_in_process(["report", str(run_dir)], capsys)
    assert result.returncode == 1  # exit statuses differ; the FIFO is skipped, not read


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, '{"format": "detaudit-run", "version": 1, '
                                     '"script": "t.py", "results": [{"index": "zero"}]}', '{"format": []}'])
def test_malformed_run_records_exit_4_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      content: str) -> None:
    run_dir = write_run(tmp_path / "run", [training_records(), training_records()])
    (run_dir / "run.json").write_text(content)
    assert_clean_error(run_in_process(["report", str(run_dir)], capsys), 4, "run.json")


@pytest.mark.process
@pytest.mark.slow
def test_redact_args_stores_the_scripts_arguments_nowhere(tmp_path: Path) -> None:
    script = tmp_path / "uses_token.py"
    script.write_text("import sys\nprint(len(sys.argv[2]))\n")  # receives the real argument, never prints it
    result = run_cli(["run", str(script), "-n", "2", "--out", "run", "--json", "r.json", "--junit", "r.xml",
                      "--redact-args", "--", "--token", "s3cr3t-value"], cwd=tmp_path)
    assert result.returncode == 6, result.output
    assert result.report is not None
    assert result.report["script_args"] == ["<redacted>", "<redacted>"]
    assert (tmp_path / "run" / "repeat-0.stdout").read_text() == "12\n"  # the script saw the real value
    stored = [p for p in [*(tmp_path / "run").iterdir(), tmp_path / "r.json", tmp_path / "r.xml"]]
    assert all(b"s3cr3t" not in p.read_bytes() for p in stored)
    assert "s3cr3t" not in result.output


@pytest.mark.process
@pytest.mark.slow
def test_a_reader_that_stops_early_never_turns_into_an_error(tmp_path: Path) -> None:
    """`detaudit show T | head`, `detaudit report R --json - | head`: the exit code stays the command's own."""
    path = write_trace(tmp_path / "long.trace", training_records(steps=30), {"exit_code": 0})
    run_dir = write_run(tmp_path / "run", [training_records()] * 2)
    commands = (["show", str(path), "--limit", "0"], ["report", str(run_dir), "--json", "-"], ["report", str(run_dir)])
    for args in commands:
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before the first byte: every write to stdout fails (EPIPE)
        proc = subprocess.run([sys.executable, "-m", "detaudit", *args], cwd=tmp_path, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        os.close(write_end)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert "internal error" not in proc.stderr
