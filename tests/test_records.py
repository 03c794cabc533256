"""The run directory's records as types (detaudit/records.py): the round trip, the errors that name
the file and the key, and a static check that no module outside the reader handles them as dicts."""

from __future__ import annotations

import ast
import dataclasses
import json
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from detaudit import records
from detaudit.errors import TraceError
from detaudit.records import (
    BaselineManifest,
    ExplainRecord,
    Host,
    Narrowing,
    Reference,
    RunRecord,
    StoredExperiment,
)
from detaudit.report import baseline
from detaudit.results import Experiment, RepeatResult, SelfCheck, Tolerance
from detaudit.run import rundir

PACKAGE = Path(records.__file__).parent
# the modules that open the record files and turn their JSON into the types (and back)
READERS = {PACKAGE / "records.py", PACKAGE / "run" / "rundir.py", PACKAGE / "report" / "baseline.py"}
RECORD_TYPES = (RunRecord, Narrowing, Host, ExplainRecord, StoredExperiment, BaselineManifest, Reference)


def _result(i: int) -> RepeatResult:
    return RepeatResult(i, "cpu", 0, 1.5, False, f"repeat-{i}.trace", f"repeat-{i}.stdout", f"repeat-{i}.stderr", "ab")


FULL = RunRecord(
    script="train.py", script_args=("--epochs", "1"), cwd="/work", repeats=2, devices=("cpu",), granularity="auto",
    timeout=30.0, tolerance=Tolerance(0.1, 0.2), env={"A": "1"}, stdout="masked", module=None, max_steps=3,
    baseline="/b", results=(_result(0), _result(1)), nproc_per_node=2, torchrun_args=("--nnodes", "1"),
    environment=Host("0.1.0", "3.11.7", "Linux", "x86_64", 8), started=1.5, interrupted=True,
    narrowing=Narrowing((_result(0),), [1, 2]), self_check=SelfCheck(4, 1, "fc.weight", 4),
)


def test_a_run_record_round_trips_and_keeps_the_key_order_it_always_had() -> None:
    data = json.loads(json.dumps(FULL.to_dict()))
    assert RunRecord.from_dict(data, "run.json") == FULL
    assert list(data) == ["format", "version", "script", "script_args", "args_redacted", "cwd", "repeats", "devices",
                          "granularity", "timeout", "tolerance", "env", "own_device", "stdout", "module",
                          "max_steps", "max_time", "baseline", "results", "nproc_per_node", "torchrun_args",
                          "environment", "started", "interrupted", "narrowing", "self_check"]
    # a single-process run, finished and not narrowed, writes none of the optional keys
    plain = dataclasses.replace(FULL, nproc_per_node=None, torchrun_args=(), interrupted=False, narrowing=None,
                                self_check=None).to_dict()
    assert list(plain)[-3:] == ["results", "environment", "started"]


@pytest.mark.parametrize("check", [SelfCheck(None, None, None, None, "no recorded tensor could carry the change"),
                                   SelfCheck(4, 1, "fc.weight", None, "the control repeat left no trace"),
                                   SelfCheck(4, 1, "fc.weight", None)])
def test_a_self_check_round_trips_made_or_not(check: SelfCheck) -> None:
    data = json.loads(json.dumps(dataclasses.replace(FULL, self_check=check).to_dict()))
    assert RunRecord.from_dict(data, "run.json").self_check == check


def test_a_minimal_record_reads_with_the_defaults_its_missing_keys_mean() -> None:
    record = RunRecord.from_dict({"format": "detaudit-run", "version": 1, "script": "t.py"}, "run.json")
    assert record == RunRecord("t.py")
    assert record.tolerance == Tolerance()
    assert record.results is None
    assert record.environment == Host()


