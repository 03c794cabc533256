"""Stable dtype codes, as written into traces (docs/trace-format.md).

Kept free of torch: reading and comparing traces happens in detaudit's own process, which never
imports torch (about 1.3 s and 200 MB of RSS that the comparison does not need).
"""

from __future__ import annotations

# Never renumber: code = position + 1; 0 means unknown. Names are torch's, without "torch.".
DTYPE_ORDER = (
    "float32", "float64", "float16", "bfloat16", "complex64", "complex128", "bool", "uint8",
    "int8", "int16", "int32", "int64", "complex32", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
)
# torch.save's values that are not tensors (recorder/objects.py): never renumber either; far from the torch
# dtypes, which may grow.
OBJECT_CODES = {"str": 101, "bytes": 102, "none": 103, "int": 104}  # int: a Python int beyond 64 bits
DTYPE_NAMES: dict[int, str] = {0: "unknown", **{code: name for code, name in enumerate(DTYPE_ORDER, start=1)},
                               **{code: name for name, code in OBJECT_CODES.items()}}
