"""`detaudit batch`'s origin search: where a difference between a subset's rows and the whole batch's starts.

The subset's run and the whole batch's are watched call by call (recorder/batchprobe.py runs them); `Search`
keeps the subset's calls, pairs the whole batch's with them and names the first module and the first op whose
rows differ while their inputs' rows agree, among what reaches the module's output (`Flow`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from detaudit.batch_events import BatchSpot, SubsetKind
from detaudit.events import BatchOriginEvent
from detaudit.recorder.batchknob import batch_invariant_knob
from detaudit.recorder.batchrows import RowDiff, Rows, compare_values, rebuild, tensors

CAPTURE_LIMIT = 200_000  # op calls watched in one origin search (each subset op keeps its tensors)
CANDIDATES = 1_000  # differing calls (inputs' rows agreeing) kept per kind in one origin search


class Flow:
    """Which watched ops' results reach the module's output: each op linked to the ops that made its inputs.

    A value the forward keeps aside (`self.last_mean = x.mean()` for logging) differs between batches by
    construction, but is no part of any row's result: the first difference is looked for among what
    reaches the output. A value turned into a Python number (`.item()`, a comparison's bool) may reach the
    output unseen, so what made it counts as reaching. Tensors are told apart by identity; a tensor's entry
    goes when it is freed (before its id can be reused), so the search holds no activation alive."""

    def __init__(self) -> None:
        self.producer: dict[int, int] = {}  # id(tensor) -> the op that made (or last wrote) it
        self.sources: list[set[int]] = []  # op -> the ops that made its inputs
        self.escaped: set[int] = set()  # ops whose result left the tensors (a Python number)
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}

    def op(self, inputs: Any, out: Any) -> None:
        index = len(self.sources)
        self.sources.append(self.made(inputs))
        made = tensors(out)
        if not made and out is not None:
            self.escaped.add(index)
        for t in made:
            key = id(t)
            self.producer[key] = index
            self._refs[key] = weakref.ref(t, lambda _, key=key: self._forget(key))  # type: ignore[misc]

    def _forget(self, key: int) -> None:
        self.producer.pop(key, None)
        self._refs.pop(key, None)

    @property
    def last(self) -> int:
        return len(self.sources) - 1

    def made(self, value: Any) -> set[int]:
        """The ops that made the tensors in `value` (none for an input or a parameter)."""
        return {self.producer[id(t)] for t in tensors(value) if id(t) in self.producer}

    def reaching(self, output: Any) -> set[int]:
        """The ops whose results the module's output was, or may have been, computed from."""
        seen, todo = set(), [*self.made(output), *self.escaped]
        while todo:
            index = todo.pop()
            if index not in seen:
                seen.add(index)
                todo.extend(self.sources[index] - seen)
        return seen


@dataclass
class Seen:
    """One watched call of the subset run: its inputs and outputs (clones) and where it ran."""

    kind: str
    name: str
    module: str
    loc: str
    inputs: Any
    outputs: Any
    cls: str = ""


# ops that only move or alias elements: they never round, so a path the batch changes is named by an op that computes
MOVES = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.clone", "aten.contiguous", "aten.copy_",
                   "aten.transpose", "aten.t", "aten.permute", "aten.expand", "aten.squeeze", "aten.unsqueeze",
                   "aten.select", "aten.slice", "aten.alias", "aten.detach", "aten.as_strided", "aten.unflatten"})


def layout(inputs: Any, sizes: tuple[int, int]) -> tuple[tuple[int, str, int], ...]:
    """What an op's inputs are apart from the batch: each tensor's dims, dtype and last dim (-1 where it is either
    run's number of rows, `sizes`, on both sides alike: a sequence as long as the batch stays paired). Ops are
    paired by it, so that a path one size takes (nn.Linear on a transposed input:
    `aten.clone`, `aten.mm` and `aten.add` for 6 rows, `aten.view` and `aten.addmm` for 1) shifts no later op's
    partner: the whole batch's next `aten.view` meets the subset's `aten.view` of the same kind of input."""
    return tuple((t.dim(), str(t.dtype), -1 if t.dim() == 0 or t.shape[-1] in sizes else int(t.shape[-1]))
                 for t in tensors(inputs))


def _spot(name: str, mod: str, loc: str, cls: str, diff: RowDiff) -> BatchSpot:
    return BatchSpot(name=name, module=mod, loc=loc, cls=cls, max_abs_diff=diff.max_abs, max_ulp=diff.max_ulp,
                     scale=diff.scale, dtype=diff.dtype, across_rows=diff.whole_differs,
                     shape_changed=diff.shape_differs)


