"""batch/finding.py and batch/diagnosis.py: probe events -> a finding -> causes."""

from __future__ import annotations

from batchcases import ROUNDING, call, origin, spot, subset

from detaudit.batch.diagnosis import diagnose_batch
from detaudit.batch.finding import analyse, is_large


def test_rows_that_agree_everywhere_are_batch_invariant() -> None:
    finding = analyse([call([subset("prefix", 1), subset("reversed", 256)])])  # type: ignore[list-item]
    assert finding.verdict == "batch-invariant"
    assert finding.first_variant is None
    assert diagnose_batch(finding) == []


def test_no_probed_call_is_inconclusive_and_counts_the_reasons() -> None:
    skip = {"type": "batch-skip", "module": "Net", "call": 0, "why": "dropout", "detail": "`drop` (Dropout)"}
    finding = analyse([skip, {**skip, "call": 1}])  # type: ignore[list-item]
    assert finding.verdict == "inconclusive"
    assert finding.skipped == {"dropout": 2}
    assert finding.not_comparable == 2


def test_a_variant_call_lists_the_sizes_that_differ_and_agree() -> None:
    finding = analyse([call(ROUNDING), origin(spot("aten.addmm"), spot("fc"))])  # type: ignore[list-item]
    first = finding.first_variant
    assert finding.verdict == "batch-variant"
    assert first is not None
    assert first.sizes_text == "batch 1 and 7 differ from 256; 32, 128 and reversed agree"
    assert first.op is not None
    assert first.op.name == "aten.addmm"
    assert not first.large
    assert [(s.size, s.agree) for s in finding.subsets if s.kind == "prefix"] == [(1, False), (7, False), (32, True),
                                                                                  (128, True)]


def test_a_matmul_origin_is_a_blocking_cause_with_its_fixes() -> None:
    [cause] = diagnose_batch(analyse([call(ROUNDING), origin(spot("aten.addmm"))]))  # type: ignore[list-item]
    assert cause.id == "batch-matmul"
    assert cause.basis == "op-records"
    assert "fixed batch shapes" in cause.fix
    assert any("model.py:12" in line for line in cause.evidence)


def test_reductions_and_attention_are_told_from_matmuls() -> None:
    for op, family in (("aten.sum", "batch-reduction"), ("aten._scaled_dot_product_flash_attention_for_cpu",
                                                         "batch-attention"), ("aten.cumsum", "batch-reduction"),
                       ("aten.sort", "batch-kernel")):
        [cause] = diagnose_batch(analyse([call(ROUNDING), origin(spot(op))]))  # type: ignore[list-item]
        assert cause.id == family, op


def test_a_large_difference_or_a_value_reduced_over_the_batch_is_a_rows_mix_bug() -> None:
    large = [subset("prefix", 1, 1, 0.06), subset("reversed", 256)]
    [cause] = diagnose_batch(analyse([call(large), origin(spot("aten.addmm"))]))  # type: ignore[list-item]
    assert cause.id == "batch-rows-mix"
    assert "correctness bug" in cause.summary
    across = origin(spot("aten.any", across_rows=True))
    [cause] = diagnose_batch(analyse([call(ROUNDING), across]))  # type: ignore[list-item]
    assert cause.id == "batch-rows-mix"
    assert any("reduced over the batch" in line for line in cause.evidence)


def test_large_is_relative_to_the_values_and_the_dtype() -> None:
    assert not is_large(1e-6, 2.0, "float32")
    assert is_large(0.01, 2.0, "float32")
    assert not is_large(0.1, 2.0, "bfloat16")
    assert is_large(1.0, 2.0, "bfloat16")
    assert is_large(1, 5, "int64")
    assert is_large(0.0, 1.0, "float32", structural=True)


LADDER = [subset("prefix", k, ladder=True) for k in (1, 2, 4, 8)] + [subset("prefix", 7, ladder=False)]


def test_an_invariant_call_passes_the_harness_at_every_size_of_its_ladder() -> None:
    harness = analyse([call(LADDER, n=16)]).harness  # type: ignore[list-item]
    assert (harness.status, [(k.size, k.status) for k in harness.sizes]) == (
        "pass", [(8, "pass"), (4, "pass"), (2, "pass"), (1, "pass")])


def test_the_harness_fails_at_the_first_differing_size_of_its_ladder_largest_first() -> None:
    rungs = [subset("prefix", k, differ=k if k < 4 else 0, diff=1e-7, ladder=True) for k in (1, 2, 4, 8)]
    assert analyse([call(rungs, n=16)]).harness.status == "fail_batch_invariance_at_2"  # type: ignore[list-item]


def test_a_size_outside_the_ladder_makes_the_call_variant_not_the_harness_fail() -> None:
    odd = [*LADDER[:4], subset("prefix", 7, differ=3, diff=1e-7, ladder=False)]
    finding = analyse([call(odd, n=16)])  # type: ignore[list-item]
    assert (finding.verdict, finding.harness.status) == ("batch-variant", "pass")


def test_a_model_with_only_an_aggregate_output_is_skipped_as_the_harness_does_never_passed() -> None:
    skip = {"type": "batch-skip", "module": "Net", "call": 0, "why": "aggregate-output",
            "detail": "no output has a dim of the batch's 8 rows (output (0-d))"}
    finding = analyse([skip])  # type: ignore[list-item]
    assert (finding.verdict, finding.harness.status) == ("inconclusive", "pass_due_to_skip")
    assert "output (0-d)" in (finding.harness.reason or "")


def test_a_matmul_fix_names_the_installed_torchs_batch_invariant_setting_and_its_scope() -> None:
    knob = {**origin(spot("aten.addmm")), "knob": "torch._inductor.config.batch_invariant"}
    [cause] = diagnose_batch(analyse([call(ROUNDING), knob]))  # type: ignore[list-item]
    assert "torch._inductor.config.batch_invariant = True" in cause.fix
    assert "torch.compile'd code only" in cause.fix


def test_without_a_setting_in_torch_the_fix_says_there_is_none() -> None:
    [cause] = diagnose_batch(analyse([call(ROUNDING), origin(spot("aten.addmm"))]))  # type: ignore[list-item]
    assert "This torch has no batch-invariant mode" in cause.fix
