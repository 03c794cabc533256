"""A torchrun run, rank by rank: each rank's own first divergence and role, the DDP replica check,
and teardown crashes (docs/distributed.md).

Each rank is compared across repeats as an ordinary single-process run (the same pipeline:
comparison, op finding, causes), in that rank's own execution order; there is no global order
across ranks. A rank's role says where the nondeterminism was born:

- origin: its first divergent record's inputs matched across repeats (everything the rank
  recorded before it matched, and the record is not fed by a collective);
- receiver: its first divergent record is fed by a collective (gradients of DDP-replicated
  parameters after the all-reduce, and the parameters and optimizer state the step makes of
  them) while everything it computed locally before (inputs, forward outputs, loss) matched;
  or, with op records, the op behind its divergence is a collective (`c10d.allgather_`...) whose
  inputs matched: its output is other ranks' data (one whose inputs differed was fed this rank's data).

The run's `first_divergence` is the earliest origin (by step, then rank); the earliest receiver
when no rank is an origin (the collective itself, or a rank that recorded nothing, is then the source).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from detaudit.causes.context import load
from detaudit.causes.repetition import RepeatedRandomness, repeated_across_ranks, silenced_sites
from detaudit.compare.oprules import OpFinding
from detaudit.compare.traces import gaps
from detaudit.errors import Inconclusive, TraceError, UsageError
from detaudit.records import RunRecord
from detaudit.report.model import DistributedFindings, RankSummary, ReplicaDivergence, Report, TeardownCrash, all_failed
from detaudit.results import Cause, Divergence, RepeatResult, Role
from detaudit.run.distributed import Layout, multi_node, node_rank, rank_error, root_cause
from detaudit.run.failure import excerpt, from_footer, stderr_tail
from detaudit.trace import Kind, RecordStream, sha256_regular

COLLECTIVE_FED = ("grad", "param", "optstate", "buffer")
COLLECTIVE_OPS = ("c10d.", "_c10d_functional.", "c10d_functional.")  # op records of collectives (op granularity)
_SIGNALS = {6: "SIGABRT", 11: "SIGSEGV", 9: "SIGKILL", 15: "SIGTERM", 7: "SIGBUS"}


@dataclass(frozen=True)
class Node:
    """One node's share of a torchrun job: its run directory, its repeats and how it names its ranks."""

    run_dir: Path
    results: Sequence[RepeatResult]
    layout: Layout

    def ranks(self, index: int) -> list[int]:
        """The ranks whose files repeat `index` left in this node's directory."""
        return self.layout.ranks(self.run_dir, self.results[index]) if index < len(self.results) else []


def analyse_ranks(run_dir: Path, record: RunRecord, results: Sequence[RepeatResult],
                  analyse: Callable[..., Report], explained: bool = True) -> Report:
    """The report of a torchrun run: `analyse` applied to each rank, then combined."""
    layout = Layout(record.nproc_per_node or 1, node_rank(list(record.torchrun_args)))
    report = analyse_nodes([Node(run_dir, results, layout)], record, analyse, explained)
    if report.distributed is not None and multi_node(list(record.torchrun_args)):
        held = ", ".join(str(s.rank) for s in report.distributed.ranks)
        report.distributed.notes.insert(0, f"this run is one node of a multi-node job: it compared rank(s) {held} "
                                           "only, and checked their replicas only among themselves; `detaudit "
                                           "compare` with every node's run directory gives the job's verdict")
    return report


