"""The root-cause rule over op records: which op made the repeats diverge, and why.

An op whose inputs match in every repeat but whose output does not is itself the source:
a random op (RNG), an op that read never-written memory, or a nondeterministic kernel. An op
whose inputs are the same tensors in another order points at the order they were gathered in
(set or dict iteration, hash seeds). An op whose inputs already differ only passes a divergence
on, so the rule walks back to where its inputs started to differ.

Divergent ops that lead nowhere are common (random initialisation later overwritten by
`load_state_dict`), so the chosen source is the first one whose divergence *propagates*: the
next divergent record after it is an op whose inputs differ, or a non-op record (a module
output, a gradient), rather than another source. Sources back to back, with no agreeing record
between them (one op's several outputs, the initialisation of every layer), form one run and
share a cause: the run's first is named.

That rule knows only the order of records; an unseeded RNG makes every draw differ, so the latest run of
sources before the divergence may have made something else (a classifier's init, drawn after `conv1`'s).
Where the trace links each forward op to the records that made its inputs (recorder/ops.py), the first
divergent non-op record (a module output, input, gradient...: what a module-level comparison reports) is
followed back instead:
to the op that made the same tensor (the latest op with its digest), then through the inputs that
differ, to the nearest source among its ancestors (fewest ops away; of equals, the first recorded).
Without such links (an older trace, a backward op, a maker in an earlier step) the order rule stands.
Traces are walked in lockstep chunks (align.py), stopping as soon as
the answer is known, so memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from detaudit.compare.align import Aligner, describe, reference_pairs
from detaudit.compare.set_origins import RunOrderedSet, sets_at
from detaudit.results import Divergence, RecordInfo
from detaudit.trace import LOADER_BATCH, Flag, Kind, RecordStream

BEFORE, AFTER = 3, 2  # neighbours shown around the op

Verdict = Literal["nondeterministic-op", "random-op", "uninitialized-memory", "input-order", "inputs-differ",
                  "different-ops"]
VERDICTS: dict[Verdict, str] = {
    "nondeterministic-op": "its inputs match in every repeat but its output does not: the kernel itself "
                           "is nondeterministic",
    "random-op": "it draws from a random number generator and its inputs match: the RNG state differs "
                 "between repeats",
    "uninitialized-memory": "it read memory that nothing had written (torch.empty and kin), whose leftover "
                            "contents differ between repeats",
    "input-order": "it received the same input tensors in a different order (gathered from a set, a dict "
                   "or another order that changes between runs)",
    "inputs-differ": "its inputs already differ",
    "different-ops": "the repeats ran different ops here: the control flow differs",
}
# "": not an op record; "unwritten": one input was never-written memory, whose contents its digest leaves out
InputsState = Literal["match", "reordered", "differ", "unknown", "unwritten", ""]
OutputState = Literal["match", "differ"]


@dataclass(frozen=True)
class OpRow:
    """One record of the match table around the op."""

    record: RecordInfo
    inputs: InputsState
    output: OutputState
    chosen: bool = False


@dataclass(frozen=True)
class OpFinding:
    """The op behind a divergence; consumed by the report and the causes engine."""

    verdict: Verdict
    record: RecordInfo  # the op (op, phase, node, module, location, step)
    repeats: list[int]  # repeats whose output differs from their reference there
    reference: int
    origin: RecordInfo | None = None  # inputs-differ: the earliest differing record (non-op), if any
    others: dict[int, RecordInfo] = field(default_factory=dict)  # different-ops: what the others ran
    neighbours: list[OpRow] = field(default_factory=list)
    traced_from: RecordInfo | None = None  # the divergent record whose provenance led to the op, if followed
    traces: str = ""  # which traces it was read from (the op-level re-run's prefix under --granularity auto)
    window: list[int] | None = None  # steps the op-level re-run recorded ops in
    ordered_by: list[RunOrderedSet] = field(default_factory=list)  # input-order: run-ordered sets at its line
    via: list[RecordInfo] = field(default_factory=list)  # traced: the records that are no aten op on the way from
    #                                                      the op to traced_from (a DataLoader's batch)

    @property
    def through(self) -> str:
        """The records on the way from the op to traced_from that are no aten op, in words: where the chain left
        torch and came back ("" when none)."""
        return ", then ".join(
            "the batch a DataLoader yielded" + (f" at {v.location}" if v.location else "") +
            ", built outside torch from the indices its sampler drew (Python values given to the Dataset)"
            for v in self.via)

    @property
    def summary(self) -> str:
        r = self.record
        head = f"{r.op} ({r.phase}{', ' + r.node if r.node else ''})"
        where = " ".join(x for x in (f"in {r.module}" if r.module else "", f"at {r.location}" if r.location else "")
                         if x)
        text = f"{head} {where}".strip() + f": {VERDICTS[self.verdict]}"
        t = self.traced_from
        if t is not None and t.index != r.index:
            text += f"; it made {t.kind} {t.name}" + (f" ({t.location})" if t.location else "") + \
                " (or what it was computed from)" + (f" through {self.through}" if self.via else "")
        if self.verdict == "inputs-differ":
            if self.origin is not None:
                o = self.origin
                text += f"; they started to differ at {o.kind} {o.name}" + (f" ({o.location})" if o.location else "")
            else:
                text += ("; no recorded op produced the difference: it entered as data from outside torch "
                         "(Python or NumPy values, a file), a scalar argument, or a tensor made before the steps "
                         "ops were recorded in")
        if self.verdict == "different-ops":
            text += "; " + ", ".join(f"repeat {i} ran {o.op or o.name}" for i, o in sorted(self.others.items()))
        return text


def traced_note(f: OpFinding) -> str | None:
    """How the op was found (terminal and HTML): the divergent record, followed back to the op that made it, and
    where the chain left torch on the way; None when the op was not found so."""
    t = f.traced_from
    if t is None or t.index == f.record.index:
        return None
    via = f", via {f.through}" if f.via else ""
    return f"{t.kind} {t.name}" + (f" ({t.location})" if t.location else "") + \
        f", followed back through the inputs that differ to the op that made it{via}"


class _Scan:
    """Finds the source index by the propagation rule (see the module docstring)."""

    def __init__(self) -> None:
        self.candidate: int | None = None  # the first source of the latest run, not yet seen to propagate
        self.last_source = -2
        self.first_source: int | None = None
        self.first_differing_op: int | None = None  # divergent op with differing inputs and no source before
        self.origin: int | None = None  # first divergent non-op record with no source before it
        self.chosen: int | None = None

    def visit(self, index: int, is_op: bool, source: bool, differing_inputs: bool) -> bool:
        """Feed one divergent record (in order); True once the answer is known."""
        if source:
            if self.origin is not None:
                return True  # the divergence entered as data before this source: it did not cause it
            if self.first_source is None:
                self.first_source = index
            if index != self.last_source + 1:  # a new run of back-to-back sources
                self.candidate = index
            self.last_source = index
            return False
        if self.candidate is not None:
            if differing_inputs or not is_op:
                self.chosen = self.candidate
                return True
            return False
        if differing_inputs:
            self.first_differing_op = index
            return True
        if not is_op and self.origin is None:
            self.origin = index
        return False

    @property
    def index(self) -> int | None:
        if self.chosen is not None:
            return self.chosen
        if self.first_source is not None:
            return self.first_source
        return self.first_differing_op


@dataclass(frozen=True)
class _Node:
    source: bool
    digest: int  # the reference's output digest
    makers: tuple[int, ...]  # indices of the records that made its inputs (forward ops with links)
    forward_differing: bool = False  # a forward op (its makers linked) whose inputs are known to differ


class _Provenance:
    """Divergent op records up to the first divergent non-op record (the target), and the walk back from it."""

    LIMIT = 1 << 20  # divergent ops kept; past it the order rule stands

    def __init__(self) -> None:
        self.nodes: dict[int, _Node] = {}
        self.target: int | None = None
        self._target_digest = 0
        self.first_differing: int | None = None  # the first op whose inputs differ (no target: start there)
        self.path: list[int] = []  # the walk's ops from the target's maker to the one found, nearest first
        self.entered: int | None = None  # the op found, where it is where the difference entered torch (no source)
        self.linked = False  # some divergent op names its makers: an op without any has none (not an older trace)

    def add(self, index: int, is_op: bool, source: bool, differing_inputs: bool, digest: int,
            makers: tuple[int, ...], flags: int = 0) -> None:
        if self.target is not None or len(self.nodes) >= self.LIMIT:
            return
        if not is_op:
            self.target, self._target_digest = index, digest
            return
        self.nodes[index] = _Node(source, digest, makers, differing_inputs and not flags & Flag.BACKWARD)
        self.linked = self.linked or bool(makers)
        if differing_inputs and self.first_differing is None:
            self.first_differing = index

    def source(self) -> int | None:
        """The nearest source among the target's recorded ancestors; where none is, the nearest forward op whose
        differing inputs no divergent recorded op made (where the difference entered torch: `entered`); None when
        no link reaches either."""
        if self.target is not None:
            makers = [i for i, n in self.nodes.items() if i < self.target and n.digest == self._target_digest]
            if not makers:
                return None
            start = max(makers)
        elif self.first_differing is not None:
            start = self.first_differing
        else:
            return None
        found, entry, parent = self._walk(start)
        if found is not None:
            return self._through(found, parent, entered=False)
        if entry is None or self.target is None or not self.linked:
            return None
        return self._through(entry, parent, entered=True)

    def _walk(self, start: int) -> tuple[int | None, int | None, dict[int, int]]:
        """From `start` back through the divergent makers, level by level: (the nearest source, of equals the first
        recorded; the nearest entry, a forward op with differing inputs and no divergent maker; each op's successor
        on the way back)."""
        parent: dict[int, int] = {}
        level, seen, entry = [start], {start}, None
        while level:
            found = [i for i in level if self.nodes[i].source]
            if found:
                return min(found), entry, parent
            ends = [i for i in level if self.nodes[i].forward_differing
                    and not any(m in self.nodes for m in self.nodes[i].makers)]
            entry = min(ends) if entry is None and ends else entry
            following = {m: i for i in reversed(level) for m in self.nodes[i].makers
                         if m in self.nodes and m not in seen}
            parent.update(following)
            level = sorted(following)
            seen.update(level)
        return None, entry, parent

    def _through(self, index: int, parent: dict[int, int], entered: bool) -> int:
        """Keep the walk's path to `index` (nearest the target first) and whether it is an entry, not a source."""
        path = [index]
        while path[-1] in parent:
            path.append(parent[path[-1]])
        self.path, self.entered = path[::-1], index if entered else None
        return index


