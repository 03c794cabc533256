"""The root-cause rule over op records (detaudit/compare/oprules.py), on hand-written traces."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
import torch
import torch.nn as nn
from recording import here, record
from rich.console import Console
from synthetic import Rec, write_run

from detaudit.audit.pipeline import load_run
from detaudit.cli.render import op_panel, render
from detaudit.compare import align
from detaudit.compare.oprules import OpFinding, find_op_source, op_level_note, traced_note, update_differs
from detaudit.recorder.core import Recorder
from detaudit.report.html import render_html
from detaudit.report.junit import to_junit
from detaudit.report.model import report_json
from detaudit.results import Divergence, RecordInfo
from detaudit.trace import Flag, Kind, TraceWriter


@dataclass(frozen=True)
class Op:
    """One record of an op-granularity trace, as a test writes it."""

    name: str
    out: int
    ins: tuple[int, int] = (11, 12)
    kind: Kind = Kind.OP
    flags: int = 0
    node: str = ""
    module: str = "net.0"
    loc: str = "train.py:10"
    step: int = 0

    def but(self, **changes: Any) -> Op:
        return replace(self, **changes)


def write_ops(path: Path, records: Sequence[Op]) -> Path:
    writer = TraceWriter(path, {"repeat": 0, "granularity": "op"})
    for r in records:
        writer.add((int(r.kind), 1, r.flags, 0, writer.intern(r.name), writer.intern(r.module), writer.intern(r.loc),
                    r.step, writer.intern("4"), writer.intern(r.node), r.out, r.ins[0], r.ins[1], (0.0,) * 4))
    writer.close({"exit_code": 0})
    return path


def traces(tmp_path: Path, *repeats: Sequence[Op]) -> list[Path]:
    return [write_ops(tmp_path / f"ops-{i}.trace", recs) for i, recs in enumerate(repeats)]


BASE = [
    Op("aten.addmm.default", 1),
    Op("aten.relu.default", 2),
    Op("aten.mm.default", 3, flags=Flag.BACKWARD, node="AddmmBackward0", loc="train.py:12"),
    Op("aten.index_put.default", 4, flags=Flag.BACKWARD, node="IndexBackward0", loc="train.py:14"),
    Op("aten.add_.Tensor", 5, module="optimizer SGD"),
    Op("net.0.weight", 6, kind=Kind.PARAM, ins=(0, 0)),
]


def diverge(records: list[Op], at: int, *, ins_from: int | None = None, ordered_only: bool = False) -> list[Op]:
    """Repeat 1 of `records`: outputs differ from `at` on; inputs differ from `ins_from` on."""
    out = []
    for i, r in enumerate(records):
        if i >= at:
            r = r.but(out=r.out + 1000)
        if ins_from is not None and i >= ins_from and r.kind == Kind.OP:
            r = r.but(ins=(r.ins[0] + 1000, r.ins[1] + (0 if ordered_only and i == ins_from else 1000)))
        out.append(r)
    return out


def test_an_op_whose_inputs_match_but_output_differs_is_nondeterministic(tmp_path: Path) -> None:
    finding = find_op_source(traces(tmp_path, BASE, diverge(BASE, 3, ins_from=4)))
    assert finding is not None
    assert finding.verdict == "nondeterministic-op"
    assert (finding.record.op, finding.record.phase, finding.record.node) == (
        "aten.index_put.default", "backward", "IndexBackward0")
    assert finding.record.location == "train.py:14"
    assert finding.record.index == 3
    assert finding.repeats == [1]
    table = [(n.record.index, n.inputs, n.output, n.chosen) for n in finding.neighbours]
    assert table == [(0, "match", "match", False), (1, "match", "match", False), (2, "match", "match", False),
                     (3, "match", "differ", True), (4, "differ", "differ", False), (5, "", "differ", False)]
    assert "nondeterministic" in finding.summary
    assert "train.py:14" in finding.summary


@pytest.mark.parametrize(("flag", "verdict"), [(Flag.RANDOM, "random-op"), (Flag.UNINIT, "uninitialized-memory")])
def test_flags_of_the_source_op_name_the_mechanism(tmp_path: Path, flag: int, verdict: str) -> None:
    base = [r.but(flags=r.flags | flag) if i == 1 else r for i, r in enumerate(BASE)]
    finding = find_op_source(traces(tmp_path, base, diverge(base, 1, ins_from=2)))
    assert finding is not None
    assert finding.verdict == verdict
    assert finding.record.index == 1
    # the table never calls what an op read from never-written memory a match
    assert [n.inputs for n in finding.neighbours if n.record.index == 1] == \
        ["unwritten" if flag == Flag.UNINIT else "match"]


def test_same_inputs_in_another_order_is_an_order_finding(tmp_path: Path) -> None:
    finding = find_op_source(traces(tmp_path, BASE, diverge(BASE, 1, ins_from=1, ordered_only=True)))
    assert finding is not None
    assert finding.verdict == "input-order"
    assert finding.record.op == "aten.relu.default"
    assert finding.neighbours[1].inputs == "reordered"


def test_a_source_that_leads_nowhere_is_passed_over_for_one_that_propagates(tmp_path: Path) -> None:
    # an op at 0 differs (say random init later overwritten) but the next divergent op at 2 has matching
    # inputs: the divergence at 0 did not reach it. Op 2's does reach op 3 and the parameter.
    base = [BASE[0].but(flags=Flag.RANDOM), BASE[1], *BASE[2:]]
    rep = [r.but(out=r.out + 1000) if i in (0, 2, 3, 4, 5) else r for i, r in enumerate(base)]
    rep = [r.but(ins=(r.ins[0] + 1000, r.ins[1] + 1000)) if i in (3, 4) else r for i, r in enumerate(rep)]
    finding = find_op_source(traces(tmp_path, base, rep))
    assert finding is not None
    assert finding.record.index == 2
    assert finding.verdict == "nondeterministic-op"


def test_outputs_of_one_op_call_count_as_one_source(tmp_path: Path) -> None:
    base = [BASE[0], Op("aten.native_dropout.default", 2, flags=Flag.RANDOM),
            Op("aten.native_dropout.default[1]", 3, flags=Flag.RANDOM), *BASE[2:]]
    finding = find_op_source(traces(tmp_path, base, diverge(base, 1, ins_from=3)))
    assert finding is not None
    assert finding.record.index == 1
    assert finding.verdict == "random-op"


def test_back_to_back_sources_are_one_run_named_by_its_first(tmp_path: Path) -> None:
    base = [Op("aten.uniform_.default", 1 + i, flags=Flag.RANDOM, module=f"layer{i}") for i in range(3)]
    base += [Op("aten.convolution.default", 9, module="layer0")]
    finding = find_op_source(traces(tmp_path, base, diverge(base, 0, ins_from=3)))
    assert finding is not None
    assert finding.record.index == 0
    assert finding.record.module == "layer0"


def test_inputs_that_differ_walk_back_to_the_record_they_came_from(tmp_path: Path) -> None:
    base = [Op("Net.input[0]", 9, kind=Kind.INPUT, ins=(0, 0), loc="train.py:30"), *BASE]
    finding = find_op_source(traces(tmp_path, base, diverge(base, 0, ins_from=1)))
    assert finding is not None
    assert finding.verdict == "inputs-differ"
    assert finding.record.index == 1
    assert finding.origin is not None
    assert finding.origin.name == "Net.input[0]"
    assert "started to differ at input Net.input[0] (train.py:30)" in finding.summary


def test_inputs_that_differ_with_nothing_recorded_before_them(tmp_path: Path) -> None:
    finding = find_op_source(traces(tmp_path, BASE, diverge(BASE, 0, ins_from=0)))
    assert finding is not None
    assert finding.verdict == "inputs-differ"
    assert finding.origin is None
    assert "outside torch" in finding.summary


def test_repeats_that_ran_different_ops(tmp_path: Path) -> None:
    rep = [*BASE[:2], BASE[2].but(name="aten.bmm.default"), *BASE[3:]]
    finding = find_op_source(traces(tmp_path, BASE, rep))
    assert finding is not None
    assert finding.verdict == "different-ops"
    assert finding.others[1].op == "aten.bmm.default"
    assert finding.record.op == "aten.mm.default"
    assert [n.record.index for n in finding.neighbours] == [0, 1, 2]


def test_ops_with_unknown_inputs_are_never_called_sources(tmp_path: Path) -> None:
    base = [r.but(ins=(0, 0)) if i == 3 else r for i, r in enumerate(BASE)]
    finding = find_op_source(traces(tmp_path, base, diverge(base, 3, ins_from=4)))
    assert finding is not None
    assert finding.verdict == "inputs-differ"
    assert finding.record.index == 4
    assert {n.record.index: n.inputs for n in finding.neighbours}[3] == "unknown"


def test_nothing_to_say_without_divergent_ops(tmp_path: Path) -> None:
    assert find_op_source(traces(tmp_path, BASE, BASE)) is None
    params = [Op("w", 1, kind=Kind.PARAM), Op("b", 2, kind=Kind.PARAM)]
    (tmp_path / "params").mkdir()
    assert find_op_source(traces(tmp_path / "params", params, [params[0], params[1].but(out=7)])) is None


def test_repeats_on_other_devices_are_not_compared_bitwise(tmp_path: Path) -> None:
    paths = traces(tmp_path, BASE, diverge(BASE, 3, ins_from=4))
    assert find_op_source(paths, ["cpu", "cuda"]) is None


def test_the_scan_is_the_same_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long = [Op("aten.add.Tensor", 100 + i) for i in range(11)] + BASE
    paths = traces(tmp_path, long, diverge(long, 14, ins_from=15))
    whole = find_op_source(paths)
    monkeypatch.setattr(align, "CHUNK", 4)
    chunked = find_op_source(paths)
    assert whole is not None
    assert chunked is not None
    assert whole.record.index == chunked.record.index == 14
    assert [n.record.index for n in whole.neighbours] == [n.record.index for n in chunked.neighbours]


def test_an_auto_run_directory_reports_the_op_from_its_op_level_rerun(tmp_path: Path) -> None:
    run = tmp_path / "run"
    module_level = [Rec("net.0", 1, kind=Kind.OUTPUT, module="net.0"), Rec("net.0.weight", 2, kind=Kind.GRAD)]
    write_run(run, [module_level, [module_level[0], module_level[1].but(digest=3)]])
    ops = traces(run, BASE, diverge(BASE, 3, ins_from=4))
    record = json.loads((run / "run.json").read_text())
    record["granularity"] = "auto"
    record["narrowing"] = {"window": [0, 0], "prefix": "ops", "results": [
        {**r, "trace": p.name} for r, p in zip(record["results"], ops)]}
    (run / "run.json").write_text(json.dumps(record))

    report = load_run(run)
    # the op finding is the report's (the next stage's output), not the comparison's
    assert report.op_finding is not None
    assert report.op_finding.verdict == "nondeterministic-op"
    assert not hasattr(report.comparison.first_divergence, "op_finding")
    assert any(c.basis == "op-records" for c in report.causes)  # and the causes engine was given it
    first = report_json(report)["first_divergence"]
    assert (first["kind"], first["name"]) == ("grad", "net.0.weight")
    assert (first["op"], first["phase"], first["node"], first["location"]) == (
        "aten.index_put.default", "backward", "IndexBackward0", "train.py:14")
    finding = first["op_finding"]
    assert finding["verdict"] == "nondeterministic-op"
    assert finding["window"] == [0, 0]
    assert finding["traces"] == "ops"
    assert [(n["index"], n["inputs"], n["output"]) for n in finding["neighbours"]][2:5] == [
        (2, "match", "match"), (3, "match", "differ"), (4, "differ", "differ")]


def test_terminal_json_and_junit_name_the_same_file_and_line(tmp_path: Path) -> None:
    """The op-level re-run pinpoints train.py:14 while the module-level record came from train.py:20: every
    rendering names train.py:14 as the divergence's location, the terminal also says where it was recorded."""
    run = tmp_path / "run"
    module_level = [Rec("net.0", 1, kind=Kind.OUTPUT, module="net.0", loc="train.py:20"),
                    Rec("net.0.weight", 2, kind=Kind.GRAD, loc="train.py:20")]
    write_run(run, [module_level, [module_level[0], module_level[1].but(digest=3)]])
    ops = traces(run, BASE, diverge(BASE, 3, ins_from=4))
    record = json.loads((run / "run.json").read_text())
    record["narrowing"] = {"window": [0, 0], "prefix": "ops", "results": [
        {**r, "trace": p.name} for r, p in zip(record["results"], ops)]}
    (run / "run.json").write_text(json.dumps(record))

    report = load_run(run)
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    panel = text[text.index("First divergence"):text.index("The op behind it")]
    assert "location     train.py:14" in panel
    assert "recorded at  train.py:20" in panel
    assert report_json(report)["first_divergence"]["location"] == "train.py:14"
    assert "train.py:14" in ET.fromstring(to_junit(report)).find("testcase[@name='repeats agree']/failure").get(
        "message", "")
    assert "(train.py:14)" in text.strip().splitlines()[-1]  # the closing summary line
    # the HTML's first-divergence table: location, module and op as the terminal shows them, and the record's line
    page = render_html(report)
    first = page[page.index("<h2>First divergence</h2>"):page.index("<h2>The op behind it</h2>")]
    for key, value in (("location", "train.py:14"), ("module", "net.0"), ("op", "aten.index_put.default (backward)"),
                       ("recorded at", "train.py:20")):
        assert f"<th>{key}</th><td>{value}</td>" in first
    # the op table scrolls inside its own box, its cells wrap: it never widens the 1000-px page
    ops = page[page.index("<h2>The op behind it</h2>"):]
    assert "<div class='wide'><table>" in ops
    assert ".wide{max-width:100%;overflow-x:auto}" in page
    assert ".wide td,.kv td{overflow-wrap:anywhere}" in page
    assert "max-width:1000px" in page

    console = Console(record=True, width=160)
    panel = op_panel(report)
    assert panel is not None
    console.print(panel)
    text = console.export_text()
    assert "aten.index_put.default (backward, autograd node IndexBackward0)" in text
    assert "train.py:14 (the forward line that created its autograd node)" in text
    assert "ops in steps 0–0" in text


