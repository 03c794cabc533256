"""`python cli.py SOCKETS ARGS...`: detaudit's CLI as `python -m detaudit ARGS...`, its repeats forked from
the warm servers at SOCKETS (comma-separated; tests/warm/server.py) by way of tests/warm/client.py.

Repeats go to the servers in turn, so consecutive repeats (a comparison's, an experiment's pair) come from
different servers: different string hash seeds and address layouts, as between fresh interpreters."""

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

from detaudit.run import launcher

CLIENT = str(Path(__file__).with_name("client.py"))
SOCKETS = itertools.cycle(sys.argv.pop(1).split(","))
real_command = launcher.child_command


def warm_command(config_path: Path, script: str, script_args: Sequence[str],
                 python_flags: Sequence[str] = ()) -> list[str]:
    command = real_command(config_path, script, script_args, python_flags)
    return [sys.executable, "-I", "-S", CLIENT, next(SOCKETS), *command]


launcher.child_command = warm_command  # type: ignore[assignment]
from detaudit.cli.commands import main  # noqa: E402

main()