def analyse_nodes(nodes: Sequence[Node], record: RunRecord, analyse: Callable[..., Report],
                  explained: bool = True) -> Report:
    """One report over every node's run directory of a job (one node for `detaudit run`, every node for
    `detaudit compare NODE_A NODE_B`): each rank compared across repeats wherever each repeat left its
    files, roles across all ranks, and the replica check across all ranks of each repeat."""
    single = replace(record, nproc_per_node=None, torchrun_args=())
    nodes, crashes = _without_teardown_crashes(nodes)
    launched = [_combined([n.results[i] for n in nodes]) for i in range(len(nodes[0].results))]
    where, rank_ids, moved = _rank_homes(nodes, len(launched))
    notes = _launch_notes(moved, launched)
    if not rank_ids:
        if moved:
            raise Inconclusive(f"{nodes[0].run_dir}: no rank left its traces here in every repeat. {notes[0]}.")
        raise TraceError("no trace was written")
    summaries = []
    for rank in rank_ids:
        rank_results = [rank_result(where[i][rank], r, rank) for i, r in enumerate(launched)]
        report = analyse(where[0][rank], rank_record(single, rank) if len(nodes) == 1 else single, rank_results,
                         explained=explained)
        d = report.first_divergence
        role = None if d is None else classify(d, [Path(r.trace) for r in rank_results], report.op_finding)
        summaries.append(RankSummary(rank, d, role, report))
    chosen = earliest(summaries)
    if chosen is not None and chosen.role == "origin":
        for s in summaries:
            if s.role == "receiver":
                s.report = replace(s.report, causes=[])  # what reached it through a collective was born elsewhere
    primary = chosen.report if chosen is not None else summaries[0].report
    repeat_errors = _repeat_errors(nodes, launched)
    findings = DistributedFindings(
        nproc_per_node=nodes[0].layout.nproc_per_node, rank=chosen.rank if chosen is not None else None,
        ranks=summaries, replica_divergence=replica_check(where, launched, rank_ids), teardown_crashes=crashes,
        notes=[*notes, *sampler_notes(where[0], launched[0], rank_ids)])
    failed = all_failed(launched) and not any(r.timed_out for r in launched)  # the combined verdict `failed`
    return replace(primary, runs=list(launched), repeat_errors=repeat_errors, distributed=findings,
                   run_dir=str(nodes[0].run_dir),
                   repeated_randomness=[*primary.repeated_randomness, *across_ranks(where[0], launched[0], rank_ids)],
                   causes=[on_rank(c, chosen, summaries) for c in primary.causes] if chosen is not None
                   else primary.causes,
                   # the repeat's error (the rank that failed first), not the primary rank's own
                   failure=(repeat_errors.get(launched[0].index) or primary.failure) if failed else primary.failure)


def _without_teardown_crashes(nodes: Sequence[Node]) -> tuple[list[Node], list[TeardownCrash]]:
    """Each node with a repeat that crashed only in teardown (every rank finished with status 0) counted as
    status 0, and those crashes, reported on their own."""
    fixed, crashes = list(nodes), []
    for k, n in enumerate(fixed):
        found = [teardown_crash(n.run_dir, r, n.layout) for r in n.results]
        crashes += [c for c in found if c is not None]
        fixed[k] = replace(n, results=[r if c is None else replace(r, exit_code=0) for r, c in zip(n.results, found)])
    return fixed, crashes


def _rank_homes(nodes: Sequence[Node], repeats: int) -> tuple[list[dict[int, Path]], list[int], list[int]]:
    """(where each repeat's rank left its files, the ranks found in every repeat, the ranks found in some only)."""
    where = _homes(nodes, repeats)
    seen = sorted({rank for places in where for rank in places})
    if len(nodes) > 1:  # every node's directory is here: a rank missing from a repeat left no trace anywhere
        for places in where:
            for rank in seen:
                places.setdefault(rank, nodes[0].run_dir)
    rank_ids = [rank for rank in seen if all(rank in places for places in where)]
    return where, rank_ids, [rank for rank in seen if rank not in rank_ids]


def _launch_notes(moved: Sequence[int], launched: Sequence[RepeatResult]) -> list[str]:
    """What the report says about ranks that moved between nodes, exit barriers waited at, rendezvous retried."""
    notes = [f"rank(s) {', '.join(map(str, moved))} left traces here in some repeats only: the rendezvous "
             "numbered the nodes differently from one launch to the next (c10d orders them by host name, then by "
             "agent pid), so their repeats lie in other nodes' run directories and are not compared here; "
             "`detaudit compare` with every node's run directory compares them"] if moved else []
    waited = [r.index for r in launched if r.exit_barrier_waited]
    if waited:
        notes.append(f"repeat(s) {', '.join(map(str, waited))}: every rank on a node ended by itself, then torchrun's "
                     "agent there waited at its exit barrier until --timeout for another node's agent, which torchrun "
                     "never sends there once a rank of that node failed (a teardown crash included); the ranks' own "
                     "exit statuses stand for the repeat, and their recordings are complete")
    retried = [r.index for r in launched if r.rendezvous_retries]
    if retried:
        notes.append(f"repeat(s) {', '.join(map(str, retried))}: a node's launch failed in torchrun's rendezvous "
                     "before any rank started (another node's agent of the previous repeat still held it) and was "
                     "launched again; the failed launches' output is kept as repeat-I.rendezvous-N.stdout/.stderr")
    return notes


