"""Pin planning and how experiment results confirm, qualify or demote causes."""

from __future__ import annotations

from detaudit import explain
from detaudit.report import Cause, Experiment


def cause(cause_id: str, pins: list[str], confidence: str = "likely") -> Cause:
    return Cause(cause_id, confidence, "summary", ["seen"], "fix", pins)


def test_plan_follows_the_ranking_without_duplicates() -> None:
    causes = [cause("nondeterministic-op", ["deterministic", "one-thread"]), cause("thread-count", ["one-thread"]),
              cause("concurrency", [])]
    assert explain.plan(causes) == ["deterministic", "one-thread"]


def test_all_pins_everything() -> None:
    everything = explain.pin_of(explain.ALL)
    assert set(everything.child) >= {"torch-rng", "deterministic", "zero-empty", "address-layout"}
    assert everything.env["PYTHONHASHSEED"] == "0" and everything.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_pin_that_removes_the_divergence_confirms_and_ranks_first() -> None:
    causes = [cause("python-hash-seed", ["hash-seed"]), cause("object-order", ["address-layout"], "possible")]
    experiments = [Experiment("hash-seed", "the hash seed", "divergent", 5, "still at #5"),
                   Experiment("address-layout", "the layout", "deterministic", None)]
    ranked = explain.apply(causes, experiments, 5)
    assert [c.id for c in ranked] == ["object-order", "python-hash-seed"]
    assert ranked[0].confidence == "confirmed"
    assert ranked[1].confidence == "possible"
    assert "still diverge" in ranked[1].evidence[-1]


def test_a_pin_that_moves_the_divergence_later_says_where() -> None:
    causes = [cause("unseeded-torch-rng", ["torch-rng"])]
    ranked = explain.apply(causes, [Experiment("torch-rng", "the torch RNG", "divergent", 40, "moved later")], 3)
    assert ranked[0].confidence == "likely"
    assert "from #3 to #40" in ranked[0].evidence[-1]


def test_everything_pinned_still_diverging_is_evidence_for_order_causes() -> None:
    causes = [cause("concurrency", [])]
    ranked = explain.apply(causes, [Experiment("all", "every source", "divergent", 0, "")], 0)
    assert "every pin at once" in ranked[0].evidence[-1]
    ranked = explain.apply([cause("unseeded-torch-rng", ["torch-rng"])],
                           [Experiment("all", "every source", "divergent", 0, "")], 0)
    assert ranked[-1].id == "unknown"


def test_skipped_experiments_change_nothing() -> None:
    causes = [cause("cudnn-benchmark", ["cudnn"])]
    ranked = explain.apply(causes, [Experiment("cudnn", "cuDNN", "skipped", None, "over the budget")], 2)
    assert ranked[0].confidence == "likely" and ranked[0].evidence == ["seen"]
