"""recorder/batchprobe.py in process: row comparison, batch dims, and the probe on real modules."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from detaudit.batch.diagnosis import diagnose_batch
from detaudit.batch.finding import analyse
from detaudit.recorder import batchprobe, location
from detaudit.recorder.batchprobe import BatchProbe, ProbeSettings
from detaudit.recorder.batchrows import (
    Rows,
    batch_rows,
    compare_rows,
    compare_values,
    default_sizes,
    halving_ladder,
)
from detaudit.recorder.core import Recorder
from detaudit.trace import TraceWriter, read_trace


def test_the_ladder_halves_the_batch_down_to_one_row_as_pytorchs_harness_does() -> None:
    assert halving_ladder(256) == [128, 64, 32, 16, 8, 4, 2, 1]
    assert halving_ladder(48) == [24, 12, 6, 3, 1]
    assert halving_ladder(2) == [1]


def test_default_sizes_are_the_ladder_and_an_odd_size_it_lacks() -> None:
    assert default_sizes(256) == [1, 2, 4, 7, 8, 16, 32, 64, 128]
    assert default_sizes(14) == [1, 3, 7]  # 7 is a rung already
    assert default_sizes(2) == [1]


def test_rows_are_compared_bit_for_bit_with_ulp_and_magnitude() -> None:
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = a.clone()
    assert compare_rows(a, b).agree
    b[1, 0] = torch.nextafter(b[1, 0], torch.tensor(10.0))
    diff = compare_rows(a, b)
    assert (diff.differ, diff.max_ulp, diff.scale) == (1, 1, 4.0)
    assert diff.max_abs > 0
    signed_zero = compare_rows(torch.tensor([[0.0]]), torch.tensor([[-0.0]]))
    assert signed_zero.differ == 1  # bits, not values


def test_a_batch_folded_into_a_bigger_dim_is_compared_row_by_row() -> None:
    full = torch.arange(24.0).reshape(12, 2)  # 4 rows of 3 entries each, flattened (a matmul's view)
    part = full[:6].clone()  # the first 2 rows
    rows = Rows(2, torch.arange(2), torch.arange(2))
    assert compare_values(full, part, 4, rows, 0).agree
    part[5, 1] += 1
    diff = compare_values(full, part, 4, rows, 0)
    assert diff.differ == 1
    assert not diff.shape_differs


def test_a_sequence_first_batch_folded_into_a_bigger_dim_is_compared_row_by_row() -> None:
    steps = torch.randn(3, 4, 2)  # (time, 4 rows, features), flattened time-major as nn.MultiheadAttention does
    rows = Rows(2, torch.arange(2), torch.arange(2))
    assert compare_values(steps.reshape(12, 2), steps[:, :2].reshape(6, 2), 4, rows, 0).agree


def test_a_value_reduced_over_the_batch_differs_whole_and_is_left_out_of_row_results() -> None:
    rows = Rows(1, torch.arange(1), torch.arange(1))
    assert compare_values(torch.tensor(5.0), torch.tensor(2.0), 4, rows, 0).whole_differs
    left_out = compare_values(torch.tensor(5.0), torch.tensor(2.0), 4, rows, 0, whole=False)
    assert left_out.agree
    assert left_out.uncompared == 1


def _probed(tmp_path: Path, run: Callable[[], Any], **settings: Any) -> list[dict[str, Any]]:
    path = tmp_path / "t.trace"
    recorder = Recorder(TraceWriter(path, {"repeat": 0}))
    probe = BatchProbe(recorder, lambda m: type(m).__name__, ProbeSettings(**settings))
    probe.install()
    try:
        run()
    finally:
        probe.remove()
        recorder.close({"exit_code": 0})
    return read_trace(path).events


class _PerRow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.norm(self.embed(ids)), -1)


def test_a_model_of_per_row_ops_is_batch_invariant(tmp_path: Path) -> None:
    model = _PerRow().eval()
    events = _probed(tmp_path, lambda: [model(torch.randint(0, 50, (40, 5))) for _ in range(2)])
    finding = analyse(events)  # type: ignore[arg-type]
    assert finding.verdict == "batch-invariant"
    assert finding.probed_calls == 2
    assert {(s.kind, s.size) for s in finding.subsets} >= {("prefix", 1), ("prefix", 7), ("reversed", 40),
                                                          ("mixed", 40)}


def test_a_linear_blocked_by_batch_size_is_variant_at_its_first_linear(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)).eval()
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randn(256, 64)))
    first = analyse(events).first_variant  # type: ignore[arg-type]
    assert first is not None
    assert not first.large
    assert first.module is not None
    assert (first.module.name, first.module.cls) == ("0", "Linear")
    assert first.op is not None
    assert first.op.name == "aten.addmm"
    assert "1" in first.differ
    assert "32" in first.agree
    assert "128" in first.agree


def test_torch_layers_probed_in_the_forked_copy_are_placed_at_the_scripts_call_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy's thread holds no line of the script's: an `nn.Sequential` of torch layers has none in its
    forward, so its modules and ops are placed where the script made the call (not at threading.py)."""
    monkeypatch.setattr(location, "_skip_prefixes", (location.package_dir(torch), *location.own_code()))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)).eval()
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randn(256, 64)))
    [call] = [e for e in events if e["type"] == "batch-call"]
    [origin] = [e for e in events if e["type"] == "batch-origin"]
    assert {origin["first_module"]["loc"], origin["first_op"]["loc"]} == {call["loc"]}


