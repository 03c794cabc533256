"""trace/strip.py: an op-windowed repeat's trace without its op records is the module-level trace the same
repeat would have written: the same records, its evidence at the same records, its footer's count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic import Rec, training_records, write_trace

from detaudit.errors import TraceError
from detaudit.trace import Kind, read_trace
from detaudit.trace.strip import strip_ops

PER_STEP = len(training_records(steps=1))


def _with_ops(records: list[Rec], window: tuple[int, int]) -> list[Rec]:
    """`records` with two op records before each record of a step in `window` (as a TorchDispatchMode adds)."""
    out: list[Rec] = []
    for i, r in enumerate(records):
        if window[0] <= r.step <= window[1]:
            out += [Rec(f"aten.mm.default#{i}", digest=90_000 + i, step=r.step, kind=Kind.OP, loc="train.py:20"),
                    Rec(f"aten.relu.default#{i}", digest=91_000 + i, step=r.step, kind=Kind.OP)]
        out.append(r)
    return out


def _events_at(records: list[Rec], indices: list[int]) -> list[tuple[int, dict]]:
    return [(i, {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": n, "loc": "train.py:3"})
            for n, i in enumerate(indices)]


@pytest.mark.parametrize("footer", [{"exit_code": 0, "stopped_at_step": 5}, None])
def test_a_trace_without_its_op_records_is_the_module_level_trace_of_the_same_run(tmp_path: Path,
                                                                                   footer: dict | None) -> None:
    module = training_records(steps=6)
    mixed = _with_ops(module, (2, 3))
    # evidence before, inside and after the window: the module trace has it at the same records
    module_at = [0, 2 * PER_STEP + 1, 3 * PER_STEP, 5 * PER_STEP]
    mixed_at = [mixed.index(module[i]) for i in module_at]
    header = {"repeat": 2, "granularity": "op", "op_window": [2, 3]}
    src = write_trace(tmp_path / "ops-2.trace", mixed, footer, events=_events_at(mixed, mixed_at), header=header,
                      flush_every=PER_STEP)
    expected = write_trace(tmp_path / "module.trace", module, footer, events=_events_at(module, module_at),
                           header={**header, "granularity": "module", "op_window": None}, flush_every=PER_STEP)
    strip_ops(src, tmp_path / "repeat-2.trace", {"granularity": "module", "op_window": None})

    got, want, whole = (read_trace(tmp_path / "repeat-2.trace"), read_trace(expected), read_trace(src))
    assert got.header == want.header
    names = [got.text(int(n)) for n in got.records["name"]]
    assert names == [r.name for r in module]  # the module records, in order (string ids may differ)
    for column in ("kind", "step", "digest", "samples"):
        assert np.array_equal(got.records[column], want.records[column])
    assert [e["at"] for e in got.events] == module_at
    assert [e["value"] for e in got.events] == [0, 1, 2, 3]
    assert got.footer == want.footer  # None for a trace cut short: it stays incomplete
    ops = int((whole.records["kind"] == Kind.OP).sum())
    assert len(whole.records) == len(mixed)
    assert ops == len(mixed) - len(module)
    assert (tmp_path / "repeat-2.trace").stat().st_mode & 0o777 == 0o600


def test_a_trace_with_no_op_records_is_copied_and_the_copy_is_never_written_over(tmp_path: Path) -> None:
    module = training_records(steps=3)
    src = write_trace(tmp_path / "a.trace", module, {"exit_code": 0}, events=_events_at(module, [PER_STEP]))
    strip_ops(src, tmp_path / "b.trace", {})
    assert (tmp_path / "b.trace").read_bytes() == src.read_bytes()
    with pytest.raises(FileExistsError):
        strip_ops(src, tmp_path / "b.trace", {})


def test_what_is_not_a_trace_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.trace").write_bytes(b"not a trace at all")
    with pytest.raises(TraceError, match="not a detaudit trace"):
        strip_ops(tmp_path / "x.trace", tmp_path / "y.trace", {})
