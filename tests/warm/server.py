"""A warm interpreter for the suite's processes: torch (or detaudit's CLI) imported once, each process a fork of
it (tests only).

Most of an end-to-end test's time is spent starting interpreters that import torch (1.3 s) and
torch._dynamo (1.2 s, imported by every torch.optim optimizer's first step): the subject of most
tests is what detaudit records and reports, not how long python takes to start. The tests start the CLI
(tests/warm/cli.py), and the CLI its repeats, torchrun agents and ranks, as tests/warm/client.py, which asks a
server to fork a copy of itself that then runs exactly what that python command would (`-c BOOT ...` of
detaudit/run/launcher.py, `-m torch.distributed.run`, a script: pool.PythonCommand). Started `--cli`, a
server imports detaudit's CLI and not torch.

A fork is not a fresh interpreter, and where the difference could change an outcome the server
answers "fresh" and the client execs the real command instead:
- an environment variable read while python, torch or numpy start differs from the server's
  (PYTHONHASHSEED of the hash-seed pin, OMP_NUM_THREADS of the one-thread pin, TORCH*, ...);
- the repeat re-executes itself (the address-layout pin), or runs with python flags other than `-u`
  (torchrun's ranks run `python -u`: a fork makes its stdout and stderr unbuffered as python would).
A repeat whose start-up variables a variant of the server was started with (tests/warm/pool.py: one
thread, the hash-seed pin's PYTHONHASHSEED=0) is sent by its client to a server of that variant.
torchrun's ranks go to servers started `--without-dynamo`: forked from a server that had imported
torch._dynamo, a DDP rank deadlocked in about one audit in three (the script's DDP model, freed with the
GIL held, joins gloo's run-loop thread, which waits for the GIL to drop the Python context its last
work captured); forked from one that had not, as in a fresh interpreter (which imports it at the first
optimizer step), it did not in 30 audits. A rank's `__main__` globals also live until the fork ends, as in
python (freed when the script returned, they would destroy the process group in the same way).
What a fork shares with its siblings and a fresh interpreter would not: the string hash seed and
whatever torch and numpy did on import. The RNGs python, numpy and torch seed from the OS on import are
reseeded from the OS in each fork, and each fork scatters its heap (scatter_heap) so that its objects'
addresses, and with them `id()` orders, are its own as in a fresh interpreter. Tests whose subject depends
on the rest are marked `fresh_interpreters` (tests/conftest.py) and get real interpreters. A fork also
ends without python's module teardown (`exit_like_python`): threads joined, atexit handlers run, output
flushed, then os._exit, so an object finalizer that only teardown would run does not run in a fork.

Protocol (AF_UNIX, SOCK_SEQPACKET, one connection per repeat): the client sends one JSON message
{"argv": [...], "env": {...}, "cwd": "..."} with its descriptors 0, 1, 2 attached; the server answers
"fresh", or "pid N" and later "status S" (the raw wait status) when the fork ends. A client that goes
away (killed with its process group by the launcher) takes its fork's process group with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import mmap
import os
import random
import runpy
import selectors
import signal
import socket
import sys

from pool import PythonCommand

from detaudit.run.guard import PARENT_ENV

STARTED_WITH = dict(os.environ)  # before torch, whose import sets some (TORCHINDUCTOR_CACHE_DIR)

FOR_THE_CLI = "--cli" in sys.argv  # a server of detaudit's CLI processes: detaudit's CLI imported, not torch
WITH_DYNAMO = not FOR_THE_CLI and "--without-dynamo" not in sys.argv  # torchrun's ranks' servers leave it out
if FOR_THE_CLI:
    import warm_launch  # noqa: F401  (tests/warm/cli.py's own import)

    import detaudit.cli.commands  # noqa: F401
else:
    import numpy  # noqa: F401  (warm: imported once, here)
    import torch

    if WITH_DYNAMO:
        import torch._dynamo  # noqa: F401
    assert not torch.cuda.is_initialized()

# read while python, the allocator, OpenMP, numpy or torch start: a fork keeps the server's values
STARTUP_ENV = ("PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "NUMEXPR", "TORCH", "PYTORCH", "CUBLAS",
               "CUDNN", "NCCL", "GLOO", "LD_", "MALLOC", "GLIBC_", "DNNL", "ONEDNN", "NUMPY")
# read later than start-up: when CUDA initialises (which the server never does), by torch.distributed's elastic
# agent and process groups (torchrun sets them for its ranks)
ALLOWED = ("CUDA_VISIBLE_DEVICES", "TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
FORKABLE_FLAGS = ("-u",)  # what a fork can do as python does: unbuffered stdout and stderr
REEXEC_PINS = ("address-layout",)  # pins the child applies by re-executing itself

SERVER_PID = os.getpid()
MAIN_GLOBALS: dict[str, object] = {}  # the repeat's __main__ namespace, in a fork
BASE_PATH = sys.path[1:]  # what python has after its first entry (the server's own folder, here)


def run_as_python(command: PythonCommand) -> None:
    """Run it in this process as python would: sys.argv and sys.path[0] as python sets them."""
    if "-u" in command.flags:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            stream = getattr(sys, name)
            setattr(sys, name, io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False),  # noqa: SIM115
                                                encoding=stream.encoding, errors=stream.errors,
                                                write_through=True))
    if command.mode == "-c":
        sys.argv = ["-c", *command.args]
        sys.path[:] = ["", *BASE_PATH]
        # __main__'s globals live until the process ends, as in python: freed when the code returned, a
        # script's DDP process group would be destroyed with the GIL held while gloo's thread waits for it
        MAIN_GLOBALS.update({"__name__": "__main__", "__builtins__": __builtins__})
        exec(compile(command.target, "<string>", "exec"), MAIN_GLOBALS)  # noqa: S102
    elif command.mode == "-m":
        sys.argv = ["-m", *command.args]  # runpy puts the module's file first
        sys.path[:] = [os.getcwd(), *BASE_PATH]
        runpy.run_module(command.target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [command.target, *command.args]
        sys.path[:] = [os.path.dirname(os.path.realpath(command.target)), *BASE_PATH]
        runpy.run_path(command.target, run_name="__main__")


def needs_fresh(argv: list[str], env: dict[str, str]) -> str | None:
    """Why this command must run in a real interpreter; None when a fork runs it as python would."""
    command = PythonCommand.parse(argv)
    if command is None or any(f not in FORKABLE_FLAGS for f in command.flags):
        return "python flags"
    if WITH_DYNAMO and "TORCHELASTIC_RUN_ID" in env:
        return "a torchrun rank, on a server that imported torch._dynamo"
    for key in set(env) | set(STARTED_WITH):
        # as the server started, or as its own imports set it (torch sets TORCHINDUCTOR_CACHE_DIR to the default a
        # fresh interpreter computes too: the test process that imported torch passes that value on)
        if key.startswith(STARTUP_ENV) and not key.startswith(ALLOWED) \
                and env.get(key) not in (STARTED_WITH.get(key), os.environ.get(key)):
            return f"{key} differs"
    if command.mode != "-c":
        return None
    try:
        with open(command.child_config() or "") as fh:  # the launcher's paths are absolute
            pins = json.load(fh).get("pins", [])
    except (OSError, ValueError):
        return "unreadable child config"
    if any(p in REEXEC_PINS for p in pins):
        return "a re-executing pin"
    return None


def become_repeat(request: dict[str, object], fds: list[int], keep_closed: list[int]) -> None:
    """In the fork: take the client's descriptors, directory and environment, reseed what python, numpy and
    torch seeded from the OS, and run the command as python would."""
    os.setsid()  # a group of its own, as the launcher gives every repeat: DataLoader workers go with it
    for fd in keep_closed:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(str(request["cwd"]))
    os.environ.clear()
    os.environ.update(request["env"])  # type: ignore[arg-type]
    if PARENT_ENV in os.environ:  # the fork dies with this server; with its client, through the connection
        os.environ[PARENT_ENV] = str(os.getppid())
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()  # a fresh interpreter's default generator starts from a random seed too
    argv = list(request["argv"])  # type: ignore[call-overload]
    sys.orig_argv = argv
    command = PythonCommand.parse(argv)
    assert command is not None  # needs_fresh said so
    try:
        scatter_heap()  # in here: a failure ends the fork with its traceback, never back in the server's loop
        run_as_python(command)
    except SystemExit as exc:
        exit_like_python(exc.code)
    except BaseException as exc:  # noqa: BLE001  uncaught: python prints it and exits 1 (KeyboardInterrupt: by SIGINT)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        exit_like_python(1, signal.SIGINT if isinstance(exc, KeyboardInterrupt) else None)
    exit_like_python(0)


HELD: list[object] = []  # a fork's hold on memory (scatter_heap), for as long as it runs
# prototypes of its own: setting restype on ctypes.pythonapi's shared attributes would change what a script sees
MALLOC = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t)(("PyObject_Malloc", ctypes.pythonapi))
FREE = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("PyObject_Free", ctypes.pythonapi))


def scatter_heap() -> None:
    """Give this fork an address layout of its own, as address randomization gives every fresh interpreter.

    Forks of one server would otherwise allocate a script's objects at the same addresses, so a set of objects
    hashed by identity would iterate in one order in all of them: an experiment's repeats would agree where
    fresh interpreters differ. Python's small-object allocator hands out a size class's freed blocks last
    freed first: for every class, this takes 64 blocks and frees a random half in a random order, so the
    script's objects land in a random order of addresses; a random number of pages held moves where the next
    memory maps go. About 1 ms.
    """
    draw = random.Random(os.urandom(16))
    for size in range(16, 513, 16):  # every size class (16-byte steps up to 512 bytes)
        blocks = [MALLOC(size) for _ in range(64)]
        draw.shuffle(blocks)
        for block in blocks[32:]:
            FREE(block)
    HELD.append(mmap.mmap(-1, mmap.PAGESIZE * draw.randrange(1, 257)))


def exit_like_python(code: object, killed_by: signal.Signals | None = None) -> None:
    """End the fork as python ends, up to its module teardown, which is left out.

    Python's exit joins the threads that are not daemons, runs the atexit handlers (the child's footer is
    the last of them) and flushes stdout and stderr; then it tears the interpreter down, freeing every
    module's objects. In a fork of this server that teardown writes to nearly every page the fork shares
    with it, so the kernel copies them: 0.9 s of a repeat that otherwise takes 0.3 s (0.6 s in a fresh
    interpreter). Nothing the suite checks happens there (no test script has a finalizer that runs only
    at teardown), so the fork ends with os._exit after the flush, with python's exit status for `code`.
    """
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:  # sys.exit("message"): python prints it and exits 1
        print(code, file=sys.stderr)
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = 120 if status == 0 and stream is sys.stdout else status  # as python: a stdout it cannot flush
    if killed_by is not None:
        signal.signal(killed_by, signal.SIG_DFL)
        os.kill(os.getpid(), killed_by)
    os._exit(status)


def serve(path: str, owner: int | None = None) -> None:
    """Fork a repeat per connection to PATH until the test process that started the server is gone (end of file on
    its stdin) or, given `owner` (the xdist controller, whose workers share the servers: conftest.WarmServers),
    until that process has ended."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    # the test process that started the server holds the other end of its stdin: end of file is that
    # process gone (a worker killed, a run interrupted), and the server ends with it, its forks too
    ended = sys.stdin if owner is None else os.pidfd_open(owner)  # readable once the owner has ended
    selector.register(ended, selectors.EVENT_READ)
    clients: dict[int, tuple[socket.socket, int] | None] = {}  # fork pid -> (its client's connection, its fd)
    by_conn: dict[int, int] = {}
    print("ready", flush=True)
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj is listener:
                    conn, _ = listener.accept()
                    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                    request = json.loads(message)
                    why = needs_fresh(request["argv"], request["env"])
                    print(f"{'fresh: ' + why if why else 'fork'}: {request['argv'][-1][-60:]} in {request['cwd']}",
                          file=sys.stderr, flush=True)
                    if why is not None or len(fds) != 3:
                        conn.send(f"fresh {why}".encode())
                        conn.close()
                        for fd in fds:
                            os.close(fd)
                        continue
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        others = [entry[1] for entry in clients.values() if entry is not None]
                        become_repeat(request, fds, [listener.fileno(), conn.fileno(), wake_r, wake_w,
                                                     selector.fileno(), *others])
                    for fd in fds:
                        os.close(fd)
                    conn.send(f"pid {pid}".encode())
                    clients[pid] = (conn, conn.fileno())
                    by_conn[conn.fileno()] = pid
                    selector.register(conn, selectors.EVENT_READ)
                elif key.fileobj is ended:
                    if owner is not None or not os.read(sys.stdin.fileno(), 4096):
                        return
                elif key.fileobj == wake_r:
                    os.read(wake_r, 4096)
                    while True:
                        try:
                            pid, status = os.waitpid(-1, os.WNOHANG)
                        except ChildProcessError:
                            break
                        if pid == 0:
                            break
                        with contextlib.suppress(ProcessLookupError):  # what it left in its group, as the launcher
                            os.killpg(pid, signal.SIGKILL)
                        entry = clients.pop(pid, None)
                        if entry is not None:  # None: its client went away first
                            conn, fd = entry
                            by_conn.pop(fd, None)
                            selector.unregister(conn)
                            with contextlib.suppress(OSError):
                                conn.send(f"status {status}".encode())
                            conn.close()
                else:  # a client's connection: readable means it went away
                    conn = key.fileobj  # type: ignore[assignment]
                    pid = by_conn.pop(conn.fileno(), None)  # type: ignore[union-attr]
                    selector.unregister(conn)
                    conn.close()  # type: ignore[union-attr]
                    if pid is not None:
                        clients[pid] = None
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(pid, signal.SIGKILL)
    finally:
        if os.getpid() == SERVER_PID:
            for pid in list(clients):  # forks still running when the session ends
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[sys.argv.index("--owner") + 1]) if "--owner" in sys.argv else None)
