"""The optimizer step boundary on the host: what is recorded at every step, planned once per run.

Each optimizer step records the same tensors again, in the same order and under the same names: a model's
gradients (made anew by each backward), then its parameters and their optimizer state (the same tensors, updated
in place). Done one tensor at a time, the Python around each small tensor's hash (name and shape lookups, cache
checks, a row tuple, a struct call) cost more than the hash.

`StepLayout` (one per optimizer, in the hooks) keeps the record order and the names, and checks each step that the
optimizer still holds the same parameters and state tensors by identity, in a few C-level passes over flat lists.
`HostGroup` (one per recorded list) keeps, per position, what does not depend on the contents: the dtype/shape
seed, the sample layout, the record's fixed fields as a numpy row, and for tensors that keep their storage the
ctypes view of their bytes. Each step it checks the tensors against its plan, one C-level pass per property over
the whole list (data pointer, shape, contiguity, dtype, negative bit; device, layout and nesting too for tensors
made anew), hashes them with `map` over xxh3, reads their samples with one struct call each, and fills the
step's records as one numpy block. A list that no longer matches is planned again; a tensor the plan cannot read
in place (empty, complex, non-contiguous, negative view, sparse, nested, quantized) is fingerprinted by
`fingerprint_cpu` each step. Digests and samples are exactly `fingerprint_cpu`'s.
"""

from __future__ import annotations

import ctypes
import itertools
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import xxhash

from detaudit.recorder.fingerprint import fingerprint_cpu, meta_seed, sample_layout, shape_seed
from detaudit.trace import N_SAMPLES, RECORD_DTYPE, Flag, Kind

_Tensor = torch.Tensor
_PTR, _CONTIGUOUS, _NEG = _Tensor.data_ptr, _Tensor.is_contiguous, _Tensor.is_neg
_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")
_CPU, _LAYOUT, _NESTED = operator.attrgetter("is_cpu"), operator.attrgetter("layout"), operator.attrgetter("is_nested")
_GRAD = operator.attrgetter("grad")
_call, _is, _is_not = operator.call, operator.is_, operator.is_not
_NONE, _STRIDED, _TENSOR = itertools.repeat(None), itertools.repeat(torch.strided), itertools.repeat(torch.Tensor)
_NAN = float("nan")
_NO_DATA = int(Flag.NO_DATA)


def _no_samples(buf: Any) -> tuple[Any, ...]:
    return ()


def _in_place(t: torch.Tensor) -> bool:
    """A plan reads the tensor's bytes where they are (else `fingerprint_cpu` reads it, each step)."""
    return (t.layout == torch.strided and not t.is_nested and not t.is_quantized and not t.is_complex()
            and t.is_contiguous() and not t.is_neg() and t.numel() > 0 and t.data_ptr() != 0)


