"""The script's git commit and dirty flag, for telling a code change from nondeterminism."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from detaudit.run.provenance import git_state


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_and_dirty_flag(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "one")
    (tmp_path / "notes.txt").write_text("untracked files do not make the tree dirty")
    state = git_state(script)
    assert state is not None
    assert (state["commit"], state["dirty"]) == (git(tmp_path, "rev-parse", "HEAD").strip(), False)
    script.write_text("print(2)\n")
    changed = git_state(script)
    assert changed is not None
    assert changed["commit"] == state["commit"]
    assert changed["dirty"]
    assert changed["script"] != state["script"]


def test_outside_a_repository_records_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert git_state(script) is None