class Search:
    """One origin search: the subset run's calls kept (`keep`), the whole batch's paired with them and compared
    (`compare`, after `pair`), and what was found (`event`).

    Calls are paired by (kind, innermost module, name, inputs' layout apart from the batch, occurrence): a path
    that changes with the batch (a fused kernel taken for one size only) leaves some unpaired, which the note
    counts, and the rest still pair up. Where a paired op's inputs differ only through such unpaired ops, computed
    from results that agree, the changed path is where the rows start to differ (`_changed_path`)."""

    def __init__(self, n: int, variant: tuple[SubsetKind, Rows, Any], d: int,
                 copy: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.n, self.kind, self.rows, self.d = n, variant[0], variant[1], d
        self.copy = copy  # how a watched tensor is kept
        self.seen: dict[tuple[Any, ...], Seen] = {}
        self.counts: dict[tuple[Any, ...], int] = {}
        self.found: dict[str, list[tuple[BatchSpot, set[int]]]] = {"module": [], "op": []}
        self.unpaired: dict[str, list[str]] = {"module": [], "op": []}
        self.flow = Flow()
        self.agreed: set[int] = set()  # the whole batch's ops whose results agree with their partners'
        self.alone: dict[int, tuple[str, str, str]] = {}  # its ops with no partner: name, module, `file:line`

    def _key(self, kind: str, mod: str, what: str, ins: Any) -> tuple[Any, ...]:
        base = (kind, mod, what, layout(ins, (self.n, self.rows.size)) if kind == "op" else ())
        self.counts[base] = self.counts.get(base, 0) + 1
        return (*base, self.counts[base] - 1)

    def keep(self, kind: str, what: str, mod: str, loc: str, ins: Any, outs: Any, cls: str = "") -> None:
        """A call of the subset's run."""
        self.seen[self._key(kind, mod, what, ins)] = Seen(
            kind, what, mod, loc, rebuild(ins, self.copy), rebuild(outs, self.copy), cls)

    def pair(self) -> None:
        """The whole batch's run starts: its calls' occurrences are counted afresh."""
        self.counts.clear()

    def compare(self, kind: str, what: str, mod: str, loc: str, ins: Any, outs: Any, cls: str = "") -> None:
        """A call of the whole batch's run, against its partner in the subset's."""
        partner = self.seen.get(self._key(kind, mod, what, ins))
        found = self.found[kind]
        if partner is None:
            if not found:  # counted up to the first difference
                self.unpaired[kind].append(f"{what}{f' in {mod}' if mod else ''}")
            if kind == "op":
                self.alone[self.flow.last] = (what, mod, loc)
            return
        if len(found) >= CANDIDATES:
            return
        given = compare_values(ins, partner.inputs, self.n, self.rows, self.d)
        if not given.agree:
            path = self._changed_path() if kind == "op" and not found else None
            if path:
                name, inside, where = next((self.alone[i] for i in path if self.alone[i][0] not in MOVES),
                                           self.alone[path[0]])
                found.append((_spot(name, inside, where, "", given), set(path)))
            return
        diff = compare_values(outs, partner.outputs, self.n, self.rows, self.d)
        if diff.agree and kind == "op":
            self.agreed.add(self.flow.last)
        elif not diff.agree:
            found.append((_spot(what, mod, loc, cls, diff), {self.flow.last} if kind == "op" else self.flow.made(outs)))

    def _changed_path(self) -> list[int]:
        """The unpaired ops (a path the batch changed) the current op's inputs came through, in order, when
        everything they and it were computed from otherwise agrees: its inputs differ because of that path. Empty
        when an input comes from a paired op whose result differs, or through no unpaired op."""
        path: set[int] = set()
        todo = list(self.flow.sources[self.flow.last])
        while todo:
            index = todo.pop()
            if index in self.agreed or index in path:
                continue
            if index not in self.alone:
                return []
            path.add(index)
            todo.extend(self.flow.sources[index])
        return sorted(path)

    def event(self, name: str, call: int, calls: int, output: Any) -> BatchOriginEvent:
        """The first module (in the order calls end) and the first op whose rows differ while their inputs' rows
        agree, given the whole batch's `output` and how many ops its run made."""
        reach = self.flow.reaching(output)
        first: dict[str, BatchSpot] = {}
        aside: list[BatchSpot] = []
        for kind, spots in self.found.items():
            reaching = [spot for spot, made in spots if made & reach]
            if spots:  # none reaching: the output got it through a value the flow cannot follow (`.item()`)
                first[kind] = (reaching or [spot for spot, _ in spots])[0]
            if kind == "op" and reaching:
                aside = [spot for spot, made in spots if not made & reach]
        notes = [f"{len(missing)} {kind}{'s' if len(missing) > 1 else ''} of the whole batch ran with no "
                 f"counterpart in the {self.rows.size}-row run, first {missing[0]}: the batch changes the path "
                 "taken there" for kind, missing in self.unpaired.items() if missing]
        if aside:
            many = len(aside) > 1
            notes.append(f"{len(aside)} op{'s' if many else ''} whose result{'s' if many else ''} never "
                         f"reach{'' if many else 'es'} the output differ{'' if many else 's'} too, first "
                         f"{aside[0]['name']} at {aside[0]['loc']} (a value kept aside, such as a statistic for "
                         "logging): not where the rows' difference starts")
        if calls > CAPTURE_LIMIT:
            notes.append(f"only the first {CAPTURE_LIMIT} of {calls} ops were watched")
        return BatchOriginEvent(type="batch-origin", module=name, call=call, subset=self.kind, size=self.rows.size,
                                first_module=first.get("module"), first_op=first.get("op"),
                                note="; ".join(notes) or None, knob=batch_invariant_knob())
