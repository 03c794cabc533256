"""`detaudit watch`'s report value (detaudit/report/watch_model.py)."""

from __future__ import annotations

import json

import pytest

from detaudit.errors import TraceError
from detaudit.report.watch_model import WatchReport, WatchSettings, read_watch_json
from detaudit.results import RepeatResult
from detaudit.run.watchlog import Mismatch, Stopped, UncheckedSave, WatchLog

MISMATCH = Mismatch(3, "aten.mm.default", None, "t.py:4", None, 1e-7, 1, "first")


def report(exit_code: int | None, timed_out: bool = False, log: WatchLog | None = None) -> WatchReport:
    result = RepeatResult(0, "auto", exit_code, 1.0, timed_out, "watch-0.trace", "watch-0.stdout", "watch-0.stderr",
                          "")
    return WatchReport("t.py", "run", WatchSettings(), result, log or WatchLog())


@pytest.mark.parametrize(("made", "code"), [
    (report(0, log=WatchLog(steps=2, checked_steps=(0,))), 0), (report(1, log=WatchLog(mismatches=(MISMATCH,))), 1),
    (report(2), 3),
    (report(None, timed_out=True), 5),
])
def test_the_exit_code_says_mismatch_before_the_scripts_own_failure(made: WatchReport, code: int) -> None:
    assert made.exit_code == code


def test_the_json_carries_the_verdict_and_the_mismatches() -> None:
    data = report(1, log=WatchLog(steps=4, checked_steps=(0, 2), mismatches=(MISMATCH,))).to_json()
    assert (data["verdict"], data["steps"], data["checked_steps"]) == ("mismatch", 4, [0, 2])
    assert data["mismatches"][0]["check"] == "replay"



def test_a_replica_mismatch_counts_and_names_its_rank() -> None:
    replica = Mismatch(2, "module.2.weight", None, None, None, 0.25, 0, None, "replica", 1)
    data = WatchReport("t.py", "run", WatchSettings(), report(0).result, WatchLog(), replica=replica).to_json()
    assert (data["verdict"], data["mismatches"][0]["rank"]) == ("mismatch", 1)


def test_the_json_lists_the_saves_written_before_the_check_caught_up() -> None:
    data = report(0, log=WatchLog(steps=6, unchecked_saves=(UncheckedSave(4, "ckpt.pt"),))).to_json()
    assert data["unchecked_saves"] == [{"step": 4, "target": "ckpt.pt"}]


def test_a_run_whose_training_thread_was_never_replayed_is_not_clean() -> None:
    """Four steps, and only ops of another thread replayed (the main thread building the model): not `clean`."""
    made = report(0, log=WatchLog(steps=4, replayed_ops=6, training_thread="trainer"))
    assert (made.verdict, made.exit_code) == ("unchecked", 6)
    assert made.unchecked_sentence == ("no optimizer step was checked: the training ran on thread 'trainer', and "
                                       "only 6 ops of other threads were replayed (docs/watch.md)")


def test_a_compiled_model_is_named_as_not_checked_in_the_json() -> None:
    """The trial's compiled TransformerEncoder: `clean` with nothing said of the kernels the replay never ran."""
    result = RepeatResult(0, "auto", 0, 1.0, False, "watch-0.trace", "watch-0.stdout", "watch-0.stderr", "")
    made = WatchReport("t.py", "run", WatchSettings(), result, WatchLog(steps=2, checked_steps=(0, 1)),
                       compiled=("TransformerEncoder",))
    assert made.to_json()["compiled_not_checked"] == ["TransformerEncoder"]


def test_nothing_compiled_says_nothing() -> None:
    assert report(0, log=WatchLog(steps=2, checked_steps=(0,))).compiled_sentence is None


def test_the_json_reads_back_as_written() -> None:
    written = report(1, log=WatchLog(steps=4, checked_steps=(0, 2), mismatches=(MISMATCH,),
                                     unchecked_saves=(UncheckedSave(3, "ckpt.pt"),))).to_json()
    assert read_watch_json(json.loads(json.dumps(written)), "watch.json") == written


@pytest.mark.parametrize(("edit", "refusal"), [
    ({"format": "detaudit-run"}, "not a detaudit watch report"), ({"version": 2}, "version 2 is not supported"),
    ({"steps": "four"}, "field `steps` must be an integer"),
])
def test_a_foreign_newer_or_edited_json_is_refused_by_name(edit: dict, refusal: str) -> None:
    with pytest.raises(TraceError, match=refusal):
        read_watch_json({**report(0).to_json(), **edit}, "watch.json")


def test_a_stop_when_a_backward_returned_says_the_update_was_not_applied() -> None:
    made = report(1, log=WatchLog(steps=1, checked_steps=(0, 1), mismatches=(MISMATCH,), boundary="backward",
                                  stopped=Stopped("update", 1, None)))
    assert made.stop_sentence == "stopped the job at step 1 when its backward() returned: the update was not applied"


def test_the_json_says_what_ended_the_steps() -> None:
    made = report(0, log=WatchLog(steps=3, checked_steps=(0,), boundary="backward"))
    assert made.to_json()["step_boundary"] == "backward"
