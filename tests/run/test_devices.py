"""Device selection: `auto` keeps the script's own device and only labels it; named devices compare."""

from __future__ import annotations

import pytest

from detaudit.errors import UsageError
from detaudit.run import devices


@pytest.mark.parametrize("present, label", [(True, "cuda"), (False, "cpu")])
def test_auto_is_one_device_the_scripts_own(monkeypatch: pytest.MonkeyPatch, present: bool, label: str) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: present)
    assert devices.resolve_devices([]) == [label]
    assert devices.resolve_devices(["auto"]) == [label]
    assert devices.own_device([])
    assert devices.own_device(["auto"])


def test_named_devices_compare_across_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    assert devices.resolve_devices(["cpu", "cuda", "cpu"]) == ["cpu", "cuda"]
    assert not devices.own_device(["cpu", "cuda"])
    assert not devices.own_device(["auto", "cpu"])
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    with pytest.raises(UsageError, match="no CUDA device"):
        devices.resolve_devices(["cuda"])


def test_jobs_that_oversubscribe_the_cores_are_warned_about() -> None:
    warning = devices.oversubscription(2, ["cpu"], {}, 2)
    assert warning is not None
    assert "--jobs 2" in warning
    assert "2 CPU cores" in warning
    assert "one thread per core" in warning
    assert "OMP_NUM_THREADS=2" in (devices.oversubscription(3, ["cpu"], {"OMP_NUM_THREADS": "2"}, 4) or "")


def test_jobs_that_fit_the_cores_or_run_on_a_gpu_are_not_warned_about() -> None:
    assert devices.oversubscription(1, ["cpu"], {}, 2) is None
    assert devices.oversubscription(2, ["cpu"], {"OMP_NUM_THREADS": "1"}, 2) is None
    assert devices.oversubscription(4, ["cuda"], {}, 2) is None
    assert devices.oversubscription(2, ["cpu"], {"OMP_NUM_THREADS": "many"}, None) is None
