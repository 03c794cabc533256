"""Seeded fuzzing of everything detaudit reads back from disk: traces, run.json, explain.json.

Each case mutates a realistic run directory (divergent, with evidence events of every kind, stored
experiments) and runs the real entry point (`report`, `compare`, `show`) in-process. Whatever the
mutation, detaudit must answer with a verdict or a one-line error: an exit code from its table
for what a run directory can say (0 deterministic, 1 divergent, 3 failed, 4 unreadable/corrupt,
5 timed out, 6 inconclusive) — never an internal error (70), a usage error for a file that exists,
a traceback, unbounded memory or a hang. A fixed seed and budget keep it reproducible.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import signal
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from synthetic import Rec, training_records, write_run, write_trace

from detaudit.cli.commands import main
from detaudit.trace import MAGIC

VERDICT_CODES = {0, 1, 3, 4, 5, 6}
CASES = 60  # per reader; about 10 s in all on the 2-core VM
MEMORY_LIMIT = 150 << 20
CASE_SECONDS = 20

EVENTS: list[tuple[int, dict[str, Any]]] = [
    (0, {"type": "hash", "PYTHONHASHSEED": None, "randomization": 1, "probe": -348284926241805,
         "aslr_disabled": False}),
    (0, {"type": "environment", "python": "3.11.7", "torch": "2.13.0+cpu", "numpy": "2.4.6", "cuda": None,
         "cudnn": None, "driver": None, "cpu": "AMD EPYC", "machine": "x86_64", "os": "Linux 6",
         "device_request": "cpu", "device": "cpu", "env": {}}),
    (0, {"type": "state", "when": "import", "rng": {"torch": {"digest": "04fdcde06a8fa8c6", "drawn": False,
                                                              "initial_seed": 81864357}},
         "flags": {"cudnn.benchmark": False, "matmul.allow_tf32": False, "float32_matmul_precision": "highest",
                   "deterministic_algorithms": False, "num_threads": 2, "CUBLAS_WORKSPACE_CONFIG": None}}),
    (0, {"type": "seed", "lib": "numpy", "fn": "np.random.seed", "value": 1, "loc": "train.py:7", "library": False,
         "drawn_before": False, "state": "bbe1102be70d0dde", "pinned": None}),
    (0, {"type": "draw", "lib": "torch", "fn": "torch.randn", "loc": "train.py:9", "generator": "global"}),
    (0, {"type": "generator", "lib": "numpy", "fn": "np.random.default_rng", "seeded": False, "value": None,
         "loc": "train.py:8", "library": False, "state": "358b635d2b213d24", "pinned": None}),
    (0, {"type": "empty", "fn": "torch.empty", "loc": "train.py:10", "shape": [2], "dtype": "float32",
         "device": "cpu", "digest": "04f9a147d84e5ce2", "pinned": False}),
    (0, {"type": "modules", "root": "Net", "device": "cpu", "listed": [{"module": "net.0", "class": "EmbeddingBag",
                                                                       "entry": "EmbeddingBag backward"}],
         "matmul": [{"module": "net.0", "class": "Linear"}]}),
    (1, {"type": "op", "op": "index_add_", "device": "cpu", "entry": "index_add_", "phase": "forward",
         "loc": "train.py:12", "threads": 2, "deterministic": False}),
    (1, {"type": "dataloader", "loc": "train.py:5", "num_workers": 2, "worker_init_fn": None, "generator": False,
         "sampler": "RandomSampler"}),
    (2, {"type": "concurrency", "what": "threading.Thread.start", "loc": "train.py:13", "target": "work"}),
    (2, {"type": "call", "fn": "torch.set_num_threads", "value": 1, "loc": "train.py:14"}),
    (3, {"type": "state", "when": "first-step", "rng": {"numpy": {"digest": "613f2a2325e04de6", "drawn": True}},
         "flags": {"num_threads": 1}}),
]


def base_run(root: Path) -> Path:
    """A divergent run with evidence in every trace and one stored --explain experiment."""
    recs = training_records(steps=2)
    other = [*recs[:3], recs[3].but(digest=12345, samples=(9.0, 1.0, 2.0, 3.0)), *recs[4:]]
    run_dir = write_run(root / "run", [recs, other])
    for i, rs in enumerate((recs, other)):
        path = run_dir / f"repeat-{i}.trace"
        path.unlink()
        write_trace(path, rs, {"exit_code": 0, "error": None, "duration_s": 1.0}, events=EVENTS,
                    header={"repeat": i, "device_request": "cpu", "granularity": "module"})
    experiment = {"pin": "numpy-rng", "description": "the NumPy RNG", "verdict": "deterministic",
                  "first_divergence_index": None, "note": "", "prefix": "explain-numpy-rng",
                  "results": json.loads((run_dir / "run.json").read_text())["results"]}
    (run_dir / "explain.json").write_text(json.dumps({"format": "detaudit-explain", "version": 1,
                                                      "experiments": [experiment]}))
    return run_dir


# -- mutations -----------------------------------------------------------------------------------------
def odd_value(rng: random.Random) -> Any:
    """A JSON value of a random (usually wrong) type."""
    return rng.choice([None, True, -1, 0, 2**70, 1.5, float("nan"), "", "x" * 1000, "../../etc/passwd",
                       "/dev/zero", [], [1, "a"], {}, {"a": {"b": []}}, "\x1b]52;c;aGk=\x07"])


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths_of(item, (*prefix, i))


def mutate_json(value: Any, rng: random.Random) -> str:
    """A structure-aware mutation: a field of another type, a deleted field, or deep nesting."""
    value = copy.deepcopy(value)
    choice = rng.random()
    if choice < 0.08:
        return deep(rng.choice([1000, 100_000]))
    targets = [p for p in paths_of(value) if p]
    if not targets:
        return json.dumps(odd_value(rng))
    path = rng.choice(targets)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if choice < 0.25 and isinstance(parent, dict):
        del parent[path[-1]]
    elif choice < 0.35 and isinstance(parent, dict):  # a key this release does not know
        parent["added_by_a_newer_release"] = odd_value(rng)
    elif choice < 0.4 and isinstance(parent[path[-1]], dict):
        parent[path[-1]]["added_by_a_newer_release"] = odd_value(rng)
    else:
        parent[path[-1]] = odd_value(rng)
    return json.dumps(value)


def frames(data: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], len(MAGIC)
    while pos + 5 <= len(data):
        tag, length = struct.unpack_from("<cI", data, pos)
        out.append((tag, data[pos + 5:pos + 5 + length]))
        pos += 5 + length
    return out


def join(parts: list[tuple[bytes, bytes]]) -> bytes:
    return MAGIC + b"".join(struct.pack("<cI", tag, len(payload)) + payload for tag, payload in parts)


def mutate_trace(data: bytes, rng: random.Random) -> bytes:
    parts = frames(data)
    choice = rng.random()
    if choice < 0.45:  # a JSON frame (header, strings, event, footer) with a field of another type
        json_frames = [i for i, (tag, _) in enumerate(parts) if tag in b"HSEF"]
        i = rng.choice(json_frames)
        parts[i] = (parts[i][0], mutate_json(json.loads(parts[i][1]), rng).encode())
        return join(parts)
    if choice < 0.6:  # bit flips anywhere
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return bytes(buf)
    if choice < 0.7:  # cut anywhere
        return data[:rng.randrange(len(data))]
    if choice < 0.8:  # a frame's length field lies
        buf = bytearray(data)
        at = len(MAGIC) + 1
        struct.pack_into("<I", buf, at, rng.choice([0, 1, 2**30, 2**32 - 1, len(data) * 3]))
        return bytes(buf)
    if choice < 0.9:  # frames duplicated, reordered or dropped
        i = rng.randrange(1, len(parts)) if len(parts) > 1 else 0
        op = rng.choice(["dup", "drop", "swap"])
        if op == "dup":
            parts.insert(i, parts[i])
        elif op == "drop":
            del parts[i]
        else:
            parts[0], parts[i] = parts[i], parts[0]
        return join(parts)
    # a record frame whose string ids point past the table
    record_frames = [i for i, (tag, _) in enumerate(parts) if tag == b"R"]
    i = rng.choice(record_frames)
    buf = bytearray(parts[i][1])
    struct.pack_into("<I", buf, 4, rng.choice([10**6, 2**32 - 1]))
    parts[i] = (b"R", bytes(buf))
    return join(parts)


# -- the harness --------------------------------------------------------------------------------------
class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, int]:
    """(exit code, stderr, peak traced memory) of one in-process CLI call, under a time limit."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    tracemalloc.start()
    code: object = 0
    try:
        main(args)
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    err = capsys.readouterr().err
    return code if isinstance(code, int) else -1, err, peak


