"""A side's recording from its torchrun ranks' traces. Across world sizes with the same global batch, what every
rank holds alike is compared (gradients after averaging, parameters, optimizer state, saved values: rank 0's);
what each rank computes on its own shard (module outputs, inputs, buffers) is compared rank by rank only when
both sides run the same world size: otherwise the sample sets differ, and the records are set aside, never
judged as drift."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from detaudit.compare.identity import Identity, Value, read_recording
from detaudit.drift.drift_report import NotComparable, RankDisagreement
from detaudit.results import RepeatResult
from detaudit.run.distributed import Layout

# the same on every rank of a data-parallel job once the gradients are averaged
SHARED_KINDS = frozenset({"grad", "param", "optstate", "save", "checkpoint"})
OTHER_SAMPLES = "different sample sets per rank"
SHOWN_DISAGREEMENTS = 10  # per side


def rank_traces(run_dir: Path, result: RepeatResult, nproc: int | None) -> list[Path]:
    """A repeat's traces, rank 0's first (one process: its one trace)."""
    if not nproc:
        return [run_dir / result.trace]
    return [run_dir / Layout.rank_file(result.trace, rank) for rank in range(nproc)]


@dataclass(frozen=True)
class SideView:
    """One repeat's records as judged: rank 0's shared records, and the per-rank ones kept (`set_aside`: how many
    per-rank records of each kind were left out); `disagreements`: shared records a rank holds otherwise."""

    recording: dict[Identity, Value]
    set_aside: dict[str, int]
    disagreements: list[tuple[int, Identity]]


def side_view(traces: Sequence[Path], per_rank: bool) -> SideView:
    """The records of one repeat's ranks (`traces`, rank 0's first); `per_rank`: the other side runs as many
    ranks, so per-rank records are compared rank by rank (each keeps its rank in its identity)."""
    ranks = [read_recording(p) for p in traces]
    recording: dict[Identity, Value] = {}
    set_aside: dict[str, int] = {}
    disagreements = []
    for rank, records in enumerate(ranks):
        for identity, value in records.items():
            if identity.kind in SHARED_KINDS:
                if rank == 0:
                    recording[identity] = value
                elif identity in ranks[0] and ranks[0][identity].digest != value.digest:
                    disagreements.append((rank, identity))
            elif per_rank:
                ranked = replace(identity, rank=rank)
                recording[ranked] = replace(value, identity=ranked)
            else:
                set_aside[identity.kind] = set_aside.get(identity.kind, 0) + 1
    return SideView(recording, set_aside, disagreements)


def not_comparable(a: SideView, b: SideView) -> list[NotComparable]:
    """The kinds set aside on either side, with how many records each side had of them."""
    kinds = sorted(set(a.set_aside) | set(b.set_aside))
    return [NotComparable(k, a.set_aside.get(k, 0), b.set_aside.get(k, 0), OTHER_SAMPLES) for k in kinds]


def disagreements(a: SideView, b: SideView) -> list[RankDisagreement]:
    """The first shared records each side's ranks disagree on."""
    sides: tuple[tuple[Literal["a", "b"], SideView], ...] = (("a", a), ("b", b))
    return [RankDisagreement(side, rank, i.step, i.kind, i.name)
            for side, view in sides for rank, i in view.disagreements[:SHOWN_DISAGREEMENTS]]
