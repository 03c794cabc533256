"""Each detector on synthetic evidence: it fires on its own cause, ranks by the first divergence, and stays quiet
otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from detaudit import causes
from detaudit.cause_table import CAUSES, ISOLATED, CauseId
from detaudit.causes import confirm, device, order, rng
from detaudit.causes import flags as flags_module
from detaudit.causes.context import Context, RepeatEvidence, detects, finding
from detaudit.compare.set_origins import RunOrderedSet
from detaudit.events import PARAMETERS_BY_IDENTITY
from detaudit.explain import runner as explain_runner
from detaudit.results import Divergence, Experiment, RecordInfo, StdoutDifference


def record(kind: str = "output", name: str = "fc", step: int = 0, index: int = 10, module: str = "") -> RecordInfo:
    return RecordInfo(index, kind, name, module or name, "train.py:20", step, "4x3", "float32", "", False)


def context(per_repeat: list[list[dict[str, Any]]], rec: RecordInfo | None = None, index: int = 10,
            devices: list[str] | None = None, workers: list[list[dict[str, Any]]] | None = None) -> Context:
    reps = []
    for i, events in enumerate(per_repeat):
        rep = RepeatEvidence(i, (devices or ["cpu"] * len(per_repeat))[i], Path(f"/nonexistent/repeat-{i}.trace"))
        rep.events = [{"at": 0, **e} for e in events]
        rep.worker_events = [{"at": 0, **e} for e in (workers[i] if workers else [])]
        reps.append(rep)
    rec = rec if rec is not None else record(index=index)
    divergence = Divergence(index, "content", rec, list(range(1, len(reps))), 0)
    return Context(divergence, reps)


def state(when: str, at: int = 0, **libs: Any) -> dict[str, Any]:
    return {"type": "state", "when": when, "at": at, "rng": libs, "flags": flags()}


def flags(**changes: Any) -> dict[str, Any]:
    base = {"cudnn.benchmark": False, "cudnn.deterministic": False, "cudnn.enabled": True, "cudnn.allow_tf32": True,
            "matmul.allow_tf32": False, "float32_matmul_precision": "highest", "deterministic_algorithms": False,
            "num_threads": 2, "CUBLAS_WORKSPACE_CONFIG": None, "OMP_NUM_THREADS": None, "MKL_NUM_THREADS": None}
    return {**base, **changes}


def hash_event(probe: int, randomization: int = 1, aslr_disabled: bool = False) -> dict[str, Any]:
    return {"type": "hash", "PYTHONHASHSEED": None, "randomization": randomization, "probe": probe,
            "aslr_disabled": aslr_disabled}


def ids(ctx: Context) -> list[str]:
    return [c.id for c in causes.rank(ctx)]


# -- RNG ---------------------------------------------------------------------------------------------
def test_unseeded_numpy_explains_a_divergent_input_over_unseeded_torch() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}),
                state("numpy-import", numpy={"digest": f"n{i}", "drawn": False}),
                {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "train.py:3",
                 "library": False, "drawn_before": False, "state": "s"},
                {"type": "draw", "lib": "numpy", "fn": "np.random.randn", "loc": "train.py:7", "generator": "global"}]

    ctx = context([events(0), events(1)], rec=record("input", "Net.input[0]", index=0), index=0)
    found = causes.rank(ctx)
    assert found[0].id == "unseeded-numpy-rng"
    assert found[0].confidence == "likely"
    assert any("np.random.randn at train.py:7" in line for line in found[0].evidence)
    assert "np.random.seed(0)" in found[0].fix
    assert "train.py:7" in found[0].fix
    assert found[0].pins == ["numpy-rng"]
    assert "unseeded-torch-rng" not in ids(ctx)  # torch was seeded before it was drawn from


def test_unseeded_torch_with_draws_before_the_seed_call() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}),
                {"type": "draw", "lib": "torch", "fn": "Tensor.uniform_", "loc": "model.py:9", "generator": "global"},
                {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "train.py:30",
                 "library": False, "drawn_before": True, "state": "s"}]

    found = causes.rank(context([events(0), events(1)], rec=record("output", "conv1")))
    assert found[0].id == "unseeded-torch-rng"
    assert any("before torch.manual_seed(0) at train.py:30" in line for line in found[0].evidence)


def test_an_rng_never_drawn_from_is_not_a_cause() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}, python={"digest": f"p{i}", "drawn": False}),
                state("first-forward", torch={"digest": f"t{i}", "drawn": False},
                      python={"digest": f"p{i}", "drawn": False})]

    ctx = context([events(0), events(1)])
    assert rng.unseeded_torch_rng(ctx) is None
    assert rng.unseeded_python_rng(ctx) is None


def test_draws_after_the_divergence_do_not_explain_it() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", python={"digest": f"p{i}", "drawn": False}),
                {"type": "draw", "at": 50, "lib": "python", "fn": "random.shuffle", "loc": "t.py:4",
                 "generator": "global"}]

    assert rng.unseeded_python_rng(context([events(0), events(1)], index=10)) is None


def test_unseeded_generator() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("numpy-import", numpy={"digest": f"n{i}", "drawn": False}),
                {"type": "generator", "lib": "numpy", "fn": "np.random.default_rng", "seeded": False, "value": None,
                 "loc": "train.py:13", "library": False, "state": f"g{i}"}]

    found = rng.unseeded_numpy_rng(context([events(0), events(1)], rec=record("input", "x", index=0), index=0))
    assert found is not None
    assert "at train.py:13: `np.random.default_rng(0)`" in found.cause.fix


def test_varying_seed_outranks_everything_and_names_the_call() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [hash_event(i), state("import", torch={"digest": f"t{i}", "drawn": False}),
                {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 1000 + i, "loc": "train.py:9",
                 "library": False, "drawn_before": False, "state": f"s{i}"}]

    found = causes.rank(context([events(0), events(1)]))
    assert found[0].id == "varying-seed"
    assert "1000 in repeat 0, 1001 in repeat 1" in found[0].evidence[0]
    # the hash probe differs too, but no hash() call was seen: that hashing is randomized is no evidence the seed
    # came from it (issue 35), so the evidence does not guess
    assert not any("hash()" in line for line in found[0].evidence)
    assert "torch.manual_seed(0)" in found[0].fix
    assert "train.py:9" in found[0].fix
    assert found[0].pins == ["torch-rng"]


def test_a_generator_seeded_from_the_pid_is_varying_seed_at_its_line_with_a_constant_as_the_fix() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [{"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "train.py:4",
                 "library": False, "drawn_before": False, "state": "s"},
                {"type": "outside", "fn": "os.getpid", "loc": "train.py:6"},
                {"type": "generator", "lib": "torch", "fn": "Generator.manual_seed", "seeded": True,
                 "value": 4000 + i, "loc": "train.py:6", "library": False, "state": f"g{i}", "obj": 0},
                {"type": "draw", "lib": "torch", "fn": "Tensor.uniform_", "loc": "train.py:7", "generator": "explicit",
                 "obj": 0}]

    top = causes.rank(context([events(0), events(1)]))[0]
    assert (top.id, top.basis) == ("varying-seed", "direct")
    assert top.summary == "this torch.Generator is seeded from the process id at train.py:6, so its seed differs " \
                          "in every run"
    assert "4000 in repeat 0, 4001 in repeat 1" in top.evidence[0]
    assert top.fix.startswith("seed it with a constant at train.py:6: `.manual_seed(0)`")


def test_a_constant_seed_is_not_varying() -> None:
    seed = {"type": "seed", "lib": "python", "fn": "random.seed", "value": 7, "loc": "a.py:1", "library": False,
            "drawn_before": False, "state": "same"}
    assert rng.varying_seed(context([[seed], [seed]])) is None


def test_dataloader_workers_with_an_unseeded_generator_in_a_worker() -> None:
    main = [{"type": "dataloader", "loc": "train.py:26", "num_workers": 2, "worker_init_fn": None,
             "generator": True, "sampler": "RandomSampler"}]

    def worker(i: int) -> list[dict[str, Any]]:
        return [{"type": "generator", "lib": "numpy", "fn": "np.random.default_rng", "seeded": False, "value": None,
                 "loc": "data.py:18", "library": False, "state": f"w{i}", "worker": 0}]

    ctx = context([main, main], rec=record("input", "x", index=0), index=0, workers=[worker(0), worker(1)])
    found = causes.rank(ctx)
    assert found[0].id == "dataloader-workers"
    assert "data.py:18" in found[0].fix
    assert "torch.initial_seed()" in found[0].fix
    assert found[0].pins == ["numpy-rng"]


def test_dataloader_with_seeded_workers_is_not_a_cause() -> None:
    main = [{"type": "dataloader", "loc": "train.py:26", "num_workers": 2, "worker_init_fn": None,
             "generator": False, "sampler": "RandomSampler"}]
    assert rng.dataloader_workers(context([main, main], workers=[[], []])) is None


# -- order ---------------------------------------------------------------------------------------------
def test_hash_seed_only_with_randomized_hashes() -> None:
    assert order.python_hash_seed(context([[hash_event(1)], [hash_event(2)]])) is not None
    assert order.python_hash_seed(context([[hash_event(5, 0)], [hash_event(5, 0)]])) is None


def test_a_seed_from_hash_of_a_prompt_names_the_hash_call_not_a_set_order() -> None:
    """`torch.manual_seed(hash(prompt) % 2**32)`: the evidence shows the script's own hash() of a string, so that
    use is named, at its line, in both causes it feeds; not "an order derived from a set or dict"."""
    def repeat(value: int) -> list[dict[str, Any]]:
        return [hash_event(value), {"type": "hash-call", "loc": "gen.py:7", "value": value, "of": "str of length 12"},
                {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": value % 2**32, "loc": "gen.py:7",
                 "library": False, "drawn_before": False, "state": f"s{value}"}]

    ctx = context([repeat(11), repeat(22)])
    found = order.python_hash_seed(ctx)
    assert found is not None
    assert found.cause.summary.startswith("hash() of a string at gen.py:7")
    assert "set or dict" not in found.cause.summary
    assert "gen.py:7" in found.cause.fix
    assert found.cause.evidence[0] == ("hash() of a str of length 12 at gen.py:7 gave 11 in repeat 0, 22 in repeat 1: "
                                       "the value changes with string hash randomization")
    assert found.cause.basis == "circumstantial"
    assert found.score > order.object_order(ctx).score
    ranked = causes.rank(ctx)
    assert [c.id for c in ranked[:2]] == ["varying-seed", "python-hash-seed"]
    assert any("hash() of a str of length 12 at gen.py:7" in line for line in ranked[0].evidence)
    # the same hash() value in every repeat (PYTHONHASHSEED set): nothing named
    same = context([[hash_event(5), {"type": "hash-call", "loc": "gen.py:7", "value": 5, "of": "str of length 1"}],
                    [hash_event(6), {"type": "hash-call", "loc": "gen.py:7", "value": 5, "of": "str of length 1"}]])
    assert order.hash_calls(same) == []


def test_object_order_rises_when_the_hash_seed_is_fixed() -> None:
    randomized = order.object_order(context([[hash_event(1)], [hash_event(2)]]))
    fixed = order.object_order(context([[hash_event(5, 0)], [hash_event(5, 0)]]))
    assert randomized is not None
    assert fixed is not None
    assert fixed.score > randomized.score
    # with no reordering seen, object order is a candidate, not a cause: first among those not ruled out
    assert causes.split(causes.rank(context([[hash_event(5, 0)], [hash_event(5, 0)]])))[1][0].id == "object-order"
    off = context([[hash_event(5, 0, aslr_disabled=True)], [hash_event(5, 0, aslr_disabled=True)]])
    assert order.object_order(off) is None


def _reordered_parameters(events: list[dict[str, Any]]) -> Context:
    """Tied Parameters de-duplicated with `set()`: repeat 1 records another parameter's gradient at one index."""
    rec = RecordInfo(6, "grad", "mid.weight", "mid", "train.py:26", 0, "6x6", "float32", "", False)
    other = RecordInfo(6, "grad", "mid.bias", "mid", "train.py:26", 0, "6", "float32", "", False)
    ctx = context([[hash_event(1), *events], [hash_event(2), *events]], rec=rec, index=6)
    return Context(Divergence(6, "structure", rec, [1], 0, others={1: other}), ctx.involved)


