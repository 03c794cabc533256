"""The benchmark suite's own logic on tiny sizes: rows come out, compare finds the planted
divergence in a fresh interpreter, the table and RESULTS.md render. No timing is asserted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

RUN_PY = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("detaudit_benchmarks_run", RUN_PY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_fingerprint_rows(bench: ModuleType) -> None:
    sizes = bench.Sizes(fp_sizes_mb=(1,), fp_rounds=1, small_calls=50)
    rows, raw = bench.bench_fingerprint(sizes)
    assert [r.name for r in rows] == ["fingerprint 1 MB float32", "fingerprint 1 KB tensor (fixed cost)"]
    assert raw["hash_gbs"] > 0
    assert all(r.ratio and r.ratio > 0 for r in rows)


@pytest.mark.process
def test_compare_finds_the_planted_divergence_without_torch(bench: ModuleType, tmp_path: Path) -> None:
    sizes = bench.Sizes(compare_records=2000, compare_repeats=3)
    rows, raw = bench.bench_compare(sizes, tmp_path)
    assert raw["verdict"] == "divergent"
    assert raw["first_divergence"] == 1500
    assert raw["torch_imported"] is False  # comparing traces must not pay for importing torch
    assert raw["peak_rss_mb"] > 0
    assert "found" in rows[0].detail


def test_table_and_results_markdown_keep_notes(bench: ModuleType, tmp_path: Path) -> None:
    rows = [bench.Row("1 fingerprint", "x", "≤ 3 µs", "2 µs", 0.67, True),
            bench.Row("6 CUDA", "y", "design", "not measurable here", None, None)]
    lines = bench.table_lines(rows)
    assert "pass" in lines[2]
    assert lines[3].rstrip().endswith("-")
    md = tmp_path / "RESULTS.md"
    md.write_text("old table\n" + bench.NOTES_MARK + "\nhand-written analysis\n")
    meta = {"date": "d", "machine": "m", "cpus": 2, "python": "3", "torch": "t", "load_before": "0",
            "load_after": "0", "duration_s": 1.0}
    text = bench.markdown(rows, meta, bench.kept_notes(md))
    assert "| 1 fingerprint | x |" in text
    assert "hand-written analysis" in text
    assert "old table" not in text


PROFILE_PY = RUN_PY.with_name("profile.py")


@pytest.fixture(scope="module")
def profiler() -> ModuleType:
    spec = importlib.util.spec_from_file_location("detaudit_benchmarks_profile", PROFILE_PY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_profiler_charges_a_call_inside_another_to_its_own_part_only(profiler: ModuleType) -> None:
    """benchmarks/profile.py's split: each part's time excludes the wrapped calls it makes (a clock that ticks
    one second per read: the outer call spans 3 reads' worth, the inner one 1)."""
    ticks = iter(range(100))
    split = profiler.Split(clock=lambda: float(next(ticks)))
    inner = split.wrap(lambda: None, "fingerprint")
    outer = split.wrap(lambda: inner(), "hook dispatch")
    outer()
    assert dict(split.totals) == {"fingerprint": 1.0, "hook dispatch": 2.0}
