"""The warm server the suite forks repeats from (tests/warm/): a fork runs a command as `python -c` would, reseeded,
with the client's descriptors, directory, environment and exit status, and a repeat it cannot run faithfully runs
in a real interpreter."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import WARM, WARM_SERVERS

PROBE = """import json, os, random, sys, time
import numpy as np
import torch
class Item:
    def __init__(self, i):
        self.i = i
print(json.dumps({"hash": hash("probe"), "order": [item.i for item in {Item(i) for i in range(50)}],
                  "random": random.random(), "numpy": float(np.random.rand()),
                  "torch": float(torch.rand(1)), "pid": os.getpid(), "address": id(torch),
                  "threads": torch.get_num_threads(), "dynamo": "torch._dynamo" in sys.modules,
                  "write_through": sys.stdout.write_through,
                  "argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PROBE_ENV")}), flush=True)
time.sleep(float(os.environ.get("PROBE_SLEEP", "0")))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""
# the launcher's command shape: python -c BOOT ROOT CONFIG SCRIPT ARGS (detaudit/run/launcher.py)
BOOT = "import runpy, sys; sys.argv = sys.argv[3:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def _through_client(command: list[str]) -> list[str]:
    folder = WARM_SERVERS.folder()
    from pool import through_client  # importable once the servers started

    return through_client(folder, command)