def test_parameters_an_optimizer_got_through_a_set_get_the_fix_where_the_set_was_made() -> None:
    made = {"type": "set-order", "at": 0, "loc": "train.py:21", "sets": [
        {"name": "params", "of": PARAMETERS_BY_IDENTITY, "size": 4, "built": ["train.py:20"], "iterated": [],
         "used": []}]}
    found = order.object_order(_reordered_parameters([made]))
    assert found is not None
    assert found.cause.fix.startswith("give the optimizer its parameters in a fixed order at train.py:20: ")


def test_a_set_of_other_objects_is_no_source_of_the_parameters_order() -> None:
    other = {"type": "set-order", "at": 0, "loc": "train.py:9", "sets": [
        {"name": "samples", "of": "objects hashed by identity", "size": 4, "built": ["train.py:8"], "iterated": [],
         "used": []}]}
    found = order.object_order(_reordered_parameters([other]))
    assert found is not None
    assert "train.py:8" not in found.cause.fix


def test_parameters_recorded_in_another_order_point_at_object_order_and_its_experiment() -> None:
    """Tied Parameters de-duplicated with `set()`: the optimizer's records come in another order in each run."""
    rec = RecordInfo(6, "grad", "mid.weight", "mid", "train.py:26", 0, "6x6", "float32", "", False)
    other = RecordInfo(6, "grad", "mid.bias", "mid", "train.py:26", 0, "6", "float32", "", False)
    ctx = context([[hash_event(1)], [hash_event(2)]], rec=rec, index=6)
    ctx = Context(Divergence(6, "structure", rec, [1], 0, others={1: other}), ctx.involved)
    ranked = causes.rank(ctx)
    assert [(c.id, c.basis) for c in ranked[:1]] == [("object-order", "circumstantial")]
    assert "repeat 0 recorded grad 'mid.weight' where repeat 1 recorded grad 'mid.bias'" in ranked[0].evidence[-2]
    assert "list(dict.fromkeys(model.parameters()))" in ranked[0].fix
    assert "python-hash-seed" not in [c.id for c in ranked]  # a guess below the evidence: not offered
    assert explain_runner.cheap_pin(ranked) == "address-layout"


