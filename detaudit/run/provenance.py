"""Which code ran: the git commit of the script's repository and whether its tracked files differed.

Found once per batch of repeats by the parent (a subprocess inside a repeat would shift its heap
layout, and with it the order of objects hashed by identity) and recorded in every repeat's
environment fingerprint, so a comparison across machines or days can
tell a code change from nondeterminism. No torch here; best effort: no git, or a script outside a
repository, records nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TypedDict

import xxhash

GIT_TIMEOUT_S = 5.0


class GitState(TypedDict):
    commit: str
    dirty: bool  # tracked files differ from the commit (untracked files do not count)
    script: str  # digest of the script file's bytes: with the commit, says whether the code that ran differs


def git_state(script: Path) -> GitState | None:
    """The commit of the repository holding `script`, or None outside one (or without git)."""
    folder = Path(script).resolve().parent
    try:
        commit = _git(folder, "rev-parse", "HEAD")
        status = _git(folder, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if commit is None or status is None:
        return None
    try:
        script_digest = f"{xxhash.xxh3_64_intdigest(Path(script).read_bytes()):016x}"
    except OSError:
        script_digest = ""
    return {"commit": commit.strip(), "dirty": bool(status.strip()), "script": script_digest}


def _git(folder: Path, *args: str) -> str | None:
    proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    return proc.stdout if proc.returncode == 0 else None
