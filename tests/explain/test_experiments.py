"""How `--explain` experiments confirm, qualify or demote causes, and how stored ones are read back."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
from synthetic import training_records, write_run

from detaudit.audit.pipeline import load_run
from detaudit.causes import confirm
from detaudit.causes.confirm import apply
from detaudit.errors import TraceError
from detaudit.pin import SEP, Pin, also_pins
from detaudit.records import StoredExperiment
from detaudit.results import Cause, Confidence, Experiment, ExperimentVerdict
from detaudit.run.rundir import read_experiments, write_experiments


def cause(cause_id: str, pins: list[str], confidence: Confidence = "likely", separating: Pin | None = None) -> Cause:
    return Cause(cause_id, confidence, "summary", ["seen"], "fix", pins, separating_pin=separating)


REST_OF_LAYOUT = SEP.join(also_pins(Pin.ADDRESS_LAYOUT))  # what the address-layout experiment pins besides


def test_a_pin_that_removes_the_divergence_confirms_and_ranks_first() -> None:
    causes = [cause("python-hash-seed", ["hash-seed"]), cause("object-order", ["address-layout"], "possible")]
    experiments = [Experiment("hash-seed", "the hash seed", "divergent", 5, "still at #5"),
                   Experiment("address-layout", "the layout", "deterministic", None),
                   Experiment(REST_OF_LAYOUT, "the rest", "divergent", 5)]
    ranked = apply(causes, experiments, 5)
    assert [c.id for c in ranked] == ["object-order", "python-hash-seed"]
    assert ranked[0].confidence == "confirmed"
    assert "with only the rest of what it pins (torch-rng, numpy-rng, python-rng, hash-seed) they still diverge" in \
        ranked[0].evidence[-1]
    assert ranked[1].confidence == "ruled-out"  # its own experiment failed: listed below, as such
    assert "still diverge" in ranked[1].evidence[-1]


def test_an_experiment_that_pins_several_sources_confirms_none_alone() -> None:
    """The address-layout pin also seeds the RNGs: with a seeding undone (fork_rng) it agrees, and must not
    confirm object order; pinning the rest without the layout tells which."""
    causes = [cause("object-order", ["address-layout"])]
    agreed = Experiment("address-layout", "the layout", "deterministic", None)
    [narrowed] = apply(causes, [agreed], 5)
    assert narrowed.confidence == "likely"
    assert "narrows the source to these and confirms none" in narrowed.evidence[-1]
    ranked = apply(causes, [agreed, Experiment(REST_OF_LAYOUT, "the rest", "deterministic", None),
                            Experiment("torch-rng", "the torch RNG", "deterministic", None)], 5)
    assert [(c.id, c.confidence) for c in ranked] == [("unseeded-torch-rng", "confirmed"),
                                                      ("object-order", "not-needed")]
    assert "not needed" in ranked[1].evidence[-1]


def test_a_confirmed_source_makes_the_others_unnecessary() -> None:
    causes = [cause("unseeded-python-rng", ["python-rng"]), cause("unseeded-torch-rng", ["torch-rng"], "possible")]
    ranked = apply(causes, [Experiment("torch-rng", "the torch RNG", "deterministic", None)], 5)
    assert [(c.id, c.confidence) for c in ranked] == [("unseeded-torch-rng", "confirmed"),
                                                      ("unseeded-python-rng", "not-needed")]


def test_every_cause_refuted_ranks_below_one_that_was_not() -> None:
    causes = [cause("python-hash-seed", ["hash-seed"], "possible"), cause("object-order", ["address-layout"]),
              cause("concurrency", [], "possible")]
    ranked = apply(causes, [Experiment("hash-seed", "h", "divergent", 5), Experiment("address-layout", "a",
                                                                                      "divergent", 5)], 5)
    assert [(c.id, c.confidence) for c in ranked] == [("concurrency", "possible"), ("python-hash-seed", "ruled-out"),
                                                      ("object-order", "ruled-out")]


def test_a_control_agreeing_once_is_weak_beside_evidence_at_the_divergence() -> None:
    direct = replace(cause("unseeded-python-rng", ["python-rng"]), basis="direct")
    ranked = apply([direct], [Experiment("python-rng", "p", "deterministic", None),
                              Experiment("control", "nothing", "deterministic", None)], 5)
    assert [(c.id, c.confidence) for c in ranked] == [("unseeded-python-rng", "likely"),
                                                      ("not-reproduced", "possible")]
    assert any("weak evidence" in line for line in ranked[1].evidence)
    ranked = apply([cause("object-order", ["address-layout"])],
                   [Experiment("control", "nothing", "deterministic", None)], 5)
    assert ranked[0].id == "not-reproduced"  # nothing ties a source to the divergence: the control leads


def test_a_divergence_that_only_moved_is_no_evidence() -> None:
    """A loop whose length depends on the clock moves the first divergence by chance: never a confirmation."""
    causes = [cause("python-hash-seed", ["hash-seed"])]
    ranked = apply(causes, [Experiment("hash-seed", "the hash seed", "divergent", 40145, "moved later")],
                           39516)
    assert ranked[0].confidence == "ruled-out"
    assert ranked[0].basis != "experiment"
    assert "from #39516 to #40145, which is no evidence by itself" in ranked[0].evidence[-1]
    assert "explains" not in ranked[0].evidence[-1]


def test_a_confirmed_cause_rests_on_the_experiment() -> None:
    ranked = apply([cause("unseeded-torch-rng", ["torch-rng"])],
                           [Experiment("torch-rng", "the torch RNG", "deterministic", None)], 3)
    assert ranked[0].confidence == "confirmed"
    assert ranked[0].basis == "experiment"


@pytest.mark.parametrize("verdict, first", [("deterministic", "python-hash-seed"), ("divergent", "object-order")])
def test_the_separating_experiment_settles_a_toss_up(verdict: ExperimentVerdict, first: str) -> None:
    a = cause("python-hash-seed", ["hash-seed"], "possible", Pin.HASH_SEED)
    b = cause("object-order", ["address-layout"], "possible", Pin.HASH_SEED)
    ranked = apply([a, b], [Experiment("hash-seed", "the hash seed", verdict, None)], 5)
    assert ranked[0].id == first
    assert ranked[0].confidence == ("confirmed" if verdict == "deterministic" else "likely")
    # the other of the pair: made unnecessary by its rival's experiment, or ruled out by its own
    assert ranked[1].confidence == ("not-needed" if verdict == "deterministic" else "ruled-out")


def test_elimination_within_a_toss_up_is_not_likely_while_another_cause_stands() -> None:
    a = cause("object-order", ["address-layout"], "possible", Pin.HASH_SEED)
    b = cause("python-hash-seed", ["hash-seed"], "possible", Pin.HASH_SEED)
    ranked = apply([a, b, cause("concurrency", [], "possible")],
                   [Experiment("hash-seed", "the hash seed", "divergent", None)], 5)
    assert [(c.id, c.confidence) for c in ranked] == [("object-order", "possible"), ("concurrency", "possible"),
                                                      ("python-hash-seed", "ruled-out")]
    assert ranked[0].evidence[-1].endswith("this one remains beside concurrency (not confirmed)")


def test_an_isolated_source_no_cause_named_is_added_confirmed() -> None:
    experiments = [Experiment("all", "every source", "deterministic", None),
                   Experiment("torch-rng+numpy-rng+python-rng+hash-seed", "four", "deterministic", None),
                   Experiment("hash-seed", "the string hash seed", "deterministic", None)]
    ranked = apply([cause("concurrency", [])], experiments, 5)
    assert ranked[0].id == "python-hash-seed"
    assert ranked[0].confidence == "confirmed"
    assert [c.id for c in ranked] == ["python-hash-seed", "concurrency"]


def test_everything_pinned_still_diverging_is_evidence_for_order_causes() -> None:
    causes = [cause("concurrency", [])]
    ranked = apply(causes, [Experiment("all", "every source", "divergent", 0, "")], 0)
    assert "every pin at once" in ranked[0].evidence[-1]
    ranked = apply([cause("unseeded-torch-rng", ["torch-rng"])],
                           [Experiment("all", "every source", "divergent", 0, "")], 0)
    assert ranked[-1].id == "unknown"


def test_skipped_experiments_change_nothing() -> None:
    causes = [cause("cudnn-benchmark", ["cudnn"])]
    ranked = apply(causes, [Experiment("cudnn", "cuDNN", "skipped", None, "over the budget")], 2)
    assert ranked[0].confidence == "likely"
    assert ranked[0].evidence == ["seen"]


def test_apply_leaves_the_causes_it_was_given_unchanged() -> None:
    """Causes are values: the ranking before experiments (`inferred`) must not change under the re-ranking."""
    causes = [cause("python-hash-seed", ["hash-seed"])]
    apply(causes, [Experiment("hash-seed", "the hash seed", "deterministic", None)], 5)
    assert causes == [cause("python-hash-seed", ["hash-seed"])]


def test_a_stored_experiment_reranks_the_rebuilt_report(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    before = load_run(run_dir)
    assert before.experiments == []
    write_experiments(run_dir, [StoredExperiment(Experiment("torch-rng", "the torch RNG", "deterministic", None),
                                                 "explain-torch-rng", ())])
    stored = [e.experiment for e in read_experiments(run_dir)]
    assert stored == [Experiment("torch-rng", "the torch RNG", "deterministic", None)]
    after = load_run(run_dir)
    assert [e.pin for e in after.experiments] == ["torch-rng"]
    assert after.inferred == before.inferred  # the ranking from the evidence alone stays on record
    assert after.causes[0].confidence == "confirmed"
    assert after.causes[0].basis == "experiment"


def test_the_reranking_reads_no_file() -> None:
    """confirm.py is a detector: the audit hands it the stored experiments (issue 34: detectors do no I/O)."""
    imported = {node.module for node in ast.walk(ast.parse(Path(confirm.__file__).read_text()))
                if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and (m.startswith("detaudit.run") or m == "pathlib")}


def test_a_foreign_experiment_record_is_refused(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    run_dir = write_run(tmp_path / "run", [recs, [recs[0].but(digest=77), *recs[1:]]])
    (run_dir / "explain.json").write_text(json.dumps({"format": "detaudit-explain", "version": 99}))
    with pytest.raises(TraceError, match="experiment record version 99 is not supported"):
        load_run(run_dir)