def test_modules_recorded_in_another_order_are_no_evidence_of_object_order() -> None:
    rec = RecordInfo(6, "output", "a", "a", "train.py:26", 0, "6", "float32", "", False)
    ctx = context([[hash_event(1)], [hash_event(2)]], rec=rec, index=6)
    ctx = Context(Divergence(6, "structure", rec, [1], 0, others={1: replace(rec, name="b")}), ctx.involved)
    assert causes.rank(ctx)[0].id == "unknown"


def test_concurrency_with_completion_order() -> None:
    events = [{"type": "concurrency", "what": "ThreadPoolExecutor.submit", "loc": "e.py:20", "target": "score"},
              {"type": "concurrency", "what": "concurrent.futures.as_completed", "loc": "e.py:21", "target": None}]
    found = causes.rank(context([events + [hash_event(1)], events + [hash_event(2)]]))
    assert found[0].id == "concurrency"
    assert found[0].confidence == "likely"
    assert "e.py:21" in found[0].fix
    assert "python-hash-seed" not in [c.id for c in found]  # weak background causes dropped


def test_the_concurrency_fix_for_a_plain_thread_is_no_futures_recipe() -> None:
    """Issue 45: a plain threading.Thread was told to read its futures in order (it has none)."""
    events = [{"type": "concurrency", "what": "threading.Thread.start", "loc": "e.py:9", "target": "work"}]
    [found] = [c for c in causes.rank(context([events + [hash_event(1)], events + [hash_event(2)]]))
               if c.id == "concurrency"]
    assert "future" not in found.fix
    assert "`join()` every thread, then combine the slots in index order" in found.fix


# -- kernels and devices ---------------------------------------------------------------------------------
def op_event(op: str = "IndexBackward0", dev: str = "cpu", threads: int = 2, deterministic: bool = False,
             at: int = 0) -> dict[str, Any]:
    return {"type": "op", "at": at, "op": op, "device": dev, "entry": "torch.Tensor.__getitem__ ...",
            "phase": "backward", "loc": "model.py:12", "threads": threads, "deterministic": deterministic}


def test_nondeterministic_op_names_the_op_and_line() -> None:
    ctx = context([[op_event()], [op_event()]], rec=record("grad", "table"))
    found = causes.rank(ctx)
    assert found[0].id == "nondeterministic-op"
    assert "IndexBackward0 ran on cpu at model.py:12" in found[0].evidence[0]
    assert "use_deterministic_algorithms(True)" in found[0].fix
    assert "model.py:12" in found[0].fix
    assert found[0].pins == ["deterministic", "one-thread"]


@pytest.mark.parametrize("event", [op_event(threads=1), op_event(deterministic=True), op_event(at=99)])
def test_listed_op_that_cannot_explain_it(event: dict[str, Any]) -> None:
    assert device.nondeterministic_op(context([[event], [event]], index=10)) is None


def test_cuda_op_counts_with_one_thread() -> None:
    event = op_event("index_add_", "cuda", threads=1)
    assert device.nondeterministic_op(context([[event], [event]])) is not None


def cuda_modules(convs: bool = True) -> dict[str, Any]:
    layers = [{"module": "encode", "class": "Conv2d"}] if convs else []
    return {"type": "modules", "root": "Net", "device": "cuda", "listed": [],
            "matmul": layers + [{"module": "head", "class": "Linear"}]}


def test_cudnn_benchmark_needs_the_flag_and_cuda_convolutions() -> None:
    benchmark = flags(**{"cudnn.benchmark": True})
    on = [cuda_modules(), {"type": "state", "when": "first-forward", "rng": {}, "flags": benchmark}]
    found = causes.rank(context([on, on], rec=record("output", "encode")))
    assert found[0].id == "cudnn-benchmark"
    assert found[0].pins == ["cudnn"]
    off = [cuda_modules(), state("first-forward")]
    assert device.cudnn_benchmark(context([off, off])) is None
    cpu = [dict(cuda_modules(), device="cpu"), on[1]]
    assert device.cudnn_benchmark(context([cpu, cpu])) is None


def test_cublas_workspace_only_without_the_variable() -> None:
    unset = [cuda_modules(False), state("first-forward")]
    found = device.cublas_workspace(context([unset, unset]))
    assert found is not None
    assert found.cause.pins == ["cublas"]
    assert found.cause.confidence == "possible"
    fixed = [cuda_modules(False), {"type": "state", "when": "end", "rng": {},
                                   "flags": flags(CUBLAS_WORKSPACE_CONFIG=":4096:8")}]
    assert device.cublas_workspace(context([fixed, fixed])) is None


def test_tf32_needs_two_devices_and_tf32_on_the_cuda_side() -> None:
    cpu = [{"type": "environment", "device": "cpu"}, state("first-forward")]
    gpu = [{"type": "environment", "device": "cuda"}, cuda_modules(False),
           {"type": "state", "when": "first-forward", "rng": {}, "flags": flags(**{"matmul.allow_tf32": True})}]
    found = causes.rank(context([cpu, gpu]))
    assert found[0].id == "tf32"
    assert device.tf32(context([gpu, gpu])) is None  # the same device: TF32 rounds alike every run


def test_tf32_on_against_off_on_the_same_gpu() -> None:
    def gpu(allow: bool) -> list[dict[str, Any]]:
        return [{"type": "environment", "device": "cuda"}, cuda_modules(False),
                {"type": "state", "when": "first-forward", "rng": {}, "flags": flags(**{"matmul.allow_tf32": allow})}]

    found = device.tf32(context([gpu(False), gpu(True)]))
    assert found is not None
    assert found.cause.id == "tf32"
    assert "repeat 0: cudnn.allow_tf32; repeat 1: matmul.allow_tf32, cudnn.allow_tf32" in found.cause.evidence[0]
    assert causes.rank(context([gpu(False), gpu(True)]))[0].id == "tf32"


def test_thread_count_differs() -> None:
    def events(n: int) -> list[dict[str, Any]]:
        return [{"type": "state", "when": "first-forward", "rng": {}, "flags": flags(num_threads=n)},
                {"type": "call", "fn": "torch.set_num_threads", "value": n, "loc": "t.py:5"}]

    found = causes.rank(context([events(1), events(2)]))
    assert found[0].id == "thread-count"
    assert "1 in repeat 0, 2 in repeat 1" in found[0].evidence[0]
    assert "t.py:5" in found[0].fix
    assert device.thread_count(context([events(2), events(2)])) is None


def test_uninitialized_memory_from_user_empty() -> None:
    def events(d: str) -> list[dict[str, Any]]:
        return [{"type": "empty", "fn": "torch.empty", "loc": "layer.py:9", "shape": [32], "dtype": "float32",
                 "device": "cpu", "digest": d, "pinned": False}]

    found = causes.rank(context([events("aa" * 8), events("bb" * 8)]))
    assert found[0].id == "uninitialized-memory"
    assert "torch.zeros(...)` instead of `torch.empty(...)` at layer.py:9" in found[0].fix
    assert device.uninitialized_memory(context([events("cc" * 8), events("cc" * 8)])) is None


@pytest.mark.parametrize("states, score, words", [
    (None, 0.5, ""), (["written", "unwritten"], 0.6, "1 of them had not been written"),
    (["written", "written"], 0.25, "probably not read"), (["freed", "written"], 0.5, "")])
