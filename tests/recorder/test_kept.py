"""The files a stopped torch.save was given are left as they were (detaudit/recorder/kept.py)."""

from __future__ import annotations

import os
from pathlib import Path

from detaudit.recorder.kept import KeptFiles

TRUNCATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def opened(kept: KeptFiles, path: Path) -> object:
    """The script's `open(path, "wb")`, with the audit event python raises before it."""
    kept.audit("open", (str(path), "wb", TRUNCATE))
    return open(path, "wb")  # noqa: SIM115  the script's handle, closed by the test


def test_a_file_emptied_by_its_open_gets_its_bytes_back(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"last good")
    kept = KeptFiles(str(tmp_path / "run"), lambda: True)
    with opened(kept, ckpt) as f:  # type: ignore[attr-defined]
        said = kept.restore(f)
    assert (ckpt.read_bytes(), said) == (b"last good", "its previous 9 bytes were put back")
    assert list((tmp_path / "run").iterdir()) == []


def test_a_file_its_open_created_is_removed(tmp_path: Path) -> None:
    kept = KeptFiles(str(tmp_path / "run"), lambda: True)
    with opened(kept, tmp_path / "new.pt") as f:  # type: ignore[attr-defined]
        kept.restore(f)
    assert not (tmp_path / "new.pt").exists()


def test_nothing_is_copied_while_no_stop_can_come(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"x")
    kept = KeptFiles(str(tmp_path / "run"), lambda: False)
    with opened(kept, ckpt):
        pass
    assert kept.kept == {}


def test_a_save_to_a_path_has_nothing_to_restore(tmp_path: Path) -> None:
    assert KeptFiles(str(tmp_path), lambda: True).restore(str(tmp_path / "ckpt.pt")) is None