def check(args: list[str], capsys: pytest.CaptureFixture[str], what: str) -> int:
    code, err, peak = run_main(args, capsys)
    assert code in VERDICT_CODES, f"{what}: exit {code}\n{err}"
    assert "Traceback" not in err, f"{what}\n{err}"
    assert "internal error" not in err, f"{what}\n{err}"
    assert peak < MEMORY_LIMIT, f"{what}: {peak >> 20} MB"
    return code


def fuzz(tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int, target: str,
         mutate: Callable[[bytes, random.Random], bytes], commands: Callable[[Path], list[list[str]]]) -> set[int]:
    rng = random.Random(seed)
    base = base_run(tmp_path / "base")
    original = (base / target).read_bytes()
    seen: set[int] = set()
    for case in range(CASES):
        run_dir = tmp_path / f"case{case}"
        shutil.copytree(base, run_dir)
        (run_dir / target).write_bytes(mutate(original, rng))
        for args in commands(run_dir):
            seen.add(check(args, capsys, f"seed {seed} case {case}: {' '.join(args)}"))
        shutil.rmtree(run_dir)
    return seen


def test_the_unmutated_run_reads_as_divergent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = base_run(tmp_path)
    assert check(["report", str(run_dir)], capsys, "base") == 1


@pytest.mark.slow
def test_fuzz_trace_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seen = fuzz(tmp_path, capsys, 1, "repeat-1.trace", mutate_trace, lambda d: [
        ["report", str(d)], ["compare", str(d / "repeat-0.trace"), str(d / "repeat-1.trace")],
        ["show", str(d / "repeat-1.trace"), "--limit", "3"]])
    assert 4 in seen
    assert 1 in seen


