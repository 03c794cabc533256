"""What `--explain` experiments mean for the causes: stored experiments read back, and the re-ranking.

Below the audit (which attaches a run's stored experiments to every report it rebuilds) and
below explain.py (which runs new ones and stores them here). A cause whose pin alone made the
repeats agree is confirmed; one whose pin left them diverging is demoted; the experiment that
separates a toss-up settles it; a source the bisection isolated that no cause named is added. A control
that agreed with nothing pinned voids every confirmation (`not-reproduced`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from detaudit.pin import ALL, CONTROL, PINS, SEP, Pin
from detaudit.results import Cause, Experiment
from detaudit.run.rundir import read_experiments

ORDER_CAUSES = ("concurrency", "object-order", "unknown")

# the cause a pin isolates when no detector named it (id, summary, fix); ALL: a pair or more of sources
PIN_CAUSES: dict[str, tuple[str, str, str]] = {
    Pin.TORCH_RNG: ("unseeded-torch-rng", "the torch RNG differs between runs", "seed torch with a constant: "
                    "`torch.manual_seed(0)` at the start of the script"),
    Pin.NUMPY_RNG: ("unseeded-numpy-rng", "NumPy randomness differs between runs", "seed NumPy with a constant "
                    "(`np.random.seed(0)`, `np.random.default_rng(0)`)"),
    Pin.PYTHON_RNG: ("unseeded-python-rng", "Python `random` differs between runs", "seed it with a constant: "
                     "`random.seed(0)`"),
    Pin.HASH_SEED: ("python-hash-seed", "string hash randomization changes an order derived from a set or dict",
                    "iterate `sorted(...)` instead of a set of strings (or set `PYTHONHASHSEED=0`)"),
    Pin.ADDRESS_LAYOUT: ("object-order", "iteration over objects hashed by identity (memory address)",
                         "keep the objects in a list, or sort them by a stable attribute, instead of a set"),
    Pin.DETERMINISTIC: ("nondeterministic-op", "an op accumulates in thread or atomic order",
                        "call `torch.use_deterministic_algorithms(True)` at the top of the script"),
    Pin.ONE_THREAD: ("thread-count", "a multithreaded reduction sums in a run-dependent order",
                     "use a constant thread count, or `torch.use_deterministic_algorithms(True)`"),
    Pin.CUDNN: ("cudnn-benchmark", "cuDNN picks convolution algorithms per run",
                "set `torch.backends.cudnn.benchmark = False` and `torch.backends.cudnn.deterministic = True`"),
    Pin.CUBLAS: ("cublas-workspace", "cuBLAS splits matmuls in a run-dependent way",
                 "run with `CUBLAS_WORKSPACE_CONFIG=:4096:8`"),
    Pin.TF32_OFF: ("tf32", "TF32 precision", "turn TF32 off (`torch.set_float32_matmul_precision('highest')`)"),
    Pin.ZERO_EMPTY: ("uninitialized-memory", "memory read before it is written", "use `torch.zeros` instead of "
                     "`torch.empty`"),
    Pin.NCCL: ("collective-algorithm", "NCCL's reduction algorithm or protocol varies",
               "set `NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_NVLS_ENABLE=0` on every rank and run"),
    ALL: ("unknown", "several sources together: only pinning them all at once makes the repeats agree",
          "pin each of the named sources (see docs/causes.md for each pin's fix)"),
}


def saved(run_dir: Path) -> list[Experiment]:
    """The experiments stored in a run directory (none when it has no explain.json)."""
    return [e.experiment for e in read_experiments(run_dir)]


def apply(causes: Sequence[Cause], experiments: Sequence[Experiment], baseline_index: int) -> list[Cause]:
    """Confirm, qualify or demote each cause by the experiments that pinned its sources; re-rank.

    Only repeats that agree with the pin in place confirm; a first divergence that merely moved is
    reported, never counted (it moves by chance when, say, a loop's length depends on the clock).
    """
    done = {e.pin: e for e in experiments if e.verdict in ("deterministic", "divergent")}
    control = done.get(CONTROL)
    if control is not None and control.verdict == "deterministic":
        return [NOT_REPRODUCED, *(replace(c, evidence=[*c.evidence, NOT_REPRODUCED.evidence[0]]) for c in causes)]
    refuted: set[int] = set()
    judged: list[Cause] = []
    for i, cause in enumerate(causes):
        evidence = list(cause.evidence)
        for name in cause.pins:
            e = done.get(name)
            if e is None:
                continue
            if e.verdict == "deterministic":
                cause = _confirmed(replace(cause, evidence=evidence),
                                   f"--explain: with {e.description} pinned alone, the repeats agree")
                evidence = list(cause.evidence)
                break
            moved = e.first_divergence_index is not None and 0 <= baseline_index < e.first_divergence_index
            evidence.append(f"--explain: with {e.description} pinned alone, the repeats still diverge"
                            + (f" (the first divergence moved from #{baseline_index} to "
                               f"#{e.first_divergence_index}, which is no evidence by itself)" if moved else ""))
            if cause.confidence != "confirmed":
                cause = replace(cause, confidence="possible")
                refuted.add(i)
        separating = done.get(cause.separating_pin or "")
        if separating is not None and cause.separating_pin not in cause.pins and cause.confidence != "confirmed":
            if separating.verdict == "deterministic":  # the other cause of the toss-up explains it
                refuted.add(i)
            else:  # `likely` by elimination only when the pair were the only explanations offered
                rivals = [c.id for c in causes if c.separating_pin != cause.separating_pin]
                cause = replace(cause, confidence="possible" if rivals else "likely")
                evidence.append(f"--explain: with {separating.description} pinned the repeats still diverge, "
                                "which rules out the other explanation of the pair: "
                                + (f"this one remains beside {', '.join(rivals)} (not confirmed)" if rivals
                                   else "this one remains (not confirmed)"))
        judged.append(replace(cause, evidence=evidence))
    judged.extend(_isolated(judged, experiments))
    everything = done.get(ALL)
    if everything is not None and everything.verdict == "divergent":
        line = "--explain: with every pin at once the repeats still diverge, which no pinnable source explains"
        if any(c.id in ORDER_CAUSES for c in judged):
            judged = [replace(c, evidence=[*c.evidence, line]) if c.id in ORDER_CAUSES else c for c in judged]
        else:
            judged.append(Cause("unknown", "possible", "a source no pin reaches (concurrency, object order, or one "
                                "detaudit does not know)", [line], "look for threads, processes, sets of objects "
                                "and external state (files, time) between the last agreeing and the first "
                                "divergent record"))
    ranked = sorted(range(len(judged)), key=lambda i: (judged[i].confidence != "confirmed", i in refuted, i))
    return [judged[i] for i in ranked]


# the control (explain.py) agreed: the original repeats' disagreement did not come back with nothing pinned
NOT_REPRODUCED = Cause(
    "not-reproduced", "likely", "the divergence did not reproduce: re-run with nothing pinned, the repeats agree, so "
    "no experiment can confirm a source",
    ["--explain: a control with nothing pinned agreed, so a pinned experiment that agreed proves nothing"],
    "look for state one run leaves for the next (a resume or checkpoint file, a cache, a download) and start each "
    "run from the same state; a rare race shows only in more repeats (`--repeats 5`)", [], "experiment")


def _confirmed(cause: Cause, line: str) -> Cause:
    return replace(cause, confidence="confirmed", basis="experiment", evidence=[*cause.evidence, line])


def _isolated(causes: Sequence[Cause], experiments: Sequence[Experiment]) -> list[Cause]:
    """Sources the bisection isolated that no listed cause names, each confirmed by its experiment.

    Appended by the caller (the ranking puts confirmed causes first), after the listed ones.
    """
    found = [e for e in experiments if e.verdict == "deterministic" and e.pin != ALL]
    sets = [set(e.pin.split(SEP)) for e in found]
    cut_short = any(e.verdict == "skipped" for e in experiments)
    added: list[Cause] = []
    for e, names_set in zip(found, sets):
        if any(other < names_set for other in sets):
            continue  # a smaller set also made the repeats agree: that one names the source
        names = e.pin.split(SEP)
        pins = [Pin(name) for name in names if name in PINS]  # `all` pins every source: no one pin
        if any(set(pins) & set(c.pins) for c in [*causes, *added] if c.confidence == "confirmed"):
            continue
        cause_id, summary, fix = PIN_CAUSES.get(names[0] if len(names) == 1 else ALL, PIN_CAUSES[ALL])
        line = f"--explain: no recorded evidence pointed here, but with {e.description} pinned the repeats agree"
        if len(names) > 1:
            line += ("; the budget ran out before the set was narrowed further (raise --budget)" if cut_short
                     else "; none of them can be left out")
        added.append(_confirmed(Cause(cause_id, "possible", summary, [], fix, pins), line))
    return added