def _makers(stream: RecordStream, row: Any, index: int) -> tuple[int, ...]:
    """The record indices a forward op record's `aux` names as its inputs' makers (distances back)."""
    if int(row["flags"]) & Flag.BACKWARD or not row["aux"]:
        return ()
    try:
        back = [int(d) for d in stream.strings[row["aux"]].split(",")]
    except ValueError:  # not a list of distances (a trace from elsewhere): no links
        return ()
    return tuple(index - d for d in back if 0 < d <= index)


def find_op_source(paths: Sequence[Path], devices: Sequence[str] | None = None) -> OpFinding | None:
    """The op behind the first divergence of these traces; None when they hold no divergent op."""
    devices = list(devices) if devices is not None else ["same"] * len(paths)
    pairs = [(ref, rep) for ref, rep, bitwise in reference_pairs(devices) if bitwise]
    if not pairs:
        return None
    scan = _Scan()
    prov = _Provenance()
    done_at: int | None = None  # the block in which the order rule had its answer
    structure_at: int | None = None
    streams = [RecordStream(Path(p)) for p in paths]
    for block in Aligner(streams):
        chunks, base, n = block.chunks, block.base, block.n
        same = np.ones(n, dtype=bool)
        out_diff = np.zeros(n, dtype=bool)
        in_diff = np.zeros(n, dtype=bool)
        unordered_diff = np.zeros(n, dtype=bool)
        unknown = np.zeros(n, dtype=bool)
        for ref, rep in pairs:
            a, b = chunks[ref][:n], chunks[rep][:n]
            same &= block.same_structure(ref, rep)
            out_diff |= a["digest"] != b["digest"]
            in_diff |= a["in_ordered"] != b["in_ordered"]
            unordered_diff |= a["in_unordered"] != b["in_unordered"]
            unknown |= (a["in_ordered"] == 0) | (b["in_ordered"] == 0)
        bad = np.flatnonzero(~same)
        limit = int(bad[0]) if len(bad) else n
        ref = pairs[0][0]
        ref_rows = chunks[ref]
        for i in np.flatnonzero(out_diff[:limit]).tolist():
            row = ref_rows[i]
            is_op = int(row["kind"]) == Kind.OP
            known = is_op and not unknown[i]
            source = known and not unordered_diff[i]  # inputs match, or the same inputs reordered
            differing = known and bool(in_diff[i])
            prov.add(base + i, is_op, source, differing, int(row["digest"]),
                     _makers(streams[ref], row, base + i) if is_op else (), int(row["flags"]))
            if done_at is None and scan.visit(base + i, is_op, source, differing):
                done_at = base
            if done_at is not None and prov.target is not None:
                return _finding(paths, pairs, scan, prov, None)
        if done_at is not None and done_at < base:  # the target is not near: the order rule's answer
            return _finding(paths, pairs, scan, prov, None)
        if limit < n or n < block.longest:
            structure_at = base + limit
            break
    return _finding(paths, pairs, scan, prov, structure_at)


