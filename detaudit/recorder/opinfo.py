"""What the op recorder (recorder/ops.py) knows about an aten op overload, worked out on its first call: how it
is treated (recorded, a view, never-written memory, passed through), whether it draws random numbers, and which
of its arguments it reads and writes (the tables below, for what schemas do not say); the tensors in an op's
argument or result."""

from __future__ import annotations

from typing import Any

import torch
import xxhash

from detaudit.recorder.core import Recorder
from detaudit.recorder.scratch import is_scratch_argument, scratch_outputs
from detaudit.trace import Flag

PASS, VIEW, UNINIT, RECORD = range(4)

# Ops that draw from an RNG. Most carry torch.Tag.nondeterministic_seeded; these names cover
# the ones that do not (and older releases).
RANDOM_OPS = frozenset({
    "bernoulli", "bernoulli_", "native_dropout", "dropout", "feature_dropout", "alpha_dropout",
    "feature_alpha_dropout", "_fused_dropout", "randperm", "normal", "normal_", "uniform_", "rand",
    "rand_like", "randn", "randn_like", "randint", "randint_like", "random_", "multinomial",
    "exponential_", "geometric_", "cauchy_", "log_normal_", "poisson", "binomial", "_standard_gamma",
    "_sample_dirichlet", "rrelu_with_noise", "rrelu_with_noise_",
})
# Ops whose first argument's contents are never read: it is overwritten, or only its shape,
# dtype and device are used. Its digest would only report leftover bytes.
SELF_BLIND_OPS = frozenset({
    "fill_", "zero_", "copy_", "bernoulli_", "uniform_", "normal_", "random_", "exponential_",
    "geometric_", "cauchy_", "log_normal_", "empty_like", "zeros_like", "ones_like", "full_like",
    "rand_like", "randn_like", "randint_like", "new_empty", "new_empty_strided", "new_zeros",
    "new_ones", "new_full", "resize_",
})
# c10d's schemas carry no alias annotations (`Tensor[] tensors`, not `Tensor(a!)[]`), so what each collective
# writes is listed here by argument name: its outputs, written without their old contents being read, and
# the tensors it reads and then overwrites in place. A broadcast writes its tensors on every rank but the
# root, which reads them (decided per call: `OpInfo.root`).
C10D_WRITE_ONLY = {
    "allgather_": "output_tensors", "_allgather_base_": "output_tensor", "allgather_coalesced_": "output_lists",
    "allgather_into_tensor_coalesced_": "outputs", "reduce_scatter_": "output_tensors",
    "_reduce_scatter_base_": "output_tensor", "reduce_scatter_tensor_coalesced_": "outputs",
    "alltoall_": "output_tensors", "alltoall_base_": "output", "scatter_": "output_tensors",
    "gather_": "output_tensors", "recv_": "tensors", "recv_any_source_": "tensors", "broadcast_": "tensors",
}
C10D_UNUSED = {"barrier": "tensor", "monitored_barrier_": "tensor"}  # a placeholder: neither read nor written
C10D_READ_WRITE = {"allreduce_": "tensors", "allreduce_coalesced_": "tensors", "reduce_": "tensors"}
UNINIT_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
PASS_NAMESPACES = frozenset({"profiler", "prim"})
# `t.set_(storage, ...)` points a tensor at existing memory: how a tensor a DataLoader worker (or any
# other process) sent arrives (torch.multiprocessing rebuilds it in shared memory). Its contents were
# made outside this process's ops, so like a script's input it is data entering from outside, never
# "the op behind" a divergence; ops that read it hash it as a fresh input.
STORAGE_ALIAS_OPS = frozenset({"set_"})


