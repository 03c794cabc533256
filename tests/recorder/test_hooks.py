"""recorder/hooks.py: what a training step is when several optimizers step (two per iteration, a GAN's
alternating pair, gradient accumulation, an optimizer replaced mid-run). The hooks are called directly,
as torch's global hooks would call them, so nothing is installed in the test process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from detaudit.recorder.core import Recorder
from detaudit.recorder.hooks import Hooks
from detaudit.trace import Kind, TraceWriter, read_trace


class Pair(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Loop:
    """A model, an optimizer for each of its two submodules, and the hooks' view of a training loop."""

    def __init__(self, tmp_path: Path) -> None:
        torch.manual_seed(0)
        self.path = tmp_path / "t.trace"
        self.recorder = Recorder(TraceWriter(self.path, {"repeat": 0}))
        self.hooks = Hooks(self.recorder)
        self.model = Pair()
        self.body = torch.optim.SGD(self.model.body.parameters(), lr=0.1)
        self.head = torch.optim.SGD(self.model.head.parameters(), lr=0.1)

    def forward_backward(self) -> None:
        self.hooks._on_forward_pre(self.model, ())
        out = self.model(torch.ones(2, 3))
        self.hooks._on_forward(self.model, (), out)
        out.sum().backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.hooks._on_step_pre(optimizer, (), {})
        optimizer.step()
        self.hooks._on_step_post(optimizer, (), {})
        optimizer.zero_grad(set_to_none=True)

    def steps(self, kind: Kind, name: str) -> list[int]:
        """The step of each record of one kind and name, in record order."""
        self.recorder.close({"exit_code": 0})
        trace = read_trace(self.path)
        return [int(r["step"]) for r in trace.records if r["kind"] == int(kind) and trace.strings[r["name"]] == name]