def _finding(paths: Sequence[Path], pairs: list[tuple[int, int]], scan: _Scan, prov: _Provenance,
             structure_at: int | None) -> OpFinding | None:
    """Turn the scan's indices into an OpFinding, reading the records around the chosen one."""
    index, origin, target, path = _chosen(scan, prov, structure_at)
    if index is None:
        return None
    near = range(max(0, index - BEFORE), index + AFTER + 1)
    if structure_at is not None:
        near = range(near.start, min(near.stop, structure_at + 1))
    rows, streams = _read_rows(paths, {*near, index, *path} | {i for i in (origin, target) if i is not None})
    ref = pairs[0][0]
    if index not in rows or int(rows[index][ref]["kind"]) != Kind.OP:
        return None  # e.g. a structural divergence at a module record: nothing to say about ops

    def info(k: int, i: int) -> RecordInfo:
        return describe(streams[k], rows[i][k], i)

    at = rows[index]
    here = [info(k, index) for k in range(len(paths))]
    differs = sorted({rep for r, rep in pairs if (here[r].name, here[r].shape) != (here[rep].name, here[rep].shape)})
    verdict = _verdict(at, pairs, bool(differs), index in (scan.first_differing_op, prov.entered))
    repeats = differs or sorted({rep for r, rep in pairs if at[r]["digest"] != at[rep]["digest"]})
    neighbours = [OpRow(info(ref, i), _inputs_state(rows[i], pairs), _output_state(rows[i], pairs), i == index)
                  for i in near if i in rows]
    return OpFinding(
        verdict=verdict, record=here[ref], repeats=repeats, reference=ref,
        origin=info(ref, origin) if origin is not None and origin in rows else None,
        traced_from=info(ref, target) if target is not None and target in rows else None,
        others={i: here[i] for i in differs}, neighbours=neighbours,
        ordered_by=sets_at([paths[ref]], here[ref].location) if verdict == "input-order" else [],
        via=_off_torch(path, rows, lambda i: info(ref, i)),
    )


