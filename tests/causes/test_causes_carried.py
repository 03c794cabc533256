"""causes/carried.py: state an earlier repeat left, read by a later one, as a cause and as an excuse for output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from detaudit import causes
from detaudit.causes import carried
from detaudit.causes.context import Context, RepeatEvidence
from detaudit.results import Divergence, RecordInfo, StdoutDifference

LISTED = {"type": "carried", "what": "list", "path": "lightning_logs", "loc": "train.py:24",
          "by": "lightning/fabric/loggers/csv_logs.py:120", "entries": ["version_0"]}
READ = {"type": "carried", "what": "read", "path": "last.ckpt", "loc": "train.py:30",
        "by": "torch/serialization.py:776", "entries": []}
# what repeat 0 (run first) recorded writing: the files its successors then read or list
WROTE_CKPT = {"type": "file-write", "path": "/work/run/last.ckpt", "loc": "train.py:41"}
WROTE_LOG = {"type": "file-write", "path": "/work/run/lightning_logs/version_0", "loc": "train.py:22"}


def _context(per_repeat: list[list[dict[str, Any]]], stdout_only: bool, at: int = 0) -> Context:
    reps = []
    for i, events in enumerate(per_repeat):
        rep = RepeatEvidence(i, "cpu", Path(f"/nonexistent/repeat-{i}.trace"))
        hashing = {"type": "hash", "PYTHONHASHSEED": None, "randomization": 1, "probe": 100 + i, "aslr_disabled": False}
        rep.events = [{"at": 0, **hashing}, *({"at": at, **e} for e in events)]
        reps.append(rep)
    differing = list(range(1, len(reps)))
    if stdout_only:
        diff = StdoutDifference(13, "masked", 0, {i: f"v_num={i}" for i in range(len(reps))}, "v_num")
        rec = RecordInfo(-1, "stdout", "line 13", "", "", -1, "", "", "", False)
        return Context(Divergence(-1, "outcome", rec, differing, 0, stdout=diff), reps)
    rec = RecordInfo(5, "output", "fc", "fc", "train.py:40", 0, "4x3", "float32", "", False)
    return Context(Divergence(5, "content", rec, differing, 0), reps)


def test_a_stdout_difference_is_explained_when_every_differing_repeat_read_carried_state() -> None:
    evidence = carried.explains_output(_context([[WROTE_LOG], [LISTED], [LISTED]], stdout_only=True))
    assert evidence is not None
    assert len(evidence) == 2
    assert evidence[0] == ("repeat 1 listed directory lightning_logs/, holding version_0, which an earlier repeat of "
                           "this audit created or changed, at train.py:24 (through "
                           "lightning/fabric/loggers/csv_logs.py:120)")


def test_a_differing_repeat_that_read_nothing_carried_is_not_explained() -> None:
    assert carried.explains_output(_context([[], [LISTED], []], stdout_only=True)) is None
    assert carried.explains_output(_context([[LISTED], [], []], stdout_only=True)) is None  # only the reference
    assert carried.explains_output(_context([[], []], stdout_only=True)) is None


def test_carried_state_outranks_the_hash_and_order_guesses_with_the_path_and_line() -> None:
    found = causes.rank(_context([[WROTE_CKPT], [READ], [READ]], stdout_only=False))
    assert found[0].id == "carried-state"
    assert found[0].basis == "direct"
    assert found[0].confidence == "likely"
    assert found[0].evidence[0] == ("repeat 1 read last.ckpt, which an earlier repeat of this audit wrote, at "
                                    "train.py:30 (through torch/serialization.py:776)")
    assert "last.ckpt" in found[0].fix
    assert "train.py:30" in found[0].fix
    assert "python-hash-seed" not in [c.id for c in found]  # a weak background guess beside a likely cause


def test_a_file_no_earlier_repeat_wrote_is_not_blamed_on_one() -> None:
    """Modified during the audit, but no repeat recorded writing it: another process may have (issue 35)."""
    found = causes.rank(_context([[], [READ], [READ]], stdout_only=False))
    assert found[0].evidence[0].startswith("repeat 1 read last.ckpt, which was modified during this audit, before "
                                           "this repeat started (no earlier repeat recorded writing it: another "
                                           "process")


def test_a_read_after_the_divergence_does_not_explain_it() -> None:
    found = causes.rank(_context([[], [READ], [READ]], stdout_only=False, at=9))
    assert "carried-state" not in [c.id for c in found]


def test_only_some_differing_repeats_reading_carried_state_is_possible() -> None:
    found = causes.rank(_context([[], [READ], []], stdout_only=False))
    cause = next(c for c in found if c.id == "carried-state")
    assert cause.confidence == "possible"


def test_the_stdout_cause_ranks_below_carried_state_when_the_output_is_not_excused() -> None:
    ranked = [c.id for c in causes.rank(_context([[], [LISTED], []], stdout_only=True))]
    assert ranked[:2] == ["stdout-differs", "carried-state"]


def _session(lines: int, digest: str) -> dict[str, Any]:
    """A read of the session log at the script's line 10, holding `lines` entries."""
    return {"type": "file-read", "path": "sessions.jsonl", "loc": "train.py:10", "by": "train.py:10",
            "size": 19 * lines, "lines": lines, "digest": digest}


