"""Why it diverged: detectors that read recorded evidence and the comparison (docs/causes.md).

Each detector is one small function `Context -> Finding | None` for one cause id, scored by
how well it explains the *first* divergence (evidence recorded before it, in the repeats that
differ). `diagnose` ranks them; when none fires, `unknown` says what was ruled out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from detaudit.cause_table import CAUSES, REORDERED_PARAMETERS, CauseId
from detaudit.causes import (
    carried,
    clock,
    collective,
    compile_causes,
    device,
    flags,
    order,
    outside,
    perturbed_settings,
    rng,
    stdout_causes,
)
from detaudit.causes.context import LIKELY, Context, Detector, Finding, build, finding
from detaudit.compare.oprules import OpFinding
from detaudit.compare.perturb import PerturbationFinding
from detaudit.events import ConcurrencyEvent, EmptyEvent, HashEvent, OpEvent
from detaudit.pin import PINS, separating_pin
from detaudit.results import BASES, Basis, Cause, Divergence, RepeatResult

NO_EVIDENCE: Basis = "no-evidence"  # the basis of a candidate no evidence of whose mechanism was seen (results.BASES)
TIE = 1e-6  # scores this close on the same basis fit the evidence equally
BACKGROUND = 0.55  # below this, a cause is listed only when nothing likely explains the divergence
DETECTORS: tuple[Detector, ...] = (
    rng.varying_seed, rng.unseeded_torch_rng, rng.unseeded_numpy_rng, rng.unseeded_python_rng,
    rng.dataloader_workers, device.environment, device.tf32, device.thread_count, device.nondeterministic_op,
    compile_causes.compiled_kernels, clock.wall_clock,
    device.uninitialized_memory, device.cudnn_benchmark, device.cublas_workspace, order.concurrency,
    order.python_hash_seed, order.object_order, carried.carried_state, stdout_causes.stdout_differs, flags.flag_drift,
    flags.flag_typo,
    flags.collective_algorithm, collective.collective_algorithm, device.device_rng_geometry, outside.outside_value,
    *perturbed_settings.DETECTORS,
)
UNKNOWN = CauseId.UNKNOWN.value  # no detector fired (`unknown` below)


def diagnose(divergence: Divergence | None, traces: Sequence[Path], runs: Sequence[RepeatResult],
             op_finding: OpFinding | None = None, perturbation: PerturbationFinding | None = None) -> list[Cause]:
    """Ranked causes of the first divergence (`op_finding`: the op behind it; `perturbation`: what `run
    --perturb`'s settings changed); empty for a deterministic run."""
    if divergence is None or not runs:
        return []
    return rank(build(divergence, traces, runs, op_finding, perturbation))


def carried_output(divergence: Divergence, traces: Sequence[Path], runs: Sequence[RepeatResult]) -> list[str] | None:
    """Evidence that state carried between repeats explains a stdout-only difference (causes/carried.py), or None."""
    return carried.explains_output(build(divergence, traces, runs))


def rank(ctx: Context) -> list[Cause]:
    """One rule, everywhere (docs/causes.md#ranking): confirmed > direct evidence (op-level records, then direct) >
    circumstantial > not ruled out (`no-evidence`); the score orders only within one basis.

    Two causes at the top that fit equally are a toss-up: both `possible`, and the report names the
    one experiment that separates them (which `--explain` and the default confirmation run first). When no
    candidate has evidence of its mechanism, `unknown` leads and says so; the candidates follow it, to be split
    off into the report's "not ruled out" list (`split`).
    """
    findings = [f for f in (detect(ctx) for detect in DETECTORS) if f is not None]
    if ctx.perturbation is not None and ctx.perturbation.sensitive:
        # `run --perturb` proved it: repeats with equal settings agree, so nothing but the settings varied on
        # purpose changes the bits, and a cause that varies from run to run would be a wrong lead
        findings = [f for f in findings if f.cause.basis == "experiment"]
    findings = [f if _observed(ctx, f.cause) else Finding(_candidate(f.cause), f.score) for f in findings]
    findings.sort(key=lambda f: (BASES.index(f.cause.basis), -f.score))  # stable: ties keep DETECTORS order
    if findings and findings[0].score >= LIKELY:  # weak, always-true background causes only add noise
        findings = [f for f in findings if f.score >= BACKGROUND]
    observed = [f for f in findings if f.cause.basis != NO_EVIDENCE]
    candidates = [f for f in findings if f.cause.basis == NO_EVIDENCE]
    leading = observed or candidates  # a toss-up among candidates matters only where they lead the experiments
    if len(leading) >= 2 and _tied(leading[0], leading[1]):
        leading[0].cause, leading[1].cause = _toss_up(leading[0].cause, leading[1].cause)
    if not observed:
        return [unknown(ctx, [f.cause for f in candidates]).cause, *(f.cause for f in candidates)]
    return [f.cause for f in [*observed, *candidates]]


def _observed(ctx: Context, cause: Cause) -> bool:
    """Whether this run holds evidence of the cause's mechanism (docs/causes.md#ranking), of the kind its row
    declares (cause_table.CauseSpec.mechanism), seen in a compared repeat or its DataLoader workers. An experiment
    or the op-level re-run is evidence for any cause."""
    if cause.basis in ("experiment", "op-records", NO_EVIDENCE):
        return True
    kinds = CAUSES[CauseId(cause.id)].mechanism
    if REORDERED_PARAMETERS in kinds and order.parameters_reordered(ctx):  # the comparison itself saw it
        return True
    return not kinds or any(e["type"] in kinds for r in ctx.involved for e in [*r.events, *r.worker_events])


def _candidate(cause: Cause) -> Cause:
    kinds = ", ".join(CAUSES[CauseId(cause.id)].mechanism)
    return replace(cause, basis=NO_EVIDENCE, confidence="possible", evidence=[
        *cause.evidence, f"no evidence of its mechanism was recorded in this run ({kinds})"])


def split(ranked: Sequence[Cause]) -> tuple[list[Cause], list[Cause]]:
    """(causes, not ruled out): a candidate with no evidence of its mechanism that no experiment confirmed,
    refuted or made unnecessary is not a cause. `unknown` goes once an experiment confirmed a source."""
    def open_candidate(c: Cause) -> bool:
        return c.basis == NO_EVIDENCE and c.confidence in ("likely", "possible")

    confirmed = any(c.confidence == "confirmed" for c in ranked)
    causes = [c for c in ranked if not open_candidate(c) and not (confirmed and c.id == UNKNOWN)]
    return causes, [c for c in ranked if open_candidate(c)]


def leads(causes: Sequence[Cause], not_ruled_out: Sequence[Cause]) -> list[Cause]:
    """What the experiments test, in order: the causes, then the candidates not ruled out; the candidates first
    when no cause has evidence (`unknown` leads), so the cheap confirmation runs the experiment that rules them
    in or out."""
    if causes and causes[0].id == UNKNOWN:
        return [*not_ruled_out, *causes]
    return [*causes, *not_ruled_out]


def headline(causes: Sequence[Cause], not_ruled_out: Sequence[Cause]) -> str:
    """The summary line's cause part: the top cause when one has evidence (or an experiment), else that none was
    identified, what the experiments ruled out and which candidates `detaudit explain` tests."""
    top = causes[0] if causes else None
    if top is not None and top.id != UNKNOWN and top.confidence not in ("ruled-out", "not-needed"):
        return f"top cause: {top.id} ({top.confidence})"
    parts = ["cause not identified"]
    ruled_out = [c.id for c in causes if c.confidence == "ruled-out"]
    if ruled_out:
        parts.append(f"ruled out: {', '.join(ruled_out)}")
    if not_ruled_out:
        parts.append(f"`detaudit explain` tests {', '.join(c.id for c in not_ruled_out)}")
    return "; ".join(parts)


def _tied(a: Finding, b: Finding) -> bool:
    return a.cause.basis == b.cause.basis and abs(a.score - b.score) < TIE


def _toss_up(a: Cause, b: Cause) -> tuple[Cause, Cause]:
    """Both causes `possible`, each naming the other and the experiment that separates them."""
    pin = separating_pin(a.pins, b.pins)

    def settled(this: Cause, other: Cause) -> Cause:
        line = f"fits the evidence as well as {other.id}: the two cannot be told apart without an experiment"
        if pin is not None:
            line += f"; the one that separates them pins {PINS[pin].description} (`--explain` runs it first)"
        return replace(this, confidence="possible", separating_pin=pin, evidence=[*this.evidence, line])

    return settled(a, b), settled(b, a)


def unknown(ctx: Context, candidates: Sequence[Cause] = ()) -> Finding:
    """No cause has evidence of its mechanism: say what the evidence rules out, so the user knows where not to
    look, and which candidates are not ruled out (with the experiment that tests each)."""
    ruled_out = [*_rngs_ruled_out(ctx), *(text for rules_out, text in RULED_OUT if rules_out(ctx))]
    lines = [f"ruled out: {line}" for line in ruled_out]
    lines += [f"not ruled out: {c.id} ({c.summary}); the experiment that tests it pins "
              f"{' and '.join(PINS[p].description for p in c.pins) or 'nothing: no pin reaches it'}"
              for c in candidates]
    if ctx.divergence.category == "outcome" and ctx.record is None or ctx.divergence.index < 0:
        lines.insert(0, f"the traces agree record for record; only the outcome differs ({ctx.divergence.detail}): "
                        "the script's output depends on something outside torch (time, pid, uuid, a file left "
                        "by an earlier run)")
    lines.append(f"first divergence: {ctx.where()}")
    fix = "rerun with `--granularity op` to find the op, and `detaudit explain RUN_DIR` to test each source of " \
          "nondeterminism in turn"
    return finding(UNKNOWN, 0.0, "no recorded evidence explains the divergence", lines, fix)


def _rngs_ruled_out(ctx: Context) -> list[str]:
    """The global RNGs whose state matched in every repeat before the divergence (after the imports)."""
    ruled_out = []
    for lib in ("torch", "numpy", "python"):
        states = [next((s["rng"][lib]["digest"] for s in r.states() if lib in s.get("rng", {})
                        and ctx.precedes(s) and s.get("when") != "import"), None) for r in ctx.involved]
        seeds = rng.seeding_calls(ctx.ref, lib)
        if None not in states and not ctx.differs(states):
            how = f"seeded at {seeds[0].get('loc')}" if seeds else "never seeded but"
            ruled_out.append(f"{rng.NAMES[lib]} RNG: {how} its state matched in every repeat before the divergence")
    return ruled_out


def _same_string_hashing(ctx: Context) -> bool:
    hashes = [r.first(HashEvent) for r in ctx.involved]
    return all(h is not None for h in hashes) and not ctx.differs([h["probe"] for h in hashes if h is not None])


# what else the evidence rules out when no cause explains a divergence: (the test, what it rules out)
RULED_OUT: tuple[tuple[Callable[[Context], bool], str], ...] = (
    (_same_string_hashing, "string hashing: the same in every repeat (PYTHONHASHSEED fixed)"),
    (lambda ctx: not ctx.ref.of(OpEvent), "no op on torch's nondeterministic list ran"),
    (lambda ctx: not ctx.ref.of(EmptyEvent), "no torch.empty-family allocation from the script"),
    (lambda ctx: not ctx.ref.of(ConcurrencyEvent), "no threads, executors or pools started by the script"),
    (lambda ctx: len({device.device_of(r) for r in ctx.involved}) == 1,
     "same device and environment in every compared repeat"),
)