class _Counting(nn.Module):
    """State a forward changes: a buffer and a plain attribute (a cache's length)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen += 1
        return self.lin(x) + torch.rand(()) * 0


def test_probes_leave_the_modules_state_and_the_rng_as_a_plain_run_has_them(tmp_path: Path) -> None:
    def script() -> tuple[float, float, int, torch.Tensor]:
        torch.manual_seed(7)
        model = _Counting()
        with torch.no_grad():
            out = [model(torch.randn(16, 8)) for _ in range(3)]
        return float(model.calls), torch.rand(()).item(), model.seen, torch.cat(out)

    plain = script()
    probed: list[Any] = []
    events = _probed(tmp_path, lambda: probed.append(script()))
    assert probed[0][:3] == plain[:3]
    assert torch.equal(probed[0][3], plain[3])
    assert [e["why"] for e in events if e["type"] == "batch-skip"] == ["random"] * 3  # it draws: not comparable


class _NumpyNoise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import numpy as np

        return x + float(np.random.rand()) * 0


def test_a_forward_drawing_from_numpy_is_not_comparable_and_its_draws_are_put_back(tmp_path: Path) -> None:
    import numpy as np

    def script() -> float:
        np.random.seed(3)
        _NumpyNoise()(torch.ones(4, 2))
        return float(np.random.rand())

    plain = script()
    seen: list[float] = []
    events = _probed(tmp_path, lambda: seen.append(script()))
    assert seen == [plain]
    assert [e["why"] for e in events if e["type"] == "batch-skip"] == ["random"]


class _InPlace(nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        scale.add_(1)
        return x.mul_(2)


def test_a_forward_writing_into_its_arguments_writes_into_the_probes_copies(tmp_path: Path) -> None:
    x, scale = torch.ones(4, 3), torch.zeros(3)
    _probed(tmp_path, lambda: _InPlace()(x, scale))
    assert torch.equal(x, torch.full((4, 3), 2.0))
    assert torch.equal(scale, torch.ones(3))


def test_batch_norm_in_train_mode_and_dropout_are_reported_not_comparable(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    events = _probed(tmp_path, lambda: model(torch.randn(8, 4)))
    [skip] = [e for e in events if e["type"] == "batch-skip"]
    assert skip["why"] == "batch-statistics"
    assert "Dropout" in skip["detail"]
    assert int(model[1].num_batches_tracked) == 1
    assert not torch.equal(model[1].running_mean, before["1.running_mean"])


class _MeanLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.fc(x) - y) ** 2).mean()


def test_a_model_whose_only_output_is_a_batch_mean_loss_is_skipped_with_the_reason(tmp_path: Path) -> None:
    model = _MeanLoss()
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randn(8, 4), torch.randn(8, 1)))
    [skip] = [e for e in events if e["type"] == "batch-skip"]
    assert (skip["why"], "output (0-d)" in skip["detail"]) == ("aggregate-output", True)


class _ScoresAndLoss(_MeanLoss):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        scores = self.fc(x)
        return scores, ((scores - y) ** 2).mean()


def test_an_aggregate_beside_row_outputs_is_listed_as_not_compared(tmp_path: Path) -> None:
    model = _ScoresAndLoss()
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randn(8, 4), torch.randn(8, 1)))
    [call] = [e for e in events if e["type"] == "batch-call"]
    assert call["not_compared"] == ["output[1] (0-d)"]


class _NoisyWhenSmall(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand(1) if x.shape[0] < 4 else x  # draws for some batch sizes only


def test_each_size_starts_from_the_calls_rng_states(tmp_path: Path) -> None:
    model = _NoisyWhenSmall()
    events = _probed(tmp_path, lambda: model(torch.zeros(8, 4)))
    [call] = [e for e in events if e["type"] == "batch-call"]
    noise = {s["size"]: s["max_abs_diff"] for s in call["subsets"] if s["size"] < 4}
    assert noise[1] > 0
    assert noise[1] == noise[2]  # both drew the same number: each size started from the call's states


def test_a_call_without_a_batch_is_counted_with_its_reason(tmp_path: Path) -> None:
    model = nn.Linear(3, 3)
    events = _probed(tmp_path, lambda: (model(torch.randn(1, 3)), nn.Identity()(3.0)))
    assert [e["why"] for e in events if e["type"] == "batch-skip"] == ["no-batch", "no-batch"]


def test_a_forward_that_raises_leaves_later_calls_probed(tmp_path: Path) -> None:
    model = nn.Linear(3, 3)

    def script() -> None:
        with pytest.raises(RuntimeError):
            model(torch.randn(4, 5))
        model(torch.randn(4, 3))

    events = _probed(tmp_path, script)
    assert [e["call"] for e in events if e["type"] == "batch-call"] == [0]


def test_module_picks_the_probed_calls_by_name(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    events = _probed(tmp_path, lambda: model(torch.randn(6, 4)), module="ReLU")
    assert [e["module"] for e in events if e["type"] == "batch-call"] == ["ReLU"]


def test_the_batch_dim_option_finds_rows_elsewhere(tmp_path: Path) -> None:
    model = nn.GRU(4, 4)  # (time, batch, features)
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randn(3, 10, 4)), batch_dim=1)
    [call] = [e for e in events if e["type"] == "batch-call"]
    assert call["rows"] == 10
    assert call["batch_dim"] == 1


class _SequenceFirst(nn.Module):
    def __init__(self, transpose: bool) -> None:
        super().__init__()
        self.transpose = transpose
        self.embed = nn.Embedding(50, 8)
        self.rnn = nn.GRU(8, 8)  # batch_first=False: (time, batch, features)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.rnn(x.transpose(0, 1) if self.transpose else x)[0]


def test_a_sequence_first_rnn_is_probed_along_the_batch_it_declares(tmp_path: Path) -> None:
    model = _SequenceFirst(transpose=False).eval()
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randint(0, 50, (5, 12))))  # (time, batch)
    [call] = [e for e in events if e["type"] == "batch-call"]
    assert (call["batch_dim"], call["rows"], call["batch_dim_from"]) == (1, 12, "declared")


def test_batch_first_ids_transposed_into_a_sequence_first_rnn_keep_dim_0(tmp_path: Path) -> None:
    model = _SequenceFirst(transpose=True).eval()
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randint(0, 50, (12, 5))))  # (batch, time)
    [call] = [e for e in events if e["type"] == "batch-call"]
    assert (call["batch_dim"], call["rows"]) == (0, 12)


def test_a_sequence_as_long_as_its_batch_is_not_probed_and_says_why(tmp_path: Path) -> None:
    model = _SequenceFirst(transpose=False).eval()
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randint(0, 50, (6, 6))))
    assert [e["why"] for e in events if e["type"] == "batch-skip"] == ["batch-dim-unknown"]


def test_a_failing_hook_stops_the_probing_not_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("no rng")

    monkeypatch.setattr(batchprobe, "_RngGuard", broken)
    model = nn.Linear(2, 2)
    events = _probed(tmp_path, lambda: [model(torch.randn(4, 2)) for _ in range(2)])
    assert [(e["why"], e["detail"]) for e in events] == [("probe-failed", "probing stopped here: RuntimeError: no rng")]


def test_a_failing_probe_never_breaks_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(batchprobe.BatchProbe, "_probe", broken)
    model = nn.Linear(2, 2)
    events = _probed(tmp_path, lambda: model(torch.randn(4, 2)))
    assert [(e["why"], e["detail"]) for e in events if e["type"] == "batch-skip"] == [("probe-failed",
                                                                                      "RuntimeError: boom")]


def test_the_origin_search_keeps_weights_by_reference_and_activations_as_copies(tmp_path: Path) -> None:
    model = nn.Linear(4, 4)
    x = torch.randn(6, 4)
    runner = batchprobe._Runner(BatchProbe(Recorder(TraceWriter(tmp_path / "t.trace", {"repeat": 0})),
                                           lambda m: None, ProbeSettings()),
                                model, model, (x,), {}, [0], 0)
    assert runner._keep(model.weight) is model.weight
    assert runner._keep(model.weight.t())._base is model.weight
    kept = runner._keep(x)
    assert kept is not x
    assert torch.equal(kept, x)


def test_a_call_after_a_smaller_one_is_mixed_only_when_the_smaller_has_the_rows_to_fill_it(tmp_path: Path) -> None:
    model = nn.Embedding(50, 8).eval()  # the 7-row call's mixed probe once took 3 rows from a 2-row call: IndexError
    events = _probed(tmp_path, lambda: [model(torch.randint(0, 50, (n, 5))) for n in (2, 7, 7)])
    assert [e["type"] for e in events] == ["batch-call"] * 3
    assert [[s["subset"] for s in e["subsets"] if s["subset"] == "mixed"] for e in events] == [[], [], ["mixed"]]


class _Centred(nn.Module):
    """Every row minus the batch's mean: a reduction over the batch that reaches each row's result."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept = x.std()  # a value kept aside, which differs too
        return x - x.mean()


