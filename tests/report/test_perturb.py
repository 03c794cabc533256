"""`run --perturb`, in process: the settings catalogue (pin.py), which repeat runs with what (run/perturb_plan.py),
the repeats compared group by group (compare/perturb.py), the cause it proves (causes/perturbed_settings.py) and how
the report, the baseline and the renderers carry it. The real CLI runs in tests/e2e/test_e2e_perturb.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rich.console import Console
from synthetic import training_records, write_run

from detaudit.audit.pipeline import load_run
from detaudit.cli.render import render
from detaudit.compare import baseline_diff
from detaudit.compare.baseline_diff import BaselineCheck, EnvironmentChange
from detaudit.compare.perturb import compare_perturbed
from detaudit.errors import TraceError, UsageError
from detaudit.explain.runner import run_experiments
from detaudit.pin import Perturb, perturb_knobs, perturbations
from detaudit.recorder.pinning import Pins
from detaudit.records import BaselineManifest, Reference, RunRecord
from detaudit.report import baseline
from detaudit.report.html import render_html
from detaudit.report.model import Report, report_json
from detaudit.results import RepeatResult, Tolerance
from detaudit.run import perturb_plan
from detaudit.run.launcher import plan_repeats

T1, T2 = {"threads": "1"}, {"threads": "2"}


# -- the catalogue ------------------------------------------------------------------------------------------
def test_knobs_are_read_from_a_comma_list_in_catalogue_order() -> None:
    assert perturb_knobs("hash-seed, threads") == [Perturb.THREADS, Perturb.HASH_SEED]
    assert perturb_knobs("all") == list(Perturb)
    with pytest.raises(ValueError, match="unknown setting 'cores'.*threads, hash-seed"):
        perturb_knobs("threads,cores")
    with pytest.raises(ValueError, match="at least one"):
        perturb_knobs(" , ")
    with pytest.raises(ValueError, match="unknown setting 'bogus'"):
        perturb_knobs("all,bogus")  # `all` does not excuse a name that is no setting
    assert perturb_knobs("all,threads") == list(Perturb)


def test_threads_run_at_one_and_at_the_machines_count_never_both_at_one() -> None:
    assert [s.value for s in perturbations(16)[Perturb.THREADS].settings] == ["1", "16"]
    assert [s.value for s in perturbations(1)[Perturb.THREADS].settings] == ["1", "2"]
    assert perturbations(None)[Perturb.THREADS].settings[1].env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}


def test_every_setting_has_two_different_values() -> None:
    for spec in perturbations(8).values():
        first, second = spec.settings
        assert first.value != second.value
        assert (first.env != second.env or first.child != second.child)


# -- which repeat runs with what ----------------------------------------------------------------------------
def test_repeats_alternate_between_the_base_group_and_one_group_per_setting(tmp_path: Path) -> None:
    plan = perturb_plan.plan([Perturb.THREADS, Perturb.HASH_SEED], ["cpu"], 4)
    plans = plan.assign(plan_repeats(tmp_path, 6, ["cpu"], env={"KEEP": "1"}, child_config={"pins": []}))
    assert [p.perturbation for p in plans] == [
        {"threads": "1", "hash-seed": "1"}, {"threads": "4", "hash-seed": "1"}, {"threads": "1", "hash-seed": "2"}] * 2
    assert plans[1].env == {"KEEP": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4",
                            "PYTHONHASHSEED": "1"}
    assert plans[1].child_config["perturb"] == {}
    assert plans[1].child_config["pins"] == []


def test_a_cuda_only_setting_is_not_varied_on_a_run_that_sees_no_gpu(tmp_path: Path) -> None:
    plan = perturb_plan.plan(list(Perturb), ["cpu"], 2)
    assert [s.knob for s in plan.specs] == [Perturb.THREADS, Perturb.HASH_SEED]
    assert set(plan.not_tested) == {"cudnn-benchmark", "cublas-workspace", "allocator"}
    with pytest.raises(UsageError, match="only CUDA work can notice"):
        perturb_plan.plan([Perturb.CUDNN_BENCHMARK], ["cpu"], 2)
    on_gpu = perturb_plan.plan([Perturb.CUDNN_BENCHMARK], ["cuda"], 2)
    [base, benchmark] = on_gpu.assign(plan_repeats(tmp_path, 2, ["cuda"]))
    assert base.child_config["perturb"] == {"cudnn.benchmark": False}
    assert benchmark.child_config["perturb"] == {"cudnn.benchmark": True}


def test_the_child_sets_a_perturbed_flag_at_import_and_refuses_an_unknown_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    Pins([], {"cudnn.benchmark": True}).apply_torch(torch)
    assert torch.backends.cudnn.benchmark is True
    with pytest.raises(ValueError, match="unknown perturbed flag 'cudnn.fast'"):
        Pins([], {"cudnn.fast": True})


def test_a_repeats_settings_travel_through_run_json() -> None:
    result = RepeatResult(0, "cpu", 0, 1.0, False, "t", "o", "e", "d", perturbation=T1)
    assert RepeatResult.from_dict(result.to_dict()) == result
    assert "perturbation" not in RepeatResult(0, "cpu", 0, 1.0, False, "t", "o", "e", "d").to_dict()
    record = RunRecord("train.py", perturb=("threads",), not_perturbed={"allocator": "CPU only"}, results=(result,))
    assert RunRecord.from_dict(record.to_dict(), "run.json") == record
    assert "perturb" not in RunRecord("train.py").to_dict()
    edited = record.to_dict()
    edited["results"][0]["perturbation"] = {"cores": "4"}
    with pytest.raises(TraceError, match=r"run.json: field `results\[0\].perturbation` names 'cores'"):
        RunRecord.from_dict(edited, "run.json")


# -- the comparison, the cause and the report -----------------------------------------------------------------
def perturbed_run(tmp_path: Path, sensitive: bool, control_differs: bool = False) -> Path:
    """Four repeats, threads 1 and 2 alternating: the thread groups differ when `sensitive`; repeat 2 differs
    from repeat 0 (equal settings) when `control_differs`."""
    one, two, odd = training_records(), training_records(), training_records()
    if sensitive:
        two[3] = two[3].but(digest=99, samples=(1.0, 2.0, 3.0, 4.5))
    odd[1] = odd[1].but(digest=77)
    return write_run(tmp_path / "run", [one, two, odd if control_differs else one, two],
                     perturbations=[T1, T2, T1, T2])


def test_a_setting_that_changes_the_bits_is_confirmed_by_the_groups_that_agree(tmp_path: Path) -> None:
    report = load_run(perturbed_run(tmp_path, sensitive=True))
    found = report.perturbation
    assert found is not None
    assert found.control is None
    assert found.groups == ((0, 2), (1, 3))
    [threads] = found.sensitive
    assert (threads.values, threads.base, threads.changed) == (("1", "2"), (0, 2), (1, 3))
    assert threads.divergence is not None
    assert threads.divergence.index == 3
    assert threads.divergence.repeats == [1, 3]
    assert report.verdict == "divergent"
    assert [c.id for c in report.causes] == ["thread-count"]  # nothing else varies from run to run
    cause = report.causes[0]
    assert (cause.confidence, cause.basis) == ("confirmed", "experiment")
    assert "will not reproduce on a machine with a different core count" in cause.summary
    assert any("1 in repeats 0 and 2; 2 in repeats 1 and 3; every other" in line for line in cause.evidence)
    assert "repeats with equal settings agree: repeats 0 and 2; repeats 1 and 3" in cause.evidence
    assert any(line.startswith("first divergence between the two: record #3") for line in cause.evidence)
    data = report_json(report)
    assert data["runs"][1]["perturbation"] == T2
    assert data["perturbation"]["sensitive"] == ["threads"]
    assert data["perturbation"]["control_agrees"] is True
    assert data["perturbation"]["settings"][0]["first_divergence"]["index"] == 3


def test_a_setting_that_changes_nothing_survives(tmp_path: Path) -> None:
    report = load_run(perturbed_run(tmp_path, sensitive=False))
    assert report.verdict == "deterministic"
    assert report.causes == []
    assert report.perturbation is not None
    assert [k.knob for k in report.perturbation.survived] == ["threads"]


def test_when_equal_settings_already_differ_no_setting_is_blamed(tmp_path: Path) -> None:
    report = load_run(perturbed_run(tmp_path, sensitive=True, control_differs=True))
    found = report.perturbation
    assert found is not None
    assert found.control is not None
    assert found.control.repeats == [2]
    assert found.sensitive == []
    assert found.survived == []
    assert "thread-count" not in [c.id for c in report.causes]


def test_a_setting_under_which_the_script_exits_early_is_an_outcome_difference_not_a_bit_change(
        tmp_path: Path) -> None:
    """The threads-2 repeats end by themselves after 4 records: no record they made differs, so the setting
    changed how the script ended, never the bits of a record those repeats did not make."""
    whole = training_records()
    run = write_run(tmp_path / "run", [whole, whole[:4], whole, whole[:4]], perturbations=[T1, T2, T1, T2])
    report = load_run(run)
    assert report.perturbation is not None
    [threads] = report.perturbation.sensitive
    assert threads.divergence is not None
    assert (threads.divergence.category, threads.divergence.record) == ("outcome", None)
    assert threads.divergence.detail == ("repeat(s) 1, 3 ended by themselves after 4 records where repeat 0 went on "
                                         "(exit status 0)")
    evidence = report.causes[0].evidence
    assert not any(line.startswith("first divergence between the two") for line in evidence)
    assert f"the two ended differently, every record both made agreeing: {threads.divergence.detail}" in evidence
    console = Console(record=True, width=250)
    render(report, console)
    assert "ENDED DIFFERENTLY: repeat(s) 1, 3 ended by themselves" in console.export_text()
    page = render_html(Report.from_dict(json.loads(json.dumps(report.to_dict()))))
    assert "ENDED DIFFERENTLY: repeat(s) 1, 3 ended by themselves" in page


def test_a_setting_under_which_the_script_fails_is_compared_as_a_failure(tmp_path: Path) -> None:
    recs = training_records()
    run = write_run(tmp_path / "run", [recs, recs, recs, recs], perturbations=[T1, T2, T1, T2],
                    exit_codes=[0, 1, 0, 1])
    found = load_run(run).perturbation
    assert found is not None
    [threads] = found.sensitive
    assert threads.divergence is not None
    assert threads.divergence.detail == ("exit status differs: repeat 0 exited 0, repeat 2 exited 0, repeat 1 exited "
                                         "1, repeat 3 exited 1")  # the base group first


def test_explain_refuses_a_perturbed_run(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="a `run --perturb` run, whose repeats differ on purpose"):
        run_experiments(perturbed_run(tmp_path, sensitive=True))


def test_an_unperturbed_run_has_no_perturbation_finding(tmp_path: Path) -> None:
    recs = training_records()
    run = write_run(tmp_path / "run", [recs, recs])
    assert load_run(run).perturbation is None
    assert compare_perturbed([], [], [], Tolerance(), []) is None


def test_the_terminal_and_html_reports_show_the_settings_and_what_they_changed(tmp_path: Path) -> None:
    report = load_run(perturbed_run(tmp_path, sensitive=True))
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "Perturbed settings (--perturb)" in text
    assert "threads=2" in text
    assert "the bits change with the settings varied (threads)" in text
    assert "CHANGED, first at record #3" in text
    page = render_html(Report.from_dict(json.loads(json.dumps(report.to_dict()))))
    assert "Perturbed settings (--perturb)" in page
    assert "CHANGED, first at record #3" in page


def test_the_terminal_names_a_changed_field_a_setting_stands_for(tmp_path: Path) -> None:
    report = load_run(perturbed_run(tmp_path, sensitive=True))
    moved = report.perturbation.knobs[0].divergence if report.perturbation is not None else None
    found = baseline_diff.sensitivities([change("num_threads", 2, 1)], {}, None, differs=True)
    check = BaselineCheck("base", moved, [change("num_threads", 2, 1)], sensitivities=found)
    console = Console(record=True, width=200)
    render(replace(report, baseline=check), console)
    assert "num_threads: not tested: `detaudit run --perturb threads` tells whether the difference comes from it" \
        in console.export_text()
    page = render_html(Report.from_dict(json.loads(json.dumps(replace(report, baseline=check).to_dict()))))
    assert "tells whether the difference comes from it" in page


# -- baselines ------------------------------------------------------------------------------------------------
def change(name: str, before: object, after: object) -> EnvironmentChange:
    return EnvironmentChange(name, before, after)


def test_a_changed_field_is_matched_to_the_setting_it_stands_for(tmp_path: Path) -> None:
    changes = [change("num_threads", 2, 16), change("$PYTHONHASHSEED", "0", None), change("torch", "2.1", "2.2")]
    found = baseline_diff.sensitivities(changes, {"hash-seed": ("1", "2")}, None, differs=True)
    assert [(s.setting, s.fields, s.status) for s in found] == [
        ("threads", ["num_threads"], "untested"), ("hash-seed", ["$PYTHONHASHSEED"], "survived")]
    assert "--perturb threads" in found[0].note
    # a run that matched the baseline: an untested change is no suspect
    assert [s.setting for s in baseline_diff.sensitivities(changes, {}, None, differs=False)] == []


def test_this_runs_perturbation_names_a_change_the_bits_depend_on(tmp_path: Path) -> None:
    found = load_run(perturbed_run(tmp_path, sensitive=True)).perturbation
    [threads] = baseline_diff.sensitivities([change("$OMP_NUM_THREADS", "1", "8")], {}, found, differs=True)
    assert threads.status == "sensitive"
    assert "matches it" in threads.note


def test_a_baseline_keeps_the_settings_its_run_survived(tmp_path: Path) -> None:
    run = perturbed_run(tmp_path, sensitive=False)
    saved = baseline.save(run, load_run(run), tmp_path / "base")
    manifest = json.loads((saved / baseline.MANIFEST).read_text())
    assert manifest["survived"] == {"threads": ["1", "2"]}
    assert baseline.load(saved).survived == {"threads": ("1", "2")}
    plain = BaselineManifest("t.py", (), "module", Reference("reference.trace", "x", "cpu", 0, "d"), {})
    assert "survived" not in plain.to_dict()
    assert BaselineManifest.from_dict(plain.to_dict(), "b") == plain
