"""Match strength (what a verdict rests on) and the --self-check negative control."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import torch
from conftest import SCRIPTS, run_cli
from synthetic import training_records, write_trace

from detaudit.compare.match import choose_record, describe_match, detect, not_compared
from detaudit.compare.traces import compare_traces
from detaudit.recorder.core import one_ulp
from detaudit.results import RepeatResult, Tolerance
from detaudit.trace import Flag, Kind


def test_match_counts_records_by_kind_and_says_what_was_not_observed(tmp_path: Path) -> None:
    recs = training_records(steps=3, layers=2)
    paths = [write_trace(tmp_path / f"r{i}.trace", recs, {"exit_code": 0}) for i in range(2)]
    comparison = compare_traces(paths, ["cpu", "cpu"])
    m = describe_match(paths[0], comparison, bitwise=True, tolerance=Tolerance(), granularity="module",
                       stdout="ignore", devices=["cpu", "cpu"])
    assert m.records_by_kind == {"output": 6, "grad": 6, "param": 6}
    assert m.comparison == "bitwise"
    assert m.tolerance is None
    assert m.steps_covered == 3
    assert any("CUDA kernels" in line for line in m.not_observed)
    assert any("individual ops" in line for line in m.not_observed)
    assert "stdout (ignored, or not recorded)" in m.not_observed
    assert m.stdout_compared == "no"


def test_a_schedulers_step_after_the_last_optimizer_step_adds_no_step(tmp_path: Path) -> None:
    """OneCycleLR stepped per batch: its state is recorded after each optimizer step, numbered with the next."""
    recs = training_records(steps=8, layers=1)
    recs += [recs[-1].but(name="lr_scheduler OneCycleLR", kind=Kind.OPTSTATE, step=8, module="")]
    paths = [write_trace(tmp_path / f"r{i}.trace", recs, {"exit_code": 0}) for i in range(2)]
    m = describe_match(paths[0], compare_traces(paths, ["cpu", "cpu"]), bitwise=True, tolerance=Tolerance(),
                       granularity="module", stdout="ignore", devices=["cpu", "cpu"])
    assert m.steps_covered == 8


def test_values_torch_save_could_not_encode_are_listed_as_not_observed(tmp_path: Path) -> None:
    recs = training_records(steps=2, layers=1)
    event = {"type": "unobserved", "what": "torch.save[0].config", "name": "mylib.Config", "loc": "t.py:3"}
    paths = [write_trace(tmp_path / f"r{i}.trace", recs, {"exit_code": 0}, events=[(1, event)]) for i in range(2)]
    m = describe_match(paths[0], compare_traces(paths, ["cpu", "cpu"]), bitwise=True, tolerance=Tolerance(),
                       granularity="module", stdout="ignore", devices=["cpu", "cpu"])
    assert any("torch.save[0].config (mylib.Config)" in line for line in m.not_observed)


def test_outputs_set_aside_as_no_results_are_named_with_their_count(tmp_path: Path) -> None:
    recs = training_records(steps=2, layers=1)
    aside = recs[0].but(kind=Kind.OP, name="aten.mkldnn_rnn_layer.default[3]", flags=int(Flag.NOT_RESULT))
    paths = [write_trace(tmp_path / f"r{i}.trace", [aside, *recs, aside], {"exit_code": 0}) for i in range(2)]
    m = describe_match(paths[0], compare_traces(paths, ["cpu", "cpu"]), bitwise=True, tolerance=Tolerance(),
                       granularity="op", stdout="ignore", devices=["cpu", "cpu"])
    assert [line.split(" (")[0] for line in m.not_observed if line.startswith("not results")] == \
        ["not results: 2 workspace outputs of aten.mkldnn_rnn_layer.default[3]"]


def test_the_perturbed_record_is_plain_and_in_the_middle_step(tmp_path: Path) -> None:
    recs = training_records(steps=4, layers=2)
    recs[6] = recs[6].but(flags=int(Flag.NO_DATA))  # contents unreadable: a change there cannot show
    recs[7] = recs[7].but(shape="0x3")  # empty: nothing to change
    path = write_trace(tmp_path / "r.trace", recs, {"exit_code": 0})
    index, step, name = choose_record(path) or (None, None, None)
    assert (index, step) == (8, 1)
    assert name == recs[8].name


def test_a_device_record_can_carry_the_change_but_not_a_content_less_or_threaded_one(tmp_path: Path) -> None:
    """On an accelerator every record is DEVICE: --self-check picks those (it silently did nothing there)."""
    recs = [r.but(flags=int(Flag.DEVICE)) for r in training_records(steps=2)]
    assert choose_record(write_trace(tmp_path / "device.trace", recs, {"exit_code": 0})) is not None
    unusable = [r.but(flags=int((Flag.NO_DATA, Flag.THREAD, Flag.NOT_RESULT)[i % 3])) for i, r in enumerate(recs)]
    assert choose_record(write_trace(tmp_path / "none.trace", unusable, {"exit_code": 0})) is None


def test_the_change_lands_at_its_record_on_the_device_path_too(tmp_path: Path) -> None:
    """Recorder.perturb_at counts records still waiting for their device digests: the change is
    seen at exactly the chosen record (the device path runs on the CPU here)."""
    from detaudit.recorder.core import Recorder
    from detaudit.trace import Kind, TraceWriter, read_trace

    digests = []
    for sub, perturb in (("ref", None), ("changed", 3)):
        rec = Recorder(TraceWriter(tmp_path / f"{sub}.trace", {"repeat": 0}), device_path_on_cpu=True)
        rec.perturb_at = perturb
        for i in range(6):
            rec.record_object(Kind.CHECKPOINT, f"t{i}", torch.arange(4.0) + i)
        rec.close({"exit_code": 0})
        digests.append(read_trace(tmp_path / f"{sub}.trace").records["digest"])
    assert [i for i in range(6) if digests[0][i] != digests[1][i]] == [3]


def test_a_self_check_that_cannot_run_says_why(tmp_path: Path) -> None:
    from synthetic import write_run

    from detaudit.audit.follow_up import self_check
    from detaudit.run.rundir import read_run

    recs = [r.but(flags=int(Flag.THREAD)) for r in training_records(steps=2)]
    run_dir = write_run(tmp_path / "run", [recs, recs])
    _, results = read_run(run_dir)
    check = self_check(cast(Any, None), run_dir, results[0])  # no options needed: no repeat is started
    assert not check.passed
    assert check.record is None
    assert "no recorded tensor could carry" in check.not_run


@pytest.mark.parametrize("seen_at, passed", [(8, True), (3, False), (None, False)])
def test_self_check_passes_only_at_exactly_the_injected_record(tmp_path: Path, seen_at: int | None,
                                                                passed: bool) -> None:
    recs = training_records(steps=4)
    changed = list(recs)
    if seen_at is not None:
        changed[seen_at] = changed[seen_at].but(digest=changed[seen_at].digest + 1)
    ref = write_trace(tmp_path / "ref.trace", recs, {"exit_code": 0})
    other = write_trace(tmp_path / "other.trace", changed, {"exit_code": 0})
    check = detect(ref, other, (8, 1, recs[8].name), Tolerance(), bitwise=True)
    assert check.passed is passed
    assert check.detected_at == seen_at


@pytest.mark.parametrize("value", [torch.tensor([1.5, 2.0]), torch.ones(3, 2).t(), torch.arange(4),
                                   torch.tensor([True, False]), torch.ones(2, dtype=torch.bfloat16)])
def test_one_ulp_changes_one_element_by_its_lowest_bit_and_leaves_the_original(value: torch.Tensor) -> None:
    before = value.clone()
    changed = one_ulp(value)
    assert torch.equal(value, before)
    differ = (changed != value).flatten()
    assert int(differ.sum()) == 1
    assert bool(differ[0])
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()]
    a = value.contiguous().view(bits).flatten()[0].item()
    b = changed.contiguous().view(bits).flatten()[0].item()
    assert a ^ b == 1  # the lowest bit: one ULP for a float


@pytest.mark.process
@pytest.mark.slow
def test_self_check_end_to_end(tmp_path: Path) -> None:
    result = run_cli(["run", str(SCRIPTS / "train_mlp.py"), "-n", "2", "--granularity", "step", "--self-check",
                      "--out", "run", "--json", "report.json"], cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert result.report is not None
    check = result.report["match"]["self_check"]
    assert check["passed"]
    assert check["detected_at"] == check["record"]
    assert "self-check passed" in result.stdout
    assert (tmp_path / "run" / "selfcheck-0.trace").is_file()
    assert result.report["match"]["granularity"] == "step"


def test_a_device_digest_fallback_is_said_once_in_what_the_verdict_rests_on(tmp_path: Path) -> None:
    """recorder/devicehash.py's fail-safe: a fast device digest that disagreed with the reference is one line."""
    recs = training_records(steps=2, layers=1)
    event = {"type": "device-digest", "detail": "the Triton batch kernel disagreed with the reference"}
    paths = [write_trace(tmp_path / f"r{i}.trace", recs, {"exit_code": 0}, events=[(1, event), (2, event)])
             for i in range(2)]
    m = describe_match(paths[0], compare_traces(paths, ["cuda", "cuda"]), bitwise=True, tolerance=Tolerance(),
                       granularity="module", stdout="ignore", devices=["cuda", "cuda"])
    assert [line for line in m.not_observed if "Triton" in line] == [event["detail"]]


def _stopped(index: int) -> RepeatResult:
    return RepeatResult(index, "cpu", None, 1.0, False, f"repeat-{index}.trace", "o", "e", "", stopped_at_step=4,
                        stopped_by="divergence", diverged_at_step=0)


@pytest.mark.parametrize(("stopped", "named"), [((1,), False), ((0, 1), True)])
def test_the_reference_is_said_to_have_stopped_only_when_it_did(stopped: tuple[int, ...], named: bool) -> None:
    assert ("the others' reference" in not_compared([_stopped(i) for i in stopped])[0]) is named