def _repeat_errors(nodes: Sequence[Node], launched: Sequence[RepeatResult]) -> dict[int, str]:
    """Each failed repeat's error: the root-cause rank's, on the first node whose launch failed."""
    errors = {}
    for i, r in enumerate(launched):
        stopped = [n for n in nodes if n.results[i].exit_code not in (0, None) and not n.results[i].timed_out]
        if stopped:
            errors[r.index] = _stderr_excerpt(stopped[0].run_dir, stopped[0].results[i], stopped[0].layout)
    return errors


def _combined(results: Sequence[RepeatResult]) -> RepeatResult:
    """One repeat across nodes: the first node's, failed or stopped when any node's launch was."""
    failed = [r for r in results if r.exit_code != 0]
    first = results[0]
    return replace(first, exit_code=failed[0].exit_code if failed else first.exit_code,
                   timed_out=any(r.timed_out for r in results), interrupted=any(r.interrupted for r in results),
                   duration_s=max((r.duration_s for r in results if r.duration_s is not None), default=None),
                   exit_barrier_waited=any(r.exit_barrier_waited for r in results),
                   rendezvous_retries=max(r.rendezvous_retries for r in results),
                   error=next((r.error for r in failed if r.error is not None), first.error))


def _homes(nodes: Sequence[Node], repeats: int) -> list[dict[int, Path]]:
    """Per repeat, the run directory holding each rank's files; a rank found on two nodes is two jobs' data."""
    where: list[dict[int, Path]] = []
    for i in range(repeats):
        places: dict[int, Path] = {}
        found: dict[int, Path] = {}  # the ranks whose trace is there
        for n in nodes:
            for rank in n.ranks(i):
                if os.path.lexists(n.run_dir / Layout.rank_file(n.results[i].trace, rank)):
                    if rank in found:
                        raise UsageError(f"repeat {i}: both {found[rank]} and {n.run_dir} hold rank {rank}'s trace; "
                                         "the run directories of one job's nodes hold different ranks (were they "
                                         "recorded by the same job, started together?)")
                    found[rank] = n.run_dir
                places.setdefault(rank, n.run_dir)
        places.update(found)
        where.append(places)
    return where


def sampler_notes(homes: dict[int, Path], result: RepeatResult, ranks: Sequence[int]) -> list[str]:
    """A shuffling DistributedSampler reused at the same epoch (first repeat; every rank alike);
    `homes`: the run directory of each rank's files."""
    notes = []
    for rank in ranks:
        for e in _events(homes[rank] / Layout.rank_file(result.trace, rank)):
            if e.get("type") == "sampler-epoch":
                notes.append(f"rank {rank}: the DistributedSampler iterated at {e.get('loc') or '?'} shuffled in "
                             f"the same order in every epoch (epoch {e.get('epoch')} again; `set_epoch` was never "
                             "called): deterministic, but each epoch sees the data in one fixed order. "
                             "Call `sampler.set_epoch(epoch)` before each epoch.")
                break
        if notes:
            break
    return notes


def on_rank(cause: Cause, chosen: RankSummary, summaries: Sequence[RankSummary]) -> Cause:
    """A cause found on one rank says so, and names the ranks that only received the difference."""
    receivers = [s.rank for s in summaries if s.role == "receiver"]
    line = f"found on rank {chosen.rank}, where the divergence was born ({chosen.role})"
    if receivers:
        line += f"; rank(s) {', '.join(map(str, receivers))} only received it through a collective"
    return replace(cause, evidence=[line, *cause.evidence])


def across_ranks(homes: dict[int, Path], result: RepeatResult, ranks: Sequence[int]) -> list[RepeatedRandomness]:
    """Data-side draws that repeat from rank to rank in the first repeat (causes/repetition.py), its ranks' traces
    read together; `homes`: the run directory of each rank's files."""
    evidence = [load(homes[rank] / Layout.rank_file(result.trace, rank), result.index, result.device) for rank in ranks]
    return repeated_across_ranks(evidence, silenced_sites(os.environ))