def _client(tmp_path: Path, env: dict[str, str], pins: tuple[str, ...] = (), server: int = 0,
            flags: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    script, config = tmp_path / "probe.py", tmp_path / "config.json"
    script.write_text(PROBE)
    config.write_text(json.dumps({"pins": list(pins), "repeat": server}))  # the repeat index picks the server
    command = [sys.executable, *flags, "-c", BOOT, "root", str(config), str(script), "an-arg"]
    return subprocess.Popen(_through_client(command),
                            cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def _probe(tmp_path: Path, server: int = 0, flags: tuple[str, ...] = (), **env: str) -> tuple[int, dict[str, object]]:
    proc = _client(tmp_path, env, server=server, flags=flags)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, json.loads(out)


@pytest.mark.process
def test_forks_run_the_command_reseeded_with_the_clients_descriptors_directory_environment_and_status(
        tmp_path: Path) -> None:
    code, first = _probe(tmp_path, PROBE_ENV="one", PROBE_EXIT="3")
    _, second = _probe(tmp_path, PROBE_ENV="two")
    assert code == 3
    assert (first["env"], second["env"]) == ("one", "two")
    assert first["argv"] == [str(tmp_path / "probe.py"), "an-arg"]
    assert first["cwd"] == str(tmp_path)
    assert first["hash"] == second["hash"]  # shared by every fork of one server
    for source in ("random", "numpy", "torch", "pid"):  # seeded from the OS in each, as in a fresh interpreter
        assert first[source] != second[source], source


@pytest.mark.process
def test_each_server_has_its_own_hash_seed_and_address_layout(tmp_path: Path) -> None:
    """Why the CLI takes the servers in turn: two repeats side by side differ in both, as fresh interpreters do."""
    probes = [_probe(tmp_path, server=index)[1] for index in range(2)]
    assert len({p["hash"] for p in probes}) == 2
    assert len({p["address"] for p in probes}) == 2


@pytest.mark.process
def test_forks_of_one_server_each_have_an_address_layout_of_their_own(tmp_path: Path) -> None:
    """As address randomization gives every fresh interpreter (server.scatter_heap): a set of objects hashed by
    identity iterates in another order in each fork, so an experiment's repeats of one server can disagree."""
    orders = [tuple(_probe(tmp_path, server=0)[1]["order"]) for _ in range(4)]  # type: ignore[arg-type]
    assert len(set(orders)) == 4, orders


def _forks(cwd: Path) -> int:
    """How many repeats the servers have forked so far in `cwd` (their logs; the workers share the servers)."""
    logs = glob.glob(os.path.join(WARM_SERVERS.folder(), "*.log"))
    return sum(line.startswith("fork: ") and line.endswith(f" in {cwd}")
               for log in logs for line in Path(log).read_text().splitlines())


@pytest.mark.process
def test_the_hash_seed_pins_repeats_fork_from_servers_started_with_it(tmp_path: Path) -> None:
    """PYTHONHASHSEED=0 is read as python starts: servers of the `hash-seed` variant were started with it. The
    pinned repeats share the hash seed and, from two servers, still differ in address layout."""
    before = _forks(tmp_path)
    probes = [_probe(tmp_path, server=index, PYTHONHASHSEED="0")[1] for index in range(2)]
    fresh = subprocess.run([sys.executable, "-c", "print(hash('probe'))"], env={**os.environ, "PYTHONHASHSEED": "0"},
                           capture_output=True, text=True, check=True)
    assert [p["hash"] for p in probes] == [int(fresh.stdout)] * 2
    assert probes[0]["address"] != probes[1]["address"]
    assert _forks(tmp_path) == before + 2


@pytest.mark.process
def test_the_one_thread_pins_repeats_fork_from_servers_started_with_it(tmp_path: Path) -> None:
    before = _forks(tmp_path)
    probes = [_probe(tmp_path, server=index, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")[1] for index in range(2)]
    assert _forks(tmp_path) == before + 2
    assert [p["threads"] for p in probes] == [1, 1]
    assert probes[0]["hash"] != probes[1]["hash"]


@pytest.mark.process
def test_torchruns_ranks_fork_unbuffered_from_servers_without_dynamo_each_rank_from_another(tmp_path: Path) -> None:
    """A rank (`python -u -c`, torchrun's variables, OMP_NUM_THREADS=1) forks from a `rank` server, which never
    imported torch._dynamo (tests/warm/server.py says why); the two ranks of a repeat come from two servers."""
    before = _forks(tmp_path)
    rank = {"TORCHELASTIC_RUN_ID": "none", "OMP_NUM_THREADS": "1", "LOCAL_WORLD_SIZE": "2"}
    probes = [_probe(tmp_path, flags=("-u",), RANK=str(r), LOCAL_RANK=str(r), **rank)[1] for r in range(2)]
    assert _forks(tmp_path) == before + 2
    assert [(p["dynamo"], p["write_through"], p["threads"]) for p in probes] == [(False, True, 1)] * 2
    assert probes[0]["hash"] != probes[1]["hash"]
    assert probes[0]["argv"] == [str(tmp_path / "probe.py"), "an-arg"]
    _, plain = _probe(tmp_path)
    assert plain["dynamo"] is True


@pytest.mark.process
@pytest.mark.parametrize("pins", [(), ("address-layout",)])
def test_what_a_fork_cannot_run_faithfully_runs_in_a_real_interpreter(tmp_path: Path, pins: tuple[str, ...]) -> None:
    # a startup variable that differs from the server's (the hash-seed pin), or a pin that re-executes the child
    env = {"PYTHONHASHSEED": "123"} if not pins else {}
    proc = _client(tmp_path, env, pins)
    out, _ = proc.communicate(timeout=120)
    probe = json.loads(out)
    fresh = subprocess.run([sys.executable, "-c", "print(hash('probe'))"], env={**os.environ, **env},
                           capture_output=True, text=True, check=True)
    if env:
        assert probe["hash"] == int(fresh.stdout)  # the seed took effect: python started with it
    else:
        _, fork = _probe(tmp_path)
        assert probe["hash"] != fork["hash"]  # not the server's hash seed


ENDING = """import atexit, sys, threading, time
def late():
    time.sleep(0.3)
    print("thread joined", flush=True)
threading.Thread(target=late).start()
atexit.register(lambda: print("atexit ran"))
print("buffered", end=" ")
sys.exit(sys.argv[1] if sys.argv[1:] else None)
"""


@pytest.mark.process
@pytest.mark.parametrize("argument,status", [((), 0), (("a message",), 1)])
def test_a_fork_ends_as_python_does_threads_joined_exit_handlers_run_output_flushed(
        tmp_path: Path, argument: tuple[str, ...], status: int) -> None:
    # the fork skips only python's module teardown (server.exit_like_python): what a script sees of its exit stays
    script, config = tmp_path / "ending.py", tmp_path / "config.json"
    script.write_text(ENDING)
    config.write_text(json.dumps({"pins": [], "repeat": 0}))
    command = [sys.executable, "-c", BOOT, "root", str(config), str(script), *argument]
    warm = subprocess.run(_through_client(command),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    real = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (warm.returncode, warm.stdout, warm.stderr) == (real.returncode, real.stdout, real.stderr)
    assert warm.returncode == status
    assert warm.stdout == "buffered thread joined\natexit ran\n"
    assert warm.stderr == "".join(f"{a}\n" for a in argument)


@pytest.mark.process
@pytest.mark.parametrize("error", ["ValueError('boom')", "KeyboardInterrupt('boom')"])
def test_an_uncaught_exception_ends_a_fork_as_it_ends_python(tmp_path: Path, error: str) -> None:
    """Printed, then exit status 1; a KeyboardInterrupt kills the process with SIGINT, as python does. The
    command is a script (`python SCRIPT`), as the CLI's is."""
    script = tmp_path / "raising.py"
    script.write_text(f"import atexit\natexit.register(lambda: print('atexit ran'))\nraise {error}\n")
    command = [sys.executable, str(script)]
    warm = subprocess.run(_through_client(command), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    real = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (warm.returncode, warm.stdout) == (real.returncode, real.stdout)
    assert warm.returncode == (1 if error.startswith("Value") else -signal.SIGINT)
    assert warm.stdout == "atexit ran\n"
    last = f"{error.split('(')[0]}: boom\n"
    assert warm.stderr.endswith(last)
    assert real.stderr.endswith(last)


@pytest.mark.process
def test_a_signal_to_the_client_reaches_the_fork_and_the_client_ends_as_the_fork_did(tmp_path: Path) -> None:
    proc = _client(tmp_path, {"PROBE_SLEEP": "60"})
    assert proc.stdout is not None
    fork = json.loads(proc.stdout.readline())["pid"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{fork}").exists():
        time.sleep(0.1)
    assert not Path(f"/proc/{fork}").exists()


@pytest.mark.process
def test_a_server_ends_when_the_test_process_that_started_it_is_gone(tmp_path: Path) -> None:
    """A test process of its own (`-n 0`) killed mid-run never reaches the session's end, where its servers are
    stopped: its end of each server's stdin closes instead, and the server ends with it."""
    server = subprocess.Popen([sys.executable, str(WARM / "server.py"), str(tmp_path / "sock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert server.stdout is not None
    assert server.stdout.readline() == "ready\n"
    assert server.stdin is not None
    server.stdin.close()
    assert server.wait(timeout=60) == 0
    assert not (tmp_path / "sock").exists()


@pytest.mark.process
def test_a_server_the_workers_share_ends_when_their_controller_is_gone(tmp_path: Path) -> None:
    """xdist's workers share one pool (conftest.WarmServers): its servers outlive the worker that started them,
    which may finish first, and end with the controller (`--owner`, the workers' parent)."""
    controller = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    socket = tmp_path / "plain-0"  # the server a plain script goes to (tests/warm/pool.py)
    server = subprocess.Popen([sys.executable, str(WARM / "server.py"), str(socket), "--cli",
                               "--owner", str(controller.pid)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert server.stdout is not None
    assert server.stdout.readline() == "ready\n"
    script = tmp_path / "hello.py"
    script.write_text("import os; print('served by', os.getppid())\n")
    served = subprocess.run([sys.executable, "-I", "-S", str(WARM / "client.py"), str(tmp_path), sys.executable,
                             str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # forked by the server, whose stdin (no test process's) was at end of file from the start
    assert served.stdout == f"served by {server.pid}\n", served.stderr
    assert controller.stdin is not None
    controller.stdin.close()
    controller.wait(timeout=60)
    assert server.wait(timeout=60) == 0
    assert not socket.exists()
