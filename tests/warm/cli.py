"""`python cli.py FOLDER ARGS...`: detaudit's CLI as `python -m detaudit ARGS...`, its repeats forked from
the warm servers whose sockets are in FOLDER (tests/warm/server.py) by way of tests/warm/client.py."""

import sys

from warm_launch import start_repeats_on

start_repeats_on(sys.argv.pop(1))
from detaudit.cli.commands import main  # noqa: E402

main()
