"""One process of the suite (the CLI under test, a repeat, a torchrun agent or rank), run by a fork of a warm
server (tests/warm/server.py).

`python client.py FOLDER COMMAND...`: COMMAND is what detaudit's launcher would have run, FOLDER
holds the servers' sockets (tests/warm/pool.py picks the one for this repeat). The client stands
for the repeat towards the launcher: it passes on the signals the launcher sends (SIGTERM of
--timeout, SIGINT, SIGHUP) to the fork's process group and ends as the fork ended
(its exit status, or the same signal). Killed itself (SIGKILL of the repeat's group), its
connection closes and the server kills the fork's group. When the server says the repeat needs a
fresh interpreter, the client becomes COMMAND.
"""

import contextlib
import json
import os
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `python -I` leaves the script's folder out
from pool import server_for  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this detaudit
from detaudit.run.guard import PARENT_ENV, die_with_parent  # noqa: E402

del sys.path[0]

# the client stands for the repeat: it dies with detaudit as the repeat would (its fork goes with its connection);
# a command it becomes (`fresh`) has detaudit for its parent still, as the environment says
guarded_by = os.environ.get(PARENT_ENV)
die_with_parent()
if guarded_by is not None:
    os.environ[PARENT_ENV] = guarded_by
folder, command = sys.argv[1], sys.argv[2:]
path = server_for(folder, command, dict(os.environ))
conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    conn.connect(path)
    socket.send_fds(conn, [json.dumps({"argv": command, "env": dict(os.environ), "cwd": os.getcwd()}).encode()],
                    [0, 1, 2])
    answer = conn.recv(4096).decode()
except OSError:
    answer = "fresh (no server)"
if answer.startswith("fresh"):
    conn.close()
    os.execv(command[0], command)
pid = int(answer.split()[1])


def forward(signum, frame):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, forward)
message = conn.recv(4096).decode()
if not message.startswith("status "):  # the server went away: the fork's outcome is unknown
    sys.exit(70)
status = int(message.split()[1])
if os.WIFSIGNALED(status):
    sig = os.WTERMSIG(status)
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
sys.exit(os.waitstatus_to_exitcode(status))
