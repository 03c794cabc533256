"""`run --perturb`: the repeats compared by the settings they ran with (docs/perturb.md).

The repeats of a perturbed run form groups of equal settings (run/perturb_plan.py). Each group is compared
within itself first, the control: repeats with equal settings must agree, or nothing can be put down to
a setting. Then, for each setting, the base group (every setting at its first value) is compared with
the group that changed only that setting: where those two first differ is what the setting changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from detaudit.cause_table import PERTURBED
from detaudit.compare.outcome import outcome_divergence
from detaudit.compare.traces import Comparison, compare_traces
from detaudit.pin import Perturb, perturbations
from detaudit.results import Divergence, RepeatResult, Tolerance


@dataclass(frozen=True)
class KnobOutcome:
    """One varied setting: the repeats at its first value (`base`) and at its second (`changed`), every other
    setting equal, and where the two groups first differ (None: the setting changed no bit)."""

    knob: str
    description: str
    cause: str  # the cause id a change is reported as (causes/perturbed_settings.py)
    values: tuple[str, str]
    base: tuple[int, ...]
    changed: tuple[int, ...]
    divergence: Divergence | None


@dataclass(frozen=True)
class PerturbationFinding:
    """What the perturbation showed. `control`: the first divergence among repeats with equal settings (None:
    every group agrees within itself); then no setting can be blamed, and `sensitive`/`survived` are empty."""

    knobs: tuple[KnobOutcome, ...]
    groups: tuple[tuple[int, ...], ...]  # the repeats of each combination of settings, the base group first
    control: Divergence | None
    not_tested: Mapping[str, str] = field(default_factory=dict)  # setting -> why it was not varied

    @property
    def sensitive(self) -> list[KnobOutcome]:
        return [] if self.control is not None else [k for k in self.knobs if k.divergence is not None]

    @property
    def survived(self) -> list[KnobOutcome]:
        return [] if self.control is not None else [k for k in self.knobs if k.divergence is None]

    @property
    def variables(self) -> frozenset[str]:
        """The environment variables the perturbation itself varied (no one else's change)."""
        specs = perturbations(None)
        return frozenset(name for k in self.knobs for s in specs[Perturb(k.knob)].settings for name in s.env)


def compare_perturbed(traces: Sequence[Path], runs: Sequence[RepeatResult], devices: Sequence[str],
                      tolerance: Tolerance, truncated: Sequence[bool],
                      not_tested: Mapping[str, str] | None = None) -> PerturbationFinding | None:
    """The perturbation's finding over a run's repeats (None: no repeat ran perturbed)."""
    if not runs or runs[0].perturbation is None:
        return None
    base_values = runs[0].perturbation
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for position, run in enumerate(runs):
        groups.setdefault(tuple(sorted((run.perturbation or {}).items())), []).append(position)

    def compare(positions: Sequence[int]) -> Divergence | None:
        compared = compare_traces([traces[p] for p in positions], [devices[p] for p in positions], tolerance,
                                  [truncated[p] for p in positions])
        return _first_difference(compared, [runs[p] for p in positions])

    controls = [d for d in (compare(g) for g in groups.values() if len(g) > 1) if d is not None]
    specs = perturbations(None)
    base = groups[tuple(sorted(base_values.items()))]
    outcomes = []
    for knob, value in base_values.items():
        changed = next((g for key, g in groups.items() if len(key) == len(base_values)
                        and all((v != base_values.get(k)) == (k == knob) for k, v in key)), [])
        other = (runs[changed[0]].perturbation or {}) if changed else {}
        spec = specs[Perturb(knob)]
        outcomes.append(KnobOutcome(knob, spec.description, PERTURBED[spec.knob].value, (value, other.get(knob, "?")),
                                    tuple(runs[p].index for p in base), tuple(runs[p].index for p in changed),
                                    compare([*base, *changed]) if changed else None))
    return PerturbationFinding(tuple(outcomes), tuple(tuple(runs[p].index for p in g) for g in groups.values()),
                               min(controls, key=lambda d: d.index, default=None), dict(not_tested or {}))


def _first_difference(compared: Comparison, runs: Sequence[RepeatResult]) -> Divergence | None:
    """Where repeats first differ, named by their own repeat numbers: a record's bits where both made it; else
    how they ended (another exit status, or a recording that ended where another went on): a failure or an
    early exit is an outcome difference, never a bit change at a record the repeats that ended never made."""
    found = compared.first_divergence
    if found is not None and found.category == "content":
        return _renumbered(found, [r.index for r in runs])
    ended = outcome_divergence(runs, "ignore")  # another exit status
    if ended is not None:
        return ended
    if found is None:
        return None
    short = [i for i in found.repeats if compared.records[i] == found.index and compared.complete[i]]
    if found.category != "structure" or short != found.repeats:
        return _renumbered(found, [r.index for r in runs])
    codes = sorted({str(runs[i].exit_code) for i in range(len(runs))})
    return Divergence(-1, "outcome", None, [runs[i].index for i in short], runs[found.reference].index, detail=(
        f"repeat(s) {', '.join(str(runs[i].index) for i in short)} ended by themselves after {found.index} records "
        f"where repeat {runs[found.reference].index} went on (exit status {' / '.join(codes)})"))


def _renumbered(divergence: Divergence, indices: Sequence[int]) -> Divergence:
    """A divergence found among a subset of the repeats, naming them by their own repeat numbers."""
    return replace(divergence, repeats=[indices[i] for i in divergence.repeats],
                   reference=indices[divergence.reference],
                   others={indices[i]: info for i, info in divergence.others.items()})
