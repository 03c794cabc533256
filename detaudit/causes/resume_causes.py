"""Why a resumed run does not reproduce the uninterrupted one: what the checkpoint forgot (docs/resume.md).

Read from what the three runs recorded: the interrupted run's `checkpoint-save` events (what was saved, where),
the resumed run's `checkpoint-load`, `state-restore`, `rng-restore`, `seed` and `draw` events (what it loaded,
what it put back, which RNGs it draws from after loading), the alignment of its starting parameters with the
reference's (compare/resumed_alignment.py), and the first record where the two differ. The record decides the cause that
comes first; what else the resumed run left unrestored follows as `possible`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detaudit.compare.resumed_alignment import Alignment, Steps
from detaudit.compare.traces import open_stream
from detaudit.events import (
    CheckpointLoadEvent,
    CheckpointSaveEvent,
    DrawEvent,
    RngRestoreEvent,
    SeedEvent,
    StateRestoreEvent,
)
from detaudit.results import Cause, Divergence
from detaudit.trace import Kind, read_events

WEIGHTS, OPTIMIZER, SCHEDULER, SCALER = "resume-weights", "resume-optimizer-state", "resume-scheduler", \
    "resume-grad-scaler"
RNG, DATA = "resume-rng-state", "resume-data-position"
CAUSE_IDS = (RNG, OPTIMIZER, SCHEDULER, SCALER, DATA, WEIGHTS)

# an RNG: how the report names it, and the calls that save and restore its state
RNGS: dict[str, tuple[str, str, str]] = {
    "torch": ("torch's global CPU RNG", "torch.get_rng_state()", "torch.set_rng_state(...)"),
    "cuda": ("torch's CUDA RNG", "torch.cuda.get_rng_state_all()", "torch.cuda.set_rng_state_all(...)"),
    "generator": ("a torch.Generator", "generator.get_state()", "generator.set_state(...)"),
    "numpy": ("NumPy's global RNG", "np.random.get_state()", "np.random.set_state(...)"),
    "python": ("Python's `random`", "random.getstate()", "random.setstate(...)"),
}
# what restores each kind of state: the role a checkpoint part has, the call that saves it, the one that restores it
STATES: dict[str, tuple[str, str, str]] = {
    OPTIMIZER: ("optimizer", "optimizer.state_dict()", "optimizer.load_state_dict(...)"),
    SCHEDULER: ("scheduler", "scheduler.state_dict()", "scheduler.load_state_dict(...)"),
    SCALER: ("scaler", "scaler.state_dict()", "scaler.load_state_dict(...)"),
    WEIGHTS: ("module", "model.state_dict()", "model.load_state_dict(...)"),
}


@dataclass(frozen=True)
class ResumeRuns:
    """The traces of one resume check and what compare/resumed_alignment.py made of them."""

    reference: Path  # the reference's first repeat
    interrupted: Path
    resumed: Path
    stop_at: int
    alignment: Alignment
    divergence: Divergence | None  # resumed vs reference from the aligned step (None: they agree)
    reference_steps: Steps
    resumed_steps: Steps


class _Evidence:
    """The checkpoint evidence of the three runs, read once."""

    def __init__(self, runs: ResumeRuns) -> None:
        self.runs = runs
        self.saves: list[CheckpointSaveEvent] = [e for e in _events(runs.interrupted, "checkpoint-save")
                                                 if e["step"] <= runs.stop_at]
        self.save = _save_resumed_from(self.saves, runs.alignment.step)
        # the resumed run's events in the order they happened (`at`, a record index, ties before the first record)
        events = _in_order(runs.resumed)
        self.loads: list[CheckpointLoadEvent] = [e for e in events if e["type"] == "checkpoint-load"]
        at = _start_load(events)
        self.load: CheckpointLoadEvent | None = events[at] if at >= 0 else None
        user: list[StateRestoreEvent] = [e for e in events if e["type"] == "state-restore" and not e["library"]]
        self.restored = {e["what"]: e for e in user}
        self.rng_restored = _rngs_restored(events, at)
        self.setup, self.drawn = _draw_sites(events, at)

    def saved_roles(self) -> dict[str, str]:
        return {} if self.save is None else {p["role"]: p["path"] or "the saved object" for p in self.save["parts"]}

    def loaded_roles(self) -> dict[str, str]:
        return {} if self.load is None else {p["role"]: p["path"] or "the loaded object" for p in self.load["parts"]}

    def where_saved(self) -> str:
        return "the checkpoint" if self.save is None else \
            f"the checkpoint saved at {self.save['loc']} after step {self.save['step']} ({self.save['path']})"

    def where_loaded(self) -> str:
        return "the load" if self.load is None else f"`torch.load` at {self.load['loc']}"

    def unrestored_rngs(self) -> dict[str, list[str]]:
        return {rng: sites for rng, sites in self.drawn.items() if rng not in self.rng_restored}


def _save_resumed_from(saves: list[CheckpointSaveEvent], step: int | None) -> CheckpointSaveEvent | None:
    """The checkpoint the resumed run started from: the last one saved at its aligned step, else the last one."""
    matching = [e for e in saves if e["step"] == step]
    return (matching or saves)[-1] if saves else None


def _start_load(events: list[Any]) -> int:
    """The index of the load the training started from: the last one before the initial parameters were
    recorded, else the last one; -1 when nothing was loaded."""
    begin = next((i for i, e in enumerate(events) if e["type"] == "initial-params"), len(events))
    loads = [i for i, e in enumerate(events) if e["type"] == "checkpoint-load"]
    return ([i for i in loads if i < begin] or loads or [-1])[-1]


def _rngs_restored(events: list[Any], at: int) -> dict[str, str]:
    """RNG -> the call that set its state in the resumed run: a state restore, or a seeding after the load."""
    restores: list[RngRestoreEvent] = [e for e in events if e["type"] == "rng-restore" and not e["library"]]
    restored: dict[str, str] = {e["lib"]: f"{e['fn']} at {e['loc']}" for e in restores}
    seeds: list[SeedEvent] = [e for e in events[at + 1:] if e["type"] == "seed" and not e["library"]]
    for seed in seeds:  # seeding after the load sets the state as well
        restored.setdefault("cuda" if seed["fn"].startswith("torch.cuda.") else seed["lib"],
                            f"{seed['fn']} at {seed['loc']} (after the load)")
    return restored


def _draw_sites(events: list[Any], at: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """RNG -> where the resumed run draws from it after the load: while it still sets up (building a model whose
    weights the load then replaces), before its first forward; and from then on, in training."""
    first = next((i for i, e in enumerate(events) if i > at and e["type"] == "state"
                  and e["when"] == "first-forward"), at)
    setup: dict[str, list[str]] = {}
    drawn: dict[str, list[str]] = {}
    for i, draw in enumerate(events):
        if at < 0 or i <= at or draw["type"] != "draw":
            continue
        sites = (setup if i < first else drawn).setdefault(_rng_of(draw), [])
        if draw["loc"] not in sites:
            sites.append(draw["loc"])
    return setup, drawn


def _events(path: Path, kind: str) -> list[Any]:
    return read_events(path, kind)


def _in_order(path: Path) -> list[Any]:
    """Every evidence event of a trace, in the order they were written."""
    stream = open_stream(path)
    stream.drain()
    return stream.events


def _rng_of(draw: DrawEvent) -> str:
    if draw["lib"] != "torch":
        return draw["lib"]
    if draw["generator"] == "explicit":
        return "generator"
    return "cuda" if draw.get("device") == "cuda" else "torch"


def diagnose(runs: ResumeRuns) -> list[Cause]:
    """The causes of a resumed run that does not reproduce the reference, the one behind its first difference
    first; none when the two agree."""
    ev = _Evidence(runs)
    first: Cause | None
    if runs.alignment.step is None:
        first = _weights(ev)
    elif runs.divergence is None:
        return []
    else:
        first = _at_divergence(ev, runs.divergence)
    causes = [first] if first is not None else []
    seen = {c.id for c in causes}
    for latent in _latent(ev):
        if latent.id not in seen:
            seen.add(latent.id)
            causes.append(latent)
    return causes


def _at_divergence(ev: _Evidence, divergence: Divergence) -> Cause | None:
    """The cause the first differing record points at: learning rate or scheduler state, the GradScaler's state,
    parameters and optimizer state after a step whose inputs and gradients matched, or the data and forward."""
    record = divergence.record
    if record is None or divergence.category != "content":  # one run recorded other things, or ended first
        return None
    where = f"first difference: {record.kind} `{record.name}` at step {record.step} (reference numbering)" + \
        (f", {record.location}" if record.location else "")
    if record.kind == "optstate" and (record.name.endswith(":lr") or record.name.startswith("lr_scheduler")):
        what = "the learning rate" if record.name.endswith(":lr") else "the LR scheduler's state"
        return _state(ev, SCHEDULER, f"{what} differs from the uninterrupted run's at step {record.step}: the LR "
                      "scheduler (or the step count it is computed from) was not restored", where)
    if record.kind == "optstate" and record.name.startswith("grad_scaler"):
        return _state(ev, SCALER, "the GradScaler's scale differs from the uninterrupted run's: its state was not "
                      "restored", where)
    if record.kind in ("param", "optstate"):
        return _state(ev, OPTIMIZER, "the optimizer's update differs while the weights, the batch and the gradients "
                      f"of step {record.step} match: its moments or step counts were not restored", where)
    if record.kind in ("input", "output", "grad", "op", "checkpoint"):
        unrestored = ev.unrestored_rngs()
        if unrestored:
            return _rng(ev, unrestored, where, score_likely=True)
        if record.kind == "input":
            return _data(ev, record.step, where)
    return None


def _state(ev: _Evidence, cause_id: str, summary: str, where: str, likely: bool = True) -> Cause:
    role, save_call, restore_call = STATES[cause_id]
    restored = ev.restored.get(role)
    loaded = ev.loaded_roles()
    lines = [where] if where else []
    if restored is not None:
        lines.append(f"{restore_call.split('(')[0]} was called at {restored['loc']}, yet the state differs: it was "
                     "restored from another step's checkpoint, or changed after")
        fix = f"restore {role} state from the checkpoint the weights come from, after the last change to it"
    elif role in loaded:
        lines.append(f"{ev.where_loaded()} returned it (`{loaded[role]}`), but the resumed run never calls "
                     f"{restore_call}")
        fix = f"call {restore_call} with `{loaded[role]}` right after {ev.where_loaded()}"
    else:
        keys = f" (its keys: {', '.join(ev.save['keys'])})" if ev.save is not None and ev.save["keys"] else ""
        lines.append(f"{ev.where_saved()} holds no {role} state{keys}")
        save_at = f" at {ev.save['loc']}" if ev.save is not None else ""
        fix = f"save {save_call} in the checkpoint{save_at} and call {restore_call} after {ev.where_loaded()}"
    return Cause(cause_id, "likely" if likely else "possible", summary, lines, fix, basis="direct" if likely
                 else "circumstantial")


def _rng(ev: _Evidence, unrestored: dict[str, list[str]], where: str, score_likely: bool) -> Cause:
    names = [RNGS[r][0] for r in unrestored]
    lines = [where] if where else []
    saved = ev.saved_roles()
    fixes = []
    for rng, sites in unrestored.items():
        name, save_call, restore_call = RNGS[rng]
        lines.append(f"in training after the load, the resumed run draws from {name} at {_sites(sites)}; its state "
                     "was never restored")
        setup = ev.setup.get(rng, [])
        when = f"after {ev.where_loaded()}"
        if setup:
            lines.append(f"it also draws from it after the load while setting up, before its first forward, at "
                         f"{_sites(setup)}: the state must be restored after those draws")
            when += f" and after the set-up draws at {_sites(setup)}, just before the first forward"
        held = saved.get(f"rng-{rng}")
        if rng == "generator":
            lines.append("detaudit cannot see a torch.Generator's set_state: restore it and this may not apply")
            fixes.append(f"save {save_call} with the checkpoint and call {restore_call} {when}")
        elif held is not None:
            lines.append(f"{ev.where_saved()} holds its state at `{held}`")
            fixes.append(f"call {restore_call} with `{held}` {when}")
        else:
            lines.append(f"{ev.where_saved()} holds no state of it")
            save_at = f" at {ev.save['loc']}" if ev.save is not None else ""
            fixes.append(f"save {save_call} in the checkpoint{save_at} and call {restore_call} {when}")
    explicit_only = set(unrestored) == {"generator"}
    likely = score_likely and not explicit_only
    return Cause(RNG, "likely" if likely else "possible",
                 f"an RNG the script draws from after resuming was not restored: {', '.join(names)}",
                 lines, "; ".join(fixes), basis="direct" if likely else "circumstantial")


def _sites(sites: list[str]) -> str:
    return ", ".join(sites[:3]) + (f" and {len(sites) - 3} more" if len(sites) > 3 else "")


def _data(ev: _Evidence, step: int, where: str) -> Cause:
    """The first batch differs while the weights matched and no unrestored RNG is drawn: the data position."""
    lines = [where] if where else []
    first = ev.runs.resumed_steps.inputs.get(0)
    same = sorted(s for s, digest in ev.runs.reference_steps.inputs.items() if digest == first) if first else []
    start = ev.runs.alignment.step
    if same:
        j = same[0]
        lines.append(f"the resumed run's first batch is the uninterrupted run's batch of step {j}"
                     + (" (its very first: the data loader restarted from the beginning)" if j == 0 else "")
                     + f", where the uninterrupted run was at step {start}")
    else:
        lines.append("the resumed run's first batch is none of the uninterrupted run's batches")
    if ev.rng_restored:
        lines.append("the RNGs it draws from were restored (" + "; ".join(ev.rng_restored.values()) + ")")
    return Cause(DATA, "likely", "the resumed run reads other data than the uninterrupted run did at this step: "
                 "the data loader's position was not restored", lines,
                 f"after {ev.where_loaded()}, advance the data loader past the {start} batches already consumed "
                 "(save the step or the sampler's position in the checkpoint and skip to it)", basis="direct")


def _weights(ev: _Evidence) -> Cause:
    """No reference step has the parameters the resumed run starts from."""
    alignment = ev.runs.alignment
    lines = []
    if ev.load is None:
        lines.append("the resumed run loaded no checkpoint with `torch.load` before its first step")
    if alignment.fresh:
        lines.append("the resumed run starts from the same weights as a fresh run: the model was not restored")
    if alignment.expected is not None and alignment.differing:
        shown = ", ".join(f"`{n}`" for n in alignment.differing[:4])
        more = f" and {len(alignment.differing) - 4} more" if len(alignment.differing) > 4 else ""
        lines.append(f"against the uninterrupted run after step {alignment.expected} (where the checkpoint was "
                     f"saved), these parameters differ: {shown}{more}")
    cause = _state(ev, WEIGHTS, "the parameters the resumed run starts from match no step of the uninterrupted "
                   "run: the model weights were not restored", "")
    return Cause(cause.id, cause.confidence, cause.summary, [*lines, *cause.evidence], cause.fix, basis=cause.basis)


def _latent(ev: _Evidence) -> Sequence[Cause]:
    """What the resumed run also left unrestored, though not behind the first difference: `possible`."""
    found: list[Cause] = []
    unrestored = ev.unrestored_rngs()
    if unrestored:
        found.append(_rng(ev, unrestored, "", score_likely=False))
    kinds = _state_kinds(ev.runs.reference)
    for cause_id, present in ((OPTIMIZER, "optimizer" in kinds), (SCHEDULER, "scheduler" in kinds),
                              (SCALER, "scaler" in kinds)):
        role = STATES[cause_id][0]
        if present and role not in ev.restored:
            found.append(_state(ev, cause_id, f"the resumed run never restores the {role}'s state", "",
                                likely=False))
    return found


def _state_kinds(reference: Path) -> set[str]:
    """Which kinds of training state the reference has: optimizer state, an LR scheduler, a GradScaler."""
    stream = open_stream(reference)
    kinds: set[str] = set()
    for chunk in stream.chunks():
        for name_id in set(chunk[chunk["kind"] == Kind.OPTSTATE]["name"].tolist()):
            name = stream.strings[name_id]
            if name.startswith("lr_scheduler"):
                kinds.add("scheduler")
            elif name.startswith("grad_scaler"):
                kinds.add("scaler")
            elif not name.endswith(":lr"):
                kinds.add("optimizer")
        if len(kinds) == 3:
            break
    return kinds
