"""The audit's result as data, and its JSON rendering (JUnit: junit.py; terminal: render.py).

The value types of a torchrun run's findings live here too, below ranks.py that computes them,
so a Report can be read without the stage that fills it in.

JSON schema: docs/report-schema.md. Bump SCHEMA_VERSION on any incompatible change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from detaudit import __version__
from detaudit.causes import headline
from detaudit.causes.repetition import RepeatedRandomness
from detaudit.codec import Codable
from detaudit.compare.baseline_diff import BaselineCheck
from detaudit.compare.match import Match
from detaudit.compare.oprules import OpFinding
from detaudit.compare.perturb import PerturbationFinding
from detaudit.compare.stdout import DEFAULT_STDOUT
from detaudit.compare.tokens import TokenComparison
from detaudit.compare.traces import Comparison, StepSpread
from detaudit.errors import ExitCode
from detaudit.results import (
    Cause,
    Divergence,
    Ending,
    Experiment,
    Latent,
    RecordInfo,
    RepeatResult,
    Role,
    StdoutDifference,
    StdoutMode,
    Verdict,
)
from detaudit.run.failure import disk_full
from detaudit.run.files import write_output

SCHEMA_NAME = "detaudit-report"
SCHEMA_VERSION = 2  # 2: runs[].duration_s may be null (a baseline compared keeps no time)


@dataclass(frozen=True)
class CarriedOutput:
    """A stdout-only difference that state carried between repeats explains (causes/carried.py): every
    recorded tensor agrees and each differing repeat read what an earlier repeat left. Reported, but
    not a divergence: the repeats computed the same; they were told different things to print."""

    divergence: Divergence  # the first differing stdout line (outcome, stdout), or saved non-tensor value (content)
    evidence: list[str]  # what each differing repeat read, with path and line


def all_failed(runs: Sequence[RepeatResult]) -> bool:
    """Every repeat exited with an error status (the verdict `failed`, unless a repeat timed out)."""
    return bool(runs) and all(r.exit_code not in (0, None) for r in runs)


@dataclass(frozen=True)
class Report(Codable):
    """The audit's result, built once from the finished pieces (audit.analyse, ranks.analyse_ranks)."""

    script: str
    script_args: list[str]
    run_dir: str
    runs: list[RepeatResult]
    comparison: Comparison
    outcome_divergence: Divergence | None = None
    causes: list[Cause] = field(default_factory=list)
    # candidates with no evidence of their mechanism in this run (basis `no-evidence`), each with the pins of the
    # experiment that would rule it in or out: never a cause, never in the summary line (docs/causes.md#ranking)
    not_ruled_out: list[Cause] = field(default_factory=list)
    experiments: list[Experiment] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    failure: str = ""  # the script's own error when it failed in every repeat
    repeat_errors: dict[int, str] = field(default_factory=dict)  # stderr tail of each repeat that failed
    bitwise: bool = True  # False: recordings compared within a tolerance (detaudit compare --atol/--rtol)
    stdout_mode: StdoutMode = DEFAULT_STDOUT  # how stdout was compared (docs/stdout.md)
    argv: list[str] | None = None  # the script's sys.argv in every repeat; None for `compare`
    baseline: BaselineCheck | None = None  # --baseline: the comparison with a recorded run
    inferred: list[str] = field(default_factory=list)  # cause ids as ranked from the evidence, before experiments
    match: Match | None = None  # what the verdict rests on (detaudit/compare/match.py)
    distributed: DistributedFindings | None = None  # a torchrun run: ranks, replica check (ranks.py)
    op_finding: OpFinding | None = None  # the op behind first_divergence, when ops were recorded (oprules.py)
    op_level: str = ""  # `auto` named no op: why (its re-run found none, or was not run: oprules.op_level_note)
    carried_output: CarriedOutput | None = None  # a stdout difference explained by carried state: no divergence
    perturbation: PerturbationFinding | None = None  # `run --perturb`: what each varied setting changed
    latent: list[Latent] = field(default_factory=list)  # deterministic on this CPU, not on CUDA (causes/latent.py)
    recordings: list[str] = field(default_factory=list)  # `compare`: what each compared recording is (its path)
    # draws equal where they should differ (causes/repetition.py): beside the verdict, changing it only under the gate
    repeated_randomness: list[RepeatedRandomness] = field(default_factory=list)
    # `run --fail-on-repeated-randomness` (stored in run.json): repeats that agree with randomness that repeats
    # are the verdict `repeated-randomness` (exit 1) instead of `deterministic`
    fail_on_repeats: bool = False
    tokens: TokenComparison | None = None  # a decoding script's generated tokens compared (compare/tokens.py)

    def cause_headline(self) -> str:
        """The summary line's cause part (causes.headline): the top cause with evidence, or that none was found."""
        return headline(self.causes, self.not_ruled_out)

    def records_agreed(self) -> str:
        """The compared records, those compared by content counted apart from those compared by dtype and shape
        only (meta, vmapped, unreadable tensors; no results): `9 records compared by content (220 more by dtype
        and shape only)`, or `229 records` when every one was compared by content."""
        total = self.comparison.records_compared
        shape_only = self.match.records_without_contents if self.match is not None else 0
        if not shape_only:
            return f"{total} records"
        return f"{total - shape_only} records compared by content ({shape_only} more by dtype and shape only)"

    def name_of(self, index: int) -> str:
        """A repeat as the report names it: `repeat 1`, or under `compare` the recording's own name."""
        return self.recordings[index] if 0 <= index < len(self.recordings) else f"repeat {index}"

    @property
    def first_divergence(self) -> Divergence | None:
        return self.comparison.first_divergence or self.outcome_divergence

    @property
    def timed_out(self) -> bool:
        return any(r.ending is Ending.TIMED_OUT for r in self.runs)

    @property
    def verdict(self) -> Verdict:
        """What the repeats' agreement says (`agreement`), with the gate the run asked for applied: repeats that
        agree while draws repeat where they should differ are `repeated-randomness` under
        --fail-on-repeated-randomness. Every output (terminal, -q, JSON, JUnit, HTML, exit code) renders this."""
        agreement = self.agreement
        if agreement == "deterministic" and self.fail_on_repeats and self.repeated_randomness:
            return "repeated-randomness"
        return agreement

    @property
    def agreement(self) -> Verdict:
        """How the repeats compare, without a gate. `timeout` when a repeat timed out before any divergence: the
        repeats agree as far as all of them got, which settles nothing (a divergence found before the timeout is
        `divergent`)."""
        if self.timed_out:
            return "divergent" if self.first_divergence is not None else "timeout"
        if all_failed(self.runs):
            return "failed"
        if self.first_divergence is not None or self.replica_divergence is not None:
            return "divergent"
        if self.inconclusive_reason:
            return "inconclusive"
        return "deterministic"

    @property
    def inconclusive_reason(self) -> str:
        """Why agreement proves nothing, or "" when it does.

        Agreement is evidence only when every repeat's recording is whole: a repeat whose disk filled up, a
        recording that was
        lost or cut short (no footer), a repeat stopped by an interrupt, repeats that recorded no
        tensor at all, or only content-less ones (dtype and shape), agree vacuously — never
        "deterministic"; so does agreement that a requested --self-check failed or could not test.
        """
        full = {i: line for i, shown in sorted(self.repeat_errors.items()) if (line := disk_full(shown))}
        if full and not all_failed(self.runs):
            return (f"repeat(s) {', '.join(map(str, full))} ran out of disk space: {next(iter(full.values()))}; "
                    "a repeat that cannot write ends for that, so its end and what it did not record say nothing "
                    "about the script (free space and run the audit again)")
        comp = self.comparison
        cut = [r.index for r in self.runs if r.ending is not Ending.TIMED_OUT
               and (r.ending is Ending.INTERRUPTED or (r.index < len(comp.complete) and not comp.complete[r.index]))]
        if cut:
            return (f"the recording of repeat(s) {', '.join(map(str, cut))} is incomplete (stopped, killed, or "
                    f"its writes failed): the repeats agree on the {self.records_agreed()} they all "
                    "made, which says nothing about the rest")
        if self.runs and not any(comp.records):
            return ("nothing to compare: no repeat recorded a tensor (the script never imported torch, or ran no "
                    "module, optimizer step, torch.save or detaudit.checkpoint)")
        if self.match is not None and self.match.contentless:
            return (f"every one of the {self.match.records_without_contents} compared records is content-less "
                    "(meta tensors, or contents detaudit cannot read: dtype and shape only): the repeats agree "
                    "on dtypes and shapes, which says nothing about values")
        check = self.match.self_check if self.match is not None else None
        if check is not None and check.not_run:
            return (f"--self-check could not make its negative control: {check.not_run}; without it the "
                    "repeats' agreement is not proven")
        if check is not None and not check.passed:
            seen = ("not at all" if check.detected_at is None else f"first at record #{check.detected_at}, "
                    + ("before the change: that repeat diverged on its own"
                       if check.record is None or check.detected_at < check.record
                       else "after it"))
            return (f"the --self-check negative control failed: a one-ULP change injected at record "
                    f"#{check.record} ({check.name}) was seen {seen}, so the repeats' agreement proves nothing")
        return ""

    @property
    def replica_divergence(self) -> ReplicaDivergence | None:
        """DDP replicas that differ inside a repeat: divergent even when every repeat agrees."""
        return self.distributed.replica_divergence if self.distributed is not None else None

    @property
    def exit_code(self) -> ExitCode:
        if self.timed_out:
            return ExitCode.TIMEOUT
        if self.verdict == "deterministic" and self.baseline is not None and not self.baseline.matches:
            return ExitCode.DIVERGENT  # the repeats agree with each other, not with the baseline
        return {"failed": ExitCode.SCRIPT_FAILED, "divergent": ExitCode.DIVERGENT,
                "repeated-randomness": ExitCode.DIVERGENT,
                "inconclusive": ExitCode.INCONCLUSIVE}.get(self.verdict, ExitCode.DETERMINISTIC)