class OpInfo:
    """What the recorder needs to know about one OpOverload, worked out on its first call.

    Each argument is read, written, or both. One that is only written (an `out=` argument, `copy_`'s or
    `fill_`'s target, a collective's output buffers) is no input: its old contents, often from `torch.empty`,
    never reach the result, so they enter the input digest by dtype and shape only and never make the op
    "read never-written memory". Every written argument's cached digest is dropped after the op (the
    version counter is bumped only by schemas that annotate the write, and c10d's do not), and its memory
    is no longer blank; an op that returns no tensor is recorded by what it wrote (`recv`).

    A backward op's workspace or reserve argument counts by dtype and shape too, and the outputs an op makes for
    it (`scratch`: their positions) are recorded as no results (recorder/scratch.py): bytes the kernel need
    not define are no input and no result."""

    __slots__ = ("mode", "names", "random", "flags", "arg_names", "blind", "written", "bumped", "root", "collective",
                 "code", "text", "scratch", "effects")

    def __init__(self, func: Any, rec: Recorder) -> None:
        packet = func.overloadpacket.__name__
        self.text = str(func)
        self.mode = _mode(func, packet)
        self.names = [rec.intern(self.text)]
        self.random = packet in RANDOM_OPS or torch.Tag.nondeterministic_seeded in func.tags
        arguments = func._schema.arguments
        self.arg_names = [a.name for a in arguments]
        self.collective = func.namespace == "c10d"
        c10d_blind, c10d_written, c10d_unused = _c10d_arguments(packet) if self.collective else (None, None, None)
        self.blind = frozenset(
            a.name for i, a in enumerate(arguments)
            if a.is_out or a.name in (c10d_blind, c10d_unused) or (i == 0 and packet in SELF_BLIND_OPS)
            or is_scratch_argument(a.name))
        self.written = frozenset(
            a.name for a in arguments
            if (a.alias_info is not None and a.alias_info.is_write) or a.is_out or a.name in (c10d_blind, c10d_written))
        # autograd bumps these arguments' version counters after the op returns (the schema annotates the write)
        self.bumped = frozenset(a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write)
        # broadcast_: (process group, root rank) argument positions; its tensors are read on the root
        self.root = (self.arg_names.index("process_group"), self.arg_names.index("root_rank")) \
            if self.collective and packet == "broadcast_" else None
        self.code = xxhash.xxh3_64_intdigest(self.text.encode())
        self.scratch = scratch_outputs(func) if self.mode == RECORD else frozenset()
        self.flags = Flag.RANDOM if self.random else 0  # a record's flags before its inputs are read
        # what OpRecorder._effects handles: an argument written, a collective, a workspace returned
        self.effects = bool(self.written or self.collective or self.bumped or self.scratch)

    def blind_here(self, args: Any) -> frozenset[str]:
        """The arguments this call does not read: a broadcast's root reads its tensors."""
        if self.root is None or not _is_root(args, *self.root):
            return self.blind
        return self.blind - {"tensors"}

    def name(self, rec: Recorder, index: int) -> int:
        while len(self.names) <= index:
            self.names.append(rec.intern(f"{self.text}[{len(self.names)}]"))
        return self.names[index]


def _mode(func: Any, packet: str) -> int:
    """How an op is treated: PASS, VIEW, UNINIT or RECORD."""
    if func.namespace in PASS_NAMESPACES or packet in STORAGE_ALIAS_OPS and "Storage" in func._overloadname:
        return PASS
    if func.is_view:
        return VIEW
    return UNINIT if packet in UNINIT_OPS else RECORD


def _c10d_arguments(packet: str) -> tuple[str | None, str | None, str | None]:
    """A collective's arguments (their names) it only writes, reads and writes, and neither reads nor writes."""
    return C10D_WRITE_ONLY.get(packet), C10D_READ_WRITE.get(packet), C10D_UNUSED.get(packet)


def _is_root(args: Any, group_at: int, root_at: int) -> bool:
    """Whether this rank is a broadcast's root (unknown: treated as the root, whose tensors are read)."""
    try:
        from torch._C._distributed_c10d import ProcessGroup

        return bool(ProcessGroup.unbox(args[group_at]).rank() == args[root_at])
    except Exception:
        return True


def tensors_in(value: Any) -> Any:
    """The tensors in an op's argument or result (nested lists and tuples), in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
