"""The compiled-kernels detector (causes/compile_causes.py), on synthetic evidence."""

from __future__ import annotations

from typing import Any

from test_causes import context, flags, hash_event, record

from detaudit import causes
from detaudit.causes import compile_causes


def compile_event(**inductor: Any) -> dict[str, Any]:
    return {"type": "compile", "module": "CharGPT", "frames": 1, "env": {},
            "inductor": {"deterministic": False, "max_autotune": False, **inductor}}


def end_state(**changes: Any) -> dict[str, Any]:
    return {"type": "state", "when": "end", "rng": {}, "flags": flags(**changes)}


def test_compiled_model_gradient_divergence_is_compiled_kernels_not_hash_order() -> None:
    events = [compile_event(), end_state(), hash_event(1)]
    other = [compile_event(), end_state(), hash_event(2)]
    found = causes.rank(context([events, other], rec=record("grad", "tok.weight", module="tok.weight")))
    assert found[0].id == "compiled-kernels"
    assert "torch.compile ran on CharGPT" in found[0].evidence[0]
    assert "use_deterministic_algorithms(True)" in found[0].fix
    assert found[0].pins == ["deterministic"]


def test_autotuning_is_named() -> None:
    events = [compile_event(max_autotune=True), end_state()]
    found = compile_causes.compiled_kernels(context([events, events], rec=record("output", "CharGPT")))
    assert found is not None
    assert any("autotuning on (max_autotune)" in line for line in found.cause.evidence)


def test_not_when_deterministic_or_not_compiled() -> None:
    rec = record("grad", "w")
    assert compile_causes.compiled_kernels(context([[end_state()], [end_state()]], rec=rec)) is None
    on = [compile_event(), end_state(deterministic_algorithms=True)]
    assert compile_causes.compiled_kernels(context([on, on], rec=rec)) is None
    inductor_on = [compile_event(deterministic=True), end_state()]
    assert compile_causes.compiled_kernels(context([inductor_on, inductor_on], rec=rec)) is None
