"""The warm servers' pool (tests/warm/server.py): which server a repeat is forked from.

A server is a process of its own, so it has its own string hash seed and address layout; every fork of it
shares them. Two repeats side by side must differ in both, as two fresh interpreters do, so a repeat goes to
server (its repeat index) of its variant: the repeats of a comparison and of an experiment's pair come from
different servers.

A variant is a set of start-up variables a server is started with, because a fork cannot change them
once python and torch have read them: the one-thread pin (OMP_NUM_THREADS=1) and the hash-seed pin. A
repeat whose start-up environment matches no variant's server runs in a real interpreter
(server.needs_fresh). Stdlib only: the client imports it with `python -I -S`.
"""

import json
import os

# variant -> (the start-up variables its servers get, how many servers)
VARIANTS: dict[str, tuple[dict[str, str], int]] = {
    # two of each: a comparison's repeats or an experiment's pair come from two processes (a race row's
    # third repeat shares a server with its first: its race is in threads, not in hash order)
    "plain": ({}, 2),
    "one-thread": ({"OMP_NUM_THREADS": "1"}, 2),
    "hash-seed": ({"PYTHONHASHSEED": "0"}, 2),
}


def socket_path(folder: str, variant: str, index: int) -> str:
    return os.path.join(folder, f"{variant}-{index}")


def variant_of(env: dict[str, str]) -> str:
    """The first variant whose start-up variables this repeat's environment has; "plain" when none. (A repeat
    that sets more, or other values, is sent to a fresh interpreter by its server.)"""
    for name, (variables, _) in VARIANTS.items():
        if variables and all(env.get(k) == v for k, v in variables.items()):
            return name
    return "plain"


def config_of(argv: list[str]) -> str | None:
    """The child config's path in the launcher's command (`python -c BOOT ROOT CONFIG SCRIPT ...`)."""
    return argv[4] if len(argv) > 4 and argv[1] == "-c" else None


def server_for(folder: str, argv: list[str], env: dict[str, str]) -> str:
    """The socket of the server that forks this repeat."""
    variant = variant_of(env)
    repeat = 0
    config = config_of(argv)
    if config is not None:
        try:
            with open(config) as fh:
                repeat = int(json.load(fh).get("repeat", 0))
        except (OSError, ValueError, TypeError):
            pass
    return socket_path(folder, variant, repeat % VARIANTS[variant][1])