class HostGroup:
    """One list of host tensors recorded together at every optimizer step, with their kinds and name ids (fixed),
    and the plan that hashes them (made on the first step, and again whenever the tensors stop matching it).

    `fresh`: the tensors are new objects each step (gradients): their views are made each step from their data
    pointers, and device, layout and nesting are checked too. Otherwise the group holds the tensors it last
    recorded (parameters and optimizer state, which their optimizer holds anyway) and requires the same objects."""

    def __init__(self, kinds: Sequence[Kind], names: Sequence[int], fresh: bool) -> None:
        self.kinds, self.names, self.fresh = list(kinds), list(names), fresh
        self._planned = False
        self.host = False  # every tensor was on the CPU when planned (else the caller takes another path)
        self._held: list[torch.Tensor] = []
        # the positions hashed in place (None: all of them), and what their plan depends on
        self._fast: list[int] | None = None
        self._ptrs: list[int] = []  # their data pointers (fresh: this step's)
        self._shapes: list[Any] = []
        self._dtypes: list[torch.dtype] = []
        self._at: list[Callable[[int], Any]] = []  # per fast position: its ctypes view at an address
        self._views: list[Any] = []
        self._seeds: list[int] = []
        self._unpack: list[Callable[[Any], tuple[Any, ...]]] = []
        self._slow: list[int] = []  # positions fingerprinted by fingerprint_cpu
        self._count = 0  # sample values the unpacks return in all (then one NaN)
        self._gather = np.zeros((0, N_SAMPLES), np.intp)
        self._widen = np.zeros(0, np.intp)  # positions in the flat values holding bfloat16 bits
        self._template = b""  # the step's records but for step, loc, digests and samples (RECORD_DTYPE rows)

    def rows(self, tensors: list[torch.Tensor], describe: Callable[[torch.Tensor], tuple[int, int]], step: int,
             loc: int) -> np.ndarray | None:
        """The step's records of `tensors` (one per name, in order), or None when one of them is not on the CPU.
        `describe`: a tensor's (shape string id, dtype code), asked when a plan is made (and at each step for
        the tensors fingerprint_cpu reads)."""
        if not self._matches(tensors):
            self._plan(tensors, describe)
            if not self.host:
                return None
        views = list(map(_call, self._at, self._ptrs)) if self.fresh else self._views
        out = np.frombuffer(bytearray(self._template), RECORD_DTYPE)  # a copy (ndarray.copy of this dtype is slow)
        out["step"], out["loc"] = step, loc
        digests = list(map(xxhash.xxh3_64_intdigest, views, self._seeds))
        values = np.fromiter(itertools.chain(itertools.chain.from_iterable(map(_call, self._unpack, views)), (_NAN,)),
                             np.float64, self._count + 1)
        if len(self._widen):  # bfloat16 bits to floats (signalling NaNs are quieted, as struct does: no warning)
            with np.errstate(invalid="ignore"):
                values[self._widen] = (values[self._widen].astype(np.uint32) << 16).view(np.float32)
        out["samples"] = values[self._gather]
        if self._fast is None:
            out["digest"] = digests
            return out
        out["digest"][self._fast] = digests
        for i in self._slow:
            t = tensors[i]
            try:
                digest, samples = fingerprint_cpu(t)
            except (RuntimeError, NotImplementedError, TypeError):  # unreadable: dtype and shape only
                digest, samples = shape_seed(t), (_NAN,) * N_SAMPLES
                out["flags"][i] = _NO_DATA
            out["shape"][i], out["dtype"][i] = describe(t)  # may change from step to step (not checked)
            out["digest"][i], out["samples"][i] = digest, samples
        return out

    def _matches(self, tensors: list[torch.Tensor]) -> bool:
        """The plan holds for `tensors`: each property it depends on, compared in one pass per property."""
        if not self._planned or len(tensors) != len(self.names):
            return False
        if not self.fresh and not all(map(_is, tensors, self._held)):
            return False
        if self._fast is None:
            fast = tensors
        else:
            fast = list(map(tensors.__getitem__, self._fast))
            if any(not t.is_cpu or _in_place(t) for t in map(tensors.__getitem__, self._slow)):
                return False  # on another device, or now readable in place: planned again
        try:
            if self.fresh:
                if not all(map(_CPU, fast)) or not all(map(_is, map(_LAYOUT, fast), _STRIDED)) \
                        or any(map(_NESTED, fast)):
                    return False
                ptrs = list(map(_PTR, fast))
                if 0 in ptrs:  # a storage freed under its tensor: planned again (fingerprint_cpu reads it unread)
                    return False
                self._ptrs = ptrs  # where this step's tensors are
            elif list(map(_PTR, fast)) != self._ptrs:
                return False
            return (list(map(_SHAPE, fast)) == self._shapes and list(map(_DTYPE, fast)) == self._dtypes
                    and all(map(_CONTIGUOUS, fast)) and not any(map(_NEG, fast)))
        except (RuntimeError, NotImplementedError, TypeError):  # a property a layout does not have (nested sizes)
            return False

    def _plan(self, tensors: list[torch.Tensor], describe: Callable[[torch.Tensor], tuple[int, int]]) -> None:
        if len(tensors) != len(self.names):
            raise ValueError(f"{len(tensors)} tensors for {len(self.names)} names")
        self._planned = False
        self.host = all(t.is_cpu for t in tensors)
        if not self.host:
            return
        n = len(tensors)
        template = np.zeros(n, RECORD_DTYPE)
        template["kind"], template["name"] = self.kinds, self.names
        fast_at: list[int] = []
        at: list[Callable[[int], Any]] = []
        seeds: list[int] = []
        unpacks: list[Callable[[Any], tuple[Any, ...]]] = []
        slow: list[int] = []
        widen: list[int] = []
        gather = np.empty((n, N_SAMPLES), np.intp)
        nan: list[int] = []  # positions whose samples are the trailing NaN
        count = 0
        for i, t in enumerate(tensors):
            template["shape"][i], template["dtype"][i] = describe(t)
            if not _in_place(t):
                slow.append(i)
                nan.append(i)
                continue
            fast_at.append(i)
            at.append((ctypes.c_char * t.nbytes).from_address)
            seeds.append(meta_seed(t.dtype, t.shape))
            unpack, index, bf16 = sample_layout(t.dtype, t.numel())
            if unpack is None:
                unpacks.append(_no_samples)
                nan.append(i)
                continue
            unpacks.append(unpack)
            gather[i] = [count + k for k in index]
            distinct = max(index) + 1
            if bf16:
                widen.extend(range(count, count + distinct))
            count += distinct
        gather[nan] = count
        fast = [tensors[i] for i in fast_at]
        self._fast = None if not slow else fast_at
        self._at, self._seeds, self._unpack, self._slow = at, seeds, unpacks, slow
        self._count, self._gather, self._widen = count, gather, np.array(widen, np.intp)
        self._template = template.tobytes()
        self._shapes, self._dtypes = list(map(_SHAPE, fast)), list(map(_DTYPE, fast))
        self._ptrs = list(map(_PTR, fast))
        if self.fresh:
            self._held, self._views = [], []
        else:
            self._held = list(tensors)
            self._views = list(map(_call, at, self._ptrs))
        self._planned = True


