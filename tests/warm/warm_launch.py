"""Start the repeats of detaudit's launcher, in this process, on the warm servers (tests/warm/server.py);
tests/warm/pool.py says which server forks which repeat."""

from collections.abc import Sequence
from pathlib import Path

from pool import through_client

from detaudit.run import distributed, launcher


def start_repeats_on(folder: str) -> None:
    """Make every repeat, torchrun agent and torchrun rank the launcher starts a tests/warm/client.py of the servers
    in FOLDER."""
    real_command, real_torchrun = launcher.child_command, distributed.torchrun_command

    def warm_command(config_path: Path, script: str, script_args: Sequence[str],
                     python_flags: Sequence[str] = (), python: str | None = None) -> list[str]:
        if python is not None:  # another interpreter (drift --b-python): no warm server of it to fork from
            return real_command(config_path, script, script_args, python_flags, python)
        return through_client(folder, real_command(config_path, script, script_args, python_flags))

    def warm_torchrun(nproc_per_node: int, torchrun_args: list[str], worker: list[str]) -> list[str]:
        return through_client(folder, real_torchrun(nproc_per_node, torchrun_args, worker))

    launcher.child_command = distributed.child_command = warm_command  # type: ignore[assignment]
    distributed.torchrun_command = warm_torchrun  # type: ignore[assignment]
