"""The warm servers' pool (tests/warm/server.py): which server a repeat is forked from.

A server is a process of its own, so it has its own string hash seed; every fork of it shares it (not
its address layout: each fork scatters its heap, server.scatter_heap). Two repeats side by side must differ
in hash seed too, as two fresh interpreters do, so a repeat goes to server (its repeat index) of its variant:
the repeats of a comparison and of an experiment's pair come from different servers.

A variant is a set of start-up variables a server is started with, because a fork cannot change them
once python and torch have read them: the one-thread pin (OMP_NUM_THREADS=1) and the hash-seed pin; torchrun's
ranks have servers of their own (server.py says why). A repeat whose start-up environment matches no variant's
server runs in a real interpreter (server.needs_fresh). Stdlib only: the client imports it with `python -I -S`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Variant:
    """Servers started alike: `variables` in their environment, `args` on their command line, `count` of them."""

    variables: dict[str, str] = field(default_factory=dict)
    count: int = 2  # a comparison's repeats or an experiment's pair come from two processes (a third repeat
    # shares its first's hash seed: the order rows' scripts iterate sets of objects, not of strings)
    args: tuple[str, ...] = ()
    ranks: bool = False  # for torchrun's ranks only


VARIANTS: dict[str, Variant] = {
    "plain": Variant(),  # also torchrun's agents (`python -m torch.distributed.run`)
    "one-thread": Variant({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}),  # the one-thread pin's (detaudit/pin.py)
    "hash-seed": Variant({"PYTHONHASHSEED": "0"}),
    # torchrun sets OMP_NUM_THREADS=1 for its ranks; their servers leave torch._dynamo unimported (server.py)
    "rank": Variant({"OMP_NUM_THREADS": "1"}, args=("--without-dynamo",), ranks=True),
    "cli": Variant(count=1, args=("--cli",)),  # detaudit's CLI (tests/warm/cli.py): no torch, detaudit's CLI imported
}
CLI = "cli.py"


@dataclass(frozen=True)
class PythonCommand:
    """`python [FLAGS] (-c CODE | -m MODULE | SCRIPT) ARGS...`, as python reads it (server.py runs it)."""

    flags: tuple[str, ...]
    mode: str  # "-c", "-m" or "script"
    target: str  # the code, the module or the script
    args: tuple[str, ...]

    @classmethod
    def parse(cls, argv: list[str]) -> PythonCommand | None:
        at = 1
        while at < len(argv) and argv[at].startswith("-") and argv[at] not in ("-c", "-m"):
            at += 1
        if at >= len(argv) or (argv[at] in ("-c", "-m") and at + 1 >= len(argv)):
            return None
        if argv[at] in ("-c", "-m"):
            return cls(tuple(argv[1:at]), argv[at], argv[at + 1], tuple(argv[at + 2:]))
        return cls(tuple(argv[1:at]), "script", argv[at], tuple(argv[at + 1:]))

    def child_config(self) -> str | None:
        """The child config's path in the launcher's command (`python [-u] -c BOOT ROOT CONFIG SCRIPT ...`)."""
        return self.args[1] if self.mode == "-c" and len(self.args) > 1 else None


CLIENT_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "client.py")


def through_client(folder: str, command: list[str]) -> list[str]:
    """COMMAND as tests/warm/client.py of the servers in FOLDER runs it: forked by the server this module picks,
    or as itself where a fork cannot run it faithfully."""
    return [sys.executable, "-I", "-S", CLIENT_PY, folder, *command]


def socket_path(folder: str, variant: str, index: int) -> str:
    return os.path.join(folder, f"{variant}-{index}")


def variant_of(env: dict[str, str]) -> str:
    """The first variant (for a torchrun rank: of the rank variants) whose start-up variables this repeat's
    environment has; "plain" when none. (A repeat that sets more, or other values, is sent to a fresh
    interpreter by its server.)"""
    rank = "TORCHELASTIC_RUN_ID" in env
    for name, variant in VARIANTS.items():
        if variant.ranks == rank and variant.variables and \
                all(env.get(k) == v for k, v in variant.variables.items()):
            return name
    return "plain"


def server_for(folder: str, argv: list[str], env: dict[str, str]) -> str:
    """The socket of the server that forks this command."""
    command = PythonCommand.parse(argv)
    if command is not None and command.mode == "script" and os.path.basename(command.target) == CLI:
        return socket_path(folder, "cli", 0)
    variant = variant_of(env)
    repeat = 0
    config = command.child_config() if command is not None else None
    if config is not None:
        try:
            with open(config) as fh:
                repeat = int(json.load(fh).get("repeat", 0))
        except (OSError, ValueError, TypeError):
            pass
    # a torchrun rank: the ranks of one repeat, and one rank across repeats, come from different servers
    rank = int(env["RANK"]) if env.get("RANK", "").isdigit() else 0
    return socket_path(folder, variant, (repeat + rank) % VARIANTS[variant].count)
