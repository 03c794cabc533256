"""The pins: one enum for the parent that asks for them and the child that applies them.

Every pin `explain` can run (its plan and its bisection draw from PINS) must do something in the
repeat: each child-side pin is applied by the real child code (recorder/pins.py) in-process here,
and each environment-level pin reaches the repeat's environment through the launcher's plan.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from detaudit.explain import runner as explain
from detaudit.pin import ALL, PINS, Pin, pin_of, pins_of, separating_pin
from detaudit.recorder import pinning as child_pins
from detaudit.recorder.pinning import PIN_SEED, Pins, reexec_without_aslr
from detaudit.run.launcher import plan_repeats

OFFERED = sorted(set(explain.bisection_pins(["cpu", "cuda"])) | set(pin_of(ALL).child))


@pytest.fixture
def torch_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Whatever a pin changes in this process is put back: RNG states, flags, thread count, and the
    torch functions a pin replaces."""
    use_deterministic_algorithms, set_num_threads = torch.use_deterministic_algorithms, torch.set_num_threads
    for name in ("use_deterministic_algorithms", "set_num_threads"):
        monkeypatch.setattr(torch, name, getattr(torch, name))  # restored as they were, whatever a pin did
    saved = (torch.get_rng_state(), np.random.get_state(), random.getstate(), torch.get_num_threads(),
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    yield
    (rng, np_state, py_state, threads, det, warn_only, bench, cudnn_det, mm_tf32, cudnn_tf32, precision) = saved
    torch.set_rng_state(rng)
    np.random.set_state(np_state)
    random.setstate(py_state)
    set_num_threads(threads)  # the originals: a pin may have replaced torch's with a no-op for the script
    use_deterministic_algorithms(det, warn_only=warn_only)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = bench, cudnn_det
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = mm_tf32, cudnn_tf32
    torch.set_float32_matmul_precision(precision)


def _applied(pin: Pin) -> Pins:
    """The pin applied as the child applies it at import: Python, NumPy, then torch."""
    pins = Pins([pin.value])  # as the child config carries it: the plain name
    pins.apply_python(random)
    pins.apply_numpy(np.random)
    pins.apply_torch(torch)
    return pins


def _torch_rng(monkeypatch: pytest.MonkeyPatch) -> bool:
    _applied(Pin.TORCH_RNG)
    return torch.initial_seed() == PIN_SEED


def _numpy_rng(monkeypatch: pytest.MonkeyPatch) -> bool:
    np.random.seed(PIN_SEED)
    expected = np.random.get_state()[1].copy()
    np.random.seed(0)
    _applied(Pin.NUMPY_RNG)
    return bool((np.random.get_state()[1] == expected).all())


def _python_rng(monkeypatch: pytest.MonkeyPatch) -> bool:
    random.seed(PIN_SEED)
    expected = random.random()
    random.seed(0)
    _applied(Pin.PYTHON_RNG)
    return random.random() == expected


def _deterministic(monkeypatch: pytest.MonkeyPatch) -> bool:
    _applied(Pin.DETERMINISTIC)
    torch.use_deterministic_algorithms(False)  # the script's own call cannot undo the pin
    return torch.are_deterministic_algorithms_enabled()


def _one_thread(monkeypatch: pytest.MonkeyPatch) -> bool:
    _applied(Pin.ONE_THREAD)
    torch.set_num_threads(4)  # nor can this one
    return torch.get_num_threads() == 1


def _cudnn(monkeypatch: pytest.MonkeyPatch) -> bool:
    torch.backends.cudnn.benchmark = True
    _applied(Pin.CUDNN)
    return torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


def _tf32_off(monkeypatch: pytest.MonkeyPatch) -> bool:
    torch.set_float32_matmul_precision("high")
    _applied(Pin.TF32_OFF)
    return torch.get_float32_matmul_precision() == "highest"


def _zero_empty(monkeypatch: pytest.MonkeyPatch) -> bool:
    # torch.empty's wrapper (recorder/evidence.py) asks exactly this before it zeroes the memory
    return _applied(Pin.ZERO_EMPTY).active(Pin.ZERO_EMPTY) and not Pins([]).active(Pin.ZERO_EMPTY)


def _address_layout(monkeypatch: pytest.MonkeyPatch) -> bool:
    """The child restarts itself with address randomization off (the personality call and the exec
    faked: a real one would outlive this test)."""
    calls: list[int] = []

    class Libc:
        def personality(self, persona: int) -> int:
            calls.append(persona)
            return 0

    class Restarted(Exception):
        pass

    def execv(path: str, argv: list[str]) -> None:
        raise Restarted(path)

    monkeypatch.setattr(child_pins, "ctypes", SimpleNamespace(CDLL=lambda *a, **k: Libc()))
    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(Restarted):
        reexec_without_aslr(pin_of(Pin.ADDRESS_LAYOUT).child)
    return child_pins.ADDR_NO_RANDOMIZE in calls


# what each child-side pin visibly does once the child applied it
CHILD_EFFECTS: dict[Pin, Callable[[pytest.MonkeyPatch], bool]] = {
    Pin.TORCH_RNG: _torch_rng, Pin.NUMPY_RNG: _numpy_rng, Pin.PYTHON_RNG: _python_rng,
    Pin.DETERMINISTIC: _deterministic, Pin.ONE_THREAD: _one_thread, Pin.CUDNN: _cudnn, Pin.TF32_OFF: _tf32_off,
    Pin.ZERO_EMPTY: _zero_empty, Pin.ADDRESS_LAYOUT: _address_layout,
}


def test_every_pin_has_a_spec_that_does_something() -> None:
    assert set(PINS) == set(Pin)
    for pin, spec in PINS.items():
        assert spec.name == pin
        assert spec.description
        assert spec.env or spec.child, f"{pin} pins nothing"


def test_the_pins_the_child_is_sent_are_the_ones_it_applies() -> None:
    """Every name a child config can carry has an effect checked below (a new child pin needs one)."""
    sent = {name for spec in PINS.values() for name in spec.child}
    assert sent == set(CHILD_EFFECTS)


@pytest.mark.parametrize("pin", OFFERED)
@pytest.mark.usefixtures("torch_state")
def test_every_offered_pin_is_handled_in_the_repeat(pin: Pin, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = pin_of(pin)
    for child in spec.child:
        assert CHILD_EFFECTS[child](monkeypatch), f"the child did not apply {child}"
    [plan] = plan_repeats(os.getcwd(), 1, ["cpu"], env=spec.env, child_config={"pins": list(spec.child)})
    assert spec.env.items() <= plan.env.items()  # the repeat's environment carries the env-level part
    assert plan.child_config["pins"] == list(spec.child)


def test_an_unknown_pin_is_refused_by_the_child() -> None:
    with pytest.raises(ValueError, match="unknown pin 'warp-drive'"):
        Pins(["torch-rng", "warp-drive"])
    assert pins_of(["hash-seed", "cudnn"]) == [Pin.HASH_SEED, Pin.CUDNN]


def test_all_pins_everything() -> None:
    everything = pin_of(ALL)
    assert set(everything.child) >= {"torch-rng", "deterministic", "zero-empty", "address-layout"}
    assert everything.env["PYTHONHASHSEED"] == "0"
    assert everything.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_set_of_pins_pins_each_of_them() -> None:
    both = pin_of("hash-seed+one-thread")
    assert both.env == {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert both.child == (Pin.ONE_THREAD,)
    with pytest.raises(ValueError, match="unknown pin"):
        pin_of("hash-seed+warp-drive")


def test_separating_pin_pins_one_cause_and_not_the_other() -> None:
    # address-layout also sets PYTHONHASHSEED=0: only the hash-seed experiment tells the two apart
    assert separating_pin(["hash-seed"], ["address-layout"]) == Pin.HASH_SEED
    assert separating_pin(["address-layout"], ["hash-seed"]) == Pin.HASH_SEED
    assert separating_pin(["deterministic"], ["deterministic"]) is None


def test_pin_names_are_the_strings_files_and_reports_carry() -> None:
    assert [p.value for p in Pin] == [str(p) for p in Pin] == [f"{p}" for p in Pin]
    assert "torch-rng" in PINS
    assert Pin("torch-rng") is Pin.TORCH_RNG
