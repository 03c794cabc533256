"""recorder/evidence/set_order.py: the sets whose iteration order varies between runs, in scope where an op ran,
with the lines that build and iterate them (from the running code, never the script's text)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from evidence_sink import Sink
from recording import here, record

from detaudit.events import PARAMETERS_BY_IDENTITY
from detaudit.recorder.core import Recorder
from detaudit.recorder.evidence.base import Evidence
from detaudit.recorder.evidence.set_order import install_optimizer, order_kind, origins, parameter_sets


class Plain:
    """Hashed by identity (its address): a set of these iterates in another order in every run."""


@pytest.mark.parametrize("value,kind", [
    ({"b", "a"}, "str"), (frozenset({b"x", b"y"}), "bytes"), ({("a", 1), ("b", 2)}, "tuple holding str"),
    ({Plain(), Plain()}, "objects hashed by identity"), ({torch.ones(1), torch.ones(1)}, "objects hashed by identity"),
    ({1, 2, 3}, None), ({"only"}, None), (["b", "a"], None), ({"a": 1, "b": 2}, None),
])
def test_only_sets_whose_order_follows_hashes_or_addresses_count(value: Any, kind: str | None) -> None:
    assert order_kind(value) == kind


def test_a_set_in_scope_is_found_with_the_lines_that_build_and_iterate_it() -> None:
    names = set("abc"); built = here()  # noqa: E702
    gathered = []
    for name in names: iterated = here(); gathered.append(name)  # noqa: E701, E702
    found = [o for o in origins(sys._getframe()) if o["name"] == "names"]
    assert found == [{"name": "names", "of": "str", "size": 3, "built": [built], "iterated": [iterated], "used": []}]


def test_no_element_is_kept() -> None:
    secret = {"token-1", "token-2"}
    assert "token" not in repr(origins(sys._getframe()))
    assert secret


def test_the_op_recorder_records_the_sets_in_scope_at_an_ops_line_once(tmp_path: Path) -> None:
    lines = {}

    def body(rec: Recorder) -> None:
        table = {name: torch.full((2, 1), float(i)) for i, name in enumerate("abcdef")}
        columns = set(table) - {"f"}; lines["built"] = here()  # noqa: E702
        for _ in range(2):
            torch.cat([table[c] for c in columns], dim=1); lines["cat"] = here()  # noqa: E702

    trace = record(tmp_path / "t.trace", body)
    events = [e for e in trace.events if e["type"] == "set-order" and e["loc"] == lines["cat"]]
    assert len(events) == 1  # once per line, not once per op
    [columns] = [s for s in events[0]["sets"] if s["name"] == "columns"]
    assert (columns["of"], columns["size"], columns["built"], columns["iterated"]) == \
        ("str", 5, [lines["built"]], [lines["cat"]])


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def test_parameters_made_into_a_list_through_a_set_are_found_at_the_line_that_made_it() -> None:
    model = _Tied()
    params = list(set(model.parameters())); made = here()  # noqa: E702
    assert parameter_sets(sys._getframe(), params, params) == [
        {"name": "params", "of": PARAMETERS_BY_IDENTITY, "size": 1, "built": [made], "iterated": [], "used": []}]


def test_a_set_of_parameters_in_scope_is_found_as_itself() -> None:
    model = torch.nn.Linear(2, 2)
    unique = set(model.parameters())
    assert [s["name"] for s in parameter_sets(sys._getframe(), list(unique), list(unique))] == ["unique"]


def test_parameters_given_in_the_models_order_came_through_no_set() -> None:
    model = _Tied()
    params = list(model.parameters())
    assert parameter_sets(sys._getframe(), params, params) == []


def test_an_optimizer_built_from_a_set_of_its_parameters_is_a_set_order_event_at_its_line(
        evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    install_optimizer(ev, torch.optim.Optimizer)
    model = torch.nn.Linear(2, 2)
    params = list(set(model.parameters())); made = here()  # noqa: E702
    torch.optim.SGD(params, lr=0.1); built = here()  # noqa: E702
    torch.optim.SGD(model.parameters(), lr=0.1)  # the model's own order: nothing to say
    assert [(e["loc"], e["sets"][0]["built"]) for e in sink.of("set-order")] == [(built, [made])]
