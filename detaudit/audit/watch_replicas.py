"""`detaudit watch --nproc-per-node N`: the DDP replicas compared across ranks while the job runs.

Every rank's trace is followed as it is written (trace.GrowingTrace); a step's parameter records are compared
across ranks (audit/ranks.py's replica check, on the names DDP keeps identical) once every rank has recorded
past that step, and dropped then, so memory stays bounded however long the job runs. The comparison is the
watching parent's: the job computes nothing for it, so every step is compared, not only the replayed ones.
"""

from __future__ import annotations

import os
from pathlib import Path

from detaudit.audit.ranks import ParamTable, differing_replica, parameter_rows, replica_names
from detaudit.errors import TraceError
from detaudit.report.model import ReplicaDivergence
from detaudit.trace import EmptyTrace, GrowingTrace


class ReplicaWatch:
    """Follows each rank's trace; `found` is the first replica difference, once seen."""

    def __init__(self, traces: dict[int, Path]) -> None:
        self.paths = traces
        self.traces: dict[int, GrowingTrace] = {}
        self.tables: dict[int, ParamTable] = {rank: {} for rank in traces}
        self.reached: dict[int, int] = {rank: -1 for rank in traces}  # the highest step each rank recorded
        self.names: set[str] = set()
        self.events_read: dict[int, int] = {rank: 0 for rank in traces}  # a rank's events already looked at
        self.found: ReplicaDivergence | None = None
        self.agrees_to: int | None = None  # the last step compared and found equal on every rank
        self.broken = False  # a trace could not be read: followed no further (the job runs on)

    def poll(self, final: bool = False) -> ReplicaDivergence | None:
        """Read what every rank wrote whole since the last poll and compare the steps all of them finished
        (`final`: the job ended, every step left is compared)."""
        if self.found is not None or self.broken:
            return self.found
        try:
            for rank in self.paths:
                self._read(rank)
        except (TraceError, OSError, ValueError):
            self.broken = True
            return None
        done = None if final else min(self.reached.values())
        ready = {rank: {k: v for k, v in table.items() if done is None or k[0] < done}
                 for rank, table in self.tables.items()}
        self.found = differing_replica(ready, self.names)
        compared = [key[0] for table in ready.values() for key in table]
        if self.found is None and compared:
            self.agrees_to = max(compared)
        for table in self.tables.values():  # compared: dropped
            for key in [k for k in table if done is None or k[0] < done]:
                del table[key]
        return self.found

    def step_ended(self, rank: int, step: int) -> None:
        """The rank said (its events file) that `step` ended: its records of it are all in its trace, and the
        step can be compared before the rank records the next one (a torch.save may be waiting for it)."""
        self.reached[rank] = max(self.reached[rank], step + 1)

    def _read(self, rank: int) -> None:
        trace = self.traces.get(rank)
        if trace is None:
            if not os.path.lexists(self.paths[rank]):
                return
            try:
                trace = self.traces[rank] = GrowingTrace(self.paths[rank])
            except EmptyTrace:
                return
        records = trace.poll()
        if len(records):
            self.reached[rank] = max(self.reached[rank], int(records["step"].max()))
            self.tables[rank].update(parameter_rows(records, trace.strings))
        if trace.footer is not None:
            self.reached[rank] = max(self.reached[rank], 1 << 62)  # ended: no step of it is still to come
        self.names |= replica_names(trace.events[self.events_read[rank]:])
        self.events_read[rank] = len(trace.events)

    def close(self) -> None:
        for trace in self.traces.values():
            trace.close()
