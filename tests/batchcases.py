"""Probe events of `detaudit batch` as the recorder writes them, built by hand: the cases shared by the
tests of the analysis (tests/batch/test_finding.py) and of the report (tests/batch/test_reporting.py)."""

from __future__ import annotations

from typing import Any


def subset(kind: str, size: int, differ: int = 0, diff: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"subset": kind, "size": size, "rows_compared": size, "rows_differ": differ, "max_abs_diff": diff,
            "max_ulp": 40 if differ else 0, "scale": 2.0, "dtype": "float32", "nan_mismatch": False,
            "across_rows": False, "shape_changed": False, **extra}



def call(subsets: list[dict[str, Any]], n: int = 256, index: int = 0) -> dict[str, Any]:
    return {"type": "batch-call", "module": "Net", "call": index, "rows": n, "batch_dim": 0, "reproduced": True,
            "subsets": subsets, "loc": "serve.py:9"}



def spot(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "module": "fc", "cls": "Linear", "loc": "model.py:12", "max_abs_diff": 1e-7, "max_ulp": 3,
            "scale": 2.0, "dtype": "float32", "across_rows": False, "shape_changed": False, **extra}



def origin(op: dict[str, Any] | None, module: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "batch-origin", "module": "Net", "call": 0, "subset": "prefix", "size": 1,
            "first_module": module, "first_op": op, "note": None}



ROUNDING = [subset("prefix", 1, 1, 1e-7), subset("prefix", 7, 5, 1e-7), subset("prefix", 32), subset("prefix", 128),
            subset("reversed", 256)]

