"""`run --perturb`: which settings each repeat runs with (docs/perturb.md).

One setting at a time: group 0 runs every perturbed setting at its first value, and each further group
changes one setting to its second value. Repeats alternate between the groups (repeat i of a device is in
group i % groups), so the repeats of one group are each other's control: repeats with equal settings must
agree before a difference between two groups can be put down to the one setting they differ in. A setting
only CUDA work can notice is not varied on a run whose repeats see no GPU (`not_tested` says so).

The settings travel as `--explain`'s pins do (detaudit/pin.py): environment variables for the repeat, and
flags the child sets at `import torch` (the child config's `perturb`, recorder/pinning.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from detaudit.errors import UsageError
from detaudit.pin import Perturb, PerturbSpec, Setting, perturbations
from detaudit.run.launcher import RepeatPlan

MIN_PER_SETTING = 2  # one repeat per setting would leave nothing to tell a perturbation from noise


@dataclass(frozen=True)
class Group:
    """The repeats that run with one combination of values: the base group (`changed` None) or the base
    with one setting changed."""

    changed: Perturb | None
    settings: dict[Perturb, Setting]

    @property
    def values(self) -> dict[str, str]:
        """knob -> value, as run.json and the report store a repeat's settings."""
        return {knob.value: s.value for knob, s in self.settings.items()}


@dataclass(frozen=True)
class Perturbation:
    """The settings a `--perturb` run varies, and those it was asked for but cannot vary here (and why)."""

    specs: tuple[PerturbSpec, ...]
    not_tested: dict[str, str]

    @property
    def groups(self) -> list[Group]:
        base = {s.knob: s.settings[0] for s in self.specs}
        return [Group(None, base), *(Group(s.knob, {**base, s.knob: s.settings[1]}) for s in self.specs)]

    @property
    def variables(self) -> frozenset[str]:
        """The environment variables the perturbation sets in every repeat (over any other value for them)."""
        return frozenset(k for spec in self.specs for setting in spec.settings for k in setting.env)

    def assign(self, plans: Sequence[RepeatPlan]) -> list[RepeatPlan]:
        """The plans with each repeat's settings: group by position among its device's repeats."""
        groups = self.groups
        seen: dict[str, int] = {}
        assigned = []
        for plan in plans:
            position = seen.get(plan.device, 0)
            seen[plan.device] = position + 1
            group = groups[position % len(groups)]
            env: dict[str, str] = {}
            child: dict[str, bool] = {}
            for setting in group.settings.values():
                env.update(setting.env)
                child.update(setting.child)
            assigned.append(replace(plan, env={**plan.env, **env},
                                    child_config={**plan.child_config, "perturb": child}, perturbation=group.values))
        return assigned


def plan(knobs: Sequence[Perturb], devices: Sequence[str], cpu_count: int | None) -> Perturbation:
    """What `--perturb KNOBS` varies on these devices (resolved: `cpu` is a run that sees no GPU, by
    --device cpu or because the machine has none). A CUDA-only setting on such a run is not varied (it could
    change nothing); a UsageError when that leaves nothing to vary."""
    specs = perturbations(cpu_count)
    cpu_only = all(d == "cpu" for d in devices)
    tested = [specs[k] for k in knobs if not (specs[k].cuda_only and cpu_only)]
    skipped = {k.value: "the repeats run on the CPU only, where it changes nothing (run with --device cuda)"
               for k in knobs if specs[k].cuda_only and cpu_only}
    if not tested:
        raise UsageError(f"--perturb {','.join(k.value for k in knobs)}: only CUDA work can notice "
                         f"{'this setting' if len(knobs) == 1 else 'these settings'}, and the repeats run on the "
                         "CPU only; run with --device cuda (or auto) on a machine with a GPU")
    return Perturbation(tuple(tested), skipped)
