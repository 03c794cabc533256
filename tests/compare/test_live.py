"""compare/live.py and trace.GrowingTrace: following traces while they are written, whole frames only;
where a repeat is seen to diverge; the stop asked of it; what the progress display is told."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import Rec, training_records, write_trace

from detaudit.cli.session import describe_progress
from detaudit.compare.live import Follower, LiveWatch
from detaudit.results import EXTRA_STEPS, RepeatProgress, Tolerance
from detaudit.run.distributed import Layout
from detaudit.run.launcher import RepeatPlan, plan_repeats
from detaudit.trace import EmptyTrace, GrowingTrace, Kind, read_trace

STEPS = 8
PER_STEP = len(training_records(steps=1))


def _changed_from(records: list[Rec], step: int) -> list[Rec]:
    """The same records with every digest from `step` on changed (a repeat that diverged there)."""
    return [r.but(digest=r.digest + 7) if r.step >= step else r for r in records]


class Growing:
    """A trace file written out byte by byte, the way a running repeat's grows (frames cut anywhere)."""

    def __init__(self, whole: Path, path: Path) -> None:
        self.data = whole.read_bytes()
        self.path = path
        self.written = 0
        path.write_bytes(b"")

    def grow_to(self, size: int) -> None:
        size = min(size, len(self.data))
        with open(self.path, "ab") as fh:
            fh.write(self.data[self.written:size])
        self.written = size


def _bytes_through(tmp_path: Path, records: list[Rec], steps: int) -> int:
    """The size of a trace of `records`' first `steps` steps: a prefix of the whole trace's bytes."""
    path = write_trace(tmp_path / f"prefix-{steps}.part", [r for r in records if r.step < steps], None,
                       flush_every=PER_STEP)
    return path.stat().st_size


def _whole(tmp_path: Path, name: str, records: list[Rec], footer: dict | None = None) -> Path:
    return write_trace(tmp_path / f"{name}.whole", records, {"exit_code": 0} if footer is None else footer,
                       flush_every=PER_STEP)


