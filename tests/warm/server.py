"""A warm interpreter for the suite's repeats: torch imported once, each repeat a fork of it (tests only).

Most of an end-to-end test's time is spent starting interpreters that import torch (1.3 s) and
torch._dynamo (1.2 s, imported by every torch.optim optimizer's first step): the subject of most
tests is what detaudit records and reports, not how long python takes to start. The CLI under test
(tests/warm/cli.py) starts each repeat as tests/warm/client.py, which asks this server to fork a
copy of itself that then runs exactly what `python -c BOOT ...` would (detaudit/run/launcher.py).

A fork is not a fresh interpreter, and where the difference could change an outcome the server
answers "fresh" and the client execs the real command instead:
- an environment variable read while python, torch or numpy start differs from the server's
  (PYTHONHASHSEED of the hash-seed pin, OMP_NUM_THREADS of the one-thread pin, TORCH*, ...);
- the repeat re-executes itself (the address-layout pin), or runs with python flags: torchrun's ranks
  (`python -u`). Forked, a DDP rank can deadlock as its script ends: its process group, freed with the
  GIL held, joins a gloo thread that waits for the GIL to free the Python state its work captured (seen
  with train_ddp_rank_init.py); a fresh interpreter frees it at exit, where that thread is let go.
A repeat whose start-up variables a variant of the server was started with (tests/warm/pool.py: one
thread, the hash-seed pin's PYTHONHASHSEED=0) is sent by its client to a server of that variant.
What a fork shares with its siblings and a fresh interpreter would not: the string hash seed, the
address layout (so `id()` orders) and whatever torch and numpy did on import. The RNGs python, numpy
and torch seed from the OS on import are reseeded from the OS in each fork. Tests whose subject depends
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
import json
import os
import selectors
import signal
import socket
import sys

STARTED_WITH = dict(os.environ)  # before torch, whose import sets some (TORCHINDUCTOR_CACHE_DIR)

import numpy  # noqa: E402, F401  (warm: imported once, here)
import torch  # noqa: E402
import torch._dynamo  # noqa: E402, F401

# read while python, the allocator, OpenMP, numpy or torch start: a fork keeps the server's values
STARTUP_ENV = ("PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "NUMEXPR", "TORCH", "PYTORCH", "CUBLAS",
               "CUDNN", "NCCL", "GLOO", "LD_", "MALLOC", "GLIBC_", "DNNL", "ONEDNN", "NUMPY")
ALLOWED = ("CUDA_VISIBLE_DEVICES",)  # read when CUDA initialises, which the server never does
REEXEC_PINS = ("address-layout",)  # pins the child applies by re-executing itself

SERVER_PID = os.getpid()
BASE_PATH = sys.path[1:]  # what `python -c` has after its '' entry: the server's own folder is not on it
assert not torch.cuda.is_initialized()


def needs_fresh(argv: list[str], env: dict[str, str]) -> str | None:
    """Why this repeat must run in a real interpreter; None when a fork runs it as python would."""
    if len(argv) < 5 or argv[1] != "-c":
        return "python flags"
    for key in set(env) | set(STARTED_WITH):
        # as the server started, or as its own imports set it (torch sets TORCHINDUCTOR_CACHE_DIR to the default a
        # fresh interpreter computes too: the test process that imported torch passes that value on)
        if key.startswith(STARTUP_ENV) and key not in ALLOWED \
                and env.get(key) not in (STARTED_WITH.get(key), os.environ.get(key)):
            return f"{key} differs"
    try:
        with open(argv[4]) as fh:  # the child config: the launcher's paths are absolute
            pins = json.load(fh).get("pins", [])
    except (OSError, ValueError):
        return "unreadable child config"
    if any(p in REEXEC_PINS for p in pins):
        return "a re-executing pin"
    return None


def become_repeat(request: dict[str, object], fds: list[int], keep_closed: list[int]) -> None:
    """In the fork: take the client's descriptors, directory and environment, reseed what python and
    numpy seeded from the OS, and run the launcher's bootstrap as `python -c` would."""
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
    import random

    random.seed()
    numpy.random.seed()
    torch.seed()  # a fresh interpreter's default generator starts from a random seed too
    argv = list(request["argv"])  # type: ignore[call-overload]
    sys.orig_argv = argv
    sys.argv = ["-c", *argv[3:]]
    sys.path[:] = ["", *BASE_PATH]
    code = compile(argv[2], "<string>", "exec")
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
    except SystemExit as exc:
        exit_like_python(exc.code)
    exit_like_python(0)


def exit_like_python(code: object) -> None:
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
    os._exit(status)


def serve(path: str) -> None:
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
    selector.register(sys.stdin, selectors.EVENT_READ)
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
                    print(f"{'fresh: ' + why if why else 'fork'}: {request['argv'][-1][-60:]}", file=sys.stderr,
                          flush=True)
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
                elif key.fileobj is sys.stdin:
                    if not os.read(sys.stdin.fileno(), 4096):
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
    serve(sys.argv[1])