@pytest.mark.parametrize("change, message", [
    ({"version": 2}, r"run\.json: run record version 2 is not supported"),
    ({"version": True}, r"run\.json: run record version True is not supported"),  # not 1, though `True == 1`
    ({"version": 1.0}, r"run\.json: run record version 1\.0 is not supported"),
    ({"format": "other"}, r"run\.json: not a detaudit run record"),
    ({"script": None}, r"run\.json: field `script` must be a string, not NoneType"),
    ({"devices": "cpu"}, r"field `devices` must be a list of a string"),
    ({"narrowing": {"results": [], "window": [1, "2"]}}, r"field `narrowing\.window\[1\]` must be an integer"),
    ({"narrowing": {"window": [1, 2]}}, r"field `narrowing\.results` is missing"),
    ({"self_check": {"record": 1, "step": 0, "name": "x", "detected_at": "no"}},
     r"field `self_check\.detected_at` must be an integer"),
    ({"environment": {"cpu_count": "8"}}, r"field `environment\.cpu_count` must be an integer"),
    ({"tolerance": {"atol": "1"}}, r"field `tolerance\.atol` must be a finite number"),
    ({"results": [{**_result(0).to_dict(), "stderr": "../x"}]},
     r"field `results\[0\]\.stderr` must name a file inside the run directory"),
])
def test_a_wrong_field_names_the_file_and_the_key(change: dict[str, object], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        RunRecord.from_dict({**FULL.to_dict(), **change}, "run.json")


def test_the_experiments_file_round_trips_and_refuses_a_verdict_it_does_not_know() -> None:
    stored = ExplainRecord((StoredExperiment(Experiment("hash-seed", "d", "divergent", 3, "moved"), "explain-hash-seed",
                                             (_result(0),)),
                            StoredExperiment(Experiment("cudnn", "c", "skipped", None))))
    data = json.loads(json.dumps(stored.to_dict()))
    assert ExplainRecord.from_dict(data, "explain.json") == stored
    data["experiments"][1]["verdict"] = "maybe"
    with pytest.raises(TraceError, match=r"explain\.json: field `experiments\[1\]\.verdict` must be one of"):
        ExplainRecord.from_dict(data, "explain.json")


def test_a_baseline_manifest_round_trips_and_names_a_missing_key() -> None:
    manifest = BaselineManifest("t.py", ("--x",), "module", Reference("reference.trace", "00", "cpu", 0, "ab", 12),
                                {"torch": "2.13", "num_threads": 4, "$OMP_NUM_THREADS": None}, "0.1.0", "now")
    data = json.loads(json.dumps(manifest.to_dict()))
    assert BaselineManifest.from_dict(data, "baseline.json") == manifest
    del data["reference"]["sha256"]
    with pytest.raises(TraceError, match=r"baseline\.json: field `reference\.sha256` is missing"):
        BaselineManifest.from_dict(data, "baseline.json")


@pytest.mark.parametrize("change, message", [
    ({"reference": {"trace": "t", "sha256": "00", "device": "cpu", "exit_code": 0, "stdout_digest": "ab",
                    "records": -1}}, r"baseline\.json: field `reference\.records` must be an integer >= 0"),
    ({"environment": {"num_threads": float("nan")}}, r"field `environment\.num_threads` must be a string or"),
    ({"script_args": None}, r"baseline\.json: field `script_args` must be a list, not None"),
])
def test_a_baseline_manifest_refuses_a_value_its_fields_do_not_allow(change: dict[str, object], message: str) -> None:
    manifest = BaselineManifest("t.py", (), "module", Reference("reference.trace", "00", "cpu", 0, "ab", 12), {})
    with pytest.raises(TraceError, match=message):
        BaselineManifest.from_dict({**manifest.to_dict(), **change}, "baseline.json")


def test_the_readers_hand_out_types_not_dicts() -> None:
    assert typing.get_type_hints(rundir.read_run)["return"] == tuple[RunRecord, list[RepeatResult]]
    assert typing.get_type_hints(rundir.read_experiments)["return"] == list[StoredExperiment]
    assert typing.get_type_hints(baseline.load)["return"] is baseline.Baseline
    assert all(dataclasses.is_dataclass(t) and t.__dataclass_params__.frozen for t in RECORD_TYPES)  # type: ignore[attr-defined]


# -- nothing outside the readers handles a record as a dict ------------------------------------------------


def _record_keys() -> frozenset[str]:
    """Every key the three files hold, from the records' own `to_dict` (not a list kept by hand)."""
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            found.update(value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(dataclasses.replace(FULL, ignore_stdout=True).to_dict())
    walk(ExplainRecord((StoredExperiment(Experiment("p", "d", "skipped", None), "x", ()),)).to_dict())
    walk(BaselineManifest("s", (), "g", Reference("t", "h", "d", 0, "x", 1), {}).to_dict())
    return frozenset(found)


FILES = {rundir.RUN_FILE, rundir.EXPLAIN_FILE, baseline.MANIFEST}
FILE_CONSTANTS = {"RUN_FILE", "EXPLAIN_FILE", "MANIFEST"}


def _raw(node: ast.AST) -> bool:
    """A call that gives a record's JSON: the records' reader, a record's `to_dict()`, or JSON parsed from
    one of their files."""
    if not isinstance(node, ast.Call):
        return False
    name = _called(node)
    if name == "read_json_record" or name == "to_dict" and not node.args:
        return True
    return name in ("load", "loads", "load_json") and any(
        isinstance(n, ast.Constant) and n.value in FILES or isinstance(n, ast.Name) and n.id in FILE_CONSTANTS
        or isinstance(n, ast.Attribute) and n.attr in FILE_CONSTANTS for n in ast.walk(node))


def _record_names(trees: dict[Path, ast.Module]) -> frozenset[str]:
    """The names the code gives a record: parameters annotated with a record type, and names bound to a
    record made or read (`RunRecord(...)`, `BaselineManifest.from_dict(...)`)."""
    types = {t.__name__ for t in RECORD_TYPES}

    def mentions_type(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in types or isinstance(n, ast.Constant) and n.value in types
                   for n in ast.walk(node))

    names = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.annotation is not None and mentions_type(node.annotation):
                names.add(node.arg)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and mentions_type(node.value.func):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(names)


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return None


def _keyed(node: ast.AST) -> tuple[ast.AST, str] | None:
    """(receiver, key) of `x["key"]` or `x.get("key", ...)` (also pop/setdefault)."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.value, node.slice.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in ("get", "pop", "setdefault") and node.args and \
            isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.func.value, node.args[0].value
    return None


def dict_uses(tree: ast.Module, keys: frozenset[str], names: frozenset[str]) -> Iterator[tuple[int, str]]:
    """Places that index a run record (or its JSON) as a dict: a record key looked up on a name the code
    gives records, on a call that returns a record's raw JSON, or on a name bound to one."""
    raw: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _raw(node.value):
            raw.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        found = _keyed(node)
        if found is None or found[1] not in keys:
            continue
        receiver, key = found
        root = receiver
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if _raw(receiver) or isinstance(root, ast.Name) and (root.id in names or root.id in raw):
            yield node.lineno, ast.unparse(node)


def _modules() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_outside_the_readers_indexes_a_record_as_a_dict() -> None:
    trees = _modules()
    keys, names = _record_keys(), _record_names(trees)
    assert {"record", "manifest", "stored"} <= names  # the check knows what the code calls them
    found = [f"{p.relative_to(PACKAGE.parent)}:{line}: {text}" for p, tree in trees.items() if p not in READERS
             for line, text in dict_uses(tree, keys, names)]
    assert not found, "index the record's fields, not its JSON:\n" + "\n".join(found)


@pytest.mark.parametrize("code", [
    'def f(record: RunRecord):\n    return record.get("nproc_per_node")',
    'def f(record: "RunRecord"):\n    return record["script_args"][0]',
    'data = json.loads((run_dir / "explain.json").read_text())\ndata["experiments"]',
    'json.loads((run_dir / rundir.RUN_FILE).read_text())["cwd"]',
    'rundir.read_json_record(path, "x")["results"]',
    'x = record.to_dict()\nx["narrowing"]',
])
def test_the_check_catches_a_record_indexed_as_a_dict(code: str) -> None:
    tree = ast.parse(code)
    assert list(dict_uses(tree, _record_keys(), _record_names({Path("x"): tree}) | {"record"}))


def test_the_check_leaves_other_dicts_alone() -> None:
    code = ('def f(record: RunRecord, header: dict):\n    report = json.loads(text)\n'
            '    return header.get("granularity"), record.granularity, report["baseline"], report_json(r)["results"]')
    tree = ast.parse(code)
    assert not list(dict_uses(tree, _record_keys(), _record_names({Path("x"): tree})))
