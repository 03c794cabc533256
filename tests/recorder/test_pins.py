"""Pins replace the script's own seeding calls (user code only), per call and per DataLoader worker."""

from __future__ import annotations

from detaudit.recorder.pinning import PIN_SEED, Pins


def test_pins_fix_user_seeds_but_not_library_ones() -> None:
    pins = Pins(["torch-rng"])
    args, _, value = pins.seed_args("torch", (99,), {}, library=False, worker=None)
    assert value is not None
    assert args == (value,)
    assert pins.seed_args("torch", (99,), {}, library=False, worker=None)[2] == value + 1
    assert pins.seed_args("torch", (99,), {}, library=True, worker=None)[2] is None
    assert pins.seed_args("numpy", (5,), {}, library=False, worker=None)[2] is None
    assert Pins(["numpy-rng"]).seed_args("numpy-generator", (), {"seed": None}, False, 1)[2] == PIN_SEED + 2000