def test_what_became_of_the_empty_tensors_weighs_the_uninitialized_memory_cause(
        states: list[str] | None, score: float, words: str) -> None:
    """A custom layer's `empty` + init is everywhere: written before the first forward, it is no suspect."""
    def events(d: str) -> list[dict[str, Any]]:
        made = [{"type": "empty", "fn": "torch.empty", "loc": f"layer.py:{line}", "shape": [32], "dtype": "float32",
                 "device": "cpu", "digest": d + str(line), "pinned": False} for line in (9, 12)]
        return made + ([{"type": "empty-writes", "states": states}] if states is not None else [])

    finding = device.uninitialized_memory(context([events("a" * 15), events("b" * 15)]))
    assert finding is not None
    assert finding.score == score
    assert finding.cause.confidence == "possible"
    assert words in " ".join(finding.cause.evidence)
    if states and "unwritten" in states:  # the fix names the tensor still unwritten, not the first made
        assert "layer.py:12" in finding.cause.fix


def test_environment_differences_but_not_thread_variables() -> None:
    def env(version: str, threads: str) -> list[dict[str, Any]]:
        return [{"type": "environment", "python": "3.11.7", "torch": version, "device": "cpu",
                 "env": {"OMP_NUM_THREADS": threads}}]

    found = causes.rank(context([env("2.13.0", "1"), env("2.12.1", "1")]))
    assert found[0].id == "environment-change"
    assert "torch: 2.13.0 in repeat 0, 2.12.1 in repeat 1" in found[0].evidence[0]
    assert "environment changed between the recordings (torch)" in found[0].summary
    assert device.environment(context([env("2.13.0", "1"), env("2.13.0", "2")])) is None


def test_recordings_made_with_other_script_arguments_are_an_environment_change() -> None:
    """`compare` of a 30-step and a 100000-step run once blamed the hash seed."""
    env = [{"type": "environment", "python": "3.11.7", "torch": "2.13.0", "device": "cpu", "env": {}}]
    ctx = context([env, env])
    ctx.repeats[0].script_args, ctx.repeats[1].script_args = ["--steps", "30"], ["--steps", "100000"]
    found = causes.rank(ctx)
    assert found[0].id == "environment-change"
    assert "(script arguments)" in found[0].summary
    assert "script arguments: --steps 30 in repeat 0, --steps 100000 in repeat 1" in found[0].evidence[0]
    ctx.repeats[1].script_args = ["--steps", "30"]
    assert device.environment(ctx) is None


# -- ranking and unknown ---------------------------------------------------------------------------------
def test_nothing_found_says_what_was_ruled_out() -> None:
    def events() -> list[dict[str, Any]]:
        return [hash_event(3, 0, aslr_disabled=True), state("import", torch={"digest": "t", "drawn": False}),
                {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "a.py:2",
                 "library": False, "drawn_before": False, "state": "s"},
                state("first-forward", torch={"digest": "s2", "drawn": True})]

    found = causes.rank(context([events(), events()]))
    assert [c.id for c in found] == ["unknown"]
    text = "\n".join(found[0].evidence)
    assert "torch RNG: seeded at a.py:2" in text
    assert "no op on torch's nondeterministic list ran" in text
    assert "string hashing" in text


def test_deterministic_run_gets_no_cause(tmp_path: Path) -> None:
    assert causes.diagnose(None, [], []) == []


def test_every_declared_cause_is_reported_by_a_detector_or_by_explain() -> None:
    """No row of cause_table without a producer: the detectors' ids, `unknown`, what --explain adds (a source a pin
    isolated, confirm.NOT_REPRODUCED)."""
    produced = {i for d in causes.DETECTORS for i in d.cause_ids} | {s.id for s in ISOLATED.values()}
    assert produced | {CauseId.UNKNOWN, confirm.NOT_REPRODUCED.id} == set(CauseId)


def test_a_detector_of_an_undeclared_cause_id_is_refused_when_registered() -> None:
    with pytest.raises(ValueError, match="no-such-cause"):
        detects("no-such-cause")(lambda ctx: None)  # type: ignore[arg-type]


def test_a_detector_reporting_an_id_it_does_not_declare_is_a_bug() -> None:
    wrong = detects(CauseId.TF32)(lambda ctx: finding("thread-count", 1.0, "s", [], "f"))
    with pytest.raises(AssertionError, match="reported cause 'thread-count'"):
        wrong(context([[], []]))


# -- strength of proof --------------------------------------------------------------------------------------
def with_op_finding(ctx: Context, verdict: str, op_name: str = "aten.index_put.default",
                    ordered_by: Sequence[RunOrderedSet] = ()) -> Context:
    op = replace(record("op", op_name), op=op_name)
    ctx.op_finding = SimpleNamespace(
        verdict=verdict, summary=f"{verdict}: inputs match in every repeat, output differs", record=op,
        ordered_by=list(ordered_by))
    return ctx


def test_a_constant_seed_with_a_differing_state_digest_is_never_varying_seed() -> None:
    """The evidence `received 0 in repeat 0, 0 in repeat 1` contradicts the claim: not emitted."""
    def seed(i: int) -> dict[str, Any]:
        return {"type": "seed", "lib": "python", "fn": "random.seed", "value": 0, "loc": "a.py:1", "library": False,
                "drawn_before": False, "state": f"digest-{i}"}

    assert rng.varying_seed(context([[seed(0)], [seed(1)]])) is None
    entropy = [{**seed(i), "value": None} for i in range(2)]  # random.seed(): OS entropy, the state differs
    assert rng.varying_seed(context([[entropy[0]], [entropy[1]]])) is not None


def test_op_level_proof_outranks_direct_evidence() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", python={"digest": f"p{i}", "drawn": False}),
                {"type": "draw", "lib": "python", "fn": "random.shuffle", "loc": "a.py:5", "generator": "global"},
                op_event()]

    ctx = with_op_finding(context([events(0), events(1)], rec=record("grad", "table")), "nondeterministic-op")
    found = causes.rank(ctx)
    assert [c.id for c in found][:2] == ["nondeterministic-op", "unseeded-python-rng"]
    assert found[0].basis == "op-records"
    assert found[1].basis == "direct"


def test_a_convolution_proven_nondeterministic_under_cudnn_benchmark_is_the_benchmark_first() -> None:
    """Found on an H100: the op records prove the forward convolution's kernel nondeterministic; with
    `cudnn.benchmark` on, the algorithm picked per run explains it, so the targeted cause (and its pin) leads
    and the general reading follows; without benchmark, or for another op, the op cause leads alone."""
    benchmark = [cuda_modules(), {"type": "state", "when": "first-forward", "rng": {}, "flags":
                                  flags(**{"cudnn.benchmark": True})}]
    conv = with_op_finding(context([benchmark, benchmark], rec=record("output", "encode")), "nondeterministic-op",
                           "aten.convolution.default")
    found = causes.rank(conv)
    assert [c.id for c in found][:2] == ["cudnn-benchmark", "nondeterministic-op"]
    assert found[0].basis == found[1].basis == "op-records"
    assert any("op-level records" in line for line in found[0].evidence)
    other = with_op_finding(context([benchmark, benchmark], rec=record("output", "encode")), "nondeterministic-op")
    assert [c.id for c in causes.rank(other)][:2] == ["nondeterministic-op", "cudnn-benchmark"]
    plain = [cuda_modules(), state("first-forward")]
    no_benchmark = with_op_finding(context([plain, plain], rec=record("output", "encode")), "nondeterministic-op",
                                   "aten.convolution.default")
    assert "cudnn-benchmark" not in [c.id for c in causes.rank(no_benchmark)]
    assert causes.rank(no_benchmark)[0].id == "nondeterministic-op"