class _ScaledByItem(nn.Module):
    """The batch's largest value reaches the rows through a Python number, which the data flow cannot follow."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.abs().amax().item()


def _first_op(tmp_path: Path, model: nn.Module) -> Any:
    torch.manual_seed(0)
    events = _probed(tmp_path, lambda: model(torch.randn(32, 8)))
    return analyse(events).first_variant  # type: ignore[arg-type]


def test_a_reduction_over_the_batch_that_reaches_the_output_is_where_it_starts(tmp_path: Path) -> None:
    first = _first_op(tmp_path, _Centred())
    assert (first.op.name, first.op.across_rows, first.large) == ("aten.mean", True, True)
    assert "aten.std" in first.note  # the value kept aside: a note, not the start


def test_a_reduction_reaching_the_output_through_a_python_number_is_still_found(tmp_path: Path) -> None:
    first = _first_op(tmp_path, _ScaledByItem())
    assert (first.op.name, first.op.across_rows) == ("aten.amax", True)



def test_an_ops_workspace_is_never_compared_as_a_result_of_its_rows() -> None:
    # oneDNN's LSTM returns a workspace beside its results while autograd records (the probes run under no_grad,
    # but a kernel's reserve need not follow the grad mode), whose size follows the batch's and whose bytes it
    # need not define: the origin search gets its results only
    handed: dict[str, Any] = {}
    lstm = nn.LSTM(4, 4)
    with batchprobe._Watch(lambda *call: handed.setdefault(call[1], call[5]), [], torch.clone):
        lstm(torch.randn(3, 2, 4))
    outputs = handed["aten.mkldnn_rnn_layer"]
    assert [o is None for o in outputs] == [False, False, False, True]


def test_batch_first_labels_and_padding_masks_beside_a_sequence_first_input_have_their_rows_along_dim_0() -> None:
    found = batch_rows((torch.zeros(5, 12, 8), torch.zeros(12, dtype=torch.long), torch.zeros(12, 5),
                        torch.arange(5)), {}, 1)  # (seq, batch, features), labels, a padding mask, positions
    assert (found.dims if found is not None else None) == [1, 0, 0, None]


class _SequenceFirstScorer(nn.Module):
    """A sequence-first LSTM scoring each row against its batch-first label: a per-row loss."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(8, 16)  # batch_first=False: (time, batch, features)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.head(self.rnn(x)[0][-1]), labels, reduction="none")


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], bool]:
    """The scorer probed on 16 rows of 12 steps, and whether plain torch finds a row subset along the batch that
    differs (the sizes the probe takes: the ladder, 7, the batch reversed)."""
    torch.manual_seed(0)
    model = _SequenceFirstScorer().eval()
    x, labels = torch.randn(12, 16, 8), torch.randint(0, 3, (16,))
    with torch.no_grad():
        events = _probed(tmp_path_factory.mktemp("labelled"), lambda: model(x, labels))
        whole = model(x, labels)
        differ = any(not torch.equal(model(x[:, :k], labels[:k]), whole[:k]) for k in default_sizes(16)) \
            or not torch.equal(model(x.flip(1), labels.flip(0)).flip(0), whole)
    return events, differ


