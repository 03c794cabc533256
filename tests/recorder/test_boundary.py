"""recorder/boundary.py: the optimizer step's host plans give `fingerprint_cpu`'s digests and samples, see
in-place changes, and never keep a stale name, digest, shape or dtype when the tensors, their storage, the
optimizer's parameters or its state change between steps. (The digest's properties through a kept plan: the
"group" path of tests/test_fingerprint.py.)"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_fingerprint import DTYPES, flip_bit, tensors

from detaudit.recorder.boundary import HostGroup
from detaudit.recorder.core import Recorder
from detaudit.recorder.fingerprint import DTYPE_CODES, fingerprint_cpu, shape_seed
from detaudit.recorder.hooks import Hooks
from detaudit.trace import Flag, Kind, TraceWriter, read_trace


def describe(t: torch.Tensor) -> tuple[int, int]:
    return t.dim(), DTYPE_CODES.get(t.dtype, 0)


def rows(group: HostGroup, ts: list[torch.Tensor]) -> list[tuple[int, bytes]]:
    out = group.rows(ts, describe, 0, 0)
    assert out is not None
    assert [(int(r["shape"]), int(r["dtype"])) for r in out] == [describe(t) for t in ts]
    return [(int(r["digest"]), r["samples"].tobytes()) for r in out]


def expected(ts: list[torch.Tensor]) -> list[tuple[int, bytes]]:
    out = []
    for t in ts:
        digest, samples = fingerprint_cpu(t)
        out.append((digest, torch.tensor(samples, dtype=torch.float64).numpy().tobytes()))
    return out


def every_kind() -> list[torch.Tensor]:
    """One tensor of each sampled dtype and element count 0-5 (tiny tensors repeat sample positions), bfloat16
    NaN payloads, and the layouts and views a plan leaves to fingerprint_cpu."""
    out = []
    for dtype in [*DTYPES, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn]:
        for n in range(6):
            out.append((torch.arange(n, dtype=torch.float64) * 1.75 - 2).to(dtype))
        out.append(torch.tensor(2.5).to(dtype))
    out.append(torch.tensor([0x7FC1, 0xFF81 - 0x10000, 0x7F80, 1], dtype=torch.int16).view(torch.bfloat16))
    z = torch.randn(3, 4, dtype=torch.complex64)
    out += [torch.randn(4, 6).t(), z.conj(), z.conj().imag, torch.randn(3, 3).to_sparse(), torch.empty(0, 3),
            torch.quantize_per_tensor(torch.randn(4), 0.5, 2, torch.qint8),
            torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], layout=torch.jagged)]
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse, nested and quantized tensors warn
@pytest.mark.parametrize("fresh", [True, False])
def test_a_plan_gives_fingerprint_cpu_s_digests_and_samples_for_every_dtype_and_layout(fresh: bool) -> None:
    ts = every_kind()
    group = HostGroup([Kind.PARAM] * len(ts), list(range(len(ts))), fresh=fresh)
    want = expected(ts)
    assert rows(group, ts) == want
    assert rows(group, ts) == want  # the kept plan
    nan_bits = ts[-8]
    assert nan_bits.dtype is torch.bfloat16
    assert math.isnan(fingerprint_cpu(nan_bits)[1][0])


@given(t=tensors(min_numel=1), data=st.data())
def test_a_kept_plan_sees_any_bit_flipped_in_place(t: torch.Tensor, data: st.DataObject) -> None:
    group = HostGroup([Kind.PARAM] * 2, [1, 2], fresh=False)
    ts = [torch.ones(2), t]
    before = rows(group, ts)
    element = data.draw(st.integers(0, t.numel() - 1))
    bit = data.draw(st.integers(0, 8 * t.element_size() - 1))
    t.copy_(flip_bit(t, element, bit))
    after = rows(group, ts)
    assert after == expected(ts)
    assert after[1][0] != before[1][0]


@given(t=tensors(dtypes=[torch.float32, torch.int64, torch.bfloat16, torch.uint8], min_numel=2), data=st.data())
def test_a_kept_plan_sees_elements_permuted_in_place(t: torch.Tensor, data: st.DataObject) -> None:
    group = HostGroup([Kind.PARAM], [1], fresh=False)
    before = rows(group, [t])
    flat = t.view(-1)
    original = flat.clone()
    flat.copy_(original[torch.tensor(data.draw(st.permutations(range(flat.numel()))))])
    after = rows(group, [t])
    assert after == expected([t])
    if not torch.equal(flat.view(torch.uint8), original.view(torch.uint8)):  # the permutation moved other bits
        assert after[0][0] != before[0][0]


def test_a_kept_plan_follows_replaced_storage_shape_dtype_and_views() -> None:
    """A parameter whose `.data` was replaced (new storage, same object), reshaped, made non-contiguous, given
    another dtype over the same bytes or made a negative view, all in place: each step reads what it holds now."""
    p = torch.nn.Parameter(torch.randn(6, 4))
    group = HostGroup([Kind.PARAM, Kind.OPTSTATE], [1, 2], fresh=False)
    state = torch.zeros(3)

    def check() -> None:
        assert rows(group, [p, state]) == expected([p.detach(), state])

    check()
    with torch.no_grad():
        p.mul_(2)
    check()
    p.data = torch.randn(6, 4)
    check()
    p.data = torch.randn(3, 8)
    check()
    p.data = p.data.t()
    check()
    p.data = torch.randn(24).view(4, 6)
    check()
    p.data = torch.randn(4, 6).bfloat16()
    check()
    p.data = p.data.view(torch.float16)  # the same bytes, shape and address
    check()
    state.data = state.data.view(torch.int32)
    check()
    p.data = torch._neg_view(p.data)  # the same bytes, shape and address, negated
    check()
    p.data = torch.empty(0, 3)
    check()
    p.data = torch.randn(2, 2)
    check()
    meta = torch.empty(2, 2, device="meta")
    assert group.rows([p, meta], describe, 0, 0) is None  # not on the host: the caller's device path
    check()


def test_a_fresh_plan_follows_new_tensors_of_another_kind_at_the_same_position() -> None:
    """Gradients are new tensors each step: one of another dtype, shape, layout, contiguity or device at a
    position (at the same address or not) is read as what it is."""
    group = HostGroup([Kind.GRAD] * 2, [1, 2], fresh=True)
    base = torch.randn(12)
    steps: list[list[torch.Tensor]] = [
        [torch.randn(3, 4), base], [torch.randn(3, 4), base.view(torch.int32)], [torch.randn(4, 3), base.view(3, 4)],
        [torch.randn(4, 3).t(), base[::2]], [torch.randn(3, 4).to_sparse(), base], [torch.randn(3, 4), base.flip(0)],
        [torch.randn(3, 4), base], [torch.randn(3, 4), torch._neg_view(base)],
        [torch.randn(3, 4, dtype=torch.float64), base.view(2, 6)], [torch.randn(3, 4), torch.empty(0)],
        [torch.randn(3, 4), base],
    ]
    for ts in steps:
        assert rows(group, ts) == expected(ts)
    assert group._fast is None  # positions read by fingerprint_cpu for a while are read in place again
    assert group.rows([torch.randn(3, 4), torch.empty(12, device="meta")], describe, 0, 0) is None


@pytest.mark.parametrize("fresh", [True, False])
def test_a_tensor_whose_storage_was_freed_under_it_is_recorded_unread(fresh: bool) -> None:
    """FSDP frees a parameter's memory by resizing its storage to 0 and keeps the tensor: read in place, it
    would be read at address 0 (a crash); it is recorded with dtype and shape only, flagged NO_DATA."""
    p, other = torch.randn(16), torch.randn(4)
    group = HostGroup([Kind.PARAM] * 2, [1, 2], fresh=fresh)
    assert rows(group, [p, other]) == expected([p, other])
    p.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="storage holds no memory"):
        fingerprint_cpu(p)
    out = group.rows([p, other], describe, 0, 0)
    assert out is not None
    assert out["flags"].tolist() == [int(Flag.NO_DATA), 0]
    assert int(out["digest"][1]) == expected([other])[0][0]
    assert int(out["digest"][0]) == shape_seed(p)
    assert math.isnan(out["samples"][0][0])


def test_a_plan_refuses_a_list_of_another_length() -> None:
    group = HostGroup([Kind.GRAD] * 2, [1, 2], fresh=True)
    with pytest.raises(ValueError, match="3 tensors for 2 names"):
        group.rows([torch.ones(1)] * 3, describe, 0, 0)


# -- the step boundary through the hooks ------------------------------------------------------------------

Records = list[tuple[Any, ...]]


def train(tmp_path: Path, label: str, script: Callable[[Hooks, int], None], reference: bool, steps: int = 4) -> Records:
    """Run `script(hooks, step)` for `steps` steps; the records as (step, kind, name, shape, dtype, flags, digest,
    samples). `reference`: every tensor recorded alone (`record_tensor`, the path inside op windows)."""
    path = tmp_path / f"{label}-{reference}.trace"
    rec = Recorder(TraceWriter(path, {"repeat": 0}))
    rec.eager_device = reference  # on the CPU: record_group records tensor by tensor, as before the plans
    hooks = Hooks(rec)
    for step in range(steps):
        script(hooks, step)
    rec.close({"exit_code": 0})
    trace = read_trace(path)
    return [(int(r["step"]), int(r["kind"]), trace.strings[r["name"]], trace.strings[r["shape"]], int(r["dtype"]),
             int(r["flags"]), int(r["digest"]), r["samples"].tobytes()) for r in trace.records]


def step(hooks: Hooks, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer], x: torch.Tensor,
         seen: bool = True) -> Records:
    """One training step; `seen`: the hooks see the model's forward (else its parameters have no names yet).
    Returns what the step boundary should record, worked out from the optimizers themselves: (kind, digest,
    samples) of each gradient before each step, each parameter and its state tensors after it."""
    if seen:
        hooks._on_forward_pre(model, (x,))
    out = model(x)
    if seen:
        hooks._on_forward(model, (x,), out)
    out.square().mean().backward()
    want: Records = []
    for opt in optimizers:
        params = [p for g in opt.param_groups for p in g["params"]]
        want += [(int(Kind.GRAD), *print_of(p.grad)) for p in params if p.grad is not None]
        hooks._on_step_pre(opt, (opt,), {})
        opt.step()
        hooks._on_step_post(opt, (opt,), {})
        for p in params:
            want.append((int(Kind.PARAM), *print_of(p)))
            want += [(int(Kind.OPTSTATE), *print_of(v)) for v in opt.state.get(p, {}).values()
                     if isinstance(v, torch.Tensor)]
    for opt in optimizers:
        opt.zero_grad()
    return want


def print_of(t: torch.Tensor) -> tuple[int, bytes]:
    digest, samples = fingerprint_cpu(t.detach())
    return digest, torch.tensor(samples, dtype=torch.float64).numpy().tobytes()


class Scenario:
    """A small model trained with Adam, and one change made to it (or its optimizer) after the second step."""

    def __init__(self, change: str) -> None:
        torch.manual_seed(0)
        self.change = change
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 3))
        self.opts: list[torch.optim.Optimizer] = [torch.optim.Adam(self.model.parameters(), lr=1e-2)]
        self.want: Records = []  # what the step boundary should record (`step`)
        if change == "shared":  # one parameter in two optimizers: recorded under each
            self.opts.append(torch.optim.SGD([self.model[2].bias], lr=0.1, momentum=0.9))

    def __call__(self, hooks: Hooks, at: int) -> None:
        model, opt = self.model, self.opts[0]
        if at == 2:
            if self.change == "replaced":  # a new parameter object in the model and the optimizer
                model[0].weight = torch.nn.Parameter(torch.randn(3, 4))
                opt.param_groups[0]["params"][0] = model[0].weight
                opt.state.pop(next(iter(opt.state)))
            elif self.change == "reshaped":  # a new module of another width: other shapes, names kept
                model[2] = torch.nn.Linear(3, 5)
                opt.param_groups[0]["params"][-2:] = list(model[2].parameters())
            elif self.change == "added":  # a parameter group added after the first steps
                extra = torch.nn.Linear(3, 2)
                model.append(extra)
                opt.add_param_group({"params": list(extra.parameters())})
            elif self.change == "state replaced":  # load_state_dict: new state tensors, same parameters
                opt.load_state_dict(opt.state_dict())
            elif self.change == "state swapped":  # one state tensor replaced in place in its dict
                state = opt.state[model[0].bias]
                state["exp_avg"] = state["exp_avg"].clone() + 1
            elif self.change == "state key added":  # renamed in place: the same tensors in the same order
                entry = opt.state[model[0].bias]
                renamed = {("other" if k == "extra" else k): v for k, v in entry.items()}
                entry.clear()
                entry.update(renamed)
            elif self.change == "state dicts swapped":  # two parameters' state swapped: the same dicts in order
                a, b = model[0].bias, model[2].bias
                items = list(opt.state.items())
                opt.state.clear()
                for key, entry in items:
                    opt.state[b if key is a else a if key is b else key] = entry
            elif self.change == "regrouped":  # the same parameters in two groups (named by their place)
                group = opt.param_groups[0]
                opt.param_groups.append({**group, "params": group["params"][2:]})
                group["params"] = group["params"][:2]
            elif self.change == "state value made a tensor":
                opt.state[model[0].bias]["scale"] = torch.full((2,), 3.0)
        elif at == 1 and self.change == "state value made a tensor":
            opt.state[model[0].bias]["scale"] = 3.0  # not recorded while it is no tensor
        elif at == 1 and self.change == "state key added":
            opt.state[model[0].bias]["extra"] = torch.ones(2)
        # "renamed": the model's forward is first seen at the third step (before, its parameters are named by
        # their place in the optimizer); from then on they are named after it. "regrouped": never seen
        seen = self.change != "regrouped" and (self.change != "renamed" or at >= 2)
        self.want += step(hooks, model, self.opts, torch.randn(5, 4), seen=seen)


CHANGES = ["none", "replaced", "reshaped", "added", "state replaced", "state swapped", "state key added",
           "state dicts swapped", "state value made a tensor", "renamed", "regrouped", "shared"]


@pytest.mark.parametrize("change", CHANGES)
def test_step_records_follow_the_optimizer_through_changes(tmp_path: Path, change: str) -> None:
    """The step boundary records what the optimizer holds at each step, and writes what recording each tensor
    alone (`record_tensor`) writes."""
    scenario = Scenario(change)
    got = train(tmp_path, change, scenario, reference=False)
    boundary = [(r[1], r[6], r[7]) for r in got if r[1] in (Kind.GRAD, Kind.PARAM, Kind.OPTSTATE)]
    assert boundary == scenario.want
    alone = train(tmp_path, change, Scenario(change), reference=True)
    assert len(got) == len(alone) > 0
    for g, w in zip(got, alone, strict=True):
        assert g == w


def _names(records: Records, at: int, kind: Kind) -> list[str]:
    return [r[2] for r in records if r[0] == at and r[1] == int(kind)]


def test_names_follow_the_optimizer_s_parameters_and_state(tmp_path: Path) -> None:
    """No stale name: a parameter added after the first steps, a state key added or renamed, parameters moved
    to another group, and parameters whose model is first seen after some steps are named for what they are
    from the step they appear."""
    added = train(tmp_path, "added", Scenario("added"), reference=False)
    assert _names(added, 1, Kind.GRAD) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert _names(added, 2, Kind.GRAD)[-2:] == ["3.weight", "3.bias"]
    keyed = train(tmp_path, "keyed", Scenario("state key added"), reference=False)
    assert "0.bias:extra" not in _names(keyed, 0, Kind.OPTSTATE)
    assert "0.bias:extra" in _names(keyed, 1, Kind.OPTSTATE)
    assert "0.bias:other" in _names(keyed, 2, Kind.OPTSTATE)
    assert "0.bias:extra" not in _names(keyed, 2, Kind.OPTSTATE)
    regrouped = train(tmp_path, "regrouped", Scenario("regrouped"), reference=False)
    assert _names(regrouped, 1, Kind.PARAM) == ["group0.param0", "group0.param1", "group0.param2", "group0.param3"]
    assert _names(regrouped, 2, Kind.PARAM) == ["group0.param0", "group0.param1", "group1.param0", "group1.param1"]
    renamed = train(tmp_path, "renamed", Scenario("renamed"), reference=False)
    assert _names(renamed, 1, Kind.PARAM)[0] == "group0.param0"
    assert _names(renamed, 2, Kind.PARAM)[0] == "0.weight"
    assert _names(renamed, 2, Kind.OPTSTATE)[0] == "0.weight:step"
    shared = train(tmp_path, "shared", Scenario("shared"), reference=False)
    assert _names(shared, 1, Kind.PARAM).count("2.bias") == 2
    assert "2.bias:momentum_buffer" in _names(shared, 1, Kind.OPTSTATE)


def test_frozen_parameters_without_gradients_are_left_out_of_the_gradients(tmp_path: Path) -> None:
    scenario = Scenario("none")
    scenario.model[0].weight.requires_grad_(False)
    got = train(tmp_path, "frozen", scenario, reference=False)
    assert _names(got, 1, Kind.GRAD) == ["0.bias", "2.weight", "2.bias"]
    assert all(r[5] & int(Flag.NO_DATA) == 0 for r in got)
