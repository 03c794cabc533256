"""drift/rerecord.py over recordings written by hand: a record of unknown size (its digest differs where no sample
sits) sized from A's and B's re-recordings of its full values, and judged as any other record (issue 43 item 2)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import cast

import numpy as np
from synthetic import Rec, write_trace

from detaudit.audit.pipeline import AuditOptions
from detaudit.drift.configurations import Configuration
from detaudit.drift.drift_check import _judged, judged_report, size_unknown
from detaudit.drift.drift_report import DriftReport, FloorSummary
from detaudit.drift.rerecord import read_side, size
from detaudit.results import RepeatResult
from detaudit.trace import Kind
from detaudit.trace.values import ValuesKey, ValuesWriter

# 8 elements: the trace samples positions 0, 2, 4 and 7 (trace/format.sample_positions); position 1 is unsampled
ELEMENTS_A = np.array([0.5, 0.375, -0.25, 0.0625, 0.125, 0.75, 0.625, 1.0], "<f4")
GRAD = Rec("fc.weight", 10, kind=Kind.GRAD, samples=(0.5, -0.25, 0.125, 1.0), shape="8")
A, B = Configuration("A"), Configuration("B")


def empty() -> DriftReport:
    return DriftReport("train.py", [], "run", "inconclusive", A, B, [], [], FloorSummary(10.0, 2, [], 0.0, None))


def recording(tmp_path: Path, name: str, digest: int, elements: np.ndarray | None = None, cap: int = 1 << 20) -> Path:
    """One repeat's trace holding the gradient under `digest`, and its side file keeping `elements` if given
    (at most `cap` bytes of them)."""
    trace = write_trace(tmp_path / f"{name}.trace", [Rec("fc", 1), GRAD.but(digest=digest)], footer={})
    if elements is not None:
        writer = ValuesWriter(tmp_path / f"{name}.values", cap)
        writer.add(ValuesKey(0, "grad", "fc.weight"), "float32", [8], elements.tobytes())
        writer.close()
    return trace


def judged_after_rerecording(tmp_path: Path, b_again: int, cap: int = 1 << 20) -> DriftReport:
    """A's three repeats and B (another digest, the same samples: B adds 1000 at position 1), then A and B
    re-recorded keeping the gradient's elements (B's re-recording under digest `b_again`)."""
    traces_a = [[recording(tmp_path, f"a-{i}", 10)] for i in range(3)]
    traces_b = [recording(tmp_path, "b-0", 11)]
    elements_b = ELEMENTS_A.copy()
    elements_b[1] += 1000
    recording(tmp_path, "sized-a-0", 10, ELEMENTS_A)
    recording(tmp_path, "sized-b-0", b_again, elements_b, cap)
    sides = tuple(read_side(config, tmp_path, RepeatResult(0, "cpu", 0, 1.0, False, f"sized-{label}-0.trace",
                                                           "o", "e", ""), True)
                  for config, label in ((A, "a"), (B, "b")))
    sized, done = size(size_unknown(empty(), traces_a, traces_b), (sides[0], sides[1]))
    report = judged_report(empty(), traces_a, traces_b, (tmp_path, tmp_path), sized)
    return DriftReport.from_dict(replace(report, rerecorded=done).to_dict())  # as drift.json reads back


def test_b_adding_1000_where_no_sample_sits_is_sized_and_a_drift(tmp_path: Path) -> None:
    report = judged_after_rerecording(tmp_path, 11)
    assert (report.verdict, report.counts.size_unknown, report.records[0].difference) == ("drift", 0, 1000.0)


def test_a_record_sized_by_re_recording_says_so(tmp_path: Path) -> None:
    row = judged_after_rerecording(tmp_path, 11).records[0]
    assert (row.sized, row.detail) == (True, "sized by re-recording: the largest |B-A| over all 8 elements")


def test_a_re_recording_that_does_not_reproduce_the_first_leaves_the_size_unknown(tmp_path: Path) -> None:
    report = judged_after_rerecording(tmp_path, 12)
    assert (report.verdict, report.counts.size_unknown) == ("inconclusive", 1)
    assert str(report.reason).startswith("1 record(s) of B differ where the trace samples no element (first: step 0 "
                                         "grad fc.weight: differs at an unrecorded position")
    assert "not sized by re-recording: the re-recording of B does not reproduce the first" in str(report.reason)


def test_with_b_kept_no_interpreter_starts_and_the_report_says_a_run_without_b_from_would_size_it(
        tmp_path: Path) -> None:
    traces_a = [[recording(tmp_path, f"a-{i}", 10)] for i in range(3)]
    traces_b = [recording(tmp_path, "b-0", 11)]
    report = _judged(cast(AuditOptions, None), empty(), (traces_a, traces_b), (tmp_path, tmp_path), True, None)
    assert (report.verdict, report.rerecorded, str(report.reason).endswith(
        "a run without --b-from would size them by re-recording A and B (2 interpreters)")) == (
        "inconclusive", None, True)


def test_the_re_recording_s_two_interpreters_are_counted(tmp_path: Path) -> None:
    report = judged_after_rerecording(tmp_path, 11)
    assert (report.rerecorded and report.rerecorded.interpreters, report.interpreters) == (2, 2)


def test_a_record_over_the_side_file_s_cap_stays_of_unknown_size_and_says_why(tmp_path: Path) -> None:
    report = judged_after_rerecording(tmp_path, 11, cap=16)  # 8 float32 elements: 32 bytes
    assert report.rerecorded is not None
    assert (report.verdict, report.rerecorded.records[0].reason) == (
        "inconclusive", "the re-recording of B kept no elements of it: its 32 bytes of elements would exceed the side "
                        "file's cap of 16 bytes per run")
