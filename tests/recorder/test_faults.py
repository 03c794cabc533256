"""recorder/faults.py, the test-only fault injector: off unless DETAUDIT_TEST_FAULT is set; when set,
the named op is perturbed only while its flag condition holds, and evidence labels the device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from detaudit.recorder import faults


def test_nothing_changes_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    evidence = SimpleNamespace()
    linear = torch.nn.functional.linear
    faults.install(evidence, torch)
    assert torch.nn.functional.linear is linear
    assert not vars(evidence)


def test_the_op_is_perturbed_only_while_its_condition_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.nn.functional, "linear", torch.nn.functional.linear)  # restored after the test
    monkeypatch.setenv(faults.ENV, '{"op": "torch.nn.functional.linear", "when": "cublas"}')
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    evidence = SimpleNamespace()
    x, w = torch.ones(2, 3), torch.ones(4, 3)
    clean = torch.nn.functional.linear(x, w)
    faults.install(evidence, torch)
    assert evidence.device_as == "cuda"
    assert not torch.equal(torch.nn.functional.linear(x, w), clean)  # a tiny jitter, as atomics would give
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # the condition pinned away: exact again
    assert torch.equal(torch.nn.functional.linear(x, w), clean)


def test_an_unknown_condition_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown condition"):
        faults._holds("sometimes", torch)
