"""Start the repeats of detaudit's launcher, in this process, on the warm servers (tests/warm/server.py).

Repeats go to the servers in turn, so consecutive repeats (a comparison's, an experiment's pair) come from
different servers: different string hash seeds and address layouts, as between fresh interpreters."""

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

from detaudit.run import launcher

CLIENT = str(Path(__file__).with_name("client.py"))


def start_repeats_on(sockets: Sequence[str]) -> None:
    """Make every repeat the launcher starts a tests/warm/client.py of the next server in turn."""
    turn = itertools.cycle(sockets)
    real_command = launcher.child_command

    def warm_command(config_path: Path, script: str, script_args: Sequence[str],
                     python_flags: Sequence[str] = ()) -> list[str]:
        command = real_command(config_path, script, script_args, python_flags)
        return [sys.executable, "-I", "-S", CLIENT, next(turn), *command]

    launcher.child_command = warm_command  # type: ignore[assignment]
