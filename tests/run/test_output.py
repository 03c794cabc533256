"""output.py: atomic writes, `-` as stdout, and the early writability check."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest

from detaudit.errors import ExitCode, OutputError, TraceError
from detaudit.run.files import (
    check_writable,
    copy_atomically,
    create_private,
    write_output,
    write_text_atomically,
)


def test_atomic_writes_use_unique_temporaries_and_leave_none(tmp_path: Path) -> None:
    """Writers of one file at once (two runs, a run and a report) never share a temporary name."""
    target = tmp_path / "run.json"
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(50):
                write_text_atomically(target, json.dumps({"writer": n, "i": i}) * 200)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    json.loads(target.read_text().split("}{")[0] + "}" if "}{" in target.read_text() else target.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EROFS", "EACCES"])
def test_a_failed_write_is_one_output_error_and_leaves_no_temporary(tmp_path: Path, errno_name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    code = getattr(errno, errno_name)

    def fail(src: str, dst: str) -> None:
        raise OSError(code, os.strerror(code), src)

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OutputError, match=errno_name) as caught:
        write_text_atomically(tmp_path / "report.json", "{}")
    assert caught.value.exit_code == ExitCode.OUTPUT
    assert "report.json" in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_dash_is_stdout_and_a_file_is_written_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_output(Path("-"), "to stdout\n")
    write_output(tmp_path / "sub" / "report.json", "{}\n")
    assert capsys.readouterr().out == "to stdout\n"
    assert (tmp_path / "sub" / "report.json").read_text() == "{}\n"


def test_a_directory_or_a_file_under_a_file_is_refused_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    with pytest.raises(OutputError, match="is a directory"):
        check_writable(tmp_path)
    with pytest.raises(OutputError, match="is not a directory"):
        check_writable(tmp_path / "plain" / "report.json")
    check_writable(tmp_path / "new" / "report.json")  # a missing parent is made when the file is written
    check_writable(Path("-"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]  # the probe leaves nothing behind


def test_a_run_directory_file_is_created_exclusively_never_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "users-file"
    victim.write_text("precious\n")
    (tmp_path / "repeat-1.stdout").symlink_to(victim)
    with pytest.raises(OutputError, match="already exists") as caught:
        create_private(tmp_path / "repeat-1.stdout")
    assert caught.value.exit_code == ExitCode.OUTPUT
    assert victim.read_text() == "precious\n"
    fd = create_private(tmp_path / "repeat-2.stdout", readable=True)
    os.write(fd, b"mine")
    assert os.pread(fd, 4, 0) == b"mine"
    assert oct(os.fstat(fd).st_mode & 0o777) == "0o600"
    os.close(fd)


def test_a_link_at_a_run_files_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "users-file"
    victim.write_text("precious\n")
    for name in ("run.json", "report.json"):
        (tmp_path / name).symlink_to(victim)
    write_text_atomically(tmp_path / "run.json", "{}", mode=0o600)
    write_output(tmp_path / "report.json", "{}", mode=0o600)  # a run directory's report: never in place
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "run.json").is_symlink()
    assert (tmp_path / "report.json").read_text() == "{}"


def test_a_copy_reads_its_source_never_through_a_link(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("hunter2")
    (tmp_path / "repeat-0.stdout").symlink_to(tmp_path / "secret")
    with pytest.raises(TraceError, match="symbolic link"):
        copy_atomically(tmp_path / "repeat-0.stdout", "stdout capture", tmp_path / "reference.stdout")
    assert not (tmp_path / "reference.stdout").exists()
    (tmp_path / "plain").write_text("printed\n")
    copy_atomically(tmp_path / "plain", "stdout capture", tmp_path / "reference.stdout")
    assert (tmp_path / "reference.stdout").read_text() == "printed\n"
