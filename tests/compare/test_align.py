"""The lockstep aligner (detaudit/compare/align.py): blocks, shared string ids, structure, record naming."""

from __future__ import annotations

import ast
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import detaudit
from detaudit.compare.align import Aligner, StringTable, describe, reference_pairs
from detaudit.errors import TraceError
from detaudit.trace import RECORD_DTYPE, Flag, Kind, Record, RecordStream, TraceWriter

# (kind, step, name, shape) per record: a small alphabet, so traces often agree and sometimes do not
NAMES = ("net.0", "net.1", "net.0.weight", "aten.mm.default", "head")
SHAPES = ("4", "4x4", "scalar")
KINDS = (Kind.OUTPUT, Kind.GRAD, Kind.OP)
Entry = tuple[Kind, int, str, str]
entries = st.tuples(st.sampled_from(KINDS), st.integers(0, 2), st.sampled_from(NAMES), st.sampled_from(SHAPES))


def write(path: Path, recs: list[Entry], interned_first: Sequence[str] = (), footer: bool = True) -> Path:
    """A trace of `recs`; `interned_first` are interned before any record, so each trace's local string
    ids differ from the others' for the same texts."""
    writer = TraceWriter(path, {"repeat": 0})
    for text in interned_first:
        writer.intern(text)
    for i, (kind, step, name, shape) in enumerate(recs):
        writer.add(Record(int(kind), 1, 0, 0, writer.intern(name), 0, writer.intern("train.py:1"), step,
                          writer.intern(shape), 0, i, 0, 0, (0.0,) * 4))
    if footer:
        writer.close({"exit_code": 0})
    else:
        writer.abandon()
    return path


def streams(tmp: Path, traces: list[list[Entry]], orders: list[list[str]] | None = None) -> list[RecordStream]:
    orders = orders or [[] for _ in traces]
    return [RecordStream(write(tmp / f"t{i}.trace", recs, orders[i])) for i, recs in enumerate(traces)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(traces=st.lists(st.lists(entries, max_size=25), min_size=1, max_size=4),
       chunk=st.sampled_from([1, 2, 3, 5, 64]), data=st.data())
def test_property_the_walk_covers_the_common_prefix_in_bounded_blocks(
        traces: list[list[Entry]], chunk: int, data: st.DataObject) -> None:
    orders = [data.draw(st.permutations(NAMES + SHAPES)) for _ in traces]
    with tempfile.TemporaryDirectory() as tmp:
        aligner = Aligner(streams(Path(tmp), traces, orders), chunk=chunk)
        common = min(len(t) for t in traces)
        covered, ended = 0, False
        for block in aligner:
            assert not ended  # past a trace's end the traces no longer line up: no block there
            ended = block.n < block.longest or block.n < chunk
            assert block.base == covered  # blocks follow each other without gaps
            assert all(len(c) <= chunk for c in block.chunks)  # memory: one chunk per trace at a time
            for c in block.chunks:  # every trace's records at the same indices
                assert c["digest"][:block.n].tolist() == list(range(covered, covered + block.n))
            for ref in range(len(traces)):
                for rep in range(len(traces)):
                    expected = [traces[ref][k] == traces[rep][k] for k in range(covered, covered + block.n)]
                    assert block.same_structure(ref, rep).tolist() == expected
            covered += block.n
        assert covered == common  # the walk stops where the shortest trace ends, never earlier
        assert aligner.finish() == [len(t) for t in traces]  # the rest is counted
        assert all(s.footer is not None for s in aligner.streams)  # and read to the end


def test_the_same_text_gets_one_shared_id_whatever_each_trace_numbered_it() -> None:
    table = StringTable()
    a = table.mapping(0, ["", "x", "y"])
    b = table.mapping(1, ["", "y", "z", "x"])
    assert table.texts[a[1]] == table.texts[b[3]] == "x"
    assert a[1] == b[3]
    assert a[2] == b[1]
    assert a[0] == b[0] == 0
    grown = table.mapping(0, ["", "x", "y", "z"])  # a trace's table grows as its frames are read
    assert grown[:3].tolist() == a.tolist()
    assert grown[3] == b[2]


def test_a_trace_that_ends_early_ends_the_walk_after_its_last_block(tmp_path: Path) -> None:
    long = [(Kind.OUTPUT, 0, "net.0", "4")] * 10
    aligner = Aligner(streams(tmp_path, [long, long[:4]]), chunk=3)
    blocks = [(b.base, b.n, b.longest) for b in aligner]
    assert blocks == [(0, 3, 3), (3, 1, 3)]
    assert aligner.finish() == [10, 4]


def test_empty_traces_give_no_block(tmp_path: Path) -> None:
    aligner = Aligner(streams(tmp_path, [[], []]))
    assert list(aligner) == []
    assert aligner.finish() == [0, 0]


def test_a_record_naming_a_string_never_written_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.trace"
    writer = TraceWriter(path, {"repeat": 0})
    writer.add(Record(int(Kind.OUTPUT), 1, 0, 0, 99, 0, 0, 0, 0, 0, 1, 0, 0, (0.0,) * 4))
    writer.close({"exit_code": 0})
    with pytest.raises(TraceError, match="never written"):
        list(Aligner([RecordStream(path)]))


def test_describe_names_a_record_in_words(tmp_path: Path) -> None:
    path = tmp_path / "op.trace"
    writer = TraceWriter(path, {"repeat": 0})
    writer.add(Record(int(Kind.OP), 1, int(Flag.BACKWARD | Flag.RANDOM), 0, writer.intern("aten.mm.default"),
                      writer.intern("net.0"), writer.intern("train.py:7"), 2, writer.intern("4x4"),
                      writer.intern("MmBackward0"), 5, 0, 0, (0.0,) * 4))
    writer.add(Record(200, 1, 0, 0, writer.intern("x"), 0, 0, 0, 0, 0, 6, 0, 0, (0.0,) * 4))  # a future kind
    writer.close({"exit_code": 0})
    stream = RecordStream(path)
    rows = stream.take(2)
    op = describe(stream, rows[0], 7)
    assert (op.index, op.kind, op.op, op.node, op.module, op.location, op.step, op.shape, op.dtype) == \
        (7, "op", "aten.mm.default", "MmBackward0", "net.0", "train.py:7", 2, "4x4", "float32")
    assert op.phase == "backward"
    assert op.random
    assert op.backward
    other = describe(stream, rows[1], 8)
    assert other.kind == "?"
    assert other.op == ""
    assert other.phase is None


def test_reference_pairs_bitwise_within_a_device_tolerance_across() -> None:
    assert reference_pairs(["cpu", "cpu", "cuda", "cuda", "cpu"]) == \
        [(0, 1, True), (0, 2, False), (2, 3, True), (0, 4, True)]


def test_record_fields_are_the_trace_format_fields() -> None:
    assert Record._fields == RECORD_DTYPE.names
    row = np.zeros(1, dtype=RECORD_DTYPE)[0]
    assert all(name in row.dtype.names for name in Record._fields)


def _imports(module: str) -> set[str]:
    tree = ast.parse((Path(detaudit.__file__).parent / "compare" / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_compare_and_oprules_do_not_import_each_other() -> None:
    """Data flows one way: align <- compare, align <- oprules; neither stage knows the other."""
    assert "detaudit.compare.oprules" not in _imports("traces")
    assert "detaudit.compare.traces" not in _imports("oprules")
    assert not {"detaudit.compare.traces", "detaudit.compare.oprules"} & _imports("align")