def rank_result(run_dir: Path, result: RepeatResult, rank: int) -> RepeatResult:
    """One rank's view of a repeat: its trace and stdout, and the exit status its trace recorded
    (None when the trace has no footer: killed by torchrun after another rank failed, or by the timeout)."""
    # absolute (never resolved: a link planted there stays a link): where the rank's node left them
    trace = str((run_dir / Layout.rank_file(result.trace, rank)).absolute())
    stdout = str((run_dir / Layout.rank_file(result.stdout, rank)).absolute())
    footer = _footer(Path(trace))
    code: int | None = None
    if footer is not None:
        try:
            code = int(footer.get("exit_code", 0))
        except (TypeError, ValueError):
            raise TraceError(f"{trace}: corrupt trace: the footer's exit_code is not a number") from None
    return replace(result, trace=trace, stdout=stdout, exit_code=code, stdout_digest=_digest(Path(stdout)),
                   error=from_footer(footer)).ended_as(footer)


def rank_record(record: RunRecord, rank: int) -> RunRecord:
    """The run record as one rank sees it: the op-level re-run's traces are that rank's too."""
    narrowing = record.narrowing
    if narrowing is None:
        return record
    results = tuple(replace(r, trace=Layout.rank_file(r.trace, rank)) for r in narrowing.results)
    return replace(record, narrowing=replace(narrowing, results=results))


def classify(d: Divergence, traces: Sequence[Path], found: OpFinding | None = None) -> Role:
    """Origin or receiver (module docstring): a receiver's first difference is a collective's output;
    `found`: the op behind `d` (Report.op_finding)."""
    rec = d.record
    if found is not None and found.record.op.startswith(COLLECTIVE_OPS) and found.verdict != "inputs-differ":
        return "receiver"  # a collective's output differs from equal inputs here: it carries the other ranks' data
    # (a collective whose inputs already differed, with nothing before it differing, was fed this rank's own
    # data from outside: the divergence was born here)
    if d.category != "content" or rec is None or rec.kind not in COLLECTIVE_FED:
        return "origin"
    if found is not None and found.verdict != "inputs-differ":
        return "origin"  # an op of this rank was shown to change its output from equal inputs
    fed = collective_fed_params(traces[d.reference] if d.reference < len(traces) else traces[0])
    base = rec.name.split(":", 1)[0]  # optimizer state is named `param:key`
    return "receiver" if fed is None or _is_replica(base, fed) else "origin"


def collective_fed_params(path: Path) -> set[str] | None:
    """Names of the parameters whose gradients a collective produced (DDP's replicas) and of the buffers DDP
    broadcasts; None (all of them) when the script all-reduces tensors itself; empty when no collective
    touched them."""
    events = _events(path)
    if any(e.get("type") == "collective" and e.get("what") in ("all_reduce", "reduce_scatter", "reduce_scatter_tensor")
           for e in events):
        return None
    return {str(n) for e in events if e.get("type") == "ddp" for n in [*e.get("params", []), *e.get("buffers", [])]}


def _is_replica(name: str, replicas: set[str]) -> bool:
    """A parameter record's name against DDP's names (`module.fc.weight`); the inner model may have
    been named first (called before wrapping), so `fc.weight` matches too."""
    return name in replicas or f"module.{name}" in replicas


def earliest(summaries: Sequence[RankSummary]) -> RankSummary | None:
    """The earliest origin by (step, rank); the earliest receiver when there is no origin."""
    def key(s: RankSummary) -> tuple[float, int]:
        rec = s.first_divergence.record if s.first_divergence is not None else None
        step = rec.step if rec is not None and rec.step >= 0 else float("inf")
        return (step, s.rank)

    for role in ("origin", "receiver"):
        found = [s for s in summaries if s.role == role]
        if found:
            return min(found, key=key)
    return None


def replica_check(homes: Sequence[dict[int, Path]], results: Sequence[RepeatResult],
                  ranks: Sequence[int]) -> ReplicaDivergence | None:
    """Compare DDP's replicated parameters across ranks after each optimizer step, repeat by repeat.

    Within one repeat, so it catches ranks that drift apart identically in every repeat. Only
    parameters a `ddp` event names are compared: FSDP shards and tensor-parallel slices differ by design.
    `homes`: per repeat, the run directory (node) holding each rank's files.
    """
    found: list[tuple[int, int, ReplicaDivergence]] = []
    for r, places in zip(results, homes):
        paths = {rank: places[rank] / Layout.rank_file(r.trace, rank) for rank in ranks}
        hit = _replicas_differ({rank: p for rank, p in paths.items() if p.is_file()})
        if hit is not None:
            found.append((hit.step, r.index, hit))
    if not found:
        return None
    found.sort(key=lambda f: (f[0], f[1]))
    first = found[0][2]
    repeats = sorted(i for step, i, hit in found if (step, hit.name) == (first.step, first.name))
    return replace(first, repeats=repeats)


