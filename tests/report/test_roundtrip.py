"""Every report kind reads back what it writes: `Kind.from_dict(kind.to_dict()) == kind`, through JSON text.

The values are drawn from the classes' own type hints (as the decoder reads them), so a field another
change adds is covered with no edit here.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin, is_typeddict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detaudit.batch.reporting import BatchReport
from detaudit.codec import Codable, hints
from detaudit.drift.drift_report import DriftReport
from detaudit.fix.fix_report import FixReport
from detaudit.report.model import Report
from detaudit.report.resume import ResumeReport

DEEPEST = 4  # below this, optional values are None and lists empty: a report holds reports (a torchrun rank's)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
                    max_leaves=4)
SCALARS: dict[Any, st.SearchStrategy[Any]] = {
    str: st.text(max_size=6), int: st.integers(), bool: st.booleans(), type(None): st.none(),
    float: st.floats(allow_nan=False, allow_infinity=False), Any: JSON,
    dict: st.dictionaries(st.text(max_size=3), JSON),
}


def values_of(tp: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Any value of type `tp`, as its type hints describe it."""
    origin, args = get_origin(tp), get_args(tp)
    if tp in SCALARS:
        return SCALARS[tp]
    if origin in (Union, types.UnionType):
        if depth >= DEEPEST and type(None) in args:
            return st.none()
        return st.one_of(*(values_of(a, depth) for a in args))
    if origin is Literal:
        return st.sampled_from(args)
    if origin is Mapping:
        origin = dict
    fixed_tuple = origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)
    if origin in (list, tuple, dict) and depth >= DEEPEST and not fixed_tuple:
        return st.just(origin())
    if origin is list:
        return st.lists(values_of(args[0], depth + 1), max_size=2)
    if origin is tuple:
        if not fixed_tuple:
            return st.lists(values_of(args[0], depth + 1), max_size=2).map(tuple)
        return st.tuples(*(values_of(a, depth + 1) for a in args))
    if origin is dict:
        return st.dictionaries(values_of(args[0], depth + 1), values_of(args[1], depth + 1), max_size=2)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if is_typeddict(tp):
        declared = hints(tp)
        return st.fixed_dictionaries({k: values_of(declared[k], depth + 1) for k in tp.__required_keys__},
                                     optional={k: values_of(declared[k], depth + 1) for k in tp.__optional_keys__})
    assert dataclasses.is_dataclass(tp), f"no strategy for {tp!r}: teach values_of (and the codec) this type"
    declared = hints(tp)
    return st.builds(tp, **{f.name: values_of(declared[f.name], depth + 1) for f in dataclasses.fields(tp) if f.init})


@pytest.mark.slow  # 500 drawn reports, 6 s of CPU: the fast lane keeps the gold files (tests/report/test_gold.py)
@pytest.mark.parametrize("kind", [Report, BatchReport, ResumeReport, FixReport, DriftReport])
def test_report_reads_back_what_it_writes(kind: type[Codable]) -> None:
    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(values_of(kind))
    def round_trip(report: Codable) -> None:
        assert kind.from_dict(json.loads(json.dumps(report.to_dict()))) == report

    round_trip()