@dataclass
class RankSummary:
    """One rank of a torchrun run across the repeats (ranks.py)."""

    rank: int
    first_divergence: Divergence | None
    role: Role | None
    report: Report = field(repr=False)  # that rank's own report (comparison, causes)


@dataclass(frozen=True)
class ReplicaDivergence:
    """DDP replicas that differ inside one repeat, at the first optimizer step where they do."""

    step: int
    name: str
    ranks: list[int]  # the ranks whose copy differs from the lowest rank's
    reference: int
    max_abs_diff: float | None
    repeats: list[int]  # the repeats where it happened


@dataclass(frozen=True)
class TeardownCrash:
    """A repeat whose ranks all finished the script and closed their traces, then a rank died in
    interpreter teardown (torchrun then exits non-zero)."""

    repeat: int
    exit_code: int | None  # the launcher's
    ranks: list[int]  # the ranks torchrun names as failed (empty when it names none)
    signal: str | None


@dataclass
class DistributedFindings:
    """A torchrun run's findings across its ranks (ranks.analyse_ranks)."""

    nproc_per_node: int
    rank: int | None  # the rank of `first_divergence`
    ranks: list[RankSummary]
    replica_divergence: ReplicaDivergence | None = None
    teardown_crashes: list[TeardownCrash] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # advisories from the ranks' evidence (no divergence)


