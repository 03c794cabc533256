"""What kind of change a drift is: evidence that separates reorder noise from a real change, as pure functions
of two records' sampled elements and of a difference's course over the steps, and the settings A and B differ
in ranked by that evidence as candidate causes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from detaudit.compare.identity import Value
from detaudit.drift.configurations import Difference

Growth = Literal["starts-large", "grows", "flat"]
FACTOR_RTOL = 1e-6  # how far the samples' ratios may spread and still be one factor (float32 rounding of b = f*a)
LARGE = 1000.0  # a first ratio to the floor this large is no accumulated rounding: a change starts large
GROWING = 2.0  # each step's difference at least this times the last: growing, as chaotic noise does slowly


def constant_factor(a: Value, b: Value) -> float | None:
    """f when every sampled element of b is f times a's (f != 1, from at least one non-zero pair), else None:
    gradients exactly x2 where averaging or loss scaling differs."""
    if a.shape != b.shape:
        return None
    ratios = []
    for x, y in zip(a.samples, b.samples):
        if not (math.isfinite(x) and math.isfinite(y)):
            return None
        if x == 0.0 or y == 0.0:
            if x != y:
                return None
            continue
        ratios.append(y / x)
    if not ratios:
        return None
    factor = ratios[0]
    if any(abs(r - factor) > FACTOR_RTOL * abs(factor) for r in ratios) or abs(factor - 1.0) <= FACTOR_RTOL:
        return None
    return round(factor, 6)


def sign_flip(a: Value, b: Value) -> bool:
    """b is a with every sign flipped."""
    return constant_factor(a, b) == -1.0


def nan_side(a: Value, b: Value) -> Literal["a", "b"] | None:
    """The side whose samples hold a NaN the other's lack."""
    nan_a, nan_b = (any(math.isnan(x) for x in v.samples) for v in (a, b))
    return None if nan_a == nan_b else "a" if nan_a else "b"


def layout_change(a: Value, b: Value) -> str | None:
    """`dtype float32 -> bfloat16` or `shape 8x4 -> 8x2`, when the record's dtype or shape changed."""
    changed = [f"{what} {x} -> {y}" for what, x, y in (("dtype", a.dtype, b.dtype), ("shape", a.shape, b.shape))
               if x != y]
    return ", ".join(changed) or None


def growth(ratios: Sequence[float]) -> Growth | None:
    """How a record's ratio to its floor goes over the steps (one ratio per step, first drifting step first):
    `starts-large` (a real change starts beyond any rounding), `grows` (each step a multiple of the last, as
    accumulated noise or a small change compounding), `flat`; None without a ratio."""
    finite = [r for r in ratios if math.isfinite(r)]
    if not ratios:
        return None
    if not finite or ratios[0] >= LARGE or not math.isfinite(ratios[0]):
        return "starts-large"
    if len(finite) > 1 and all(later >= GROWING * earlier > 0 for earlier, later in zip(finite, finite[1:])):
        return "grows"
    return "flat"


@dataclass(frozen=True)
class ChangeEvidence:
    """What the first drifting record says about the change (each field None/False where it says nothing)."""

    factor: float | None = None
    sign_flip: bool = False
    nan_on: Literal["a", "b"] | None = None
    layout: str | None = None
    growth: Growth | None = None

    @property
    def real_change(self) -> bool:
        """Evidence that no reordering of the same arithmetic produces."""
        return self.factor is not None or self.nan_on is not None or self.layout is not None \
            or self.growth == "starts-large"


def evidence(a: Value, b: Value, ratios: Sequence[float]) -> ChangeEvidence:
    """The evidence of the first drifting record (`a`, `b`) and its ratios to the floor over the steps."""
    return ChangeEvidence(constant_factor(a, b), sign_flip(a, b), nan_side(a, b), layout_change(a, b), growth(ratios))


@dataclass(frozen=True)
class CandidateCause:
    """A setting A and B differ in, ranked by the evidence; `why` says what in the evidence puts it there."""

    setting: str
    a: str | None
    b: str | None
    family: str
    why: str

    def change(self) -> str:
        """`(unset) -> 2`: the setting's value on each side, as the terminal and the page show it."""
        return f"{_shown(self.a)} -> {_shown(self.b)}"


def _shown(value: str | None) -> str:
    return "(unset)" if value is None else value


# what the script computes changes; then its parallel layout (its own averaging), then the runtime
_FIRST_FOR_REAL_CHANGE = ("script", "layout", "runtime", "reorder")
_FIRST_FOR_NOISE = ("reorder", "layout", "runtime", "script")


def rank_causes(found: Sequence[Difference], drifted: bool, change: ChangeEvidence | None) -> list[CandidateCause]:
    """The differences as candidate causes: for a drift, settings that change what the script computes first
    (a reorder setting alone moves results by noise, not beyond it); for noise, the reorder settings first."""
    order = _FIRST_FOR_REAL_CHANGE if drifted else _FIRST_FOR_NOISE
    ranked = sorted(found, key=lambda d: order.index(d.family))
    return [CandidateCause(d.setting, d.a, d.b, d.family, _why(d.family, drifted, change)) for d in ranked]


def _why(family: str, drifted: bool, change: ChangeEvidence | None) -> str:
    if not drifted:
        return {"reorder": "changes only the order of floating-point reductions: noise of this size",
                "layout": "another world size sums the gradients in another order: noise of this size",
                "runtime": "another runtime may pick other kernels: noise of this size",
                "script": "the script's own setting; no effect of it beyond the noise was measured"}[family]
    strong = change is not None and change.real_change
    return {"script": "changes what the script computes" + (" (the change starts large or is exact: " + _what(change)
                                                            + ")" if strong and change is not None else ""),
            "layout": "another world size runs the script's own averaging and sharding"
                      + (" (" + _what(change) + ": gradients summed, not averaged?)"
                         if change is not None and change.factor is not None else ""),
            "runtime": "another interpreter or device may change kernels, defaults or dtypes",
            "reorder": "a reduction-order setting: it moves results by noise, which the floor measures, "
                       + ("not by " + _what(change) if strong and change is not None else "rarely beyond it")}[family]


def _what(change: ChangeEvidence) -> str:
    """The evidence in words."""
    parts = [f"a constant factor {change.factor:g}" if change.factor is not None else "",
             "a sign flip" if change.sign_flip else "", f"NaN on {change.nan_on.upper()}" if change.nan_on else "",
             change.layout or "", "a change that starts large" if change.growth == "starts-large" else ""]
    return ", ".join(p for p in parts if p)