class StepLayout:
    """What the hooks record at one optimizer's steps, in record order, with its name ids: gradients (one per
    parameter that has one), then each parameter followed by its state tensors. Made once per run and checked at
    each step: the same parameter objects in the same groups (`matches`), the same state mapping, state dicts,
    keys and state tensors (`after_step`); a new parameter, group or state tensor, or new names (`epoch`), make
    a new layout or state plan."""

    def __init__(self, optimizer: torch.optim.Optimizer, epoch: int,
                 param_name: Callable[[torch.Tensor, int, int], int],
                 on_dead: Callable[[weakref.ref[torch.optim.Optimizer]], None]) -> None:
        self.optimizer = weakref.ref(optimizer, on_dead)
        self.epoch = epoch
        groups = optimizer.param_groups
        self.params: list[torch.Tensor] = [p for g in groups for p in g["params"]]
        self._sizes = [len(g["params"]) for g in groups]
        self.names = [param_name(p, gi, pi) for gi, g in enumerate(groups) for pi, p in enumerate(g["params"])]
        self.ids = set(map(id, self.params))
        self._grads = HostGroup([Kind.GRAD] * len(self.names), self.names, fresh=True)
        self._some: tuple[list[bool], HostGroup] | None = None  # when some parameters have no gradient
        self._after: HostGroup | None = None
        self._recorded: list[torch.Tensor] = []  # after the step, in record order
        self._check: _StateCheck | None = None

    def matches(self, optimizer: torch.optim.Optimizer, epoch: int) -> bool:
        groups = optimizer.param_groups
        params = [p for g in groups for p in g["params"]]
        return (epoch == self.epoch and len(params) == len(self.params) and all(map(_is, params, self.params))
                and [len(g["params"]) for g in groups] == self._sizes)

    def gradients(self) -> tuple[HostGroup, list[torch.Tensor]]:
        """The gradients to record before the step, and their group."""
        grads = list(map(_GRAD, self.params))
        present = list(map(_is_not, grads, _NONE))
        if all(present):
            return self._grads, grads
        if self._some is None or self._some[0] != present:
            self._some = (present, HostGroup([Kind.GRAD] * sum(present), list(itertools.compress(self.names, present)),
                                             fresh=True))
        return self._some[1], list(itertools.compress(grads, present))

    def after_step(self, state: Any, state_name: Callable[[int, str], int]) -> tuple[HostGroup, list[torch.Tensor]]:
        """The parameters and their state tensors to record after the step, in record order, and their group."""
        if self._after is not None and self._check is not None and self._check.holds(state):
            return self._after, self._recorded
        kinds: list[Kind] = []
        names: list[int] = []
        recorded: list[torch.Tensor] = []
        for name_id, p in zip(self.names, self.params, strict=True):
            recorded.append(p)
            kinds.append(Kind.PARAM)
            names.append(name_id)
            for key, value in state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    recorded.append(value)
                    kinds.append(Kind.OPTSTATE)
                    names.append(state_name(name_id, key))
        if self._after is None or self._after.kinds != kinds or self._after.names != names:
            self._after = HostGroup(kinds, names, fresh=False)
        self._recorded = recorded
        self._check = _StateCheck.of(state, self.params)
        return self._after, recorded


