"""Why a row's result depends on its batch (`detaudit batch`), from the origin search's evidence.

The evidence is the first op whose rows differ while its inputs' rows agree (batch/finding.py `Spot`),
how large the difference is for its dtype, and which probes differ. Ids (docs/batch.md):

- `batch-rows-mix`: rows read each other's data (a value reduced over the batch, a shape or padding set
  by the batch, a mask applied along the wrong dim): a correctness bug, flagged whatever the op;
- `batch-matmul`: a matmul/linear/convolution kernel picks its blocking (and so its summation order)
  by the batch size;
- `batch-reduction`: a reduction is split differently with the batch's shape;
- `batch-attention`: an attention kernel picks its path or split by the batch's shape;
- `batch-kernel`: another op whose rows change with the batch.
"""

from __future__ import annotations

from detaudit.batch.finding import BatchFinding, FirstVariant, Spot
from detaudit.results import Basis, Cause

_MATMUL = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum", "_mkldnn",
           "mkldnn_", "convolution", "conv", "_int_mm", "_addmm_activation")
_REDUCTION = ("sum", "mean", "var", "std", "norm", "native_layer_norm", "native_group_norm", "_softmax",
              "_log_softmax", "logsumexp", "cumsum", "prod", "amax", "amin", "nansum", "linalg_vector_norm")
_ATTENTION = ("scaled_dot_product", "_flash_attention", "_efficient_attention", "multi_head_attention",
              "_transformer_encoder_layer", "_cudnn_attention")

_FIXES = ("serve with fixed batch shapes (pad every batch to one size, or bucket requests by size so a request's "
          "batch size is known), use batch-invariant kernels where they exist (vLLM's and SGLang's batch-invariant "
          "modes; a fixed-split reduction or matmul), or compare results with a tolerance rather than bitwise")
# torch.use_deterministic_algorithms answers another question: the same inputs at the same shape, run to run
_NOT_DETERMINISM = ("torch.use_deterministic_algorithms(True) does not help: it makes runs repeat at one shape, not a "
                    "row independent of its batch")


def _knob(knob: str | None) -> str:
    """What the installed torch itself offers (recorder/batchknob.py), said plainly."""
    if knob is None:
        return (f". This torch has no batch-invariant mode (neither for eager ops nor for torch.compile); "
                f"{_NOT_DETERMINISM}")
    return (f". This torch's own setting, {knob} = True (environment TORCHINDUCTOR_BATCH_INVARIANT=1), covers "
            "torch.compile'd code only: Inductor's generated reductions then keep one blocking whatever the batch "
            "size; it does not change eager aten kernels such as this op, for which torch has no batch-invariant "
            f"mode; {_NOT_DETERMINISM}")


def _family(op: str) -> str:
    bare = op.removeprefix("aten.")
    if any(bare.startswith(a) or a in bare for a in _ATTENTION):
        return "attention"
    if bare in _REDUCTION or any(bare.startswith(r + "_") for r in _REDUCTION):
        return "reduction"
    if any(bare == m or bare.startswith(m) for m in _MATMUL):
        return "matmul"
    return "kernel"


def _where(first: FirstVariant) -> list[str]:
    lines = [f"{first.call_module} call {first.call} ({first.rows} rows, called at {first.location or '?'}): "
             f"{first.sizes_text}; max |diff| {first.max_abs_diff:.3g}, {first.max_ulp} ULP "
             f"(values up to {first.scale:.3g}, {first.dtype})"]
    for label, spot in (("first module", first.module), ("first op", first.op)):
        if spot is not None:
            what = f"{spot.name}" + (f" ({spot.cls})" if spot.cls else "") + (
                f" in {spot.module}" if label == "first op" and spot.module else "")
            lines.append(f"{label} whose rows differ while its inputs' rows agree: {what} at {spot.location or '?'}; "
                         + _spot_figures(spot))
    if first.note:
        lines.append(first.note)
    return lines


def _spot_figures(spot: Spot) -> str:
    if spot.across_rows:
        return "its result has no rows: it is reduced over the batch, and differs"
    if spot.shape_changed:
        return "its shape changes with the batch"
    return f"max |diff| {spot.max_abs_diff:.3g}, {spot.max_ulp} ULP"


def diagnose_batch(finding: BatchFinding) -> list[Cause]:
    """The causes of a batch-variant finding, most likely first (none for an invariant one)."""
    first = finding.first_variant
    if first is None:
        return []
    evidence = _where(first)
    op = first.op
    basis: Basis = "op-records" if op is not None else "direct"
    leak = first.large or first.structural or (op is not None and (op.across_rows or op.shape_changed))
    if leak:
        at = f" at {op.location}" if op is not None and op.location else ""
        return [Cause("batch-rows-mix", "likely",
                      f"rows read each other's data{at}: a row's result changes by {first.max_abs_diff:.3g} "
                      f"(values up to {first.scale:.3g}) with what else is in its batch, far beyond rounding. This "
                      "is a correctness bug, not numerics: padding or a mask that leaks across rows, a reduction "
                      "over the batch dim, or a shape set by the longest request",
                      evidence, "make every row's computation use only its own row: build masks per row (mask the "
                      "padded keys of each row), reduce over feature dims only, and pad to a fixed length or mask "
                      "what the padding adds; then run `detaudit batch` again", basis=basis)]
    family = _family(op.name) if op is not None else "kernel"
    name = op.name if op is not None else "an op inside the model"
    at = f" ({op.location})" if op is not None and op.location else ""
    summary = {
        "matmul": f"{name}{at} picks its kernel blocking by the batch size, so a row's sums are added in another "
                  "order in a batch of another size (rounding-level differences)",
        "reduction": f"{name}{at} splits its reduction differently with the batch's shape (rounding-level "
                     "differences)",
        "attention": f"the attention kernel {name}{at} picks its path or split by the batch's shape "
                     "(rounding-level differences)",
        "kernel": f"{name}{at} computes a row differently with the batch's size (rounding-level differences)",
    }[family]
    return [Cause(f"batch-{family}", "likely" if op is not None else "possible", summary, evidence,
                  _FIXES + _knob(first.knob), basis=basis)]