def test_hash_order_and_identity_order_are_a_toss_up_with_the_experiment_named() -> None:
    ctx = with_op_finding(context([[hash_event(1)], [hash_event(2)]]), "input-order")
    found = causes.rank(ctx)
    assert {c.id for c in found[:2]} == {"python-hash-seed", "object-order"}
    for c in found[:2]:
        assert c.confidence == "possible"
        assert c.separating_pin == "hash-seed"
        assert "cannot be told apart without an experiment" in c.evidence[-1]
        assert "PYTHONHASHSEED=0" in c.evidence[-1]


def test_the_order_causes_name_the_line_that_iterates_the_set_of_their_kind() -> None:
    """The op shows where the order arrived (train.py:20); the set in scope there shows where it was made."""
    words = RunOrderedSet("features", "str", 5, ["train.py:7"], ["train.py:9"], ["train.py:11"])
    params = RunOrderedSet("terms", "objects hashed by identity", 3, ["train.py:4"], [], ["train.py:5"])
    ctx = with_op_finding(context([[hash_event(1)], [hash_event(2)]]), "input-order", "aten.cat.default",
                          [words, params])
    found = {c.id: c for c in causes.rank(ctx)}
    hashed, addressed = found["python-hash-seed"], found["object-order"]
    assert hashed.fix.startswith("iterate `sorted(features)` instead of the set at train.py:9 (built at train.py:7)")
    assert "in scope at train.py:20: the set `features` (5 str), built at train.py:7, iterated at train.py:9, used " \
           "at train.py:11; its iteration order changes from run to run" in hashed.evidence
    assert addressed.fix.startswith("keep the objects of `terms` in a list, or iterate `sorted(terms, key=...)` by a "
                                    "stable attribute, at train.py:5 (built at train.py:4)")
    assert not [line for line in addressed.evidence if "`features`" in line]


def test_causes_without_direct_evidence_are_never_likely() -> None:
    found = causes.rank(context([[hash_event(1)], [hash_event(2)]]))
    assert all(c.confidence == "possible" for c in found)


# -- causes users hit now -------------------------------------------------------------------------------------
def flag(name: str, value: str, loc: str, by: str = "", at: int = 0) -> dict[str, Any]:
    return {"type": "flag", "flag": name, "value": value, "loc": loc, "by": by or loc, "at": at}


def test_flag_drift_names_the_call_that_changed_the_flag() -> None:
    events = [flag("use_deterministic_algorithms", "True", "train.py:3"),
              flag("use_deterministic_algorithms", "True, warn_only=True", "train.py:40",
                   by="site-packages/trainer/core.py:120", at=4)]
    found = flags_module.flag_drift(context([events, events], index=10))
    assert found is not None
    assert found.cause.id == "flag-drift"
    assert "site-packages/trainer/core.py:120 (reached from train.py:40)" in found.cause.evidence[0]
    assert "torch.use_deterministic_algorithms(True, warn_only=True)" in found.cause.evidence[0]
    assert found.cause.pins == ["deterministic"]
    assert found.cause.basis == "direct"
    assert "site-packages/trainer/core.py:120" in found.cause.fix


def test_flag_set_once_or_to_the_same_value_is_no_drift() -> None:
    same = [flag("cudnn.benchmark", "False", "a.py:1"), flag("cudnn.benchmark", "False", "a.py:9")]
    assert flags_module.flag_drift(context([same, same])) is None


def test_flag_drift_seen_only_in_the_snapshots() -> None:
    events = [state("first-forward", at=0), {**state("end", at=50), "flags": flags(deterministic_algorithms=True)}]
    events[0]["flags"] = flags(deterministic_algorithms=False)
    found = flags_module.flag_drift(context([events, events]))
    assert found is not None
    assert "deterministic_algorithms was False at the first forward" in found.cause.evidence[0]


def test_flag_typo_says_what_was_meant() -> None:
    typo = {"type": "flag-typo", "module": "torch.backends.cudnn", "name": "determinstic", "value": True,
            "meant": "deterministic", "loc": "train.py:4", "by": "train.py:4"}
    found = flags_module.flag_typo(context([[typo], [typo]]))
    assert found is not None
    assert "torch.backends.cudnn.determinstic = True" in found.cause.evidence[0]
    assert "`torch.backends.cudnn.deterministic` at train.py:4" in found.cause.fix
    assert found.cause.pins == ["cudnn"]


def collective(backend: str = "nccl", **env: str) -> list[dict[str, Any]]:
    return [{"type": "environment", "device": "cuda", "env": env},
            {"type": "collective", "what": "init_process_group", "backend": backend, "world_size": 2,
             "loc": "train.py:10"},
            {"type": "collective", "what": "all_reduce", "loc": "train.py:30", "device": "cuda"}]


def test_collective_algorithm_unset_or_differing() -> None:
    unset = flags_module.collective_algorithm(context([collective(), collective()]))
    assert unset is not None
    assert unset.cause.basis == "circumstantial"
    assert unset.cause.pins == ["nccl"]
    assert any("NCCL_ALGO is not set" in line for line in unset.cause.evidence)
    differ = flags_module.collective_algorithm(context([collective(NCCL_ALGO="Ring", NCCL_PROTO="Simple"),
                                                        collective(NCCL_ALGO="Tree", NCCL_PROTO="Simple")]))
    assert differ is not None
    assert "NCCL_ALGO: Ring in repeat 0, Tree in repeat 1" in differ.cause.evidence
    fixed = collective(NCCL_ALGO="Ring", NCCL_PROTO="Simple")
    assert flags_module.collective_algorithm(context([fixed, fixed])) is None
    assert flags_module.collective_algorithm(context([collective("gloo")[:2], collective("gloo")[:2]])) is None


def test_environment_change_names_the_code_change() -> None:
    def env(commit: str, dirty: bool, script: str = "5c") -> list[dict[str, Any]]:
        return [{"type": "environment", "torch": "2.13.0", "device": "cpu", "env": {},
                 "git": {"commit": commit, "dirty": dirty, "script": script}}]

    found = causes.rank(context([env("a" * 40, False), env("b" * 40, False)]))
    assert found[0].id == "environment-change"
    assert "code: aaaaaaaaaaaa, script 5c in repeat 0, bbbbbbbbbbbb, script 5c in repeat 1" in found[0].evidence[0]
    edited = causes.rank(context([env("a" * 40, False), env("a" * 40, True, "6d")]))
    assert edited[0].id == "environment-change"
    assert "(dirty)" in edited[0].evidence[0]
    # another file of the repository edited meanwhile: the code that ran is the same
    assert device.environment(context([env("a" * 40, False), env("a" * 40, True)])) is None


def test_device_rng_geometry_across_gpu_models() -> None:
    def events(gpu: str) -> list[dict[str, Any]]:
        return [{"type": "draw", "lib": "torch", "fn": "torch.randn", "loc": "train.py:12", "generator": "global",
                 "device": "cuda"}, {"type": "state", "when": "end", "at": 99, "gpu": [gpu], "rng": {}}]

    found = causes.rank(context([events("NVIDIA H100 80GB HBM3"), events("NVIDIA A100-SXM4-80GB")]))
    assert found[0].id == "device-rng-geometry"
    assert "train.py:12" in found[0].fix
    same = context([events("NVIDIA H100 80GB HBM3"), events("NVIDIA H100 80GB HBM3")])
    assert device.device_rng_geometry(same) is None