@pytest.mark.slow
def test_fuzz_run_record_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def mutate(data: bytes, rng: random.Random) -> bytes:
        return mutate_json(json.loads(data), rng).encode()

    seen = fuzz(tmp_path, capsys, 2, "run.json", mutate,
                lambda d: [["report", str(d)], ["compare", str(d), str(d.parent / "base")]])
    assert 4 in seen


@pytest.mark.slow
def test_fuzz_explain_record_reader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def mutate(data: bytes, rng: random.Random) -> bytes:
        return mutate_json(json.loads(data), rng).encode()

    seen = fuzz(tmp_path, capsys, 3, "explain.json", mutate, lambda d: [["report", str(d)]])
    assert 4 in seen


def test_a_huge_string_table_is_refused_not_loaded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace naming millions of strings (the probe's 35 MB, 3 M strings) stays within bounded memory."""
    path = write_trace(tmp_path / "a.trace", [Rec("x", 1)], {"exit_code": 0})
    data = path.read_bytes()
    table = json.dumps([f"s{i}" for i in range(1_100_000)]).encode()
    parts = frames(data)
    parts.insert(1, (b"S", table))
    big = tmp_path / "big.trace"
    big.write_bytes(join(parts))
    code, err, peak = run_main(["compare", str(path), str(big)], capsys)
    assert code == 4
    assert "distinct strings" in err