# -- provenance: from the divergent record back to the op that made it (real recordings) -----------------

def _recorded(tmp_path: Path, body: Callable[[Recorder], Any]) -> list[Path]:
    """Two repeats of `body` recorded at op granularity, the global torch RNG seeded differently in each
    (an unseeded RNG: every draw differs)."""
    paths = []
    for seed in (1, 2):
        def seeded(rec: Recorder, seed: int = seed) -> None:
            torch.manual_seed(seed)
            body(rec)
        path = tmp_path / f"r{seed}.trace"
        record(path, seeded)
        paths.append(path)
    return paths


def test_an_input_drawn_after_the_weights_init_is_traced_to_its_own_draw(tmp_path: Path) -> None:
    lines = {}

    def body(rec: Recorder) -> None:
        net = nn.Linear(4, 3); lines["init"] = here()  # noqa: E702
        x = torch.randn(2, 4); lines["input"] = here()  # noqa: E702
        rec.record_tensor(Kind.INPUT, rec.intern("Linear.input[0]"), x, loc=rec.location_id(1))
        rec.record_tensor(Kind.OUTPUT, rec.intern("Linear"), net(x))

    finding = find_op_source(_recorded(tmp_path, body))
    assert finding is not None
    assert finding.verdict == "random-op"
    assert finding.record.op == "aten.randn.default"
    assert finding.record.location == lines["input"]
    assert finding.traced_from is not None
    assert finding.traced_from.name == "Linear.input[0]"


