"""child.py's pieces that need no fresh interpreter (the fast lane): the after-import hook, exit
statuses and source decoding. test_child.py runs whole scripts both ways (marked process)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from detaudit.recorder import patch
from detaudit.run import child


def test_a_callback_runs_once_right_after_its_module_imports_and_its_failure_is_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "watched_mod.py").write_text("VALUE = 1\n")
    (tmp_path / "broken_cb_mod.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []
    errors: list[tuple[str, str]] = []

    def fail(module: ModuleType) -> None:
        raise RuntimeError("hook failed")

    hook = child._AfterImport({"watched_mod": lambda m: seen.append(f"{m.__name__}={m.VALUE}"),
                               "broken_cb_mod": fail}, lambda name, exc: errors.append((name, str(exc))))
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    for name in ("watched_mod", "broken_cb_mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    kept = len(patch.patched())
    try:
        import broken_cb_mod  # noqa: F401  (the callback's failure never reaches the importer)
        import watched_mod  # noqa: F401
    finally:
        patch.restore_all(kept)  # the hook wrapped each module's loader.exec_module (recorder/patch.py)

    assert seen == ["watched_mod=1"]
    assert errors == [("broken_cb_mod", "hook failed")]
    assert hook.callbacks == {}  # each dropped once its module imported
    for name in ("watched_mod", "broken_cb_mod"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("code,status", [(None, 0), (0, 0), (3, 3), (260, 260), ("fatal: bad config", 1)])
def test_system_exit_codes_map_as_python_maps_them(code: object, status: int) -> None:
    assert child._exit_code(SystemExit(code)) == status


def test_source_is_decoded_by_its_cookie_and_bytes_that_are_no_text_get_pythons_error(tmp_path: Path) -> None:
    latin = tmp_path / "latin.py"
    latin.write_bytes("# -*- coding: latin-1 -*-\nname = 'café'\n".encode("latin-1"))
    assert "café" in child._read_source(str(latin), latin.read_bytes())
    bad = tmp_path / "bad.py"
    bad.write_bytes(b"x = 1\n\xff\xfe oops\n")
    with pytest.raises(SyntaxError, match=r"Non-UTF-8 code starting with '\\xff' in file .*bad.py on line 2"):
        child._read_source(str(bad), bad.read_bytes())


def test_a_recording_lost_to_a_full_disk_is_said_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The trace writer stops writing on ENOSPC and no footer is written: the child says so on stderr, where the
    report reads a failed repeat's end (a full disk reads inconclusive, run/failure.py `disk_full`)."""
    import errno

    from detaudit.trace import writer

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "_write_all", full)
    session = child.Session({"trace": str(tmp_path / "repeat-0.trace")}, tmp_path / "script.py")
    session.ended(0, None)
    session.close()
    assert capsys.readouterr().err == ("detaudit: this repeat's recording is incomplete: writing the trace failed: "
                                       "No space left on device\n")
