"""`detaudit batch`'s row arithmetic: which rows a probe's subset holds, where a tensor's batch dim is, and how the
rows of two evaluations differ, bit for bit (recorder/batchprobe.py runs the probes, batchorigin.py searches where
a difference starts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from detaudit.recorder.core import iter_tensors


def halving_ladder(n: int) -> list[int]:
    """PyTorch's batch-invariance harness's sizes below a batch of `n` rows: n/2, n/4, ..., 1 (integer halving;
    256 rows: 128, 64, 32, 16, 8, 4, 2, 1; 48: 24, 12, 6, 3, 1), largest first."""
    sizes: list[int] = []
    k = n // 2
    while k >= 1:
        sizes.append(k)
        k //= 2
    return sizes


def odd_size(n: int) -> int | None:
    """The odd prefix size probed beside the ladder (7, or the largest odd size below a small batch), or None when
    the ladder has it already. A power-of-two ladder's rungs are multiples of a kernel's row block except its
    smallest; a full block with a remainder after it shows only at another size (docs/batch.md)."""
    odd = 7 if n > 8 else (n - 1 if n % 2 == 0 else n - 2)
    return odd if 1 <= odd < n and odd not in halving_ladder(n) else None


def default_sizes(n: int) -> list[int]:
    """Prefix sizes probed for a batch of `n` rows: the halving ladder and the odd size, ascending."""
    odd = odd_size(n)
    return sorted([*halving_ladder(n), *([odd] if odd is not None else [])])


def rebuild(value: Any, fn: Callable[[torch.Tensor], Any], depth: int = 0) -> Any:
    """`value` with each tensor replaced by `fn(tensor)`, in `iter_tensors`' order (tuples, lists, dicts)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if depth > 8:
        return value
    if isinstance(value, dict):
        return type(value)((k, rebuild(v, fn, depth + 1)) for k, v in value.items()) \
            if type(value) is not dict else {k: rebuild(v, fn, depth + 1) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(rebuild(v, fn, depth + 1) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(rebuild(v, fn, depth + 1) for v in value)
    return value


def tensors(value: Any) -> list[torch.Tensor]:
    return [t for _, t in iter_tensors(value, "")]


@dataclass
class RowDiff:
    """How the compared rows of two evaluations differ: rows with any differing bit, max |diff|, max ULP, the
    reference's largest magnitude (to tell numerics from a leak), and what could not be compared."""

    rows: int = 0
    differ: int = 0
    max_abs: float = 0.0
    max_ulp: int = 0
    scale: float = 0.0
    dtype: str = ""
    nan_mismatch: bool = False
    whole_differs: bool = False  # a tensor without rows (reduced over the batch) differs
    shape_differs: bool = False  # a tensor whose non-batch shape depends on the batch
    compared: int = 0  # tensors compared
    uncompared: int = 0  # tensors without rows, left out

    @property
    def agree(self) -> bool:
        return not (self.differ or self.whole_differs or self.shape_differs)

    def merge(self, other: RowDiff) -> None:
        self.differ = max(self.differ, other.differ) if self.rows == other.rows else self.differ + other.differ
        self.rows = max(self.rows, other.rows)
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_ulp = max(self.max_ulp, other.max_ulp)
        self.scale = max(self.scale, other.scale)
        self.dtype = self.dtype or other.dtype
        self.nan_mismatch |= other.nan_mismatch
        self.whole_differs |= other.whole_differs
        self.shape_differs |= other.shape_differs
        self.compared += other.compared
        self.uncompared += other.uncompared


_INT_OF = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Float bits as int64 whose differences count ULPs (sign-magnitude mapped to two's complement)."""
    bits = t.contiguous().view(_INT_OF[t.element_size()]).to(torch.int64)
    width = t.element_size() * 8
    magnitude = bits & ((1 << (width - 1)) - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def compare_rows(ref: torch.Tensor, got: torch.Tensor) -> RowDiff:
    """Row by row (dim 0), bit for bit: `ref` and `got` hold the same rows in the same order."""
    out = RowDiff(rows=ref.shape[0], dtype=str(ref.dtype).removeprefix("torch."), compared=1)
    if ref.shape != got.shape or ref.dtype != got.dtype:
        out.shape_differs = True
        out.differ = ref.shape[0]
        return out
    if ref.numel() == 0:
        return out
    a, b = ref.detach(), got.detach()
    if a.device != b.device:
        b = b.to(a.device)
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        ne = a.contiguous().view(_INT_OF[a.element_size()]) != b.contiguous().view(_INT_OF[a.element_size()])
    else:
        ne = a != b
    row_ne = ne.reshape(a.shape[0], -1).any(dim=1)
    out.differ = int(row_ne.sum())
    if a.is_floating_point() or a.dtype == torch.bool:
        af, bf = a.double(), b.double()
    else:
        af, bf = a.to(torch.float64), b.to(torch.float64)
    finite = torch.isfinite(af) & torch.isfinite(bf)
    out.scale = float(af[finite].abs().max()) if bool(finite.any()) else 0.0
    if out.differ:
        nan_a, nan_b = torch.isnan(af), torch.isnan(bf)
        out.nan_mismatch = bool((nan_a != nan_b).any())
        diff = (af - bf).abs()[finite]
        out.max_abs = float(diff.max()) if diff.numel() else 0.0
        if a.is_floating_point():
            ulps = (_ordered_bits(a) - _ordered_bits(b)).abs()[finite]
            out.max_ulp = int(ulps.max()) if ulps.numel() else 0
    return out


def _batch_dim(full: torch.Tensor, part: torch.Tensor, n: int, k: int, preferred: int) -> tuple[int, int] | None:
    """(dim, m): `part` (k rows) is a subset of `full` (n rows) along dim, each row `m` consecutive entries
    there: size n·m in `full`, k·m in `part`, every other dim equal; `preferred` (--batch-dim) first, m = 1
    (a row per entry) before a batch folded into a bigger dim (a matmul flattening (n, t, d) to (n·t, d)).
    None when there is none."""
    if full.dim() != part.dim() or full.dim() == 0:
        return None
    dims = [preferred] + [d for d in range(full.dim()) if d != preferred]
    others_equal = [all(full.shape[i] == part.shape[i] for i in range(full.dim()) if i != d) if d < full.dim()
                    else False for d in dims]
    for d, equal in zip(dims, others_equal, strict=True):
        if equal and full.shape[d] == n and part.shape[d] == k:
            return d, 1
    for d, equal in zip(dims, others_equal, strict=True):
        size = full.shape[d] if equal else 0
        if size > n and size % n == 0 and part.shape[d] == size // n * k:
            return d, size // n
    return None


def _spread(index: torch.Tensor, m: int) -> torch.Tensor:
    """Row indices -> the indices of their `m` consecutive entries each."""
    return index if m == 1 else (index[:, None] * m + torch.arange(m)).reshape(-1)


def _folded(ref: torch.Tensor, got: torch.Tensor, found: tuple[int, int], rows: Rows, n: int) -> RowDiff:
    """The rows `rows` names along dim `d` of `found`, each row's `m` entries as one row. A batch folded into a
    bigger dim holds a row's entries either consecutively ((n, t) flattened, batch first) or `n` apart ((t, n)
    flattened: `nn.MultiheadAttention` folds its sequence-first (t, n, e) so); both are compared and the closer
    kept, as the other lines one row's entries up with other rows' (far beyond rounding, unless the rows agree)."""
    d, m = found
    layouts = [(_spread(rows.ref, m), _spread(rows.got, m))]
    if m > 1:
        layouts.append((_apart(rows.ref, m, n), _apart(rows.got, m, rows.size)))
    diffs = []
    for layout in layouts:
        picked = [t.detach().index_select(d, index.to(t.device)).movedim(d, 0)
                  for t, index in zip((ref, got), layout, strict=True)]
        diffs.append(compare_rows(*(t.reshape(-1, m, *t.shape[1:]) if m > 1 else t for t in picked)))
    return min(diffs, key=lambda diff: (not diff.agree, diff.max_abs))


def _apart(index: torch.Tensor, m: int, size: int) -> torch.Tensor:
    """Row indices -> the indices of their `m` entries each, `size` (the rows of the batch) apart."""
    return (index[:, None] + torch.arange(m) * size).reshape(-1)


@dataclass(frozen=True)
class Rows:
    """Which rows of the whole batch (`ref`, along the batch dim) a probe's rows (`got`) are."""

    size: int  # the probe's batch size
    ref: torch.Tensor  # indices into the whole batch
    got: torch.Tensor  # the same rows' indices in the probe's batch


def compare_values(ref_value: Any, got_value: Any, n: int, rows: Rows, preferred: int,
                   whole: bool = True) -> RowDiff:
    """The rows `rows` names, in every tensor of two evaluations (the whole batch's and a probe's).

    A tensor with a batch dim is compared row by row; one without (a scalar, a parameter, a value reduced
    over the batch) whole, or, not `whole`, not at all (`uncompared`: a batch's mean loss is no row's
    result); one whose other dims change with the batch counts as differing (`shape_differs`).
    """
    total = RowDiff()
    refs, gots = tensors(ref_value), tensors(got_value)
    if len(refs) != len(gots):
        total.shape_differs = True
        return total
    for ref, got in zip(refs, gots, strict=True):
        if ref is got or (ref.shape == got.shape and ref.dtype == got.dtype and ref.stride() == got.stride()
                          and ref.storage_offset() == got.storage_offset() and storage(ref) != 0
                          and storage(ref) == storage(got)):
            total.merge(RowDiff(compared=1))  # one tensor (a weight): equal to itself
            continue
        found = _batch_dim(ref, got, n, rows.size, preferred)
        if found is not None:
            part = _folded(ref, got, found, rows, n)
        elif ref.shape == got.shape and not whole:
            part = RowDiff(uncompared=1)
        elif ref.shape == got.shape:
            part = compare_rows(ref.detach().reshape(1, -1), got.detach().reshape(1, -1))
            part.whole_differs, part.differ, part.rows = part.differ > 0, 0, 0
        else:
            part = RowDiff(shape_differs=True, compared=1, dtype=str(ref.dtype).removeprefix("torch."))
        total.merge(part)
    return total


@dataclass(frozen=True)
class Batch:
    """A call's batch: its size, each tensor argument's batch dim (in `tensors((args, kwargs))` order; None: not of
    the batch, a shared mask or position ids, passed whole), and copies of the batch's tensors (the module's next
    call mixes them in), each with its dim."""

    n: int
    dims: list[int | None]
    rows: list[tuple[torch.Tensor, int]]


def batch_rows(args: Any, kwargs: Any, d: int, size: int | None = None) -> Batch | None:
    """The batch: its size is `size` where a layer declared it, else the most common size of dim `d` among the
    tensor arguments (a causal mask (seq, seq) and a padding mask (n, seq) beside a sequence-first input would
    outnumber the batch with the sequence's length); a tensor has its rows
    along `d` where it has that size there, else along dim 0 where that has it (batch-first labels or targets (n,),
    a key padding mask (n, seq), beside a sequence-first input (seq, n, ...)). None without a tensor argument
    that has the dim."""
    inputs = tensors((args, kwargs))
    sizes = [t.shape[d] for t in inputs if t.dim() > d]
    if not sizes:
        return None
    n = size if size is not None else max(set(sizes), key=lambda s: (sizes.count(s), -sizes.index(s)))
    dims = [d if t.dim() > d and t.shape[d] == n else 0 if t.dim() > 0 and t.shape[0] == n else None
            for t in inputs]
    return Batch(n, dims, [(t.detach().clone(), dim) for t, dim in zip(inputs, dims, strict=True) if dim is not None])


def aggregates(output: Any, n: int, d: int) -> list[str]:
    """The output's tensors without the batch's rows (a 0-d loss, a value reduced over the batch), by path: they
    are no row's result and are not compared, as PyTorch's harness leaves aggregates out."""
    return [f"{path} {'(0-d)' if t.dim() == 0 else tuple(t.shape)}"
            for path, t in iter_tensors(output, "output") if _batch_dim(t, t, n, n, d) is None]


def mixable(other: Batch, mine: Batch, fill: int) -> bool:
    """Another call's batch tensors can fill this call's batch: same count, batch dims, dtypes and non-batch
    shapes, and at least the `fill` rows the mixed batch takes from them (an earlier call may have been smaller)."""
    return len(other.rows) == len(mine.rows) and all(
        da == db and a.dtype == b.dtype and a.device == b.device and a.dim() == b.dim() and a.shape[da] >= fill
        and all(a.shape[i] == b.shape[i] for i in range(a.dim()) if i != da)
        for (a, da), (b, db) in zip(other.rows, mine.rows, strict=True))


def storage(t: torch.Tensor) -> int:
    """The address of a tensor's storage (0 for one without: a meta or functional tensor)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0