@pytest.mark.parametrize("head_first", [False, True])
def test_a_layer_output_is_traced_to_its_own_init_not_another_layers(tmp_path: Path, head_first: bool) -> None:
    """timm's shape: a classifier initialised after the stem (the latest run of draws before the divergence), or
    a library's layer drawn just before the user's conv (one run of draws, the library's first)."""
    lines = {}

    def body(rec: Recorder) -> None:
        if head_first:
            head = nn.Linear(18, 2)
        conv = nn.Conv2d(1, 2, 3); lines["conv"] = here()  # noqa: E702
        x = torch.ones(1, 1, 5, 5)  # the input agrees
        if not head_first:
            head = nn.Linear(18, 2)  # never reaching conv's output
        y = conv(x)
        rec.record_tensor(Kind.OUTPUT, rec.intern("conv1"), y)
        rec.record_tensor(Kind.OUTPUT, rec.intern("head"), head(y.flatten(1)))

    finding = find_op_source(_recorded(tmp_path, body))
    assert finding is not None
    assert finding.verdict == "random-op"
    assert finding.record.op == "aten.uniform_.default"
    assert finding.record.location == lines["conv"]
    assert finding.traced_from is not None
    assert finding.traced_from.name == "conv1"
    assert "it made output conv1" in finding.summary