# -- output --------------------------------------------------------------------------------------------
def _stdout_only(ref: str, other: str, mode: str = "masked") -> Context:
    diff = StdoutDifference(line=7, mode=mode, reference=0, lines={0: ref, 1: other})  # type: ignore[arg-type]
    rec = RecordInfo(-1, "stdout", "line 7", "", "", -1, "", "", "", False)
    reps = []
    for i in range(2):
        rep = RepeatEvidence(i, "cpu", Path(f"/nonexistent/repeat-{i}.trace"))
        rep.events = [{"at": 0, **hash_event(probe=100 + i)}]  # hashing varies, as it does by default
        reps.append(rep)
    return Context(Divergence(-1, "outcome", rec, [1], 0, stdout=diff), reps)


def test_only_stdout_differing_is_its_own_cause_never_hash_order_without_evidence() -> None:
    found = causes.rank(_stdout_only("epoch 3 val 0.8123 best", "epoch 3 val 0.8125 best"))
    assert [c.id for c in found] == ["stdout-differs"]
    assert found[0].confidence == "likely"
    assert "stdout line 7: 'epoch 3 val 0.8123 best' in repeat 0, 'epoch 3 val 0.8125 best' in repeat 1" in \
        found[0].evidence
    assert "differing tokens: '0.8123' vs '0.8125'" in found[0].evidence


def test_a_stdout_line_with_the_same_items_in_another_order_points_at_a_printed_set() -> None:
    [found] = causes.rank(_stdout_only("classes: {'dog', 'fish', 'cat'}", "classes: {'fish', 'cat', 'dog'}"))
    assert any(line.startswith("the lines hold the same items in another order") for line in found.evidence)


def test_a_printed_set_is_fixed_by_printing_it_sorted() -> None:
    [found] = causes.rank(_stdout_only("classes: {'dog', 'fish', 'cat'}", "classes: {'fish', 'cat', 'dog'}"))
    assert found.fix.startswith("print `sorted(...)` of the set")


def test_a_stdout_line_whose_values_changed_is_not_called_reordered() -> None:
    [found] = causes.rank(_stdout_only("epoch 3 val 0.8123 best 0.8125", "epoch 3 val 0.8125 best 0.8125"))
    assert not any("another order" in line for line in found.evidence)


def test_a_strict_stdout_divergence_in_timings_only_says_masking_would_hide_it() -> None:
    found = causes.rank(_stdout_only("step 1 time 3.10ms", "step 1 time 3.42ms", mode="strict"))
    assert found[0].id == "stdout-differs"
    assert any("`--stdout masked` compares them as equal" in line for line in found[0].evidence)
    assert not any("compares them as equal" in line for line in causes.rank(_stdout_only("a 1", "a 2", "strict"))[0]
                   .evidence)


def test_output_that_ended_early_is_quoted_as_ended() -> None:
    found = causes.rank(_stdout_only("done", None))  # type: ignore[arg-type]
    assert "stdout line 7: 'done' in repeat 0, (output ended) in repeat 1" in found[0].evidence


# -- RNG objects the script owns, seeding through helpers, seeding undone (issue 26 items 1, 2, 11) -----------
def own_rng(i: int, fn: str, lib: str = "python", value: Any = None, obj: int = 0, loc: str = "data.py:5",
            **extra: Any) -> list[dict[str, Any]]:
    """An RNG object made (or seeded) at `loc` whose state differs per repeat, and a draw from it."""
    made = {"type": "generator", "lib": lib, "fn": fn, "seeded": value is not None and fn != "Generator.seed",
            "value": value, "loc": loc, "library": False, "state": f"state-{i}", "pinned": None, "obj": obj, **extra}
    return [hash_event(i), made,
            {"type": "draw", "lib": lib, "fn": "Random.shuffle", "loc": "data.py:9", "generator": "explicit",
             "obj": obj}]


@pytest.mark.parametrize(("fn", "lib", "cause", "fix"), [
    ("random.Random", "python", "unseeded-python-rng", "`random.Random(0)`"),
    ("np.random.RandomState", "numpy", "unseeded-numpy-rng", "`np.random.RandomState(0)`"),
])
def test_an_unseeded_rng_object_is_the_top_cause_named_where_it_was_made_and_drawn(
        fn: str, lib: str, cause: str, fix: str) -> None:
    found = causes.rank(context([own_rng(0, fn, lib), own_rng(1, fn, lib)]))
    assert found[0].id == cause
    assert found[0].confidence == "likely"
    assert any(f"{fn}() at data.py:5 created" in line for line in found[0].evidence)
    assert "Random.shuffle at data.py:9 drew from it" in found[0].evidence
    assert fix in found[0].fix
    assert "data.py:5" in found[0].fix
    assert not {"object-order", "python-hash-seed"} & set(ids(context([own_rng(0, fn, lib), own_rng(1, fn, lib)])))


def test_a_torch_generator_seeded_from_the_os_is_a_varying_seed_at_its_line() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return own_rng(i, "Generator.seed", "torch", value=1000 + i, loc="dp.py:12")

    found = causes.rank(context([events(0), events(1)]))
    assert found[0].id == "varying-seed"
    assert found[0].pins == ["torch-rng"]
    assert "Generator.seed() at dp.py:12 seeded a torch.Generator from operating-system entropy" in \
        found[0].evidence[0]
    assert "`.manual_seed(0)`" in found[0].fix
    assert "instead of `.seed()` at dp.py:12" in found[0].fix


def test_a_torch_generator_seeded_with_os_bytes_names_the_values() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return own_rng(i, "Generator.manual_seed", "torch", value=77 + i, loc="crop.py:4")

    found = causes.rank(context([events(0), events(1)]))
    assert found[0].id == "varying-seed"
    assert "Generator.manual_seed at crop.py:4 seeded a torch.Generator with 77 in repeat 0, 78 in repeat 1" in \
        found[0].evidence[0]


def test_system_random_cannot_be_pinned_and_says_so() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return own_rng(i, "random.SystemRandom", entropy=True, state=None)

    found = causes.rank(context([events(0), events(1)]))
    assert found[0].id == "unseeded-python-rng"
    assert found[0].pins == []
    assert any("cannot reach SystemRandom" in line for line in found[0].evidence)
    assert "use `random.Random(0)` instead of SystemRandom" in found[0].fix


def test_an_rng_object_never_drawn_from_before_the_divergence_is_no_cause() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        made, draw = own_rng(i, "random.Random")[1:]
        return [made, {**draw, "at": 50}]

    assert rng.unseeded_python_rng(context([events(0), events(1)], index=10)) is None


def test_an_rng_object_with_a_constant_seed_is_no_cause() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [{**e, "state": "same"} if e["type"] == "generator" else e for e in own_rng(i, "random.Random", value=3)]

    ctx = context([events(0), events(1)])
    assert rng.unseeded_python_rng(ctx) is None
    assert rng.varying_seed(ctx) is None


def seeding(fn: str, lib: str, value: Any, state: str, library: bool = True, at: int = 0) -> dict[str, Any]:
    event = {"type": "seed", "lib": lib, "fn": fn, "value": value, "loc": "train.py:5", "library": library,
             "drawn_before": False, "state": state, "pinned": None, "at": at}
    return {**event, "by": "/venv/lib/python3.11/site-packages/lightning/seed.py:40"} if library else event


