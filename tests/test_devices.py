"""Device selection: `auto` keeps the script's own device and only labels it; named devices compare."""

from __future__ import annotations

import pytest

from detaudit import devices
from detaudit.errors import UsageError


@pytest.mark.parametrize("present, label", [(True, "cuda"), (False, "cpu")])
def test_auto_is_one_device_the_scripts_own(monkeypatch: pytest.MonkeyPatch, present: bool, label: str) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: present)
    assert devices.resolve_devices([]) == [label]
    assert devices.resolve_devices(["auto"]) == [label]
    assert devices.own_device([]) and devices.own_device(["auto"])


def test_named_devices_compare_across_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    assert devices.resolve_devices(["cpu", "cuda", "cpu"]) == ["cpu", "cuda"]
    assert not devices.own_device(["cpu", "cuda"]) and not devices.own_device(["auto", "cpu"])
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    with pytest.raises(UsageError, match="no CUDA device"):
        devices.resolve_devices(["cuda"])
