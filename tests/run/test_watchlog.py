"""Reading back `detaudit watch`'s events file (detaudit/run/watchlog.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detaudit.errors import TraceError
from detaudit.records import WATCH_EVENTS
from detaudit.run.watchlog import Mismatch, Stopped, UncheckedSave, WatchLog, merged, read_watch_log

MISMATCH = {"event": "mismatch", "step": 2, "op": "aten.mm.default", "module": "net.0", "location": "t.py:9",
            "backward_of": None, "max_abs_diff": 1e-7, "max_ulp": 3, "third_agrees_with": "first"}


HEADER = {"event": "header", **WATCH_EVENTS.stamp()}


def write(path: Path, *events: dict[str, object], tail: str = "", header: dict[str, object] = HEADER) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in (header, *events)) + tail)
    return path


def test_steps_checked_steps_and_counts_add_up(tmp_path: Path) -> None:
    log = read_watch_log(write(tmp_path / "e", {"event": "step", "step": 0, "checked": True, "replayed": 5,
                                                "skipped": {"uninitialised": 1}},
                               {"event": "step", "step": 1, "checked": False, "replayed": 0, "skipped": {}},
                               {"event": "end", "step": 2, "checked": True, "replayed": 2,
                                "skipped": {"uninitialised": 2}}))
    assert (log.steps, log.checked_steps, log.replayed_ops) == (2, (0, 2), 7)
    assert log.skipped_ops == {"uninitialised": 3}
    assert log.ended


def test_outputs_set_aside_add_up_over_steps_and_ranks(tmp_path: Path) -> None:
    aside = {"aten.mkldnn_rnn_layer.default": 2}
    events = [{"event": "step", "step": s, "checked": True, "replayed": 3, "skipped": {}, "set_aside": aside}
              for s in (0, 1)]
    log = read_watch_log(write(tmp_path / "e", *events))
    assert merged([log, log]).set_aside == {"aten.mkldnn_rnn_layer.default": 8}


def test_a_stop_closes_its_step_and_names_what_was_not_written(tmp_path: Path) -> None:
    log = read_watch_log(write(tmp_path / "e", MISMATCH, {"event": "stopped", "step": 2, "checked": True,
                                                          "replayed": 4, "before": "torch.save", "target": "c.pt"}))
    assert log.stopped == Stopped("torch.save", 2, "c.pt")
    assert log.checked_steps == (2,)
    assert log.mismatches == (Mismatch(2, "aten.mm.default", "net.0", "t.py:9", None, 1e-7, 3, "first"),)


def test_a_line_cut_short_by_a_kill_and_a_missing_file_read_as_nothing(tmp_path: Path) -> None:
    assert read_watch_log(write(tmp_path / "e", MISMATCH, tail='{"event": "step", "st')).mismatches != ()
    assert read_watch_log(tmp_path / "absent") == read_watch_log(write(tmp_path / "empty"))


def test_a_mismatch_reads_back_into_its_type() -> None:
    mismatch = Mismatch.from_json({**MISMATCH})
    assert Mismatch.from_json(dict(mismatch.to_json())) == mismatch


def test_the_ranks_logs_merge_into_one(tmp_path: Path) -> None:
    step = {"event": "step", "checked": True, "replayed": 2}
    zero = read_watch_log(write(tmp_path / "r0", {**step, "step": 0}, {**step, "step": 1}), rank=0)
    one = read_watch_log(write(tmp_path / "r1", {**step, "step": 0}, MISMATCH), rank=1)
    log = merged([zero, one])
    assert (log.steps, log.checked_steps, log.replayed_ops) == (1, (0, 1), 6)
    assert log.mismatches[0].rank == 1


def test_a_save_written_before_the_check_caught_up_is_kept_with_its_rank_s_others(tmp_path: Path) -> None:
    saved = {"event": "unchecked_save", "step": 4, "target": "ckpt.pt", "waited_s": 60.0}
    logs = [read_watch_log(write(tmp_path / f"e{rank}", *events)) for rank, events in enumerate([[saved], []])]
    assert merged(logs).unchecked_saves == (UncheckedSave(4, "ckpt.pt"),)


def test_never_more_steps_checked_than_there_are_steps(tmp_path: Path) -> None:
    """`--every 1` on 8 steps: the window after the last step (ended by the script's end) is no ninth step
    (issue 44: 9 checked for 8 steps)."""
    step = {"event": "step", "checked": True, "replayed": 2}
    events = [{**step, "step": i} for i in range(8)] + [{"event": "end", "step": 8, "checked": True, "replayed": 1}]
    log = read_watch_log(write(tmp_path / "e", *events))
    assert (log.steps, log.checked_count, log.checked_phrase) == (8, 8, "8 checked and the ops after the last")


def test_a_run_without_an_optimizer_step_is_checked_as_one_window() -> None:
    assert WatchLog(steps=0, checked_steps=(0,)).checked_phrase == "the whole run checked"


def test_a_line_cut_short_by_a_kill_is_ignored(tmp_path: Path) -> None:
    log = read_watch_log(write(tmp_path / "e", {"event": "step", "step": 0, "checked": True, "replayed": 5},
                               tail='{"event": "mismatch", "st'))
    assert log.mismatches == ()


def test_a_line_that_is_not_json_before_the_last_makes_the_file_corrupt(tmp_path: Path) -> None:
    path = write(tmp_path / "e", MISMATCH)
    path.write_text(path.read_text().replace(json.dumps(MISMATCH), "{\"event\": \"mism"))
    with pytest.raises(TraceError, match="line 2 is not JSON"):
        read_watch_log(path)


@pytest.mark.parametrize(("header", "refusal"), [
    ({"event": "step", "step": 0}, "not a detaudit watch events file"),
    ({**HEADER, "version": 2}, "version 2 is not supported"),
])
def test_a_file_without_this_versions_header_is_refused(tmp_path: Path, header: dict[str, object],
                                                        refusal: str) -> None:
    with pytest.raises(TraceError, match=refusal):
        read_watch_log(write(tmp_path / "e", MISMATCH, header=header))


def test_a_boundary_event_says_each_backward_ended_a_step(tmp_path: Path) -> None:
    log = read_watch_log(write(tmp_path / "e", {"event": "boundary", "boundary": "backward", "step": 0},
                               {"event": "step", "step": 0, "checked": True, "replayed": 3, "skipped": {}}))
    assert log.step_boundary == "backward"


def test_steps_without_a_boundary_event_were_optimizer_steps(tmp_path: Path) -> None:
    log = read_watch_log(write(tmp_path / "e", {"event": "step", "step": 0, "checked": True, "replayed": 3}))
    assert log.step_boundary == "optimizer.step"


def test_a_stop_when_a_backward_returned_is_read_back(tmp_path: Path) -> None:
    log = read_watch_log(write(tmp_path / "e", {"event": "stopped", "step": 1, "checked": True, "replayed": 4,
                                                "before": "update", "target": None}))
    assert log.stopped == Stopped("update", 1, None)