def test_a_sequence_first_model_with_batch_first_labels_is_probed_along_its_batch(
        labelled: tuple[list[dict[str, Any]], bool]) -> None:
    [call] = [e for e in labelled[0] if e["type"] == "batch-call"]
    assert (call["batch_dim"], call["rows"]) == (1, 16)


def test_a_sequence_first_model_with_batch_first_labels_is_as_variant_as_plain_torch_finds_it(
        labelled: tuple[list[dict[str, Any]], bool]) -> None:
    finding = analyse(labelled[0])  # type: ignore[arg-type]
    assert finding.verdict == ("batch-variant" if labelled[1] else "batch-invariant")


def test_a_sequence_first_model_s_batch_first_labels_are_never_a_rows_mixing_bug(
        labelled: tuple[list[dict[str, Any]], bool]) -> None:
    assert "batch-rows-mix" not in [c.id for c in diagnose_batch(analyse(labelled[0]))]  # type: ignore[arg-type]


class _TimeMajorLinear(nn.Module):
    """nn.Linear over a (batch, time, features) input turned time-major: a transposed 3-d input, which one row
    leaves foldable in place (`aten.view`, `aten.addmm`) and more rows do not (`aten.clone`, `aten.mm`, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.transpose(0, 1)).transpose(0, 1)


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two intra-op threads (the suite runs at one, where `aten.mm` and `aten.addmm` round alike here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
def test_a_path_the_batch_changes_is_named_by_the_op_that_computes_on_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _TimeMajorLinear().eval()
    x = torch.randn(16, 5, 32)
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(x))
        whole = model(x)
        differ = any(not torch.equal(model(x[:k]), whole[:k]) for k in default_sizes(16))
    first = analyse(events).first_variant  # type: ignore[arg-type]
    assert (first.op.name if first is not None and first.op is not None else None) == \
        ("aten.mm" if differ else None)



def test_a_sequence_first_encoder_with_its_masks_is_probed_along_its_declared_batch(tmp_path: Path) -> None:
    layer = nn.TransformerEncoderLayer(16, nhead=2, dim_feedforward=32, dropout=0.0)  # batch_first=False
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)  # (seq, seq)
    padding = torch.zeros(12, 5, dtype=torch.bool)  # (batch, seq): with the causal mask, 2 of 3 dim-1 sizes are 5
    with torch.no_grad():
        events = _probed(tmp_path, lambda: model(torch.randn(5, 12, 16), mask=causal, src_key_padding_mask=padding))
    [call] = [e for e in events if e["type"] == "batch-call"]
    assert (call["batch_dim"], call["rows"]) == (1, 12)
