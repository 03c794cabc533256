"""What a verdict rests on (match strength), and the `--self-check` negative control.

"Deterministic" is only as strong as what was compared: `Match` says how many records of each
kind, bitwise or within a tolerance, at which granularity, over which steps, whether stdout was
compared, and what was not observed at all. `--self-check` runs one extra repeat in which the
recorder flips the lowest bit of one recorded tensor (one ULP for a float) at a chosen record; the
comparison must report a divergence at exactly that record, proof that the pipeline could have
seen a difference. No torch here (the perturbation itself is in recorder/core.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from detaudit.compare.align import CHUNK, Aligner
from detaudit.compare.traces import Comparison, compare_traces
from detaudit.results import RepeatResult, SelfCheck, Tolerance
from detaudit.trace import Flag, Kind, RecordStream
from detaudit.trace.dtypes import DTYPE_NAMES

SELF_CHECK_PREFIX = "selfcheck"
# records the perturbation cannot be placed in exactly (another thread's), or that would not show it (no contents)
_SKIPPED = int(Flag.THREAD | Flag.NO_DATA | Flag.NOT_RESULT)
_NOT_RESULT = int(Flag.NOT_RESULT)


@dataclass(frozen=True)
class Match:
    """What the comparison covered (docs/report-schema.md: `match`)."""

    records_by_kind: dict[str, int]
    comparison: str  # "bitwise" | "tolerance"
    tolerance: dict[str, float] | None
    granularity: str
    steps_covered: int  # optimizer steps completed within the compared records
    stdout_compared: str  # "strict" | "masked" (timing-like numbers masked, docs/stdout.md) | "no"
    exit_status_compared: bool
    not_observed: list[str] = field(default_factory=list)
    self_check: SelfCheck | None = None
    records_without_contents: int = 0  # compared records with dtype and shape only (Flag.NO_DATA, Flag.NOT_RESULT)
    not_compared: list[str] = field(default_factory=list)  # what stopping repeats early left uncompared

    @property
    def contentless(self) -> bool:
        """Every compared record is content-less: agreement on dtypes and shapes proves nothing."""
        return 0 < self.records_without_contents == sum(self.records_by_kind.values())

    @property
    def records_by_content(self) -> int:
        """Compared records whose contents were compared (the rest agree on dtype and shape only)."""
        return sum(self.records_by_kind.values()) - self.records_without_contents


def not_compared(results: Sequence[RepeatResult]) -> list[str]:
    """What repeats stopped at a step boundary leave uncompared: their exit status, their stdout, and
    whatever they would have recorded later; one line per reason."""
    lines = []
    diverged = [r for r in results if r.stopped_by == "divergence"]
    if diverged:
        where = ", ".join(f"{r.index} after step {r.stopped_at_step}" + (
            f" (diverged at step {r.diverged_at_step})" if r.diverged_at_step is not None else "") for r in diverged)
        reference = (" (repeat 0, the others' reference, once every repeat compared with it had)"
                     if any(r.index == 0 for r in diverged) else "")
        lines.append(f"repeat(s) {where} were stopped a few optimizer steps after they diverged{reference}, once the "
                     "answer was known: their exit status, their stdout and anything they would have recorded later "
                     "(--run-to-end runs every repeat to its end)")
    bounded = sorted({r.stopped_at_step for r in results if r.stopped_by in ("max-steps", "max-time")
                      and r.stopped_at_step is not None})
    if bounded:
        lines.append(f"everything after step {', '.join(map(str, bounded))}, where --max-steps/--max-time stopped "
                     "the repeats, and their exit status and stdout")
    return lines


@dataclass
class _Tally:
    """What the reference trace's compared records hold, beyond their kinds (describe_match's reading of it)."""

    counts: np.ndarray = field(default_factory=lambda: np.zeros(max(Kind) + 1, dtype=np.int64))  # records by kind
    no_data: int = 0
    threaded: int = 0
    last_step: int = 0
    stepped: int = -1  # the last step index at which parameters were recorded after an optimizer step
    unencoded: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # device digests made by recorder/devicehash.py's fail-safe
    not_results: dict[str, int] = field(default_factory=dict)  # op output -> records of it set aside (NOT_RESULT)


def _tally(trace: Path, records: int) -> _Tally:
    """Count the first `records` records of `trace` (an unreadable trace counts as far as it reads: the
    comparison already reported it)."""
    tally = _Tally()
    aside: dict[int, int] = {}  # name id -> records
    try:
        stream = RecordStream(trace)
        for chunk in stream.chunks(CHUNK, records):
            tally.counts += np.bincount(chunk["kind"], minlength=len(tally.counts))[: len(tally.counts)]
            tally.no_data += int(np.count_nonzero(chunk["flags"] & int(Flag.NO_DATA)))
            tally.threaded += int(np.count_nonzero(chunk["flags"] & int(Flag.THREAD)))
            for name, n in zip(*np.unique(chunk["name"][(chunk["flags"] & _NOT_RESULT) != 0], return_counts=True)):
                aside[int(name)] = aside.get(int(name), 0) + int(n)
            tally.last_step = max(tally.last_step, int(chunk["step"].max()))
            # parameters only: an LR scheduler's state (OPTSTATE) is recorded after its own step, which is not an
            # optimizer step (OneCycleLR stepped per batch would add one)
            after = chunk["step"][chunk["kind"] == int(Kind.PARAM)]
            if len(after):
                tally.stepped = max(tally.stepped, int(after.max()))
        tally.unencoded = [f"{e.get('what')} ({e.get('name')})" for e in stream.events if e.get("type") == "unobserved"]
        tally.fallbacks = [str(e.get("detail")) for e in stream.events if e.get("type") == "device-digest"]
        tally.not_results = {stream.strings[name]: n for name, n in aside.items()}
    except Exception:  # an unreadable trace was already reported by the comparison
        pass
    return tally


def _not_observed(tally: _Tally, granularity: str, stdout: str, devices: Sequence[str]) -> list[str]:
    """What the recording cannot have seen, one line each."""
    not_observed = []
    if granularity in ("module", "auto"):
        not_observed.append("individual ops (module granularity: module outputs, inputs, gradients, parameters, "
                            "optimizer state and saves)")
    elif granularity == "step":
        not_observed.append("module outputs and individual ops (step granularity: gradients, parameters and "
                            "optimizer state at each step)")
    else:
        not_observed.append("ops inside compiled regions (torch.compile, TorchScript): only their outputs")
    if "cuda" not in devices:
        not_observed.append("CUDA kernels: every compared repeat ran on CPU")
    not_observed.append("tensors that never reach a module, an optimizer, torch.save or detaudit.checkpoint "
                        "(and work inside DataLoader workers, except the batches they return, and in object "
                        "finalizers at interpreter shutdown, after the atexit handlers)")
    unencoded = tally.unencoded
    if unencoded:
        not_observed.append(f"{len(unencoded)} values passed to torch.save or detaudit.checkpoint that have no stable "
                            f"encoding (objects of arbitrary classes): {', '.join(unencoded[:5])}"
                            + (", ..." if len(unencoded) > 5 else ""))
    not_observed += list(dict.fromkeys(tally.fallbacks))
    if tally.no_data:
        not_observed.append(f"the contents of {tally.no_data} records (meta, vmapped or unreadable tensors: dtype and "
                            "shape only)")
    if tally.not_results:
        not_observed.append(f"not results: {not_results_text(tally.not_results)} (memory an op keeps for its "
                            "backward, whose bytes the kernel need not define: compared by dtype and shape only)")
    if tally.threaded:
        not_observed.append(f"the order of {tally.threaded} records made on other threads (compared in canonical "
                            "order)")
    if stdout == "ignore":
        not_observed.append("stdout (ignored, or not recorded)")
    elif stdout == "masked":
        not_observed.append("timings and other run-dependent numbers in stdout (masked: --stdout strict compares them)")
    return not_observed


def not_results_text(counts: Mapping[str, int]) -> str:
    """Outputs set aside as no results (recorder/scratch.py), by op: `3 workspace outputs of aten.x.default[3]`."""
    return ", ".join(f"{n} workspace output{'s' if n > 1 else ''} of {name}" for name, n in counts.items())


def describe_match(trace: Path, comparison: Comparison, *, bitwise: bool, tolerance: Tolerance,
                   granularity: str, stdout: str, devices: Sequence[str], exit_status: bool = True,
                   self_check: SelfCheck | None = None, stopped: Sequence[str] = ()) -> Match:
    """The reference trace's compared records counted by kind, and what the recording cannot have seen."""
    tally = _tally(trace, comparison.records_compared)
    by_kind = {Kind(k).name.lower(): int(n) for k, n in enumerate(tally.counts) if k in Kind._value2member_map_ and n}
    return Match(by_kind, "bitwise" if bitwise else "tolerance",
                 None if bitwise else {"atol": tolerance.atol, "rtol": tolerance.rtol}, granularity,
                 # a record's step counts the steps completed before it; a step's own parameters carry its
                 # index, so N completed steps end with parameters at N - 1
                 max(tally.last_step, tally.stepped + 1),
                 "no" if stdout == "ignore" else stdout, exit_status,
                 _not_observed(tally, granularity, stdout, devices), self_check, comparison.records_shape_only,
                 list(stopped))