def _replicas_differ(paths: dict[int, Path]) -> ReplicaDivergence | None:
    if len(paths) < 2:
        return None
    params = {rank: _parameters(path) for rank, path in paths.items()}
    return differing_replica({rank: table for rank, (_, table) in params.items()},
                             {n for names, _ in params.values() for n in names})


# a rank's parameter records: (step, name) -> (digest, samples)
ParamTable = dict[tuple[int, str], tuple[int, np.ndarray]]


def differing_replica(tables: dict[int, ParamTable], replicas: set[str]) -> ReplicaDivergence | None:
    """The first DDP-replicated parameter record (by step, then name) on which a rank differs from the lowest
    rank; `replicas`: the names the ranks' `ddp` events list. Also `watch`'s live check (audit/watch_replicas.py)."""
    if len(tables) < 2 or not replicas:
        return None
    reference = min(tables)
    ref_table = tables[reference]
    for key in sorted(k for k in ref_table if _is_replica(k[1], replicas)):
        digest, samples = ref_table[key]
        differing = [rank for rank in sorted(tables) if rank != reference and key in tables[rank]
                     and tables[rank][key][0] != digest]
        if differing:
            diffs = [float(gaps(samples, tables[rank][key][1]).max()) for rank in differing]
            return ReplicaDivergence(step=key[0], name=key[1], ranks=differing, reference=reference,
                                     max_abs_diff=max(diffs), repeats=[])
    return None


def replica_names(events: Sequence[dict[str, Any]]) -> set[str]:
    """The parameter names DDP keeps identical on every rank, from a rank's `ddp` events."""
    return {str(n) for e in events if isinstance(e, dict) and e.get("type") == "ddp" for n in e.get("params", [])}


def parameter_rows(records: np.ndarray, strings: Sequence[str]) -> ParamTable:
    """A chunk's parameter records by (step, name)."""
    return {(int(row["step"]), strings[int(row["name"])]): (int(row["digest"]),
                                                            np.asarray(row["samples"], dtype=np.float64))
            for row in records[records["kind"] == Kind.PARAM]}


def _parameters(path: Path) -> tuple[set[str], ParamTable]:
    """A rank's DDP parameter names (its `ddp` events) and its parameter records by (step, name),
    streamed: only parameter records are kept, however long the trace."""
    stream = RecordStream(path)
    table: ParamTable = {}
    for chunk in stream.chunks():
        stream.check_strings(chunk)
        table.update(parameter_rows(chunk, stream.strings))
    stream.drain()
    return replica_names(stream.events), table


def teardown_crash(run_dir: Path, result: RepeatResult, layout: Layout) -> TeardownCrash | None:
    """A repeat that failed although every rank finished its script with status 0 and closed its trace."""
    if result.timed_out or result.exit_code in (0, None):
        return None
    for rank in layout.ranks(run_dir, result):
        footer = _footer(run_dir / Layout.rank_file(result.trace, rank))
        if footer is None or footer.get("exit_code") != 0:
            return None
    failed, signal = [], None
    for rank, code in root_cause(stderr_tail(run_dir / result.stderr)):
        failed.append(rank)
        if code < 0:
            signal = _SIGNALS.get(-code, f"signal {-code}")
    return TeardownCrash(result.index, result.exit_code, sorted(set(failed)), signal)


def _footer(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    stream = RecordStream(path)
    stream.drain()
    return stream.footer if isinstance(stream.footer, dict) else None


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    stream = RecordStream(path)
    stream.drain()
    return [e for e in stream.events if isinstance(e, dict)]


def _digest(path: Path) -> str:
    try:
        return sha256_regular(path, "stdout capture")[:16]
    except (OSError, TraceError):
        return ""


def _stderr_excerpt(run_dir: Path, result: RepeatResult, layout: Layout) -> str:
    """A failed repeat's error: the failing rank's exception (its footer), else torchrun's stderr."""
    text = stderr_tail(run_dir / result.stderr)
    return excerpt(result.error or rank_error(run_dir, result, layout, text), text)