def test_seeding_through_a_helper_is_seeding() -> None:
    """`seed_everything(42)`: library code makes the seeding calls, on the user's line."""
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}, python={"digest": f"p{i}", "drawn": False}),
                seeding("torch.cuda.manual_seed_all", "torch", 42, None),  # type: ignore[arg-type]
                seeding("torch.manual_seed", "torch", 42, "s"), seeding("random.seed", "python", 42, "r"),
                {"type": "draw", "lib": "torch", "fn": "Tensor.uniform_", "loc": "model.py:9", "generator": "global"},
                {"type": "draw", "lib": "python", "fn": "random.shuffle", "loc": "data.py:3", "generator": "global"},
                {"type": "empty", "fn": "torch.empty", "loc": "model.py:30", "shape": [4], "digest": f"e{i}"}]

    found = ids(context([events(0), events(1)]))
    assert not {"unseeded-torch-rng", "unseeded-python-rng", "varying-seed"} & set(found)


def test_a_helper_seeding_with_a_varying_value_is_named_through_the_helper() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}),
                seeding("torch.manual_seed", "torch", 1000 + i, f"s{i}")]

    found = causes.rank(context([events(0), events(1)]))
    assert found[0].id == "varying-seed"
    assert "torch.manual_seed at train.py:5 (through lightning/seed.py:40) received 1000" in found[0].evidence[0]


def test_seeding_undone_by_a_state_restore_leaves_the_rng_unseeded() -> None:
    """fork_rng: the seeding inside it is undone on exit, and dropout draws from the unseeded RNG."""
    def events(i: int, restored: str) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}), hash_event(i),
                seeding("torch.manual_seed", "torch", 0, "s0", library=False),
                {"type": "draw", "lib": "torch", "fn": "Tensor.normal_", "loc": "bert.py:7", "generator": "global"},
                {"type": "rng-restore", "lib": "torch", "fn": "torch.set_rng_state", "loc": "bert.py:4",
                 "library": True, "by": "/usr/lib/python3.11/site-packages/torch/random.py:237 (fork_rng)",
                 "state": restored},
                {"type": "draw", "lib": "torch", "fn": "dropout", "loc": "bert.py:20", "generator": "global"}]

    found = causes.rank(context([events(0, "t0"), events(1, "t1")]))
    assert found[0].id == "unseeded-torch-rng"
    assert any("torch.set_rng_state at bert.py:4 (by torch/random.py:237 (fork_rng))" in line and "undone" in line
               for line in found[0].evidence)
    assert "dropout at bert.py:20 drew from the unseeded global torch RNG" in found[0].evidence
    assert not any("Tensor.normal_" in line for line in found[0].evidence)  # drawn while seeded
    # a restore to the same state in every repeat (a checkpoint's RNG state) keeps it seeded
    assert rng.unseeded_torch_rng(context([events(0, "same"), events(1, "same")])) is None


@pytest.mark.parametrize("fn", sorted(rng.CONSTANT_SEED))
def test_every_constant_seed_fix_runs(fn: str) -> None:
    """The fix a cause offers is code the user can paste: it runs against the real functions."""
    import random as random_module

    import numpy as np
    import torch

    call = rng.CONSTANT_SEED[fn]
    if fn.startswith("torch.cuda.") and not torch.cuda.is_available():
        assert callable(eval(call.split("(")[0], {"torch": torch}))  # CUDA seeding: a function that exists
        return
    receivers = {"Generator": torch.Generator(), "Random": random_module.Random(),
                 "RandomState": np.random.RandomState()}
    owner = receivers.get(fn.split(".")[0]) if call.startswith(".") else None
    state = (torch.get_rng_state(), random_module.getstate(), np.random.get_state())
    try:
        eval(f"rng{call}" if owner is not None else call, {"torch": torch, "np": np, "random": random_module,
                                                            "rng": owner})
    finally:
        torch.set_rng_state(state[0])
        random_module.setstate(state[1])
        np.random.set_state(state[2])


# -- values from outside (issue 26 item 4) --------------------------------------------------------------------
def test_an_outside_value_read_before_the_divergence_is_said_at_its_line_above_the_guesses() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [hash_event(i), {"type": "clock", "fn": "time.time", "loc": "train.py:13"},
                {"type": "outside", "fn": "os.getpid", "loc": "train.py:20"}]

    found = causes.rank(context([events(0), events(1)], rec=record("param", "0.weight", step=1)))
    assert found[0].id == "outside-value"
    assert found[0].confidence == "possible"
    assert "time.time at train.py:13 read the clock, which differs in every run" in found[0].evidence
    assert "os.getpid at train.py:20 read the process id, which differs in every run" in found[0].evidence
    assert "os.getpid at train.py:20" in found[0].fix  # the read nearest the divergence
    assert [c.id for c in found[1:]] == ["python-hash-seed", "object-order"]  # guesses below, not a toss-up
    assert all(c.separating_pin is None for c in found)


def test_an_outside_value_before_a_parameter_that_differs_first_points_at_the_optimizer_update() -> None:
    """A learning rate warmed up by the wall clock: the gradients agree, the parameters the step made do not."""
    events = [{"type": "clock", "fn": "time.time", "loc": "train.py:13"}]
    [found] = causes.rank(context([events, events], rec=record("param", "0.weight", step=0)))
    assert any(line.startswith("the first record to differ is parameter 0.weight as optimizer step 0 left it")
               for line in found.evidence)


def test_an_outside_value_before_a_module_output_says_nothing_of_the_optimizer() -> None:
    events = [{"type": "clock", "fn": "time.time", "loc": "train.py:13"}]
    [found] = causes.rank(context([events, events], rec=record("output", "fc", step=0)))
    assert not any("optimizer" in line for line in found.evidence)


def test_an_outside_read_is_not_listed_beside_a_cause_with_evidence() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}),
                {"type": "clock", "fn": "time.perf_counter", "loc": "train.py:3"},
                {"type": "draw", "lib": "torch", "fn": "torch.randn", "loc": "train.py:5", "generator": "global"}]

    assert ids(context([events(0), events(1)])) == ["unseeded-torch-rng"]


def test_equal_evidence_lines_are_merged_with_a_count() -> None:
    """One init line draws for a weight and its bias (two library call sites, one user line)."""
    def events(i: int) -> list[dict[str, Any]]:
        draw = {"type": "draw", "lib": "torch", "fn": "Tensor.uniform_", "loc": "x.py:16", "generator": "global"}
        return [state("import", torch={"digest": f"t{i}", "drawn": False}), draw, dict(draw)]

    [found] = causes.rank(context([events(0), events(1)]))
    assert found.evidence[0] == "Tensor.uniform_ at x.py:16 drew from the unseeded global torch RNG (2 times)"
    assert len(found.evidence) == len(set(found.evidence))


def test_an_rng_only_a_library_drew_from_at_its_import_is_not_likely() -> None:
    """`import lightning` draws `random.getrandbits` on the user's import line; the torch RNG is the real source."""
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}, python={"digest": f"p{i}", "drawn": False}),
                {"type": "draw", "lib": "python", "fn": "random.getrandbits", "loc": "train.py:2",
                 "generator": "global", "importing": True},
                {"type": "draw", "lib": "torch", "fn": "Tensor.uniform_", "loc": "train.py:9", "generator": "global"}]

    assert ids(context([events(0), events(1)])) == ["unseeded-torch-rng"]  # the import-time draw is below the line
    python = rng.unseeded_python_rng(context([events(0), events(1)]))
    assert python is not None
    assert python.cause.confidence == "possible"
    assert any("only imported libraries drew from it" in line for line in python.cause.evidence)


