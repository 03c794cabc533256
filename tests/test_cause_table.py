"""cause_table.py: one row per cause, and every other place that names causes agrees with it (docs/causes.md,
events.py's kinds, pin.py's pins and perturbations, fix's knobs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from detaudit import events
from detaudit.cause_table import CAUSES, ISOLATED, OP_RECORDS, PERTURBED, REORDERED_PARAMETERS, CauseId
from detaudit.fix.code import KNOBS
from detaudit.pin import Perturb, Pin

ROOT = Path(__file__).parents[1]


def cause_rows() -> dict[str, list[str]]:
    """docs/causes.md's table under "## Cause ids": each row's cells by the id in its first column."""
    text = (ROOT / "docs" / "causes.md").read_text()
    section = text.split("## Cause ids", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| <a id=")]
    return {re.search(r"`([a-z0-9-]+)`", cells[0]).group(1): cells for cells in rows}  # type: ignore[union-attr]


def named_pins(cells: list[str]) -> set[str]:
    """The pins a row's `--explain pin` column (the last) names in backquotes."""
    return set(re.findall(r"`([a-z0-9+-]+)`", cells[-1]))


def test_the_documented_cause_ids_are_the_declared_ones() -> None:
    assert sorted(cause_rows()) == sorted(CauseId)


def test_every_declared_cause_has_its_anchor_in_its_docs_page() -> None:
    missing = []
    for spec in CAUSES.values():
        page, anchor = spec.doc_anchor.split("#")
        if f'<a id="{anchor}"></a>' not in (ROOT / page).read_text():
            missing.append(spec.doc_anchor)
    assert missing == []


def test_every_mechanism_is_an_event_kind_or_a_comparisons_observation() -> None:
    kinds = set(get_args(events.Kind)) | {OP_RECORDS, REORDERED_PARAMETERS}
    assert {k for spec in CAUSES.values() for k in spec.mechanism} <= kinds


def test_every_pin_isolates_exactly_one_cause() -> None:
    isolations = [spec.isolation.pin for spec in CAUSES.values() if spec.isolation is not None]
    assert sorted(isolations) == sorted(Pin)


def test_an_isolating_pin_is_named_in_its_causes_docs_row() -> None:
    rows = cause_rows()
    assert all(pin.value in named_pins(rows[spec.id]) for pin, spec in ISOLATED.items())


def test_every_fix_knob_is_a_knob_of_detaudit_fix() -> None:
    assert all(spec.fix_knob in KNOBS for spec in CAUSES.values() if isinstance(spec.fix_knob, Pin))


def test_a_fix_knob_is_a_pin_its_causes_docs_row_names() -> None:
    rows = cause_rows()
    assert all(spec.fix_knob.value in named_pins(rows[spec.id]) for spec in CAUSES.values()
               if isinstance(spec.fix_knob, Pin))


def test_every_perturbed_setting_is_reported_as_a_declared_cause() -> None:
    assert set(PERTURBED) == set(Perturb)

