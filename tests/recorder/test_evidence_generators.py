"""recorder/evidence/generators.py: seeding calls, Generator creation and first draws, in process."""

from __future__ import annotations

import pickle
import random
import sys
import threading
from pathlib import Path
from typing import Any, get_type_hints

import numpy as np
import pytest
import torch
from evidence_sink import Sink

from detaudit.events import DrawEvent, GeneratorEvent, RngRestoreEvent, SeedEvent
from detaudit.recorder import patch
from detaudit.recorder.evidence import concurrency, draws, generators
from detaudit.recorder.evidence.base import Evidence, python_rng_digest
from detaudit.recorder.pinning import PIN_SEED


def fields(cls: Any) -> set[str]:
    return set(get_type_hints(cls)) - {"at", "worker"}


def test_torch_seeding_records_value_site_and_whether_the_rng_was_drawn_from(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    state = torch.get_rng_state()
    try:
        generators.install_torch(ev, torch)
        torch.manual_seed(5)
        torch.randn(2)
        torch.manual_seed(6)
    finally:
        torch.set_rng_state(state)
    first, second = [e for e in sink.of("seed") if e["fn"] == "torch.manual_seed"]
    assert set(first) == fields(SeedEvent) - {"by"} == set(second)  # `by`: library calls only
    assert (first["fn"], first["value"], first["lib"], first["library"]) == ("torch.manual_seed", 5, "torch", False)
    assert first["loc"].endswith(f"test_evidence_generators.py:{_line('torch.manual_seed(5)')}")
    assert not first["drawn_before"]
    assert second["drawn_before"]
    assert first["state"] != second["state"]
    assert first["pinned"] is None
    [draw] = sink.of("draw")
    assert set(draw) == fields(DrawEvent) - {"obj", "library", "importing", "thread"}  # set only where they apply
    assert (draw["fn"], draw["generator"], draw["device"]) == ("torch.randn", "global", "cpu")


def test_a_draw_is_recorded_once_per_call_site_and_an_explicit_generator_is_told_apart(
        evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    generators.install_torch(ev, torch)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        torch.rand(2, generator=gen)
    torch.nn.functional.dropout(torch.ones(2), 0.5, False)  # eval mode: draws nothing
    assert [(e["fn"], e["generator"]) for e in sink.of("draw")] == [("torch.rand", "explicit")]


def test_a_library_line_drawing_for_the_global_rng_then_for_a_scripts_generator_records_both(
        evidence: tuple[Evidence, Sink]) -> None:
    """nn.init's one `uniform_` line draws for every caller: a Generator the script seeds and passes in later is
    still followed to that draw (it was once hidden behind the global RNG's first draw there)."""
    ev, sink = evidence
    generators.install_torch(ev, torch)
    weight = torch.zeros(3, 4)
    state = torch.get_rng_state()
    try:
        torch.nn.init.kaiming_uniform_(weight)
        torch.nn.init.kaiming_uniform_(weight, generator=torch.Generator().manual_seed(7))
    finally:
        torch.set_rng_state(state)
    assert [(d["fn"], d["generator"], d.get("obj")) for d in sink.of("draw")] == [
        ("Tensor.uniform_", "global", None), ("Tensor.uniform_", "explicit", 0)]


def test_python_random_seed_and_draw(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    state = random.getstate()
    seed, draw = random.seed, random.random
    try:
        generators.install_python(ev)
        random.random()
        random.seed(3)
        after = random.getstate()
    finally:
        random.setstate(state)
    [d] = sink.of("draw")
    [s] = sink.of("seed")
    assert (d["lib"], d["fn"], d["generator"]) == ("python", "random.random", "global")
    assert "device" not in d
    assert (s["fn"], s["value"], s["drawn_before"], s["state"]) == ("random.seed", 3, True, python_rng_digest(after))
    patch.restore_all()
    assert (random.seed, random.random) == (seed, draw)


def test_numpy_seed_generator_and_draw(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    state = np.random.get_state()
    try:
        generators.install_numpy(ev, np.random)
        np.random.seed(1)
        np.random.rand(2)
        np.random.default_rng()
        np.random.default_rng(7)
    finally:
        np.random.set_state(state)
    [snapshot] = sink.of("state")
    assert snapshot["when"] == "numpy-import"
    assert set(snapshot["rng"]) >= {"numpy", "python"}
    [s] = sink.of("seed")
    assert (s["fn"], s["lib"], s["value"]) == ("np.random.seed", "numpy", 1)
    unseeded, seeded = sink.of("generator")
    # entropy: SystemRandom only; the script's Generators are followed to their draws (`obj`, draws.py)
    assert set(unseeded) == fields(GeneratorEvent) - {"entropy"}
    assert (unseeded["seeded"], seeded["seeded"], seeded["value"]) == (False, True, 7)
    assert [d["fn"] for d in sink.of("draw")] == ["np.random.rand"]


def test_a_numpy_bit_generator_records_its_seed(evidence: tuple[Evidence, Sink]) -> None:
    """`np.random.Generator(np.random.PCG64(os.getpid()))`: the seed is seen as `default_rng`'s is (issue 35)."""
    ev, sink = evidence
    state = np.random.get_state()
    original = np.random.PCG64
    try:
        generators.install_numpy(ev, np.random)
        bits = np.random.PCG64(4242)
        same = np.random.Generator(bits).random()
        assert isinstance(bits, np.random.PCG64)
        assert type(pickle.loads(pickle.dumps(bits))) is original  # a worker or a checkpoint needs no detaudit
    finally:
        np.random.set_state(state)
        patch.restore_all()
    [made] = sink.of("generator")
    assert (made["fn"], made["lib"], made["value"], made["seeded"]) == ("np.random.PCG64", "numpy", 4242, True)
    assert same == np.random.Generator(np.random.PCG64(4242)).random()  # the same numbers as unrecorded


def test_a_seed_pin_replaces_the_scripts_seed(evidence: tuple[Evidence, Sink]) -> None:
    _, sink = evidence
    ev = Evidence({"pins": ["torch-rng"]})
    ev.attach_recorder(sink)
    ev.torch = torch
    state = torch.get_rng_state()
    try:
        generators.install_torch(ev, torch)
        torch.manual_seed(99)
        assert torch.initial_seed() == PIN_SEED
    finally:
        torch.set_rng_state(state)
    [s] = [e for e in sink.of("seed") if not e["library"]]
    assert (s["value"], s["pinned"]) == (99, PIN_SEED)


def _line(text: str) -> int:
    source = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if line.strip() == text)


def test_an_rng_restore_is_recorded_once_per_site_and_draws_again_reports_each_site_anew(
        evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    state = torch.get_rng_state()
    try:
        generators.install_torch(ev, torch)
        restored = state.clone()
        for _ in range(2):
            torch.set_rng_state(restored)
            torch.rand(1)
        generators.draws_again(ev)  # `detaudit resume`, after a checkpoint load
        for _ in range(2):
            torch.rand(1)
    finally:
        torch.set_rng_state(state)
    [restore] = [e for e in sink.of("rng-restore") if e["loc"].endswith(f":{_line('torch.set_rng_state(restored)')}")]
    assert set(restore) == fields(RngRestoreEvent)
    assert (restore["lib"], restore["fn"], restore["library"]) == ("torch", "torch.set_rng_state", False)
    assert [e["fn"] for e in sink.of("draw")] == ["torch.rand", "torch.rand"]  # the site, before and after


def test_rng_objects_the_script_owns_are_numbered_and_followed_to_their_draws(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    generators.install_python(ev)
    generators.install_numpy(ev, np.random)
    generators.install_torch(ev, torch)
    g = torch.Generator()
    drawn = g.seed()
    torch.randn(2, generator=g)
    r = random.Random()
    r.shuffle([1, 2, 3])
    s = random.SystemRandom()
    s.random()
    rs = np.random.RandomState()
    rs.rand(2)
    made = [(e["fn"], e["lib"], e["obj"], e["seeded"]) for e in sink.of("generator")]
    assert made == [("Generator.seed", "torch", 0, False), ("random.Random", "python", 1, False),
                    ("random.SystemRandom", "python", 2, False), ("np.random.RandomState", "numpy", 3, False)]
    assert sink.of("generator")[0]["value"] == drawn
    assert sink.of("generator")[2].get("entropy") is True
    assert all(e["loc"].startswith("test_evidence_generators.py") or "test_evidence_generators.py" in e["loc"]
               for e in sink.of("generator"))
    draws = [(d["fn"], d.get("obj")) for d in sink.of("draw")]
    assert draws == [("torch.randn", 0), ("Random.shuffle", 1), ("Random.random", 2), ("RandomState.rand", 3)]
    # the recording subclasses keep isinstance true for objects made elsewhere, and pickle as the original
    assert isinstance(torch.default_generator, torch.Generator)
    assert isinstance(np.random.mtrand._rand,
                                                                               np.random.RandomState)
    assert pickle.loads(pickle.dumps(g)).initial_seed() == g.initial_seed()
    assert isinstance(pickle.loads(pickle.dumps(rs)), np.random.RandomState)
    patch.restore_all()
    assert torch.Generator is torch._C.Generator
    assert np.random.RandomState is np.random.mtrand.RandomState


def test_a_pin_reaches_the_scripts_rng_objects(evidence: tuple[Evidence, Sink]) -> None:
    _, sink = evidence
    ev = Evidence({"pins": ["torch-rng", "python-rng", "numpy-rng"]})
    ev.attach_recorder(sink)
    ev.torch = torch
    expected = random.Random(PIN_SEED).getstate(), np.random.RandomState(PIN_SEED).get_state()[1]
    generators.install_python(ev)
    generators.install_numpy(ev, np.random)
    generators.install_torch(ev, torch)
    assert torch.Generator().seed() == PIN_SEED
    assert random.Random().getstate() == expected[0]  # each pin counts its own calls: the first gets PIN_SEED
    assert (np.random.RandomState().get_state()[1] == expected[1]).all()
    assert [e["pinned"] for e in sink.of("generator")] == [PIN_SEED] * 3


def test_seeding_through_a_helper_names_the_helper_and_a_restore_is_recorded(
        evidence: tuple[Evidence, Sink], tmp_path: Path) -> None:
    ev, sink = evidence
    helper = tmp_path / "seedhelp.py"
    helper.write_text("import random\nimport torch\n\ndef seed_everything(seed):\n    torch.manual_seed(seed)\n"
                      "    random.seed(seed)\n")
    ev._library += (str(tmp_path) + "/",)  # as an installed package is
    generators.install_python(ev)
    generators.install_torch(ev, torch)
    state = (torch.get_rng_state(), random.getstate())
    try:
        namespace: dict[str, Any] = {}
        exec(compile(helper.read_text(), str(helper), "exec"), namespace)
        namespace["seed_everything"](42)
        with torch.random.fork_rng():
            torch.manual_seed(1)
    finally:
        torch.set_rng_state(state[0])
        random.setstate(state[1])
    seeds = [(e["fn"], e["value"], e["library"], e.get("by", "").rsplit("/", 1)[-1])
             for e in sink.of("seed") if e["state"] is not None]
    assert seeds[:2] == [("torch.manual_seed", 42, True, "seedhelp.py:5"), ("random.seed", 42, True, "seedhelp.py:6")]
    # the user's line that called the helper
    assert all("test_evidence_generators.py" in e["loc"] for e in sink.of("seed"))
    restore = sink.of("rng-restore")[0]  # fork_rng's exit (then this test's own restores)
    assert restore["fn"] == "torch.set_rng_state"
    assert restore["library"]
    assert "(fork_rng)" in restore["by"]


def test_a_draw_by_a_library_at_its_import_is_told_apart(evidence: tuple[Evidence, Sink], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ev, sink = evidence
    site = tmp_path / "site"
    site.mkdir()
    (site / "drawsatimport.py").write_text("import random\nTOKEN = random.getrandbits(32)\n")
    (tmp_path / "usermodel.py").write_text("import random\nOFFSET = random.random()\n")
    ev._library += (str(site) + "/",)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(tmp_path))
    state = random.getstate()
    try:
        generators.install_python(ev)
        import drawsatimport  # noqa: F401
        import usermodel  # noqa: F401
    finally:
        random.setstate(state)
        for name in ("drawsatimport", "usermodel"):
            sys.modules.pop(name, None)
    draws = {d["fn"]: d.get("importing", False) for d in sink.of("draw")}
    assert draws == {"random.getrandbits": True, "random.random": False}  # a user module's own draw is the script's


def test_seeding_through_the_scripts_own_wrapper_is_the_scripts_seeding(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence

    def seed_all(seed: int) -> None:
        torch.manual_seed(seed)
        random.seed(seed)

    generators.install_python(ev)
    generators.install_torch(ev, torch)
    state = (torch.get_rng_state(), random.getstate())
    try:
        seed_all(5)
    finally:
        torch.set_rng_state(state[0])
        random.setstate(state[1])
    seeds = [(e["fn"], e["library"], "by" in e) for e in sink.of("seed") if e["state"] is not None]
    assert seeds == [("torch.manual_seed", False, False), ("random.seed", False, False)]
    assert sink.of("seed")[-1]["loc"].endswith(f":{_line('random.seed(seed)')}")  # the wrapper's own line


def test_a_scripts_numpy_generator_is_followed_to_its_draws_and_fingerprinted(evidence: tuple[Evidence, Sink]) -> None:
    ev, sink = evidence
    draws.install(ev)
    try:
        generators.install_numpy(ev, np.random)
        gen = np.random.default_rng(3)
        values = gen.random(4)
    finally:
        draws.tracker = None
    [made] = sink.of("generator")
    [drawn] = sink.of("random-draw")
    assert (drawn["fn"], drawn["obj"], drawn["size"]) == ("Generator.random", made["obj"], 4)
    assert drawn["value"] == draws.fingerprint(values, None)[0]
    assert isinstance(gen, np.random.Generator)


def test_draws_beside_a_started_thread_name_the_thread_that_drew(evidence: tuple[Evidence, Sink]) -> None:
    """A prefetch thread's draw names its target; the main thread's, while it runs, names the main thread; the
    main thread drawing alone names none (issue 45: a prefetch thread racing a LazyLinear's init went unseen)."""
    ev, sink = evidence
    generators.install_torch(ev, torch)
    concurrency.install_threads(ev)
    drawn, release = threading.Event(), threading.Event()

    def prefetch() -> None:
        torch.randn(2)
        drawn.set()
        release.wait(10)

    def layer() -> torch.Tensor:
        return torch.empty(3).uniform_()  # one line, as nn.init's: drawn for several layers

    layer()
    loader = threading.Thread(target=prefetch)
    loader.start()
    drawn.wait(10)
    layer()
    release.set()
    loader.join()
    target = f"{test_draws_beside_a_started_thread_name_the_thread_that_drew.__name__}.<locals>.prefetch"
    assert [(e["fn"], e.get("thread")) for e in sink.of("draw")] == [
        ("Tensor.uniform_", None), ("torch.randn", target), ("Tensor.uniform_", "MainThread")]
