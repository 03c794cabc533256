"""`python cli.py SOCKET ARGS...`: detaudit's CLI as `python -m detaudit ARGS...`, its repeats forked from
the warm server at SOCKET (tests/warm/server.py) by way of tests/warm/client.py."""

import sys
from collections.abc import Sequence
from pathlib import Path

from detaudit.run import launcher

CLIENT = str(Path(__file__).with_name("client.py"))
SOCKET = sys.argv.pop(1)
real_command = launcher.child_command


def warm_command(config_path: Path, script: str, script_args: Sequence[str],
                 python_flags: Sequence[str] = ()) -> list[str]:
    command = real_command(config_path, script, script_args, python_flags)
    return [sys.executable, "-I", "-S", CLIENT, SOCKET, *command]


launcher.child_command = warm_command  # type: ignore[assignment]
from detaudit.cli.commands import main  # noqa: E402

main()