def test_two_optimizers_stepping_one_after_the_other_share_the_step(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    for _ in range(3):
        loop.forward_backward()
        loop.step(loop.head)
        loop.step(loop.body)
    assert loop.recorder.step == 3
    assert loop.steps(Kind.GRAD, "head.weight") == [0, 1, 2]
    assert loop.steps(Kind.GRAD, "body.weight") == [0, 1, 2]
    assert loop.steps(Kind.PARAM, "body.weight") == [0, 1, 2]
    assert loop.steps(Kind.OUTPUT, "Pair") == [0, 1, 2]


def test_a_second_optimizer_that_joins_later_gets_the_step_of_its_iteration(tmp_path: Path) -> None:
    loop = Loop(tmp_path)  # the body is frozen for two steps, then both train
    for i in range(4):
        loop.forward_backward()
        loop.step(loop.head)
        if i >= 2:
            loop.step(loop.body)
    assert loop.recorder.step == 4
    assert loop.steps(Kind.GRAD, "head.weight") == [0, 1, 2, 3]
    assert loop.steps(Kind.GRAD, "body.weight") == [2, 3]


def test_alternating_optimizers_with_a_forward_between_are_one_step(tmp_path: Path) -> None:
    loop = Loop(tmp_path)  # a GAN's shape: the second update needs a forward after the first
    for _ in range(3):
        loop.forward_backward()
        loop.step(loop.head)
        loop.forward_backward()
        loop.step(loop.body)
    assert loop.recorder.step == 3
    assert loop.steps(Kind.GRAD, "head.weight") == [0, 1, 2]
    # from the second iteration on the later update ends the step; the first's is counted with the second
    assert loop.steps(Kind.GRAD, "body.weight") == [1, 1, 2]
    assert loop.steps(Kind.OUTPUT, "Pair") == [0, 1, 1, 1, 2, 2]


def test_gradient_accumulation_counts_optimizer_steps_not_backward_passes(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    for i in range(6):
        loop.forward_backward()
        if i % 3 == 2:
            loop.step(loop.head)
            loop.step(loop.body)
    assert loop.recorder.step == 2
    assert loop.steps(Kind.OUTPUT, "Pair") == [0, 0, 0, 1, 1, 1]
    assert loop.steps(Kind.GRAD, "body.weight") == [0, 1]


def test_an_optimizer_that_takes_over_counts_the_steps(tmp_path: Path) -> None:
    loop = Loop(tmp_path)  # head alone for two steps, then body alone (the head's optimizer is kept, unused)
    for i in range(5):
        loop.forward_backward()
        loop.step(loop.head if i < 2 else loop.body)
    assert loop.recorder.step == 5
    # its first step borrows the head's, the second tells it is the one stepping now
    assert loop.steps(Kind.GRAD, "head.weight") == [0, 1]
    assert loop.steps(Kind.GRAD, "body.weight") == [2, 3, 4]
    assert loop.steps(Kind.OUTPUT, "Pair") == [0, 1, 2, 2, 4]


def test_an_optimizer_whose_step_runs_the_forward_itself_is_no_partner_of_the_step_before(tmp_path: Path) -> None:
    """LBFGS after Adam: `step(closure)` runs the forward inside the step, right after the other's step."""
    loop = Loop(tmp_path)
    for _ in range(2):
        loop.forward_backward()
        loop.step(loop.head)
    for _ in range(3):  # the body's optimizer, stepping with a closure
        loop.hooks._on_step_pre(loop.body, (), {})
        loop.forward_backward()
        loop.body.step()
        loop.hooks._on_step_post(loop.body, (), {})
        loop.body.zero_grad(set_to_none=True)
    assert loop.recorder.step == 5  # five optimizer steps, five training steps
    assert loop.steps(Kind.OUTPUT, "Pair") == [0, 1, 2, 3, 4]


class Normed(torch.nn.Module):
    """A model with state beside its parameters: BatchNorm's running statistics and step counter, and an
    EMA shadow kept as a buffer."""

    def __init__(self, momentum: float = 0.1) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.bn = torch.nn.BatchNorm1d(3, momentum=momentum)
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn(self.fc(x))
        with torch.no_grad():
            self.ema.mul_(0.9).add_(out.mean(0), alpha=0.1)
        return out


def _buffer_records(path: Path) -> list[tuple[int, str, int]]:
    trace = read_trace(path)
    return [(int(r["step"]), trace.strings[r["name"]], int(r["digest"])) for r in trace.records
            if r["kind"] == int(Kind.BUFFER)]


def _train(tmp_path: Path, momentum: float, name: str) -> list[tuple[int, str, int]]:
    torch.manual_seed(0)
    path = tmp_path / name
    recorder = Recorder(TraceWriter(path, {"repeat": 0}))
    hooks = Hooks(recorder)
    model = Normed(momentum)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        hooks._on_forward_pre(model, ())
        out = model(torch.arange(6.0).view(2, 3))
        hooks._on_forward(model, (), out)
        out.sum().backward()
        hooks._on_step_pre(optimizer, (), {})
        optimizer.step()
        hooks._on_step_post(optimizer, (), {})
    recorder.close({"exit_code": 0})
    return _buffer_records(path)


def test_buffers_are_recorded_with_the_parameters_after_each_step_and_differ_with_their_updates(
        tmp_path: Path) -> None:
    records = _train(tmp_path, 0.1, "a.trace")
    names = ["ema", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    # the first forward, before any optimizer step, records them as inference would; then each step
    assert [(s, n) for s, n, _ in records] == [(s, n) for s in (0, 0, 1) for n in names]
    assert records == _train(tmp_path, 0.1, "b.trace")  # deterministic: equal digests
    other = _train(tmp_path, 0.2, "c.trace")  # another BatchNorm momentum: other running statistics
    differ = [n for (_, n, d), (_, _, e) in zip(records, other, strict=True) if d != e]
    assert set(differ) == {"bn.running_mean", "bn.running_var"}  # the counter counts the same; the EMA tracks
    # normalised outputs, which momentum does not change


def test_in_inference_a_buffer_is_recorded_when_a_forward_changed_it(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    recorder = Recorder(TraceWriter(path, {"repeat": 0}))
    hooks = Hooks(recorder)
    model = Normed()
    model.bn.eval()  # running statistics are used, not updated; the EMA still moves
    for _ in range(3):
        hooks._on_forward_pre(model, ())
        out = model(torch.ones(2, 3))
        hooks._on_forward(model, (), out)
    recorder.close({"exit_code": 0})
    names = [n for _, n, _ in _buffer_records(path)]
    # the first forward records every buffer once; later ones only the EMA, which each forward wrote
    assert names == ["ema", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "ema", "ema"]


def test_gradients_under_step_closure_are_recorded_at_the_step_they_belong_to(tmp_path: Path) -> None:
    """Lightning and LBFGS run forward and backward inside `step(closure)`: the gradients present before
    the step are the previous step's (none at the first), so they are recorded when the closure returns."""
    loop = Loop(tmp_path)

    def closure() -> torch.Tensor:
        loop.body.zero_grad(set_to_none=True)
        loop.forward_backward()
        return torch.zeros(())

    for i in range(3):
        args, kwargs = (loop.body, closure), {}
        if i == 1:  # Lightning passes it by keyword
            args, kwargs = (loop.body,), {"closure": closure}
        new_args, new_kwargs = loop.hooks._on_step_pre(loop.body, args, kwargs)
        new_args[0].step(*new_args[1:], **new_kwargs)
        loop.hooks._on_step_post(loop.body, new_args, new_kwargs)
        loop.body.zero_grad(set_to_none=True)
    assert loop.steps(Kind.GRAD, "body.weight") == [0, 1, 2]  # before: none at step 0, step k-1's at step k
    assert loop.steps(Kind.GRAD, "head.weight") == []  # not this optimizer's parameters


# -- Lightning's calling pattern, emulated (Lightning is not installed): a LightningModule-like wrapper whose
#    training_step calls its submodules, and optimizer.step(closure) running forward and backward --------------

class Lit(torch.nn.Module):
    """Two Sequentials, each of whose parameters is `0.weight` inside it; forward never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 3))
        self.head = torch.nn.Sequential(torch.nn.Linear(3, 1))
        self.scale = torch.nn.Parameter(torch.ones(1))

    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        return (self.head(self.net(x)) * self.scale).sum()


def installed(tmp_path: Path) -> tuple[Recorder, Path, list[Any]]:
    """A recorder with its hooks installed globally, the way a repeat runs (removed by the caller)."""
    path = tmp_path / "t.trace"
    recorder = Recorder(TraceWriter(path, {"repeat": 0}))
    hooks = Hooks(recorder)
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer as optim
    handles = [nn_module.register_module_forward_pre_hook(hooks.guard(hooks._on_forward_pre)),
               nn_module.register_module_forward_hook(hooks.guard(hooks._on_forward)),
               optim.register_optimizer_step_pre_hook(hooks.guard(hooks._on_step_pre)),
               optim.register_optimizer_step_post_hook(hooks.guard(hooks._on_step_post))]
    return recorder, path, handles


def names(path: Path, kind: Kind) -> list[str]:
    trace = read_trace(path)
    return [trace.strings[r["name"]] for r in trace.records if r["kind"] == int(kind)]


def test_parameters_are_named_from_the_module_that_holds_them_under_a_closure_step(tmp_path: Path) -> None:
    recorder, path, handles = installed(tmp_path)
    try:
        lit = Lit()
        opt = torch.optim.SGD(lit.parameters(), lr=0.1)
        for _ in range(2):
            def closure() -> torch.Tensor:
                opt.zero_grad()
                loss = lit.training_step(torch.ones(2, 3))
                loss.backward()
                return loss
            opt.step(closure)
    finally:
        for h in handles:
            h.remove()
    recorder.close({"exit_code": 0})
    params = ["scale", "net.0.weight", "net.0.bias", "head.0.weight", "head.0.bias"]
    assert names(path, Kind.GRAD) == params * 2
    assert names(path, Kind.PARAM) == params * 2
    assert names(path, Kind.OUTPUT)[:2] == ["net.0", "net"]
    assert "net.input[0]" in names(path, Kind.INPUT)
    assert recorder.step == 2


def test_torch_compiles_wrapper_is_no_holder_of_the_module_it_wraps() -> None:
    """The OptimizedModule calls the module it wraps from its own methods, as a LightningModule's training_step
    calls its submodules; taken for a holder, it named the compiled model '' (CharGPT.input[0] became .input[0])."""
    from detaudit.recorder.hooks import _holder

    inner = torch.nn.Linear(2, 2)

    def hook() -> torch.nn.Module | None:  # where the forward hook asks, two frames below the caller's method
        return _holder(inner)

    def method(self: torch.nn.Module) -> torch.nn.Module | None:
        return hook()

    assert method(torch.compile(inner, backend="eager")) is None
    lit = torch.nn.Sequential(inner)
    assert method(lit) is lit  # a module holding it is one


def test_gradients_the_script_assigns_itself_carry_the_parameters_names(tmp_path: Path) -> None:
    recorder, path, handles = installed(tmp_path)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(3, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        params = dict(model.named_parameters())

        def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.func.functional_call(model, p, (torch.ones(1, 3),)).sum()

        grads = torch.func.grad(loss)({k: v.detach() for k, v in params.items()})
        for k, p in params.items():
            p.grad = grads[k]
        opt.step()
    finally:
        for h in handles:
            h.remove()
    recorder.close({"exit_code": 0})
    assert names(path, Kind.GRAD) == ["0.weight", "0.bias"]


def test_a_gan_loop_counts_one_step_per_iteration(tmp_path: Path) -> None:
    """The discriminator's update, then the generator's after a forward of its own: once the discriminator
    steps again the iteration is known, and the generator's update ends each step from then on, so five
    iterations are five steps (and --max-steps 2 stops after two whole iterations)."""
    loop = Loop(tmp_path)
    updates: list[str] = []
    ended: list[int] = []  # how many updates had run when each step ended (where --max-steps stops)
    loop.recorder.step_callbacks.append(lambda step: ended.append(len(updates)))
    for i in range(5):
        loop.forward_backward()
        updates.append(f"D{i}")
        loop.step(loop.head)
        loop.forward_backward()
        updates.append(f"G{i}")
        loop.step(loop.body)
    assert loop.recorder.step == 5
    assert ended == [1, 4, 6, 8, 10]
    # the first iteration's generator update is counted with the second's
    assert loop.steps(Kind.GRAD, "body.weight") == [1, 1, 2, 3, 4]