def _off_torch(path: list[int], rows: dict[int, Any], info: Callable[[int], RecordInfo]) -> list[RecordInfo]:
    """Of the records on the way back (`path`), those that are no aten op (a DataLoader's batch: LOADER_BATCH)."""
    return [r for r in (info(i) for i in path if i in rows) if r.op.startswith(LOADER_BATCH)]


def _chosen(scan: _Scan, prov: _Provenance,
            structure_at: int | None) -> tuple[int | None, int | None, int | None, list[int]]:
    """(the op to report, the non-op record the differing data first appeared in, the record it was traced from,
    the records between the two): the op provenance traced the divergence to, else the scan's choice, else the
    structural divergence."""
    traced = prov.source()
    index = traced if traced is not None else scan.index
    origin = scan.origin if traced is None and scan.chosen is None and scan.first_source is None else None
    if traced is None:
        return (structure_at if index is None else index), origin, None, []
    return index, origin, prov.target, prov.path[:-1]


def _verdict(at: Sequence[Any], pairs: list[tuple[int, int]], other_ops: bool, first_differing_op: bool) -> Verdict:
    """What the chosen op's rows (`at`, one per trace) say: the repeats ran other ops there, its inputs differ
    (it is the first op whose do, or where the walk back found the difference entering torch), it drew random
    numbers or read unwritten memory or accumulates in a varying order (its inputs match), or the same inputs came
    in another order."""
    if other_ops:
        return "different-ops"
    if first_differing_op:
        return "inputs-differ"
    if all(at[r]["in_ordered"] == at[rep]["in_ordered"] for r, rep in pairs):
        flags = int(at[pairs[0][0]]["flags"])
        return ("random-op" if flags & Flag.RANDOM else
                "uninitialized-memory" if flags & Flag.UNINIT else "nondeterministic-op")
    return "input-order"