class _StateCheck:
    """The optimizer state a layout's records were taken from, as flat lists that one C-level pass each compares
    with the state at a later step: the mapping's keys and dicts (by identity), their keys in order, each state
    tensor (by identity, in record order: where it sits in the flattened values) and which values are no tensors."""

    def __init__(self, keys: list[Any], dicts: list[Any], flat_keys: list[Any], tensor_at: list[int],
                 tensors: list[torch.Tensor], other_at: list[int]) -> None:
        self.keys, self.dicts, self.flat_keys = keys, dicts, flat_keys
        self.tensor_at, self.tensors, self.other_at = tensor_at, tensors, other_at

    @classmethod
    def of(cls, state: Any, params: list[torch.Tensor]) -> _StateCheck | None:
        """None when the state is not a mapping of plain dicts with string keys (walked at every step instead)."""
        keys, dicts = list(state), list(state.values())
        if not all(type(d) is dict and all(type(k) is str for k in d) for d in dicts):
            return None
        start: dict[int, tuple[int, dict[Any, Any]]] = {}  # id(parameter) -> (where its dict's values start, dict)
        flat_keys: list[Any] = []
        other_at: list[int] = []
        for key, entry in zip(keys, dicts, strict=True):
            start[id(key)] = (len(flat_keys), entry)
            for k, v in entry.items():
                if not isinstance(v, torch.Tensor):
                    other_at.append(len(flat_keys))
                flat_keys.append(k)
        tensor_at: list[int] = []
        tensors: list[torch.Tensor] = []
        for p in params:
            found = start.get(id(p))
            if found is None:
                continue
            at, entry = found
            for offset, value in enumerate(entry.values()):
                if isinstance(value, torch.Tensor):
                    tensor_at.append(at + offset)
                    tensors.append(value)
        return cls(keys, dicts, flat_keys, tensor_at, tensors, other_at)

    def holds(self, state: Any) -> bool:
        keys, dicts = list(state), list(state.values())
        if len(keys) != len(self.keys) or not all(map(_is, keys, self.keys)) or not all(map(_is, dicts, self.dicts)):
            return False
        values = list(itertools.chain.from_iterable(map(dict.values, dicts)))
        return (list(itertools.chain.from_iterable(dicts)) == self.flat_keys
                and all(map(_is, map(values.__getitem__, self.tensor_at), self.tensors))
                and not any(map(isinstance, map(values.__getitem__, self.other_at), _TENSOR)))