def test_without_links_the_order_rule_stands(tmp_path: Path) -> None:
    # synthetic traces carry no makers (an older trace): the last run of sources before the divergence
    base = [Op("aten.uniform_.default", 1, flags=Flag.RANDOM, loc="a.py:1"), Op("aten.fill_.Scalar", 2),
            Op("aten.uniform_.default", 3, flags=Flag.RANDOM, loc="a.py:3"), Op("aten.convolution.default", 4),
            Op("conv1", 4, kind=Kind.OUTPUT)]
    rep = [r if i == 1 else r.but(out=r.out + 1000) for i, r in enumerate(base)]
    rep[3] = rep[3].but(ins=(91, 92))
    finding = find_op_source(traces(tmp_path, base, rep))
    assert finding is not None
    assert finding.record.location == "a.py:3"
    assert finding.traced_from is None


def _first(kind: str) -> Divergence:
    rec = RecordInfo(index=4, kind=kind, name="net.0.weight", module="net.0", location="train.py:14",  # type: ignore[arg-type]
                     step=2, shape="2x4", dtype="float32", op="", backward=False)
    return Divergence(index=4, category="content", record=rec, repeats=[1], reference=0)


def test_a_parameter_first_to_differ_is_the_optimizer_update_not_an_op() -> None:
    assert update_differs(_first("param"))
    assert not update_differs(_first("grad"))
    assert not update_differs(None)