def finite(x: Any) -> Any:
    """`x`, or None for an infinite or NaN float (JSON has neither; a renderer shows none)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass(frozen=True)
class Where:
    """Where a divergence is, as every renderer names it: the record, and module, op, phase, node and line of
    the op behind it when one was pinpointed (Report.op_finding), so the terminal, JSON, JUnit, HTML and the
    pytest plugin name the same file:line. None: not known (no record: the repeats ended differently)."""

    kind: str | None
    name: str | None
    module: str | None
    op: str | None
    phase: str | None
    node: str | None
    step: int | None  # None, or negative: before the first optimizer step is not counted as one
    location: str | None
    record_location: str | None  # the record's own line (an op's may differ)
    shape: str | None
    dtype: str | None

    @property
    def counted_step(self) -> int | None:
        """The step when there is one to name (>= 0)."""
        return self.step if self.step is not None and self.step >= 0 else None

    def place(self, category: str, rank: str = "") -> str:
        """`output fc1 at step 3 on rank 1 (train.py:42)`; the category when there is no record."""
        what = " ".join(x for x in (self.kind, self.name) if x) or category
        step = f" at step {self.counted_step}" if self.counted_step is not None else ""
        return f"{what}{step}{rank}" + (f" ({self.location})" if self.location else "")


def where(d: Divergence, finding: OpFinding | None = None) -> Where:
    """`finding`: the op behind `d` (Report.op_finding), when one was pinpointed."""
    rec = d.record
    op = finding.record if finding is not None else rec
    return Where(kind=rec.kind if rec else None, name=rec.name if rec else None,
                 module=(op.module or None) if op else None, op=(op.op or None) if op else None,
                 phase=op.phase if op else None, node=(op.node or None) if op else None,
                 step=rec.step if rec else None, location=(op.location or None) if op else None,
                 record_location=(rec.location or None) if rec else None,
                 shape=rec.shape if rec else None, dtype=rec.dtype if rec else None)


def divergence_to_dict(d: Divergence | None, finding: OpFinding | None = None) -> dict[str, Any] | None:
    """`finding`: the op behind `d` (Report.op_finding), when one was pinpointed."""
    if d is None:
        return None
    at = where(d, finding)
    return {
        "index": d.index,
        "category": d.category,
        "kind": at.kind,
        "name": at.name,
        "module": at.module,
        "op": at.op,
        "phase": at.phase,
        "node": at.node,
        "step": at.step,
        "location": at.location,
        "record_location": at.record_location,
        "shape": at.shape,
        "dtype": at.dtype,
        "repeats": d.repeats,
        "reference": d.reference,
        "max_abs_diff": finite(d.max_abs_diff),
        "max_ulp_diff": d.max_ulp_diff,
        "detail": d.detail,
        "op_finding": finding_to_dict(finding),
        "stdout": stdout_to_dict(d.stdout),
    }


def stdout_to_dict(s: StdoutDifference | None) -> dict[str, Any] | None:
    """The first differing stdout line, as each repeat printed it (null: its output had ended)."""
    if s is None:
        return None
    return {"line": s.line, "mode": s.mode, "reference": s.reference,
            "lines": {str(i): text for i, text in s.lines.items()}, "field": s.field}


def _record_brief(r: RecordInfo) -> dict[str, Any]:
    return {"index": r.index, "kind": r.kind, "name": r.name, "op": r.op or None, "phase": r.phase,
            "node": r.node or None, "module": r.module or None, "location": r.location or None, "step": r.step,
            "shape": r.shape, "dtype": r.dtype}


def finding_to_dict(f: OpFinding | None) -> dict[str, Any] | None:
    """The op behind the divergence, with the input/output match table around it (docs/report-schema.md)."""
    if f is None:
        return None
    return {
        "verdict": f.verdict,
        "summary": f.summary,
        **_record_brief(f.record),
        "random": f.record.random,
        "repeats": f.repeats, "reference": f.reference,
        "origin": _record_brief(f.origin) if f.origin is not None else None,
        "traced_from": _record_brief(f.traced_from) if f.traced_from is not None else None,
        "via": [_record_brief(v) for v in f.via],
        "others": {str(i): _record_brief(o) for i, o in f.others.items()},
        "traces": f.traces or None,
        "window": f.window,
        "neighbours": [{**_record_brief(n.record), "inputs": n.inputs or None, "output": n.output,
                        "chosen": n.chosen} for n in f.neighbours],
        "ordered_by": [asdict(s) for s in f.ordered_by],
    }


def report_json(report: Report) -> dict[str, Any]:
    """report.json as documented (docs/report-schema.md), the view consumers read; `report.to_dict()` is
    the complete typed form, which `Report.from_dict` reads back."""
    comp = report.comparison
    return {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "detaudit_version": __version__,
        "script": report.script,
        "script_args": report.script_args,
        "argv": report.argv,
        "stdout_mode": report.stdout_mode,
        "run_dir": report.run_dir,
        "verdict": report.verdict,
        "exit_code": report.exit_code,
        "timed_out": report.timed_out,
        "inconclusive": report.inconclusive_reason or None,
        "first_divergence": divergence_to_dict(report.first_divergence, report.op_finding),
        "spread": {
            "records_compared": comp.records_compared,
            "records_differing": comp.records_differing,
            "aligned_to_end": comp.aligned_to_end,
            "by_step": spread_to_list(comp.by_step),
        },
        "causes": [asdict(c) for c in report.causes],
        "not_ruled_out": [asdict(c) for c in report.not_ruled_out],
        "latent": [asdict(x) for x in report.latent],
        "repeated_randomness": [x.to_dict() for x in report.repeated_randomness],
        "inferred_ranking": report.inferred,
        "experiments": [asdict(e) for e in report.experiments],
        "runs": [
            {
                "repeat": r.index, "recording": report.recordings[r.index] if r.index < len(report.recordings)
                else None, "device": r.device, "exit_code": r.exit_code, "duration_s": r.duration_s,
                "timed_out": r.timed_out, "interrupted": r.interrupted, "stopped_at_step": r.stopped_at_step,
                "stopped_by": r.stopped_by, "diverged_at_step": r.diverged_at_step,
                "recording_stopped": r.recording_stopped, "rerun_alone": r.rerun_alone,
                "exit_barrier_waited": r.exit_barrier_waited, "rendezvous_retries": r.rendezvous_retries,
                "records": comp.records[r.index] if r.index < len(comp.records) else 0,
                "complete": comp.complete[r.index] if r.index < len(comp.complete) else False,
                "trace": r.trace, "stdout": r.stdout, "stderr": r.stderr, "stdout_digest": r.stdout_digest,
                "error": report.repeat_errors.get(r.index), "perturbation": r.perturbation,
            }
            for r in report.runs
        ],
        "failure": report.failure or None,
        "environment": report.environment,
        "baseline": baseline_to_dict(report.baseline),
        "match": match_to_dict(report.match),
        **distributed_to_dict(report),
        **carried_to_dict(report.carried_output),
        "perturbation": perturbation_to_dict(report.perturbation),
        "tokens": tokens_to_dict(report),
    }


def tokens_to_dict(report: Report) -> dict[str, Any] | None:
    """A decoding script's generated tokens compared (docs/report-schema.md#tokens), each first divergent token
    tied to the first divergent record when that record differed before the token was chosen."""
    t = report.tokens
    if t is None:
        return None
    first = report.comparison.first_divergence
    record = first.index if first is not None else None
    return {
        "repeats": t.repeats, "distinct_outputs": t.distinct, "sequences": t.sequences, "tokens": t.tokens,
        "groups": [list(g) for g in t.groups],
        "first_divergent_record": record,
        "op": report.op_finding.record.op if report.op_finding is not None and record is not None else None,
        "first_divergent_tokens": [
            {"sequence": d.sequence, "position": d.position, "call": d.fn, "location": d.loc,
             "reference": d.reference, "repeat": d.repeat, "token": d.token, "other_token": d.other,
             "margin": finite(d.margin), "other_margin": finite(d.other_margin), "record": d.at,
             "follows_first_divergence": d.follows(record)}
            for d in t.divergences],
    }


def perturbation_to_dict(p: PerturbationFinding | None) -> dict[str, Any] | None:
    """`run --perturb`'s finding (docs/report-schema.md): each varied setting, its two groups of repeats and
    where they first differ; the control (repeats with equal settings) and the settings not varied."""
    if p is None:
        return None
    return {
        "settings": [{"setting": k.knob, "description": k.description, "cause": k.cause, "values": list(k.values),
                      "repeats": [list(k.base), list(k.changed)],
                      "changed_bits": None if p.control is not None else k.divergence is not None,
                      "first_divergence": divergence_to_dict(k.divergence)} for k in p.knobs],
        "groups": [list(g) for g in p.groups],
        "control_agrees": p.control is None,
        "control_divergence": divergence_to_dict(p.control),
        "sensitive": [k.knob for k in p.sensitive],
        "survived": [k.knob for k in p.survived],
        "not_tested": dict(p.not_tested),
    }


def carried_to_dict(carried: CarriedOutput | None) -> dict[str, Any]:
    """`carried_output`, only when a stdout difference was explained by state carried between repeats."""
    if carried is None:
        return {}
    d = carried.divergence
    return {"carried_output": {"detail": d.detail, "repeats": d.repeats, "reference": d.reference,
                               "stdout": stdout_to_dict(d.stdout), "evidence": carried.evidence}}


def distributed_to_dict(report: Report) -> dict[str, Any]:
    """`ranks`, `replica_divergence` and `teardown_crashes` of a torchrun run; nothing otherwise."""
    dist = report.distributed
    if dist is None:
        return {}
    first = divergence_to_dict(report.first_divergence, report.op_finding)
    replica = dist.replica_divergence
    return {
        "first_divergence": None if first is None else {**first, "rank": dist.rank},
        "nproc_per_node": dist.nproc_per_node,
        "ranks": [{"rank": s.rank, "first_divergence": divergence_to_dict(s.first_divergence, s.report.op_finding),
                   "role": s.role,
                   "causes": [c.id for c in s.report.causes]} for s in dist.ranks],
        "replica_divergence": None if replica is None else {
            "step": replica.step, "name": replica.name, "ranks": replica.ranks, "reference": replica.reference,
            "max_abs_diff": finite(replica.max_abs_diff), "repeats": replica.repeats},
        "teardown_crashes": [asdict(c) for c in dist.teardown_crashes],
        "notes": dist.notes,
    }


def match_to_dict(m: Match | None) -> dict[str, Any] | None:
    if m is None:
        return None
    data = asdict(m)
    data["records_by_content"] = m.records_by_content
    if m.self_check is not None:
        data["self_check"]["passed"] = m.self_check.passed
    return data


def spread_to_list(by_step: list[StepSpread]) -> list[dict[str, Any]]:
    return [{"step": s.step, "records": s.records, "differing": s.differing, "max_abs_diff": finite(s.max_abs_diff),
             "modules": s.modules} for s in by_step]


def baseline_to_dict(check: BaselineCheck | None) -> dict[str, Any] | None:
    if check is None:
        return None
    return {"path": check.path, "matches": check.matches, "first_divergence": divergence_to_dict(check.divergence),
            "records_compared": check.records_compared, "records_differing": check.records_differing,
            "by_step": spread_to_list(check.by_step),
            "environment_changes": [{"field": c.field, "baseline": c.baseline, "current": c.current}
                                    for c in check.environment_changes],
            "sensitivities": [asdict(s) for s in check.sensitivities]}


def write_json(report: Report, path: Path, mode: int | None = None) -> None:
    """The JSON report at `path` (`-`: stdout); `mode`: see output.write_text_atomically."""
    write_output(path, json.dumps(report_json(report), indent=2) + "\n", mode)
