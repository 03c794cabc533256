"""`detaudit drift`: record configuration A (plain, perturbed, plain again) and B, line their records up by
identity, judge B against A's floor, and build the DriftReport (written to the run directory as drift.json).

Interpreters started: A's perturbation groups plus one (on the CPU 3: plain, threads changed, plain; on CUDA 5,
as cuBLAS's workspace and cuDNN's algorithm choice are changed too), and B_REPEATS for B: 4 on the CPU; with
`--baseline` (A kept from an earlier drift run) B's one. 2 more where records of unknown size are all that keeps
the verdict undecided (A and B re-recorded to size them: rerecord.py), and 2 for the op window of a drift.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from detaudit.audit.pipeline import AuditOptions
from detaudit.compare.identity import Identity, Recording, Value, align, record_index, structural
from detaudit.compare.noise_floor import (
    ULPS,
    Judged,
    K,
    first_drift,
    judge,
    overall,
    own_disagreement,
    ratios_over_steps,
)
from detaudit.compare.outcome import outcome_beyond_noise
from detaudit.compare.tokens import compare_tokens, read_tokens
from detaudit.drift.change_kinds import ChangeEvidence, evidence, rank_causes
from detaudit.drift.configurations import Configuration, differences, floor_perturbation
from detaudit.drift.drift_report import (
    DRIFT_FILE,
    DRIFT_FORMAT,
    Counts,
    DriftReport,
    DriftTokens,
    DriftVerdict,
    FirstDrift,
    FloorSummary,
    OutcomeDrift,
    RecordName,
    RecordRow,
    StepFigures,
    write_json,
)
from detaudit.drift.op_window import op_window
from detaudit.drift.rank_views import SideView, disagreements, not_comparable, rank_traces, side_view
from detaudit.drift.recordings import record
from detaudit.drift.rerecord import rerecord
from detaudit.errors import Inconclusive, TraceError, UsageError
from detaudit.results import Divergence, Ending, RepeatResult
from detaudit.run.devices import resolve_devices
from detaudit.run.launcher import Interrupted, check_script
from detaudit.run.rundir import REDACTED, new_run_dir, stored_args
from detaudit.trace import load_json, open_regular

B_REPEATS = 1  # B is judged against A's floor: one recording of it is the question
SHOWN = 50  # records in the report beyond those bitwise equal (the first ones, in A's order)


def run_drift(options: AuditOptions, a: Configuration, b: Configuration,
              on_done: Callable[[RepeatResult], None] | None = None, baseline: Path | None = None,
              ops: bool = True, b_from: Path | None = None) -> DriftReport:
    """Record A and B and judge B against A's floor (the report is also written as the run directory's drift.json).
    `baseline`: an earlier drift run directory whose A (configuration, recordings, floor) is used instead of
    recording A again: only B runs (one interpreter), e.g. on another machine or with another torch. `b_from`: an
    earlier drift run directory whose B (configuration, recording) is used instead of running B: with `baseline`
    too, two existing recordings are compared. `ops`: on a drift, re-run A and B once more each recording ops over
    the drifting step (op_window.py; not across world sizes, whose ranks' ops see other samples)."""
    check_script(options.target.script)
    script, args = options.target.script, options.target.script_args
    kept = None if baseline is None else load_baseline(baseline, script, script_args=None if b_from else args)
    # two kept recordings: B's common arguments must be A's (this command line's run nothing but the op window)
    kept_b = None if b_from is None else load_baseline(b_from, script, "--b-from", args if kept is None else None,
                                                       None if kept is None else kept.script_args)
    run_dir = new_run_dir(options.target.script, options.out_dir)
    perturbation = floor_perturbation(a, resolve_devices((a.device,)), os.cpu_count())
    # where each side's files lie: this run directory, the kept run's own, or the one it kept that side from
    place_a = run_dir if kept is None else Path(kept.baseline or kept.run_dir)
    place_b = run_dir if kept_b is None else Path(kept_b.b_from or kept_b.run_dir)
    try:
        if kept is None:
            results_a = record(options, a, run_dir, len(perturbation.groups) + 1, perturbation, on_done)
        else:
            a, results_a = kept.a, kept.results_a
        traces_a = [rank_traces(place_a, r, a.nproc) for r in results_a]
        if kept_b is None:
            results_b = record(options, b, run_dir, B_REPEATS, None, on_done)
        else:  # its B, labelled B whichever side it was there
            b, results_b = kept_b.b, kept_b.results_b
        traces_b = rank_traces(place_b, results_b[0], b.nproc)
    except Interrupted as exc:
        exc.run_dir = run_dir
        raise
    target = options.target
    report = DriftReport(script=target.as_typed, script_args=stored_args(target.script_args, target.redact_args),
                         run_dir=str(run_dir), verdict="inconclusive", a=a, b=b, results_a=results_a,
                         results_b=results_b, baseline=None if kept is None else kept.run_dir,
                         b_from=None if kept_b is None else kept_b.run_dir,
                         floor=FloorSummary(K, ULPS, [r.perturbation or {} for r in results_a],
                                                                 0.0, None))
    failure = _failure(results_a, results_b)
    report = replace(report, verdict=failure[0], reason=failure[1]) if failure else \
        _judged(options, report, (traces_a, traces_b), (place_a, place_b), kept_b is not None, on_done)
    first = report.first_drift
    # op records are per-rank activations: across world sizes they come from other samples (rank_views.py); a
    # drift that starts in an update has no recorded op to name (FirstDrift.starts_in_update)
    if ops and report.verdict == "drift" and first is not None and a.world_size == b.world_size \
            and not first.starts_in_update:
        try:
            report = replace(report, op_window=op_window(options, a, b, run_dir, first.step, on_done), op_runs=2)
        except Interrupted as exc:
            exc.run_dir = run_dir
            raise
    write_json(report, run_dir / DRIFT_FILE, mode=0o600)
    return report


def sizing_decides(report: DriftReport) -> bool:
    """Records of unknown size are all that keeps the verdict from being decided: nothing drifts, A agrees with
    itself. Only then are A and B re-recorded to size them (a drift fails the gate whatever their size)."""
    return report.verdict == "inconclusive" and report.counts.size_unknown > 0 and report.a_disagrees is None


def _judged(options: AuditOptions, report: DriftReport, traces: tuple[Sequence[Sequence[Path]], Sequence[Path]],
            places: tuple[Path, Path], b_kept: bool, on_done: Callable[[RepeatResult], None] | None) -> DriftReport:
    """The report judged (judged_report); where records of unknown size are all that keeps it undecided, judged
    again with them sized by re-recording A and B (drift/rerecord.py), unless B is kept (`b_kept`: --b-from, no
    interpreter may start): then it says so."""
    judged = judged_report(report, *traces, places)
    if not sizing_decides(judged):
        return judged
    if b_kept:
        return replace(judged, reason=f"{judged.reason}; B is kept (--b-from): a run without --b-from would size "
                                      "them by re-recording A and B (2 interpreters)")
    run_dir = Path(judged.run_dir)
    try:
        sized, done = rerecord(options, (judged.a, judged.b), run_dir, size_unknown(judged, *traces), on_done)
    except Interrupted as exc:
        exc.run_dir = run_dir
        raise
    return replace(judged_report(report, *traces, places, sized), rerecorded=done)


def load_baseline(baseline: Path, script: Path, option: str = "--baseline",
                  script_args: Sequence[str] | None = None, stored: Sequence[str] | None = None) -> DriftReport:
    """The earlier drift run in `baseline` (its drift.json, read into its type), checked to be of this script and
    to hold its recordings; its `run_dir` is `baseline` as given now (the directory may have moved). `option`: the
    option that named it, for the errors. `script_args`: this check's common script arguments, which must be the
    kept run's (else the side run now differs from the kept one in a setting no candidate cause names);
    `stored`: the other kept run's, as it stored them (--baseline with --b-from), which must be this one's."""
    path = Path(baseline) / DRIFT_FILE
    if not path.is_file():
        raise UsageError(f"{option} {baseline}: no {DRIFT_FILE} there; give the run directory of an earlier "
                         "`detaudit drift` (its --out)")
    with open_regular(path, "a drift report") as fh:
        data = load_json(fh.read(), str(path))
    if not isinstance(data, dict) or data.get("format") != DRIFT_FORMAT:
        raise TraceError(f"{path}: not a {DRIFT_FORMAT} report")
    kept = DriftReport.from_dict({k: v for k, v in data.items() if k not in ("format", "version", "exit_code")})
    if Path(kept.script).name != script.name:
        raise UsageError(f"{option} {baseline} recorded {kept.script}, not {script}: a floor is one script's")
    if len(kept.results_a) != len(kept.floor.perturbed) or len(kept.results_b) != B_REPEATS:
        raise TraceError(f"{path}: corrupt drift report: it lists {len(kept.results_a)} repeats of A and "
                         f"{len(kept.results_b)} of B, its floor declares {len(kept.floor.perturbed)} of A and a "
                         f"check records {B_REPEATS} of B")
    side, results = ("B", kept.results_b) if option == "--b-from" else ("A", kept.results_a)
    if not results or _failure(results, []) is not None:
        raise UsageError(f"{option} {baseline}: its {side} was not recorded whole ({kept.verdict}); record it again")
    if script_args is not None:
        _check_common_args(kept, script_args, f"{option} {baseline}")
    if stored is not None and list(stored) != kept.script_args:
        raise UsageError(f"{option} {baseline} was recorded with the script arguments {_shown(kept.script_args)!r}, "
                         f"--baseline's with {_shown(stored)!r}: two recordings of one script's common arguments")
    return replace(kept, run_dir=str(baseline))


def _check_common_args(kept: DriftReport, script_args: Sequence[str], named: str) -> None:
    """The common script arguments (after `--`) must be the kept run's: a side's own go in --a-args/--b-args,
    where they are a candidate cause. Compared as the kept run stored them (redacted if it redacted them)."""
    redacted = bool(kept.script_args) and all(arg == REDACTED for arg in kept.script_args)
    now = stored_args(script_args, redacted)
    if now != kept.script_args:
        raise UsageError(f"{named} was recorded with the script arguments {_shown(kept.script_args)!r}, this check "
                         f"gives {_shown(now)!r}: give the same ones after `--` (a side's own go in --a-args or "
                         "--b-args, where they are a candidate cause)")


def _shown(args: Sequence[str]) -> str:
    return " ".join(args) or "(none)"


def _failure(results_a: Sequence[RepeatResult], results_b: Sequence[RepeatResult]) -> tuple[DriftVerdict, str] | None:
    """A repeat that timed out or failed: nothing to judge (its records end early, or not as the other side's)."""
    for label, results in (("A", results_a), ("B", results_b)):
        for r in results:
            if r.ending is Ending.TIMED_OUT:
                return "timeout", f"configuration {label}'s repeat {r.index} timed out"
            if r.ending is Ending.FAILED:
                return "script-failed", (f"configuration {label}'s repeat {r.index} exited with status {r.exit_code} "
                                         f"(see {r.stderr})")
            if r.ending not in (Ending.COMPLETED, Ending.STOPPED_AT_BOUND):  # not a failure of the script's
                return "inconclusive", f"configuration {label}'s repeat {r.index} ended: {r.ending.value}"
    return None


def judged_report(report: DriftReport, traces_a: Sequence[Sequence[Path]], traces_b: Sequence[Path],
                  places: tuple[Path, Path], sized: Mapping[Identity, Judged] | None = None) -> DriftReport:
    """The report with B judged against A's floor, read from the recordings (each repeat's traces: one per rank,
    rank 0's first; per-rank records compared only when A and B run the same world size, rank_views.py), then
    their ends (stdout, exit status) and A's own plain repeats. `places`: the directories A's and B's repeats'
    files lie in (stdout paths are relative to them). `sized`: records of unknown size judged from a
    re-recording's full values (drift/rerecord.py), in place of their first judgement."""
    judged = _judged_records(report, traces_a, traces_b, sized or {})
    if not judged.counts.aligned:  # cut short, or nothing in common: nothing judged
        return judged
    return _generated_tokens(_judged_ends(judged, traces_a, places), traces_a, traces_b)


def _generated_tokens(report: DriftReport, traces_a: Sequence[Sequence[Path]], traces_b: Sequence[Path]
                      ) -> DriftReport:
    """A decoding script's answer in tokens (rank 0's, compare/tokens.py): B against A's first plain repeat, the
    distinct outputs among A's own repeats beside it, and the first drift's record index in A's first plain
    repeat, to tell a token that follows the first drift from one that differs before any record does."""
    streams = [read_tokens(paths[0]) for paths in traces_a]
    compared = compare_tokens([streams[0], read_tokens(traces_b[0])], [0, 1])
    if compared is None:
        return report
    own = compare_tokens(streams, list(range(len(streams))))
    first = report.first_drift
    record = None if first is None else \
        record_index(traces_a[0][0], Identity(first.step, first.kind, first.name, first.occurrence, first.rank))
    return replace(report, tokens=DriftTokens(compared, len(streams), 1 if own is None else own.distinct, record))


def _judged_ends(report: DriftReport, traces_a: Sequence[Sequence[Path]], places: tuple[Path, Path]) -> DriftReport:
    """What `run` compares beside the records: the ends (B's stdout against A's, past the lines A's own repeats
    print otherwise; the exit status), and whether A's plain repeats agree with each other: where they do not, the
    script is nondeterministic under A alone, said first, and nothing passes as within noise of it."""
    settings = report.results_a[0].perturbation if report.results_a else None
    own = own_disagreement([paths for r, paths in zip(report.results_a, traces_a) if r.perturbation == settings])
    ended: Divergence | None = None
    noisy: list[int] = []
    if report.a.world_size == report.b.world_size and report.results_b:  # ranks of other world sizes print otherwise
        a_results = [replace(r, stdout=str(places[0] / r.stdout)) for r in report.results_a]
        ended, noisy = outcome_beyond_noise(a_results, replace(report.results_b[0],
                                                               stdout=str(places[1] / report.results_b[0].stdout)))
    verdict: DriftVerdict = "drift" if report.verdict == "drift" or ended is not None else report.verdict
    note = None if own is None else _own_note(own)
    if note is not None and verdict != "drift":
        verdict = "inconclusive"
    causes = report.causes if verdict == report.verdict else \
        rank_causes(differences(report.a, report.b), verdict == "drift", None)
    reason = None if verdict == "drift" else note or report.reason
    return replace(report, verdict=verdict, reason=reason,
                   outcome=None if ended is None else _outcome(ended), stdout_unsteady=noisy[:20], a_disagrees=note,
                   causes=causes)


def _own_note(found: Divergence) -> str:
    """A's plain repeats' first divergence in words."""
    where = "" if found.record is None else \
        f" at step {found.record.step} {found.record.kind} {found.record.name}"
    return (f"A's own plain repeats (the same settings) disagree{where} ({found.detail}): the script is "
            "nondeterministic under A alone, so A's floor measures that, not reorder noise, and nothing is within "
            "noise of it; `detaudit run` on A finds why")


def _outcome(found: Divergence) -> OutcomeDrift:
    """B's end that differs from A's, in words."""
    printed = found.stdout
    if printed is None:
        return OutcomeDrift(found.detail)
    at = f" at {printed.field}" if printed.field else ""
    return OutcomeDrift(f"stdout line {printed.line} differs{at} ({printed.mode} comparison, docs/stdout.md), where "
                        "A's own repeats print it alike", printed.line, printed.lines.get(printed.reference),
                        next((text for i, text in printed.lines.items() if i != printed.reference), None))


def _views(report: DriftReport, traces_a: Sequence[Sequence[Path]], traces_b: Sequence[Path]
           ) -> tuple[list[SideView], SideView]:
    """A's repeats and B as judged (rank_views.side_view); Inconclusive for a recording cut short."""
    missing = [p for p in [*(p for paths in traces_a for p in paths), *traces_b] if not p.is_file()]
    if missing:
        raise TraceError(f"{missing[0]}: the repeat left no trace")
    per_rank = report.a.world_size == report.b.world_size
    return [side_view(paths, per_rank) for paths in traces_a], side_view(traces_b, per_rank)


def size_unknown(report: DriftReport, traces_a: Sequence[Sequence[Path]], traces_b: Sequence[Path]
                 ) -> list[tuple[Judged, Value, Value]]:
    """The records of unknown size, each with A's first plain record and B's (as `_judged_records` judged them)."""
    views_a, view_b = _views(report, traces_a, traces_b)
    plain, b = views_a[0].recording, view_b.recording
    judged = judge(align(plain, b), plain, [v.recording for v in views_a[1:]], b)
    return [(j, plain[j.identity], b[j.identity]) for j in judged if j.unrecorded]


def _judged_records(report: DriftReport, traces_a: Sequence[Sequence[Path]],
                    traces_b: Sequence[Path], sized: Mapping[Identity, Judged]) -> DriftReport:
    """The records judged: each aligned record against A's floor (or as `sized`), those one side lacks as
    structure."""
    try:
        views_a, view_b = _views(report, traces_a, traces_b)
    except Inconclusive as exc:  # a recording cut short: no verdict rests on it (compare/identity.whole)
        return replace(report, reason=str(exc))
    recordings_a = [v.recording for v in views_a]
    recording_b = view_b.recording
    report = replace(report, not_comparable=not_comparable(views_a[0], view_b),
                     rank_disagreements=disagreements(views_a[0], view_b))
    alignment = align(recordings_a[0], recording_b)
    judged = [sized.get(j.identity, j) for j in judge(alignment, recordings_a[0], recordings_a[1:], recording_b)]
    if not judged:
        return replace(report, reason="A and B hold no record in common (nothing recorded, or nothing aligned)",
                       only_a=_names(alignment.only_a), only_b=_names(alignment.only_b))
    one_sided = structural(alignment)
    first, change = _first_drift(judged, one_sided, recordings_a, recording_b)
    verdict = overall(judged, alignment)
    unsized = [j for j in judged if j.unrecorded]
    ratios = [j.ratio for j in judged if j.ratio is not None]
    return replace(
        report, verdict=verdict, first_drift=first,
        reason=None if verdict != "inconclusive" else (
            f"{len(unsized)} record(s) of B differ where the trace samples no element (first: step "
            f"{unsized[0].identity.step} {unsized[0].identity.kind} {unsized[0].identity.name}"
            + (f": {unsized[0].detail}" if unsized[0].identity in sized else "") + "): their size is "
            "unknown, so B is neither shown within noise nor beyond it"),
        floor=replace(report.floor, largest_floor=max(j.floor for j in judged),
                      largest_ratio=max(ratios, default=None)),
        counts=_counts(judged, len(one_sided)),
        records=[_row(j, recordings_a[0][j.identity]) for j in judged if j.status != "equivalent"][:SHOWN],
        by_step=by_step(judged),
        only_a=_names(alignment.only_a), only_b=_names(alignment.only_b), structure=_names(one_sided[:SHOWN]),
        causes=rank_causes(differences(report.a, report.b), verdict == "drift", change))


def _counts(judged: Sequence[Judged], structure: int) -> Counts:
    def count(status: str) -> int:
        return sum(j.status == status and not j.unrecorded for j in judged)
    return Counts(len(judged), count("equivalent"), count("within-noise"), count("drift"), structure,
                  sum(j.unrecorded for j in judged))


def _first_drift(judged: Sequence[Judged], missing: Sequence[Identity], recordings_a: Sequence[Recording],
                 recording_b: Recording) -> tuple[FirstDrift | None, ChangeEvidence | None]:
    """The first drift and its evidence: the first record beyond its floor in A's order, or the first record one
    side lacks (a structure difference) where that comes at an earlier step or no record is beyond its floor."""
    first = first_drift(judged)
    lacking = missing[0] if missing else None
    if lacking is not None and (first is None or lacking.step < first.identity.step):
        held_by_a = lacking in recordings_a[0]
        value = recordings_a[0][lacking] if held_by_a else recording_b[lacking]
        why = (f"only {'A' if held_by_a else 'B'} holds this record: a structure difference (another number of "
               "steps, a gradient, parameter or saved value one side never recorded), as `run` calls a record one "
               "repeat lacks")
        change = ChangeEvidence()
        return replace(_first(Judged(lacking, "drift", math.inf, 0.0, None, why), value, change), structure=True), \
            change
    if first is None:
        return None, None
    # a difference of unknown size has no ratio to the floor: how it goes over the steps is not known either
    ratios = ratios_over_steps(judged, first) if first.detail is None else []
    change = evidence(recordings_a[0][first.identity], recording_b[first.identity], ratios)
    return _first(first, recordings_a[0][first.identity], change), change


def by_step(judged: Sequence[Judged]) -> list[StepFigures]:
    """Each step's largest difference and floor, and its drifting records (the HTML page's plots)."""
    steps: dict[int, list[Judged]] = {}
    for j in judged:
        steps.setdefault(j.identity.step, []).append(j)
    return [StepFigures(step, None if any(not math.isfinite(j.difference) for j in group)
                        else max(j.difference for j in group), max(j.floor for j in group),
                        sum(j.status == "drift" for j in group)) for step, group in sorted(steps.items())]


def _first(judged: Judged, value: Value, change: ChangeEvidence) -> FirstDrift:
    i = judged.identity
    return FirstDrift(i.step, i.kind, i.name, value.module, value.location, judged.ratio, change.factor, value.dtype,
                      value.shape, change, judged.detail, occurrence=i.occurrence, rank=i.rank)


def _row(judged: Judged, value: Value) -> RecordRow:
    i = judged.identity
    return RecordRow(i.step, i.kind, i.name, i.occurrence, value.module, value.location, judged.status,
                     judged.difference if math.isfinite(judged.difference) else None, judged.floor, judged.ratio,
                     i.rank, judged.detail, judged.sized, judged.unrecorded)


def _names(identities: Sequence[Identity]) -> list[RecordName]:
    return [RecordName(i.step, i.kind, i.name, i.occurrence, i.rank) for i in identities]