def test_an_outside_value_outranks_object_order_also_with_the_hash_seed_fixed() -> None:
    """PYTHONHASHSEED=0 set by the user (or repeats forked from one interpreter): object order is still a guess."""
    def events(i: int) -> list[dict[str, Any]]:
        return [hash_event(5, 0), {"type": "clock", "fn": "time.time", "loc": "train.py:13"}]

    assert ids(context([events(0), events(1)])) == ["outside-value", "object-order"]


# -- the ranking rule (docs/causes.md#ranking): confirmed > direct evidence > circumstantial > not ruled out -------
AS_COMPLETED = {"type": "concurrency", "what": "concurrent.futures.as_completed", "loc": "serve.py:18", "target": None}
THREAD = {"type": "concurrency", "what": "threading.Thread.start", "loc": "serve.py:9", "target": "work"}
CLOCK = {"type": "clock", "fn": "time.time", "loc": "train.py:10"}


def _hashing(*extra: dict[str, Any]) -> Context:
    """Two repeats whose string hashes differ (PYTHONHASHSEED unset), with these evidence events in each."""
    return context([[hash_event(1), *extra], [hash_event(2), *extra]])


def test_tier_confirmed_ranks_above_direct_evidence() -> None:
    ranked = causes.rank(_hashing(AS_COMPLETED))
    assert ranked[0].id == "concurrency"
    judged = confirm.apply(ranked, [Experiment("hash-seed", "the string hash seed", "deterministic", None)], 10)
    assert [(c.id, c.confidence) for c in judged][:2] == [("python-hash-seed", "confirmed"),
                                                          ("concurrency", "not-needed")]


def test_tier_direct_evidence_ranks_above_circumstantial() -> None:
    read = {"type": "carried", "what": "read", "path": "last.ckpt", "loc": "train.py:30", "by": "", "entries": []}
    ranked = causes.rank(context([[hash_event(1), CLOCK], [hash_event(2), CLOCK, read], [hash_event(3), CLOCK]]))
    assert [(c.id, c.basis) for c in ranked][:2] == [("carried-state", "direct"), ("outside-value", "circumstantial")]


def test_tier_circumstantial_ranks_above_not_ruled_out() -> None:
    found, not_ruled_out = causes.split(causes.rank(_hashing(CLOCK)))
    assert [c.id for c in found] == ["outside-value"]
    assert [c.id for c in not_ruled_out] == ["python-hash-seed", "object-order"]


def test_tier_not_ruled_out_alone_is_cause_not_identified() -> None:
    found, not_ruled_out = causes.split(causes.rank(_hashing()))
    assert [c.id for c in found] == ["unknown"]
    assert causes.headline(found, not_ruled_out) == ("cause not identified; `detaudit explain` tests "
                                                    "python-hash-seed, object-order")


def test_a_refuted_candidate_is_ruled_out_and_named_so() -> None:
    ranked = causes.rank(_hashing())
    judged = confirm.apply(ranked, [Experiment("hash-seed", "the string hash seed", "divergent", 10)], 10)
    found, not_ruled_out = causes.split(judged)
    assert ("python-hash-seed", "ruled-out") in [(c.id, c.confidence) for c in found]
    assert causes.headline(found, not_ruled_out) == ("cause not identified; ruled out: python-hash-seed; "
                                                    "`detaudit explain` tests object-order")


def test_a_candidate_confirmed_by_experiment_becomes_the_cause_and_unknown_goes() -> None:
    judged = confirm.apply(causes.rank(_hashing()), [Experiment("hash-seed", "h", "deterministic", None)], 10)
    found, not_ruled_out = causes.split(judged)
    assert causes.headline(found, not_ruled_out) == "top cause: python-hash-seed (confirmed)"
    assert "unknown" not in [c.id for c in found]


def test_the_order_family_is_evidenced_by_values_seen_reordered() -> None:
    found, not_ruled_out = causes.split(causes.rank(with_op_finding(_hashing(), "input-order")))
    assert {c.id for c in found[:2]} == {"python-hash-seed", "object-order"}
    assert not_ruled_out == []


def test_completion_order_with_values_seen_reordered_leads_the_order_guesses() -> None:
    """A thread-pool server saving in as_completed order (issue 35): no set, no dict; concurrency leads."""
    ranked = causes.rank(with_op_finding(_hashing(AS_COMPLETED), "input-order"))
    assert ranked[0].id == "concurrency"
    assert causes.headline(*causes.split(ranked)) == "top cause: concurrency (likely)"


def test_threads_without_completion_order_are_circumstantial() -> None:
    assert causes.rank(_hashing(THREAD))[0].basis == "circumstantial"


def test_a_pools_fix_reads_results_in_order_without_executor_map() -> None:
    pool = {"type": "concurrency", "what": "multiprocessing.Pool.imap_unordered", "loc": "prep.py:12", "target": None}
    fix = causes.rank(_hashing(pool))[0].fix
    assert "pool.imap" in fix
    assert "executor.map" not in fix


def test_a_cause_without_an_event_of_its_declared_kind_is_not_a_cause() -> None:
    """A detector that fired without any evidence event of the kind its row declares (mechanism) is demoted."""
    @detects(CauseId.CONCURRENCY)
    def stray(ctx: Context) -> Any:
        return finding("concurrency", 0.9, "threads", ["no event"], "fix", basis="direct")

    ctx = _hashing()
    assert causes._observed(ctx, stray(ctx).cause) is False
    assert causes._observed(_hashing(THREAD), stray(ctx).cause) is True


def test_every_detected_cause_declares_what_it_must_observe() -> None:
    """Unless a `run --perturb` experiment proves it, or the comparison itself is the observation (a stdout line)."""
    unobserved = [i for d in causes.DETECTORS for i in d.cause_ids
                  if not CAUSES[i].mechanism and CAUSES[i].perturb is None]
    assert unobserved == [CauseId.STDOUT_DIFFERS]


def test_seeded_too_late_is_not_never_seeded() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [state("import", torch={"digest": f"t{i}", "drawn": False}),
                {"type": "draw", "lib": "torch", "fn": "torch.randn", "loc": "train.py:5", "generator": "global",
                 "at": 0},
                {"type": "seed", "lib": "torch", "fn": "torch.manual_seed", "value": 0, "loc": "train.py:9",
                 "library": False, "drawn_before": True, "state": "s", "at": 0}]

    cause = next(c for c in causes.rank(context([events(0), events(1)])) if c.id == "unseeded-torch-rng")
    assert "never seeded" not in cause.summary
    assert "before it is seeded at train.py:9" in cause.summary


def test_torch_seed_returns_its_seed() -> None:
    def events(i: int) -> list[dict[str, Any]]:
        return [{"type": "seed", "lib": "torch", "fn": "torch.seed", "value": 2101 + i, "loc": "train.py:11",
                 "library": False, "drawn_before": False, "state": f"s{i}"}]

    line = causes.rank(context([events(0), events(1)]))[0].evidence[0]
    assert "torch.seed() at train.py:11 seeded from operating-system entropy and returned 2101" in line
