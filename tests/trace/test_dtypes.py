"""dtypes: the trace's dtype codes are fixed forever and match torch's names."""

from __future__ import annotations

import torch

from detaudit.trace.dtypes import DTYPE_NAMES, DTYPE_ORDER, OBJECT_CODES


def test_codes_are_positions_from_one_with_zero_unknown() -> None:
    assert DTYPE_NAMES[0] == "unknown"
    assert DTYPE_NAMES[1] == "float32"
    assert DTYPE_NAMES[12] == "int64"
    assert len(set(DTYPE_ORDER)) == len(DTYPE_ORDER) == len(DTYPE_NAMES) - 1 - len(OBJECT_CODES)


def test_codes_of_values_that_are_no_tensors_are_fixed_and_apart_from_torch_dtypes() -> None:
    assert OBJECT_CODES == {"str": 101, "bytes": 102, "none": 103, "int": 104}
    assert all(DTYPE_NAMES[code] == name for name, code in OBJECT_CODES.items())
    assert min(OBJECT_CODES.values()) > len(DTYPE_ORDER)


def test_every_name_is_a_torch_dtype() -> None:
    assert all(isinstance(getattr(torch, name), torch.dtype) for name in DTYPE_ORDER)
