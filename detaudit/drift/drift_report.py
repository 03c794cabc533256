"""The report of `detaudit drift` (DriftReport): its verdict and exit code, and its JSON form (`detaudit-drift`
version 1, docs/drift.md), which reads back into the type (detaudit/codec.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from detaudit.codec import Codable
from detaudit.compare.tokens import TokenComparison
from detaudit.drift.change_kinds import CandidateCause, ChangeEvidence
from detaudit.drift.configurations import Configuration
from detaudit.errors import ExitCode
from detaudit.results import RepeatResult

DRIFT_FORMAT = "detaudit-drift"
DRIFT_VERSION = 1
DRIFT_FILE = "drift.json"  # in the run directory
DriftVerdict = Literal["equivalent", "within-noise", "drift", "script-failed", "timeout", "inconclusive"]
_EXIT = {"equivalent": ExitCode.DETERMINISTIC, "within-noise": ExitCode.DETERMINISTIC, "drift": ExitCode.DIVERGENT,
         "script-failed": ExitCode.SCRIPT_FAILED, "timeout": ExitCode.TIMEOUT, "inconclusive": ExitCode.INCONCLUSIVE}


@dataclass(frozen=True)
class RecordRow:
    """One aligned record judged, in words: B's difference from A, A's floor there and their ratio (None:
    beyond any floor: another shape or dtype, a NaN on one side, an exact record that changed)."""

    step: int
    kind: str
    name: str
    occurrence: int
    module: str
    location: str
    status: Literal["equivalent", "within-noise", "drift"]
    difference: float | None  # None: not comparable element by element
    floor: float
    ratio_to_floor: float | None
    rank: int = 0  # a per-rank record of two runs with the same world size
    detail: str | None = None  # why a drift has no size (compare/noise_floor.py `unsized`), or no pair, or how sized
    sized: bool = False  # its size was unknown and found by re-recording (drift/rerecord.py): from every element
    unrecorded: bool = False  # its digest differs where no sample sits and it was not sized: its size is unknown


@dataclass(frozen=True)
class FirstDrift:
    """The first record beyond the floor, and what kind of change it shows."""

    step: int
    kind: str
    name: str
    module: str
    location: str
    ratio_to_floor: float | None
    factor: float | None  # B = factor x A, element by element (gradients x2: averaging differs)
    dtype: str
    shape: str
    evidence: ChangeEvidence
    detail: str | None = None  # why it has no size (an unrecorded position, a value that is no tensor)
    structure: bool = False  # a record only one side holds (compare/identity.structural)
    occurrence: int = 0  # among its step's records of its kind and name (a module called twice)
    rank: int = 0  # a per-rank record of two runs with the same world size

    @property
    def starts_in_update(self) -> bool:
        """A parameter or optimizer state is the first record beyond the floor, every record of its step before
        it within noise: the change starts inside optimizer.step(), whose ops op recording leaves out, so an op
        window has nothing to name (it is not run: 2 interpreters)."""
        return self.kind in ("param", "optstate")


@dataclass(frozen=True)
class OpWindow:
    """The first op of the drifting step where B departs from A (drift/op_window.py): one B lacks
    (`ratio_to_floor` None, and what B ran in that module instead in `b_ops`) or one beyond K times its ULP bound."""

    step: int
    op: str
    module: str
    location: str
    backward: bool
    ratio_to_floor: float | None
    b_ops: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OutcomeDrift:
    """B ends otherwise than A (compare/outcome.py, as `run` compares repeats' ends): its stdout differs at `line`
    (masked, docs/stdout.md) where A's own repeats agree, A's text and B's there; or its exit status (line None)."""

    detail: str
    line: int | None = None
    a: str | None = None
    b: str | None = None


@dataclass(frozen=True)
class DriftTokens:
    """A decoding script's generated tokens (compare/tokens.py): A's first plain repeat (0) against B (1), each
    differing sequence's first divergent token; how many distinct outputs A's own repeats (plain and perturbed)
    generated, its noise in tokens; and the first drift's record index in A's first plain repeat, which a token
    chosen after it follows (`TokenDivergence.follows`)."""

    compared: TokenComparison
    a_repeats: int
    a_distinct: int
    first_drift_record: int | None = None  # None: no first drift, or A does not hold it (only B does)


@dataclass(frozen=True)
class RecordName:
    """A record only one side holds."""

    step: int
    kind: str
    name: str
    occurrence: int
    rank: int = 0


@dataclass(frozen=True)
class RerecordedRecord:
    """A record of unknown size that A and B were re-recorded to size (drift/rerecord.py): `sized`, or why not
    (`reason`: the re-recording did not reproduce the first, its values were over the cap, ...)."""

    step: int
    kind: str
    name: str
    occurrence: int
    rank: int
    sized: bool
    reason: str | None = None


@dataclass(frozen=True)
class Rerecorded:
    """The re-recording that sized records of unknown size: A (plain) and B run once more, keeping those records'
    full values; the interpreters it started, and each record asked for."""

    interpreters: int
    records: list[RerecordedRecord] = field(default_factory=list)


@dataclass(frozen=True)
class NotComparable:
    """Records of one kind left out of the judging, and why (another world size: different sample sets per rank)."""

    kind: str
    records_a: int
    records_b: int
    reason: str


@dataclass(frozen=True)
class RankDisagreement:
    """A record every rank should hold alike (a gradient after averaging, a parameter) that a rank holds otherwise
    than rank 0: the comparison uses rank 0's."""

    side: Literal["a", "b"]
    rank: int
    step: int
    kind: str
    name: str


@dataclass(frozen=True)
class FloorSummary:
    """How A's floor was measured: K, the least floor in ULPs, the settings A's extra repeats changed (setting ->
    value per repeat), and the largest floor and ratio over the records."""

    k: float
    ulps: int
    perturbed: list[dict[str, str]]
    largest_floor: float
    largest_ratio: float | None


@dataclass(frozen=True)
class StepFigures:
    """One step over its aligned records: B's largest difference from A (None: some record beyond comparing),
    A's largest floor, and how many records drift."""

    step: int
    largest_difference: float | None
    largest_floor: float
    drift: int


@dataclass(frozen=True)
class Counts:
    aligned: int = 0
    equivalent: int = 0
    within_noise: int = 0
    drift: int = 0
    structure: int = 0  # records one side lacks that are a structure difference (compare/identity.structural)
    size_unknown: int = 0  # records whose digest differs where no sample sits (compare/noise_floor.py `unsized`)


@dataclass(frozen=True)
class DriftReport(Codable):
    """Everything the renderers need; built once by drift/drift_check.py."""

    script: str
    script_args: list[str]
    run_dir: str
    verdict: DriftVerdict
    a: Configuration
    b: Configuration
    results_a: list[RepeatResult]  # A's plain repeats, then each perturbed one, then a plain one again
    results_b: list[RepeatResult]
    floor: FloorSummary
    first_drift: FirstDrift | None = None
    counts: Counts = field(default_factory=Counts)
    records: list[RecordRow] = field(default_factory=list)  # the records that are not bitwise equal, in A's order
    by_step: list[StepFigures] = field(default_factory=list)
    only_a: list[RecordName] = field(default_factory=list)
    only_b: list[RecordName] = field(default_factory=list)
    structure: list[RecordName] = field(default_factory=list)  # the first of only_a/only_b that are a drift
    causes: list[CandidateCause] = field(default_factory=list)
    reason: str | None = None  # script-failed, timeout, inconclusive: why
    op_window: OpWindow | None = None  # on a drift: the first op where B departs from A (None: not run, none)
    op_runs: int = 0  # interpreters the op-level window started (A's and B's re-run over the drifting step)
    baseline: str | None = None  # --baseline: the earlier drift run directory A (results_a, floor) was kept from
    b_from: str | None = None  # --b-from: the earlier drift run directory B (results_b) was kept from
    not_comparable: list[NotComparable] = field(default_factory=list)  # per-rank records across world sizes
    rank_disagreements: list[RankDisagreement] = field(default_factory=list)  # the first ones, each side
    outcome: OutcomeDrift | None = None  # B's stdout or exit status differs from A's: a drift
    stdout_unsteady: list[int] = field(default_factory=list)  # stdout lines A's own repeats print otherwise (first 20)
    a_disagrees: str | None = None  # A's own plain repeats differ (the script is nondeterministic under A): where
    rerecorded: Rerecorded | None = None  # records of unknown size re-recorded to size them (None: not run)
    tokens: DriftTokens | None = None  # the generated tokens, B against A (None: the script decodes nothing)

    @property
    def exit_code(self) -> int:
        """0 for equivalent and within-noise (a CI pass for goldens), 1 for drift, the usual codes otherwise."""
        return int(_EXIT[self.verdict])

    @property
    def interpreters(self) -> int:
        """Interpreters this check started: A's repeats (none when kept from a baseline), B's (none when kept with
        --b-from), the re-recording's, the op window's."""
        return (0 if self.baseline else len(self.results_a)) + (0 if self.b_from else len(self.results_b)) \
            + (self.rerecorded.interpreters if self.rerecorded else 0) + self.op_runs


def to_json(report: DriftReport) -> dict[str, Any]:
    """The JSON document: format, version and exit code around the report's fields."""
    return {"format": DRIFT_FORMAT, "version": DRIFT_VERSION, "exit_code": report.exit_code, **report.to_dict()}


def write_json(report: DriftReport, path: Path, mode: int | None = None) -> None:
    from detaudit.run.files import write_output

    write_output(path, json.dumps(to_json(report), indent=2) + "\n", mode)
