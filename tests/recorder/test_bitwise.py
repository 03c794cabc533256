"""Two executions' outputs compared bit for bit (detaudit/recorder/bitwise.py)."""

from __future__ import annotations

import pytest
import torch

from detaudit.recorder.bitwise import differs, distance


def test_minus_zero_and_zero_differ_bit_for_bit() -> None:
    assert differs(torch.tensor([-0.0]), torch.tensor([0.0])) is not None


def test_equal_nans_agree_bit_for_bit() -> None:
    nan = torch.tensor([float("nan")])
    assert differs(nan, nan.clone()) is None


def test_the_distance_counts_units_in_the_last_place_across_zero() -> None:
    one = torch.tensor([1.0, -0.0])
    above_one = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)).item()
    other = torch.tensor([above_one, torch.finfo(torch.float32).tiny])
    diff, ulp = distance(one, other)
    assert ulp == 1 << 23  # from -0.0 to the smallest normal float: 2**23 steps
    assert diff == pytest.approx(2.0 ** -23)
