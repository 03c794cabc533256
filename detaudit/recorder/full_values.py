"""Keeping every element of a few chosen records (`detaudit drift`'s re-recording, docs/drift.md): the child's
config names them (`full_values`: the side file and the records' identities), and a KeepingRecorder, installed
instead of the plain Recorder only then, copies each one's elements into the side file (trace/values.py) as it
records it. A run that keeps nothing runs the plain Recorder: the per-tensor path costs nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from detaudit.recorder.boundary import HostGroup
from detaudit.recorder.core import Recorder
from detaudit.trace import Kind, TraceWriter
from detaudit.trace.values import CAP_BYTES, ValuesKey, ValuesWriter, values_path

_NAMES = {k.name.lower(): k for k in Kind if k != Kind.OP}  # op records are named by position: never kept


class Keeper:
    """Which records to keep (their identities; this process's rank), how many of each name were seen this step
    (a record's occurrence), and the side file they go to."""

    def __init__(self, writer: ValuesWriter, keys: Iterable[ValuesKey], rank: int) -> None:
        self.writer = writer
        self.wanted = {k for k in keys if k.rank == rank and k.kind in _NAMES}
        self.steps = frozenset(k.step for k in self.wanted)
        self.names = {(k.step, int(_NAMES[k.kind]), k.name) for k in self.wanted}
        self.rank = rank
        self._seen: dict[tuple[int, int, str], int] = {}

    def offer(self, step: int, kind: int, name: str, t: torch.Tensor) -> None:
        """Called for each tensor recorded at a step with a wanted record: keep it if it is one."""
        place = (step, int(kind), name)
        if place not in self.names:
            return
        occurrence = self._seen.get(place, 0)
        self._seen[place] = occurrence + 1
        key = ValuesKey(step, Kind(kind).name.lower(), name, occurrence, self.rank)
        if key in self.wanted:
            self.writer.add(key, str(t.dtype).removeprefix("torch."), list(t.shape), *elements(t))


def elements(t: torch.Tensor) -> tuple[bytes | None, str | None]:
    """A tensor's elements as raw little-endian bytes in C order, or why it has none to keep."""
    if t.layout != torch.strided or t.is_nested or t.is_quantized or t.device.type == "meta":
        return None, "a tensor without plain elements (sparse, nested, quantized or meta)"
    with torch.no_grad():
        host = t.detach().resolve_conj().resolve_neg().to("cpu").contiguous()
    if host.dtype.is_complex:
        return None, "a complex tensor: no single size of difference"
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[host.element_size()]
    return host.view(width).numpy().tobytes(), None


class KeepingRecorder(Recorder):
    """A Recorder that also keeps the chosen records' elements (Keeper): every tensor of a kept step goes through
    `record_tensor`, the optimizer boundary's too (one by one, as `record_group` records them when the op recorder
    needs their digests at once: the same records)."""

    def __init__(self, writer: TraceWriter, keeper: Keeper) -> None:
        super().__init__(writer)
        self.keeper = keeper

    def record_tensor(self, kind: Kind, name: int, t: torch.Tensor, module: int = 0, loc: int = 0,
                      aux: int = 0, flags: int = 0, inputs: tuple[int, int] = (0, 0)) -> int:
        if self.step in self.keeper.steps and not self.local.flag:
            self.internal += 1  # the copy is detaudit's own work: the op recorder must not add it
            try:
                self.keeper.offer(self.step, kind, self.writer.text(name), t)
            finally:
                self.internal -= 1
        return super().record_tensor(kind, name, t, module, loc, aux, flags, inputs)

    def record_group(self, group: HostGroup, tensors: list[torch.Tensor], loc: int) -> None:
        if self.step not in self.keeper.steps:
            super().record_group(group, tensors, loc)
            return
        for kind, name, t in zip(group.kinds, group.names, tensors, strict=True):
            self.record_tensor(kind, name, t, 0, loc)

    def close(self, footer: dict[str, Any]) -> None:
        super().close(footer)
        self.keeper.writer.close()


def recorder_for(writer: TraceWriter, config: dict[str, Any], trace: Path) -> Recorder:
    """The child's recorder: a KeepingRecorder when its config names records to keep (`full_values`: a list of
    [step, kind, name, occurrence, rank]), writing beside `trace`; else the plain Recorder."""
    wanted: Sequence[Sequence[Any]] = config.get("full_values") or ()
    if not wanted:
        return Recorder(writer)
    keys = [ValuesKey(int(s), str(k), str(n), int(o), int(r)) for s, k, n, o, r in wanted]
    rank = int((config.get("distributed") or {}).get("rank", 0))
    cap = int(config.get("full_values_cap", CAP_BYTES))
    return KeepingRecorder(writer, Keeper(ValuesWriter(values_path(trace), cap), keys, rank))