def test_the_op_level_note_says_why_no_op_is_named() -> None:
    assert op_level_note(_first("param"), None).startswith(
        "no op-level re-run: parameter net.0.weight is the first record to differ, after optimizer step 2")
    assert op_level_note(_first("grad"), (1, 2)).startswith(
        "op-level re-run (steps 1–2): no op found behind the first divergence")
    assert op_level_note(_first("grad"), None) == ""


def test_a_batch_a_sampler_drew_is_traced_to_the_samplers_draw_not_the_weights_init(tmp_path: Path) -> None:
    """minGPT's adder unseeded: the weights' init is the latest run of draws the order rule sees before the input,
    but the input was chosen by the sampler's draws, which reach it only as Python indices."""
    lines = {}
    data = torch.utils.data.TensorDataset(torch.arange(40).view(20, 2))

    def body(rec: Recorder) -> None:
        sampler = torch.utils.data.RandomSampler(data, replacement=True, num_samples=100)
        batches = iter(torch.utils.data.DataLoader(data, sampler=sampler, batch_size=4))
        net = nn.Embedding(40, 3)
        (x,) = next(batches); lines["batch"] = here()  # noqa: E702
        rec.record_tensor(Kind.INPUT, rec.intern("Embedding.input[0]"), x, loc=rec.location_id(1))
        rec.record_tensor(Kind.OUTPUT, rec.intern("Embedding"), net(x))

    finding = find_op_source(_recorded(tmp_path, body))
    assert finding is not None
    assert (finding.record.op, finding.record.location) == ("aten.random_.default", lines["batch"])


def _through_a_batch(tmp_path: Path) -> OpFinding:
    """A sampled batch, taken and scaled: the model input is followed back through the batch to the sampler."""
    data = torch.utils.data.TensorDataset(torch.arange(40).view(20, 2))

    def body(rec: Recorder) -> None:
        (x,) = next(iter(torch.utils.data.DataLoader(data, sampler=torch.utils.data.RandomSampler(data),
                                                     batch_size=4)))
        rec.record_tensor(Kind.INPUT, rec.intern("Embedding.input[0]"), x * 1, loc=rec.location_id(1))

    finding = find_op_source(_recorded(tmp_path, body))
    assert finding is not None
    return finding


def test_the_walk_back_through_a_batch_says_where_the_chain_left_torch(tmp_path: Path) -> None:
    assert "through the batch a DataLoader yielded" in _through_a_batch(tmp_path).summary


def test_the_traced_from_row_names_the_batch_on_the_way(tmp_path: Path) -> None:
    assert "op that made it, via the batch a DataLoader yielded at " in str(traced_note(_through_a_batch(tmp_path)))


def test_a_linked_walk_that_reaches_no_source_names_where_the_difference_entered(tmp_path: Path) -> None:
    """The collated batch's inputs differ and no recorded op made them (Python values): it is named, not the
    weights' init drawn before it (the order rule's answer)."""
    base = [Op("aten.normal_.default", 1, flags=Flag.RANDOM, loc="model.py:5"),
            Op("aten.stack.default", 2, loc="a.py:9"), Op("aten.embedding.default", 3, node="1", loc="model.py:9"),
            Op("Net.input[0]", 3, kind=Kind.OUTPUT)]
    rep = [r.but(out=r.out + 1000) for r in base]
    rep[1:3] = [r.but(ins=(91, 92)) for r in rep[1:3]]
    finding = find_op_source(traces(tmp_path, base, rep))
    assert finding is not None
    assert (finding.record.op, finding.verdict) == ("aten.stack.default", "inputs-differ")
