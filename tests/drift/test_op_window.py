"""drift/op_window.py: the ops of the drifting step lined up by module, op and occurrence; the first departure."""

from __future__ import annotations

from pathlib import Path

from synthetic import Rec, write_trace

from detaudit.drift.op_window import first_departure, op_values
from detaudit.trace import Kind


def op(name: str, digest: int, module: str, *samples: float, step: int = 0, loc: str = "train.py:5") -> Rec:
    return Rec(name, digest, step=step, kind=Kind.OP, module=module, loc=loc,
               samples=samples or (1.0, 2.0, 3.0, 4.0))  # type: ignore[arg-type]


def test_only_the_window_s_step_is_read_and_repeated_ops_are_counted(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "a.trace", [op("aten.mm", 1, "fc"), op("aten.mm", 2, "fc"),
                                              op("aten.mm", 3, "fc", step=1), Rec("fc", 4)], footer={})
    assert list(op_values(path, 0)) == [("fc", "aten.mm", False, 0), ("fc", "aten.mm", False, 1)]


def test_an_op_b_lacks_is_the_departure_with_what_b_ran_instead(tmp_path: Path) -> None:
    a = op_values(write_trace(tmp_path / "a.trace", [op("aten.mm", 1, "fc"), op("aten.relu", 2, "act")],
                              footer={}), 0)
    b = op_values(write_trace(tmp_path / "b.trace", [op("aten.mm", 1, "fc"), op("aten.tanh", 5, "act")],
                              footer={}), 0)
    window = first_departure(a, b, 0)
    assert window is not None
    assert (window.op, window.module, window.ratio_to_floor, window.b_ops) == ("aten.relu", "act", None, ["aten.tanh"])


def test_a_rounding_apart_is_no_departure_and_a_doubling_is(tmp_path: Path) -> None:
    a = op_values(write_trace(tmp_path / "a.trace", [op("aten.mm", 1, "fc"), op("aten.mul", 2, "", loc="train.py:9")],
                              footer={}), 0)
    b = op_values(write_trace(tmp_path / "b.trace", [op("aten.mm", 3, "fc", 1.0, 2.0, 3.0, 4.0 + 2 ** -21),
                                                     op("aten.mul", 4, "", 2.0, 4.0, 6.0, 8.0, loc="train.py:9")],
                              footer={}), 0)
    window = first_departure(a, b, 0)
    assert window is not None
    assert (window.op, window.location) == ("aten.mul", "train.py:9")
