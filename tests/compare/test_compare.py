"""compare_traces on synthetic traces: first divergence (content, structure, ended early),
cross-device tolerance, spread per step, and independence from the streaming chunk size."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic import Rec, training_records, write_trace

from detaudit.compare import align
from detaudit.compare.traces import ROOT_MODULE, Comparison, compare_traces, owning_module, sample_differences
from detaudit.results import Tolerance
from detaudit.trace import Kind


def run_compare(tmp: Path, traces: Sequence[Sequence[Rec]], devices: Sequence[str] | None = None,
                tolerance: Tolerance | None = None, incomplete: Sequence[int] = ()) -> Comparison:
    paths = [write_trace(tmp / f"repeat-{i}.trace", recs, None if i in incomplete else {"exit_code": 0})
             for i, recs in enumerate(traces)]
    return compare_traces(paths, devices, tolerance)


def mutate_digest(recs: list[Rec], k: int) -> list[Rec]:
    out = list(recs)
    out[k] = out[k].but(digest=out[k].digest ^ 1)
    return out


def test_identical_traces_do_not_diverge(tmp_path: Path) -> None:
    recs = training_records(steps=4)
    c = run_compare(tmp_path, [recs, recs, recs])
    assert c.first_divergence is None
    assert not c.divergent
    assert c.records == [len(recs)] * 3
    assert c.complete == [True] * 3
    assert c.records_compared == len(recs)
    assert c.records_differing == 0
    assert c.aligned_to_end
    assert [s.step for s in c.by_step] == [0, 1, 2, 3]
    assert all(s.differing == 0 for s in c.by_step)


@pytest.mark.parametrize("k", [0, 5, 17])
def test_digest_change_in_one_repeat_is_the_first_divergence(tmp_path: Path, k: int) -> None:
    recs = training_records(steps=3)
    c = run_compare(tmp_path, [recs, recs, mutate_digest(recs, k)])
    d = c.first_divergence
    assert d is not None
    assert d.index == k
    assert d.category == "content"
    assert d.repeats == [2]
    assert d.reference == 0
    assert d.record is not None
    assert d.record.name == recs[k].name
    assert d.record.step == recs[k].step
    assert d.record.kind == recs[k].kind.name.lower()
    assert d.record.module == recs[k].module
    assert d.record.location == recs[k].loc


def test_divergence_names_every_repeat_that_differs_there(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    later = mutate_digest(recs, 9)
    c = run_compare(tmp_path, [recs, mutate_digest(later, 4), recs, mutate_digest(recs, 4), later])
    d = c.first_divergence
    assert d is not None
    assert d.index == 4
    assert d.repeats == [1, 3]


def test_earliest_index_wins_across_repeats(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    c = run_compare(tmp_path, [recs, mutate_digest(recs, 12), mutate_digest(recs, 3)])
    d = c.first_divergence
    assert d is not None
    assert d.index == 3
    assert d.repeats == [2]


def test_other_name_is_structural(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    other = list(recs)
    other[6] = other[6].but(name="net.extra")
    c = run_compare(tmp_path, [recs, other])
    d = c.first_divergence
    assert d is not None
    assert d.index == 6
    assert d.category == "structure"
    assert d.repeats == [1]
    assert d.record is not None
    assert d.record.name == recs[6].name
    assert d.others[1].name == "net.extra"
    assert "net.extra" in d.detail
    assert not c.aligned_to_end


@pytest.mark.parametrize("field,value", [("kind", Kind.SAVE), ("step", 9), ("shape", "4x2"), ("dtype", "float64")])
def test_other_kind_step_shape_or_dtype_is_structural(tmp_path: Path, field: str, value: object) -> None:
    recs = training_records(steps=2)
    other = list(recs)
    other[3] = other[3].but(**{field: value})
    d = run_compare(tmp_path, [recs, other]).first_divergence
    assert d is not None
    assert d.index == 3
    assert d.category == "structure"


@pytest.mark.parametrize("field,value,words", [
    ("step", 9, "step 0 in repeat 0 and 9 in repeat 1"),
    ("shape", "4x2", "shape 4 in repeat 0 and 4x2 in repeat 1"),
    ("dtype", "float64", "dtype float32 in repeat 0 and float64 in repeat 1")])
def test_a_structure_divergence_of_one_record_says_what_differs_not_its_name_twice(
        tmp_path: Path, field: str, value: object, words: str) -> None:
    """Issue 45: 'repeat 0 recorded grad 'w' here, repeat 1 recorded grad 'w'' named the same record on both sides."""
    recs = training_records(steps=2)
    other = list(recs)
    other[3] = other[3].but(**{field: value})
    d = run_compare(tmp_path, [recs, other]).first_divergence
    assert d is not None
    assert d.detail == f"both repeats recorded grad {recs[3].name!r} here, with {words}"


def test_content_divergence_before_structural_one_is_first(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    other = mutate_digest(recs, 2)
    other[8] = other[8].but(name="elsewhere")
    d = run_compare(tmp_path, [recs, other]).first_divergence
    assert d is not None
    assert d.index == 2
    assert d.category == "content"


@pytest.mark.parametrize("short_repeat", [0, 1])
def test_shorter_complete_trace_ended_early(tmp_path: Path, short_repeat: int) -> None:
    """A repeat that finished (footer written) after fewer records recorded something else: structure."""
    recs = training_records(steps=3)
    traces = [recs, recs]
    traces[short_repeat] = recs[:10]
    c = run_compare(tmp_path, traces)
    d = c.first_divergence
    assert d is not None
    assert d.index == 10
    assert d.category == "structure"
    assert d.repeats == [short_repeat]
    assert "stopped recording after 10 records" in d.detail
    assert c.records[short_repeat] == 10
    assert c.records[1 - short_repeat] == len(recs)
    assert c.records_compared == 10
    assert c.records_differing == 0


@pytest.mark.parametrize("short_repeat", [0, 1])
def test_incomplete_trace_is_compared_as_far_as_it_goes(tmp_path: Path, short_repeat: int) -> None:
    """A recording without a footer (killed, or its writes failed) ending early is no divergence."""
    recs = training_records(steps=3)
    traces = [recs, recs]
    traces[short_repeat] = recs[:10]
    c = run_compare(tmp_path, traces, incomplete=[short_repeat])
    assert c.first_divergence is None
    assert c.records_compared == 10
    assert c.records[short_repeat] == 10
    assert c.records[1 - short_repeat] == len(recs)
    assert c.complete[short_repeat] is False
    assert c.complete[1 - short_repeat] is True
    traces[short_repeat] = mutate_digest(recs[:10], 7)  # a difference inside the prefix still counts
    (tmp_path / "changed").mkdir()
    d = run_compare(tmp_path / "changed", traces, incomplete=[short_repeat]).first_divergence
    assert d is not None
    assert d.index == 7


def test_empty_trace_against_full_one(tmp_path: Path) -> None:
    recs = training_records()
    c = run_compare(tmp_path, [recs, []], incomplete=[1])
    assert c.first_divergence is None
    assert c.records == [len(recs), 0]
    assert c.records_compared == 0
    (tmp_path / "finished").mkdir()
    d = run_compare(tmp_path / "finished", [recs, []]).first_divergence
    assert d is not None
    assert d.index == 0
    assert d.repeats == [1]


def _float32_step(x: float, ulps: int) -> float:
    """`x` moved by `ulps` float32 steps (x > 0)."""
    return float((np.array([x], dtype=np.float32).view(np.int32) + ulps).view(np.float32)[0])


def _cross_device(recs: list[Rec], perturb: float) -> list[Rec]:
    """What another device records: other digests (other algorithm), samples off by `perturb`."""
    return [r.but(digest=r.digest + 10**6, samples=tuple(s + perturb for s in r.samples)) for r in recs]


def test_cross_device_within_tolerance_is_not_a_divergence(tmp_path: Path) -> None:
    recs = training_records(steps=2)
    c = run_compare(tmp_path, [recs, recs, _cross_device(recs, 1e-7)], devices=["cpu", "cpu", "cuda"],
                    tolerance=Tolerance(atol=1e-5, rtol=0))
    assert c.first_divergence is None
    assert c.records_differing == 0


def test_cross_device_outside_tolerance_reports_abs_and_ulp(tmp_path: Path) -> None:
    recs = [Rec(f"m{i}", digest=i + 1, samples=(1.0, 2.0, 0.5, -4.0)) for i in range(6)]
    other = [r.but(digest=r.digest + 100) for r in recs]
    far = _float32_step(2.0, 3000)
    other[4] = other[4].but(samples=(1.0, far, 0.5, -4.0))
    c = run_compare(tmp_path, [recs, other], devices=["cpu", "cuda"], tolerance=Tolerance(atol=1e-6, rtol=0))
    d = c.first_divergence
    assert d is not None
    assert d.index == 4
    assert d.category == "content"
    assert d.repeats == [1]
    assert d.max_abs_diff == pytest.approx(far - 2.0)
    assert d.max_ulp_diff == 3000
    assert "tolerance" in d.detail
    # the same pair compared bitwise (same device) diverges at the first record: digests differ
    (tmp_path / "same").mkdir()
    d2 = run_compare(tmp_path / "same", [recs, other]).first_divergence
    assert d2 is not None
    assert d2.index == 0


def test_bitwise_difference_invisible_in_samples_says_so(tmp_path: Path) -> None:
    recs = training_records()
    d = run_compare(tmp_path, [recs, mutate_digest(recs, 2)]).first_divergence
    assert d is not None
    assert d.max_abs_diff is None
    assert "sampled elements agree" in d.detail


@pytest.mark.parametrize("dtype,a,b,ulps", [
    ("float32", 1.0, float(np.nextafter(np.float32(1), np.float32(2))), 1),
    ("float64", 1.0, float(np.nextafter(1.0, 2.0)), 1),
    ("float16", 1.0, 1.0 + 2.0**-10 * 5, 5),
    ("bfloat16", 1.0, 1.0 + 2.0**-7 * 2, 2),
    ("float32", -0.0, 0.0, 0),
    ("float32", float(np.float32(-1e-45)), float(np.float32(1e-45)), 2),
])
def test_ulp_distance(dtype: str, a: float, b: float, ulps: int) -> None:
    abs_diff, ulp = sample_differences(np.array([a, 0, 0, 0.0]), np.array([b, 0, 0, 0.0]), dtype)
    assert ulp == ulps
    assert abs_diff == pytest.approx(abs(a - b))


def test_spread_counts_differing_records_per_step(tmp_path: Path) -> None:
    recs = training_records(steps=4, layers=2)  # 6 records per step
    per_step = 6
    other = list(recs)
    for k in (per_step + 1, 2 * per_step, 2 * per_step + 3, 2 * per_step + 5, 3 * per_step + 0):
        other[k] = other[k].but(digest=other[k].digest + 1, samples=tuple(s + 0.25 * (k % 5) for s in other[k].samples))
    c = run_compare(tmp_path, [recs, other, recs])
    assert c.first_divergence is not None
    assert c.first_divergence.index == per_step + 1
    assert c.first_divergence.record is not None
    assert c.first_divergence.record.step == 1
    assert [(s.step, s.records, s.differing) for s in c.by_step] == [(0, 6, 0), (1, 6, 1), (2, 6, 3), (3, 6, 1)]
    assert c.records_differing == 5
    assert c.records_compared == len(recs)
    assert c.by_step[0].max_abs_diff is None
    assert c.by_step[2].max_abs_diff == pytest.approx(0.25 * max(k % 5 for k in (12, 15, 17)))


# -- properties: the first divergence is found exactly, whatever the chunk size ------------------

@st.composite
def traces_with_mutation(draw: st.DrawFn) -> tuple[list[Rec], int, str, int, int]:
    n = draw(st.integers(1, 60))
    names = draw(st.lists(st.sampled_from(["a", "b", "enc.0", "enc.1", "head"]), min_size=n, max_size=n))
    steps = sorted(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    recs = [Rec(name, digest=draw(st.integers(0, 2**64 - 1)), step=step,
                samples=(float(i), 0.0, 1.0, -1.0)) for i, (name, step) in enumerate(zip(names, steps))]
    k = draw(st.integers(0, n - 1))
    how = draw(st.sampled_from(["digest", "name", "truncate"]))
    repeats = draw(st.integers(2, 4))
    mutated = draw(st.integers(1, repeats - 1))
    return recs, k, how, repeats, mutated


def _apply(recs: list[Rec], k: int, how: str) -> list[Rec]:
    if how == "truncate":
        return recs[:k]
    out = list(recs)
    out[k] = out[k].but(digest=out[k].digest ^ (1 << 63)) if how == "digest" else out[k].but(name=out[k].name + "!")
    return out


def _summary(c: Comparison) -> dict[str, object]:
    d = c.first_divergence
    return {"records": c.records, "complete": c.complete, "compared": c.records_compared,
            "differing": c.records_differing, "aligned": c.aligned_to_end,
            "by_step": [asdict(s) for s in c.by_step],
            "first": None if d is None else (d.index, d.category, d.repeats, d.reference, d.detail)}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=traces_with_mutation(), chunk=st.sampled_from([1, 2, 3, 7, 64, align.CHUNK]))
def test_property_first_divergence_is_exactly_the_mutated_index(
        case: tuple[list[Rec], int, str, int, int], chunk: int) -> None:
    recs, k, how, repeats, mutated = case
    traces = [recs] * repeats
    traces[mutated] = _apply(recs, k, how)
    with tempfile.TemporaryDirectory() as tmp:
        with mock.patch.object(align, "CHUNK", chunk):
            c = run_compare(Path(tmp), traces)
        d = c.first_divergence
        assert d is not None
        assert d.index == k
        assert d.repeats == [mutated]
        assert d.category == ("content" if how == "digest" else "structure")
        assert c.records[mutated] == (k if how == "truncate" else len(recs))
        # the whole comparison, spread included, does not depend on how the traces were chunked
        (Path(tmp) / "ref").mkdir()
        with mock.patch.object(align, "CHUNK", 1 << 16):
            reference = run_compare(Path(tmp) / "ref", traces)
        assert _summary(c) == _summary(reference)


@pytest.mark.parametrize("chunk", [4, 5, 6])
def test_divergence_on_chunk_boundary(tmp_path: Path, chunk: int) -> None:
    recs = training_records(steps=3)  # 18 records
    with mock.patch.object(align, "CHUNK", chunk):
        for k in (chunk - 1, chunk, chunk + 1, 2 * chunk):
            sub = tmp_path / f"k{k}"
            sub.mkdir()
            d = run_compare(sub, [recs, recs, mutate_digest(recs, k)]).first_divergence
            assert d is not None
            assert d.index == k
            assert d.repeats == [2]
        sub = tmp_path / "short"
        sub.mkdir()
        c = run_compare(sub, [recs, recs[: 2 * chunk]])
        assert c.first_divergence is not None
        assert c.first_divergence.index == 2 * chunk
        assert c.records == [len(recs), 2 * chunk]


def test_nan_against_a_number_is_a_mismatch_not_agreement(tmp_path: Path) -> None:
    nan = float("nan")
    a, b = np.array([nan, 1.0, 2.0, 3.0]), np.array([0.5, 1.0, 2.0, 3.0])
    assert sample_differences(a, b, "float32") == (float("inf"), None)
    assert sample_differences(b, a, "float32") == (float("inf"), None)
    assert sample_differences(np.array([nan, 1.0]), np.array([nan, 1.0]), "float32")[0] == 0.0
    recs = [Rec("a", 1, samples=(0.5, 1.0, 2.0, 3.0))]
    comp = run_compare(tmp_path, [recs, [recs[0].but(digest=2, samples=(nan, 1.0, 2.0, 3.0))]])
    first = comp.first_divergence
    assert first is not None
    assert first.max_abs_diff == float("inf")
    assert first.max_ulp_diff is None
    assert "NaN in one repeat" in first.detail
    assert "agree" not in first.detail
    assert comp.by_step[0].max_abs_diff == float("inf")


def test_a_timed_out_repeat_stopping_early_is_no_divergence(tmp_path: Path) -> None:
    recs = training_records(steps=3)
    paths = [write_trace(tmp_path / "r0.trace", recs, {"exit_code": 0}),
             write_trace(tmp_path / "r1.trace", recs[:5], None)]
    comp = compare_traces(paths, truncated=[False, True])
    assert comp.first_divergence is None
    assert comp.records_compared == 5
    assert comp.records == [len(recs), 5]
    changed = mutate_digest(recs[:5], 3)
    write_trace(tmp_path / "r2.trace", changed, None)
    first = compare_traces([paths[0], tmp_path / "r2.trace"], truncated=[False, True]).first_divergence
    assert first is not None
    assert first.index == 3
    assert first.category == "content"


def test_a_missing_trace_is_empty_and_incomplete_and_is_not_written(tmp_path: Path) -> None:
    recs = training_records(steps=1)
    path = write_trace(tmp_path / "r0.trace", recs, {"exit_code": 0})
    comp = compare_traces([path, tmp_path / "never.trace"])
    assert comp.records == [len(recs), 0]
    assert comp.complete == [True, False]
    assert comp.first_divergence is None
    assert comp.records_compared == 0
    assert not (tmp_path / "never.trace").exists()


@pytest.mark.parametrize(("name", "parameter", "owner"), [
    ("net.0.weight", True, "net.0"), ("net.0.weight:momentum_buffer", True, "net.0"),
    ("weight", True, ROOT_MODULE), ("bias:exp_avg", True, ROOT_MODULE), ("loss", False, "loss"),
])
def test_a_parameter_belongs_to_its_module_and_the_roots_own_to_the_root(name: str, parameter: bool,
                                                                         owner: str) -> None:
    assert owning_module(name, parameter) == owner
