"""compare/identity.py: records lined up by identity, never by position."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic import Rec, write_trace

from detaudit.compare.identity import Alignment, Identity, align, read_recording, record_index, structural
from detaudit.errors import Inconclusive, TraceError
from detaudit.trace import Kind


def test_a_module_called_twice_in_a_step_has_two_occurrences(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "a.trace", [Rec("enc", 1), Rec("enc", 2), Rec("enc", 3, step=1)], footer={})
    assert list(read_recording(path)) == [Identity(0, "output", "enc", 0), Identity(0, "output", "enc", 1),
                                          Identity(1, "output", "enc", 0)]


def test_op_records_are_left_out(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "a.trace", [Rec("aten.mm", 1, kind=Kind.OP), Rec("fc", 2)], footer={})
    assert list(read_recording(path)) == [Identity(0, "output", "fc", 0)]


def test_a_record_only_b_holds_is_listed_and_the_rest_still_pair(tmp_path: Path) -> None:
    a = read_recording(write_trace(tmp_path / "a.trace", [Rec("fc1", 1), Rec("fc2", 2)], footer={}))
    b = read_recording(write_trace(tmp_path / "b.trace", [Rec("fc1", 1), Rec("extra", 5), Rec("fc2", 2)], footer={}))
    alignment = align(a, b)
    assert (alignment.both, alignment.only_a, alignment.only_b) == (
        (Identity(0, "output", "fc1"), Identity(0, "output", "fc2")), (), (Identity(0, "output", "extra"),))


def test_a_parameter_is_paired_by_name_whatever_its_position(tmp_path: Path) -> None:
    a = read_recording(write_trace(tmp_path / "a.trace", [Rec("w", 1, kind=Kind.GRAD), Rec("b", 2, kind=Kind.GRAD)],
                                   footer={}))
    b = read_recording(write_trace(tmp_path / "b.trace", [Rec("b", 2, kind=Kind.GRAD), Rec("w", 1, kind=Kind.GRAD)],
                                   footer={}))
    assert a[Identity(0, "grad", "w")].digest == b[Identity(0, "grad", "w")].digest


def one_sided(*only_a: Identity) -> tuple[Identity, ...]:
    """The structure differences among records only A holds, beside a step-0 output both hold."""
    return structural(Alignment((Identity(0, "output", "fc"),), only_a, ()))


def test_a_parameter_only_one_side_holds_is_a_structure_difference() -> None:
    assert one_sided(Identity(0, "param", "w")) == (Identity(0, "param", "w"),)


def test_a_module_output_one_side_lacks_in_a_step_both_ran_is_listed_not_judged() -> None:
    """A module torch.compile fused away runs no hook."""
    assert one_sided(Identity(0, "output", "fused")) == ()


def test_a_module_output_of_a_step_the_other_side_never_ran_is_a_structure_difference() -> None:
    assert one_sided(Identity(3, "output", "fc")) == (Identity(3, "output", "fc"),)


def test_a_recording_without_its_footer_is_inconclusive(tmp_path: Path) -> None:
    with pytest.raises(Inconclusive, match="is incomplete"):
        read_recording(write_trace(tmp_path / "a.trace", [Rec("fc", 1)], footer=None))


def test_a_footer_declaring_more_records_than_the_trace_holds_is_corrupt(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="declares 2 records, it holds 1"):
        read_recording(write_trace(tmp_path / "a.trace", [Rec("fc", 1)], footer={"records": 2}))


def test_a_record_s_index_counts_the_op_records_before_it(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "a.trace", [Rec("fc", 1), Rec("mm", 2, kind=Kind.OP), Rec("fc", 3)], footer={})
    assert record_index(path, Identity(0, "output", "fc", 1)) == 2