def choose_record(trace: Path) -> tuple[int, int, str] | None:
    """(index, step, name) of the record to perturb: the first plain, non-empty record of the middle step."""
    stream = RecordStream(trace)
    rows: list[tuple[int, int, int, int, int]] = []  # index, step, name id, shape id, dtype
    aligner = Aligner([stream])
    for block in aligner:
        chunk = block.chunks[0]
        for i in np.flatnonzero((chunk["flags"] & _SKIPPED) == 0):
            r = chunk[i]
            rows.append((block.base + int(i), int(r["step"]), int(r["name"]), int(r["shape"]), int(r["dtype"])))
    aligner.finish()
    strings = stream.strings
    usable = [r for r in rows if DTYPE_NAMES.get(r[4], "unknown") not in ("unknown", "complex128")
              and "0" not in strings[r[3]].split("x")]
    if not usable:
        return None
    middle = max(r[1] for r in usable) // 2
    index_, step, name, _, _ = next(r for r in usable if r[1] >= middle)
    return index_, step, strings[name]


def detect(reference: Path, perturbed: Path, record: tuple[int, int, str], tolerance: Tolerance,
           bitwise: bool) -> SelfCheck:
    """Compare the perturbed repeat with the reference exactly as the audit compares repeats."""
    comparison = compare_traces([reference, perturbed], ["ref", "ref"] if bitwise else ["ref", "other"], tolerance)
    first = comparison.first_divergence
    return SelfCheck(record[0], record[1], record[2], first.index if first is not None else None)
