"""Start the repeats of detaudit's launcher, in this process, on the warm servers (tests/warm/server.py);
tests/warm/pool.py says which server forks which repeat."""

import sys
from collections.abc import Sequence
from pathlib import Path

from detaudit.run import launcher

CLIENT = str(Path(__file__).with_name("client.py"))


def start_repeats_on(folder: str) -> None:
    """Make every repeat (and torchrun rank) the launcher starts a tests/warm/client.py of the servers in FOLDER."""
    real_command = launcher.child_command

    def warm_command(config_path: Path, script: str, script_args: Sequence[str],
                     python_flags: Sequence[str] = ()) -> list[str]:
        command = real_command(config_path, script, script_args, python_flags)
        return [sys.executable, "-I", "-S", CLIENT, folder, *command]

    launcher.child_command = warm_command  # type: ignore[assignment]