APPENDED = {"type": "file-write", "path": "/work/run/sessions.jsonl", "loc": "train.py:8", "append": True}
TRUNCATED = {**APPENDED, "append": False}
APPENDING_RUNS = [[APPENDED, _session(1, "a1")], [APPENDED, _session(2, "b2")], [APPENDED, _session(3, "c3")]]


def test_a_file_read_with_other_bytes_than_the_reference_is_carried_state_at_the_read() -> None:
    [cause, *_] = causes.rank(_context(APPENDING_RUNS, stdout_only=False))
    assert (cause.id, cause.basis, cause.confidence) == ("carried-state", "direct", "likely")


def test_the_evidence_names_the_file_the_read_and_the_append_that_changed_it() -> None:
    [cause, *_] = causes.rank(_context(APPENDING_RUNS, stdout_only=False))
    assert cause.evidence[0] == ("repeat 1 read sessions.jsonl at train.py:10 holding other bytes than repeat 0 read "
                                 "there (2 lines, 38 bytes against 1 line, 19 bytes): the script appends to it at "
                                 "train.py:8 and reads it back, so each run reads what the runs before it added")


def test_the_fix_for_an_appended_file_is_at_its_append_and_read() -> None:
    [cause, *_] = causes.rank(_context(APPENDING_RUNS, stdout_only=False))
    assert cause.fix.startswith("do not carry a value from run to run through sessions.jsonl: the script appends to "
                                "it (at train.py:8) and reads it back (at train.py:10)")


def test_a_file_an_earlier_repeat_wrote_with_other_bytes_names_that_repeat() -> None:
    runs = [[TRUNCATED, _session(1, "a1")], [_session(2, "b2")]]  # repeat 1 reads what repeat 0 left
    [cause, *_] = causes.rank(_context(runs, stdout_only=False))
    assert cause.evidence[0].endswith("): an earlier repeat of this audit wrote it")


def test_a_file_this_repeat_wrote_afresh_before_reading_it_is_not_carried() -> None:
    """Its bytes were made in this run: whatever made them differ is the cause, not the file."""
    runs = [[TRUNCATED, _session(1, "a1")], [TRUNCATED, _session(1, "b1")]]
    assert "carried-state" not in [c.id for c in causes.rank(_context(runs, stdout_only=False))]


def test_a_file_read_with_the_same_bytes_in_every_repeat_is_not_carried() -> None:
    runs = [[APPENDED, _session(1, "a1")], [APPENDED, _session(1, "a1")]]
    assert "carried-state" not in [c.id for c in causes.rank(_context(runs, stdout_only=False))]