def _inputs_state(rows: Sequence[Any], pairs: list[tuple[int, int]]) -> InputsState:
    if int(rows[pairs[0][0]]["kind"]) != Kind.OP:
        return ""
    if any(rows[r]["in_ordered"] == 0 or rows[rep]["in_ordered"] == 0 for r, rep in pairs):
        return "unknown"
    if any(int(rows[r]["flags"]) & Flag.UNINIT for r, _ in pairs):  # "match" would hide what it read
        return "unwritten"
    if all(rows[r]["in_ordered"] == rows[rep]["in_ordered"] for r, rep in pairs):
        return "match"
    if all(rows[r]["in_unordered"] == rows[rep]["in_unordered"] for r, rep in pairs):
        return "reordered"
    return "differ"


def _output_state(rows: Sequence[Any], pairs: list[tuple[int, int]]) -> OutputState:
    return "match" if all(rows[r]["digest"] == rows[rep]["digest"] for r, rep in pairs) else "differ"


def _read_rows(paths: Sequence[Path], wanted: set[int]) -> tuple[dict[int, tuple[Any, ...]], list[RecordStream]]:
    """({index: (the row of each trace)}, the streams, whose string tables cover those rows)."""
    streams = [RecordStream(Path(p)) for p in paths]
    last = max(wanted)
    out: dict[int, tuple[Any, ...]] = {}
    for block in Aligner(streams):
        for i in wanted:
            if block.base <= i < block.base + block.n:
                out[i] = tuple(c[i - block.base].copy() for c in block.chunks)
        if block.base + block.n > last:
            break
    return out, streams


def update_differs(first: Divergence | None) -> bool:
    """The first record to differ is a parameter as an optimizer step left it: every record before it agrees, that
    step's gradients included (a step records its gradients before its parameters, recorder/boundary.py), so the
    optimizer's update itself differs. Its own ops are not recorded at op level, so an op-level re-run has no op
    to name: its inputs that are no tensor recorded (a learning rate, a weight decay) are what differ."""
    return first is not None and first.record is not None and first.record.kind == "param"


def op_level_note(first: Divergence | None, ran: tuple[int, int] | None) -> str:
    """One line for a report where `auto`'s op-level re-run named no op: that it ran (over steps `ran`) and found
    none, or why it did not run (update_differs); "" where neither applies."""
    if ran is not None:
        return (f"op-level re-run (steps {ran[0]}–{ran[1]}): no op found behind the first divergence (it arises "
                "where ops are not recorded, or did not recur in the re-run)")
    if update_differs(first):
        assert first is not None and first.record is not None  # update_differs says so
        rec = first.record
        return (f"no op-level re-run: parameter {rec.name} is the first record to differ, after optimizer step "
                f"{rec.step}, whose gradients agree, so the update itself differs and no op of the model makes "
                "it; look at the optimizer's inputs (its learning rate and other settings, its state)")
    return ""