def test_a_growing_trace_yields_only_whole_frames_however_the_file_is_cut(tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    whole = _whole(tmp_path, "t", records)
    growing = Growing(whole, tmp_path / "t.trace")
    trace = None
    seen = []
    for size in range(0, len(growing.data) + 13, 13):  # cut at every 13th byte: mid-head, mid-payload
        growing.grow_to(size)
        if trace is None:
            try:
                trace = GrowingTrace(growing.path)
            except EmptyTrace:
                continue
        chunk = trace.poll()
        seen.extend(chunk["digest"].tolist())
        whole_prefix = read_trace(growing.path)  # what a reader of the same bytes holds: whole frames only
        assert seen == whole_prefix.records["digest"].tolist()
    assert trace is not None
    assert trace.footer == {"records": len(records), "exit_code": 0}
    assert seen == [r.digest for r in records]
    assert not len(trace.poll())  # nothing twice
    trace.close()


def _follow(tmp_path: Path, reference: list[Rec], repeat: list[Rec], ref_footer: dict | None = None,
            ) -> tuple[Follower, Growing]:
    ref = write_trace(tmp_path / "ref.trace", reference, {"exit_code": 0} if ref_footer is None else ref_footer,
                      flush_every=PER_STEP)
    growing = Growing(_whole(tmp_path, "rep", repeat), tmp_path / "rep.trace")
    return Follower(growing.path, ref), growing


def test_the_follower_sees_where_a_growing_repeat_diverges(tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    follower, growing = _follow(tmp_path, records, _changed_from(records, 3))
    agreed = []
    for size in range(0, len(growing.data) + 50, 50):
        growing.grow_to(size)
        follower.poll()
        agreed.append(follower.agrees_to)
        if follower.diverged_at is not None:
            break
    assert follower.diverged_at == 3
    assert follower.agrees_to == 2
    assert follower.compared == 3 * PER_STEP
    assert [a for a in agreed if a is not None] == sorted(a for a in agreed if a is not None)  # only moves on
    follower.close()


def test_agreeing_repeats_never_diverge_and_agree_to_the_last_step(tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    follower, growing = _follow(tmp_path, records, records)
    for size in range(0, len(growing.data) + 97, 97):
        growing.grow_to(size)
        follower.poll()
    assert follower.diverged_at is None
    assert follower.agrees_to == STEPS - 1
    assert follower.step == STEPS - 1
    follower.close()


def test_a_saved_value_that_is_no_tensor_stops_no_repeat(tmp_path: Path) -> None:
    """A checkpoint's path that differs (a `version_N` an earlier repeat decided) is judged once every tensor is
    recorded (compare/saved_values.py): the live comparison follows on past it."""
    path = Rec("torch.save[0].best_model_path", digest=5, step=3, kind=Kind.SAVE, dtype="str", shape="")
    records = training_records(steps=STEPS)
    with_path = [*records[:4 * PER_STEP], path, *records[4 * PER_STEP:]]
    other_path = [r.but(digest=6) if r is path else r for r in with_path]
    follower, growing = _follow(tmp_path, with_path, other_path)
    growing.grow_to(len(growing.data))
    follower.poll()
    assert follower.diverged_at is None
    assert follower.agrees_to == STEPS - 1
    follower.close()


def test_a_repeat_that_records_on_after_its_reference_ended_has_diverged(tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    follower, growing = _follow(tmp_path, records[: 4 * PER_STEP], records)
    growing.grow_to(len(growing.data))
    follower.poll()
    assert follower.diverged_at == 4
    assert follower.ref_last_step == 3


def test_a_reference_stopped_early_is_no_reason_to_call_a_longer_repeat_divergent(tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    follower, growing = _follow(tmp_path, records[: 4 * PER_STEP], records,
                                ref_footer={"exit_code": 0, "stopped_at_step": 4, "stopped_by": "max-steps"})
    growing.grow_to(len(growing.data))
    follower.poll()
    assert follower.diverged_at is None


def _watch_run(tmp_path: Path, stop: bool = True, layout: Layout | None = None,
               ) -> tuple[LiveWatch, list[RepeatPlan], list[RepeatProgress]]:
    plans = plan_repeats(tmp_path, 2, ["cpu"], stoppable=True)
    progress: list[RepeatProgress] = []
    return LiveWatch(plans, Tolerance(), stop=stop, layout=layout, on_progress=progress.append), plans, progress


def test_a_divergent_repeat_is_asked_to_stop_extra_steps_after_its_divergence(tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    watch, plans, progress = _watch_run(tmp_path)
    write_trace(plans[0].trace, records, {"exit_code": 0}, flush_every=PER_STEP)
    watch.poll(plans[0], False)
    watch.poll(plans[0], True)
    assert plans[0].stop_file is not None
    assert not plans[0].stop_file.exists()
    diverging = _changed_from(records, 2)
    growing = Growing(_whole(tmp_path, "rep", diverging), plans[1].trace)
    growing.grow_to(_bytes_through(tmp_path, diverging, 2))  # steps 0 and 1: agreeing so far
    watch.poll(plans[1], False)
    assert plans[1].stop_file is not None
    assert not plans[1].stop_file.exists()
    assert progress[-1].agrees_to_step == 1
    assert progress[-1].reference_steps == STEPS - 1
    growing.grow_to(_bytes_through(tmp_path, diverging, 4))
    watch.poll(plans[1], False)
    assert json.loads(plans[1].stop_file.read_text()) == {"at_step": 2 + 1 + EXTRA_STEPS, "diverged_at_step": 2}
    last = progress[-1]
    assert (last.repeat, last.reference, last.diverged_at_step, last.stopping_at_step) == (1, 0, 2, 6)
    assert last.label == "repeat-1"


def test_run_to_end_follows_but_never_asks_for_a_stop(tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    watch, plans, progress = _watch_run(tmp_path, stop=False)
    write_trace(plans[0].trace, records, {"exit_code": 0}, flush_every=PER_STEP)
    write_trace(plans[1].trace, _changed_from(records, 1), {"exit_code": 0}, flush_every=PER_STEP)
    watch.poll(plans[1], False)
    assert progress[-1].diverged_at_step == 1
    assert progress[-1].stopping_at_step is None
    assert plans[1].stop_file is not None
    assert not plans[1].stop_file.exists()


def test_every_rank_of_a_torchrun_repeat_is_asked_through_one_file_and_its_divergence_is_the_first_ranks(
        tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    layout = Layout(2)
    watch, plans, _ = _watch_run(tmp_path, layout=layout)
    for rank in (0, 1):
        write_trace(plans[0].trace.with_name(Layout.rank_file(plans[0].trace.name, rank)), records, {"exit_code": 0},
                    flush_every=PER_STEP)
    # rank 1 diverged at step 1; the ranks agree among themselves on a step at or after the one asked for
    write_trace(plans[1].trace.with_name(Layout.rank_file(plans[1].trace.name, 0)), records[: 7 * PER_STEP], None,
                flush_every=PER_STEP)
    write_trace(plans[1].trace.with_name(Layout.rank_file(plans[1].trace.name, 1)),
                _changed_from(records, 1)[: 7 * PER_STEP], None, flush_every=PER_STEP)
    watch.poll(plans[1], False)
    assert plans[1].stop_file is not None
    assert json.loads(plans[1].stop_file.read_text()) == {"at_step": 1 + 1 + EXTRA_STEPS, "diverged_at_step": 1}


def test_the_first_repeat_is_followed_against_the_baseline_shown_and_never_stopped(tmp_path: Path) -> None:
    records = training_records(steps=STEPS)
    baseline = write_trace(tmp_path / "baseline.trace", records, {"exit_code": 0}, flush_every=PER_STEP)
    plans = plan_repeats(tmp_path, 2, ["cpu"], stoppable=True)
    progress: list[RepeatProgress] = []
    watch = LiveWatch(plans, Tolerance(), on_progress=progress.append, baseline=(baseline, "cpu"))
    diverging = _changed_from(records, 3)
    growing = Growing(_whole(tmp_path, "first", diverging), plans[0].trace)
    for steps in (3, 6):
        growing.grow_to(_bytes_through(tmp_path, diverging, steps))
        watch.poll(plans[0], False)
    last = progress[-1]
    assert (last.against_baseline, last.reference, last.agrees_to_step, last.diverged_at_step) == (True, None, 2, 3)
    assert last.stopping_at_step is None
    assert plans[0].stop_file is not None
    assert not plans[0].stop_file.exists()
    assert describe_progress(last).endswith("diverged from the baseline at step 3")
    write_trace(plans[1].trace, records[: 2 * PER_STEP], None, flush_every=PER_STEP)  # the others: against repeat 0
    watch.poll(plans[1], False)
    assert (progress[-1].against_baseline, progress[-1].reference, progress[-1].agrees_to_step) == (False, 0, 1)


def test_an_unreadable_trace_is_followed_no_further_and_never_stopped(tmp_path: Path) -> None:
    watch, plans, _ = _watch_run(tmp_path)
    write_trace(plans[0].trace, training_records(steps=2), {"exit_code": 0})
    plans[1].trace.write_bytes(b"not a trace at all, longer than the magic")
    watch.poll(plans[1], False)  # no exception: the report says what is wrong with it
    assert plans[1].stop_file is not None
    assert not plans[1].stop_file.exists()


@pytest.mark.parametrize("content", [b"{", b'{"at_step": "x"}', b"[]"])
def test_a_stop_file_that_is_not_the_audits_request_is_ignored(tmp_path: Path, content: bytes) -> None:
    import time

    import torch

    from detaudit.recorder.bounds import Bounds, Stop
    from detaudit.recorder.core import Recorder
    from detaudit.trace import TraceWriter

    stop_file = tmp_path / "r.stop"
    stops: list[Stop] = []
    bounds = Bounds(Recorder(TraceWriter(tmp_path / "t.trace", {"repeat": 0})), lambda m: True, None, None,
                    time.time(), stops.append, str(stop_file))
    bounds.optimizer_built = True
    bounds.optimizers.add(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))
    stop_file.write_bytes(content)
    bounds._check(9, "optimizer steps")
    stop_file.write_bytes(b'{"at_step": 3, "diverged_at_step": 1}')
    bounds._check(10, "optimizer steps")
    assert stops == []  # ignored for good once it was not the audit's


def test_a_requested_stop_ends_the_repeat_at_that_optimizer_step(tmp_path: Path) -> None:
    import time

    from detaudit.recorder.bounds import Bounds, Stop
    from detaudit.recorder.core import Recorder
    from detaudit.trace import TraceWriter

    stop_file = tmp_path / "r.stop"
    stops: list[Stop] = []
    bounds = Bounds(Recorder(TraceWriter(tmp_path / "t.trace", {"repeat": 0})), lambda m: True, None, None,
                    time.time(), stops.append, str(stop_file))
    bounds._check(5, "root-module forward calls")
    bounds._check(1, "optimizer steps")
    stop_file.write_text(json.dumps({"at_step": 3, "diverged_at_step": 1}))
    bounds._check(2, "root-module forward calls")  # a script without an optimizer has no step to aim at
    bounds._check(2, "optimizer steps")
    assert stops == []
    bounds._check(3, "optimizer steps")
    bounds._check(4, "optimizer steps")
    assert stops == [Stop(3, "divergence", "optimizer steps", 1)]
    assert stops[0].footer() == {"stopped_at_step": 3, "stopped_by": "divergence", "counting": "optimizer steps",
                                 "diverged_at_step": 1}


def test_repeats_numbered_from_a_later_index_are_compared_with_the_first_of_their_batch(tmp_path: Path) -> None:
    plans = plan_repeats(tmp_path, 2, ["cpu"], prefix="ops", stoppable=True, first=2)
    assert [(p.index, p.trace.name) for p in plans] == [(2, "ops-2.trace"), (3, "ops-3.trace")]
    progress: list[RepeatProgress] = []
    watch = LiveWatch(plans, Tolerance(), on_progress=progress.append)
    records = training_records(steps=STEPS)
    write_trace(plans[0].trace, records, {"exit_code": 0}, flush_every=PER_STEP)
    write_trace(plans[1].trace, records[: 2 * PER_STEP], None, flush_every=PER_STEP)
    watch.poll(plans[1], False)
    assert (progress[-1].repeat, progress[-1].reference, progress[-1].agrees_to_step) == (3, 2, 1)


@pytest.mark.parametrize("narrow_ahead", [True, False])
def test_repeats_started_after_a_divergence_record_ops_over_its_window_and_are_followed_without_them(
        tmp_path: Path, narrow_ahead: bool) -> None:
    plans = plan_repeats(tmp_path, 4, ["cpu"], stoppable=True)
    watch = LiveWatch(plans, Tolerance(), narrow_ahead=narrow_ahead)
    records = training_records(steps=STEPS)
    assert watch.configure(plans[0]) == {}
    assert watch.configure(plans[1]) == {}
    write_trace(plans[0].trace, records, {"exit_code": 0}, flush_every=PER_STEP)
    watch.poll(plans[0], False)
    watch.poll(plans[0], True)
    write_trace(plans[1].trace, _changed_from(records, 3), {"exit_code": 0}, flush_every=PER_STEP)
    watch.poll(plans[1], True)  # it ended before any poll saw it diverge: its last one does
    assert watch.window == [2, 3]
    if not narrow_ahead:
        assert watch.configure(plans[2]) == {}
        assert watch.op_windowed == {}
        return
    assert watch.configure(plans[2]) == {"granularity": "op", "op_window": [2, 3], "op_window_runs_on": True}
    assert watch.op_windowed == {2: [2, 3]}
    # its op records (steps 2 and 3) have no counterpart in the reference: skipped, it agrees to the end
    with_ops = [x for r in records for x in
                ([Rec(f"aten.mm#{r.digest}", digest=r.digest + 1, step=r.step, kind=Kind.OP)] if 2 <= r.step <= 3
                 else []) + [r]]
    write_trace(plans[2].trace, with_ops, {"exit_code": 0}, flush_every=PER_STEP)
    watch.poll(plans[2], False)
    repeat = watch._repeats[2]
    assert repeat.diverged_at is None
    assert repeat.followers[0].agrees_to == STEPS - 1
    assert plans[2].stop_file is not None
    assert not plans[2].stop_file.exists()


def test_a_parameter_first_to_differ_records_no_ops_ahead(tmp_path: Path) -> None:
    """The optimizer's update differs (its gradients agree): `auto` runs no op-level re-run for it, so no later
    repeat records ops ahead for one."""
    plans = plan_repeats(tmp_path, 3, ["cpu"], stoppable=True)
    watch = LiveWatch(plans, Tolerance(), narrow_ahead=True)
    records = training_records(steps=STEPS)
    write_trace(plans[0].trace, records, {"exit_code": 0}, flush_every=PER_STEP)
    watch.poll(plans[0], True)
    updated = [r.but(digest=r.digest + 7) if r.step >= 3 and (r.kind == Kind.PARAM or r.step > 3) else r
               for r in records]
    write_trace(plans[1].trace, updated, {"exit_code": 0}, flush_every=PER_STEP)
    watch.poll(plans[1], False)
    assert watch._repeats[1].diverged_at == 3
    assert watch.window is None
    assert watch.configure(plans[2]) == {}


def test_the_reference_of_other_repeats_never_records_ops_ahead(tmp_path: Path) -> None:
    plans = plan_repeats(tmp_path, 2, ["cpu"], stoppable=True) + plan_repeats(tmp_path, 2, ["cuda"], first=2)
    watch = LiveWatch(plans, Tolerance(), narrow_ahead=True)
    watch.window = [0, 1]
    assert watch.configure(plans[2]) == {}  # the first on cuda: the reference of repeat 3
    assert watch.configure(plans[3])["op_window"] == [0, 1]


def _running_reference_of_two(tmp_path: Path) -> tuple[list[Rec], list[RepeatPlan], LiveWatch]:
    """-j 3: repeat 0, the reference of repeats 1 and 2, has recorded 5 steps and runs on."""
    records = training_records(steps=STEPS)
    plans = plan_repeats(tmp_path, 3, ["cpu"], stoppable=True)
    watch = LiveWatch(plans, Tolerance())
    reference = Growing(_whole(tmp_path, "ref", records), plans[0].trace)
    reference.grow_to(_bytes_through(tmp_path, records, 5))
    watch.poll(plans[0], False)
    return records, plans, watch


def test_a_running_reference_is_asked_to_stop_once_every_repeat_compared_with_it_diverged(tmp_path: Path) -> None:
    """-j: repeat 0 still runs while repeats 1 and 2 diverge from it; once both have, it stops where the later one
    was asked to (its later records could be compared with nothing)."""
    records, plans, watch = _running_reference_of_two(tmp_path)
    for plan, step in ((plans[1], 2), (plans[2], 3)):
        write_trace(plan.trace, _changed_from(records, step)[: 5 * PER_STEP], None, flush_every=PER_STEP)
        watch.poll(plan, False)
        watch.poll(plans[0], False)
    assert plans[0].stop_file is not None
    assert json.loads(plans[0].stop_file.read_text()) == {"at_step": 3 + 1 + EXTRA_STEPS, "diverged_at_step": 2}


def test_a_reference_is_never_stopped_while_a_repeat_compared_with_it_agrees(tmp_path: Path) -> None:
    """One of its two repeats diverged, the other agrees so far: the reference runs on."""
    records, plans, watch = _running_reference_of_two(tmp_path)
    write_trace(plans[1].trace, _changed_from(records, 2)[: 5 * PER_STEP], None, flush_every=PER_STEP)
    write_trace(plans[2].trace, records[: 5 * PER_STEP], None, flush_every=PER_STEP)
    for plan in plans[1:]:
        watch.poll(plan, False)
    assert plans[0].stop_file is not None
    assert not plans[0].stop_file.exists()
