"""`--explain`: confirm causes by experiment, one pinned source at a time.

The baseline repeats already showed the divergence and ranked the causes; they are not run
again. Each experiment re-runs the script (a few repeats per device) with one source pinned
(PINS: seeded RNGs, a fixed PYTHONHASHSEED, deterministic algorithms, one thread, ...), in the
order of the ranking, and compares those repeats with each other. A cause whose pin alone
removes the divergence is `confirmed`; a pin that only moves the first divergence later is
reported with where it moved to. When no single pin confirms anything, one last experiment pins
everything at once: if that still diverges, the source is one no pin reaches (concurrency,
object order, or unknown). Experiments stop at the first confirmation unless asked for all,
and never exceed the budget of extra repeats.

Repeats go into the run directory as `explain-<pin>-<i>.*`; the experiments are stored in
`explain.json` there, so `detaudit report RUN_DIR` shows them and a later explain reuses them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from detaudit import distributed, schema
from detaudit.errors import TraceError, UsageError, output_error
from detaudit.launcher import RepeatResult
from detaudit.report import Cause, Experiment, Report, write_json, write_text_atomically

EXPLAIN_FILE = "explain.json"
EXPLAIN_FORMAT = "detaudit-explain"
EXPLAIN_VERSION = 1
ALL = "all"
DEFAULT_BUDGET = 12
CHEAP_REPEATS = 2  # the default confirmation: one experiment of 2 repeats (a source that varies every run)
# experiments that are cheap and decisive in 2 repeats: the source differs in every run when unpinned
CHEAP_PINS = ("torch-rng", "numpy-rng", "python-rng", "hash-seed", "address-layout")
CUDA_PINS = ("cudnn", "cublas", "tf32-off", "nccl")
# address randomization moves memory in page steps, so a set of objects keeps its order across two
# repeats about 1 time in 8: an experiment that separates a toss-up must agree over 3 (1 in 64)
SEPARATING_REPEATS = 3
MIN_REPEATS = 2
ORDER_CAUSES = ("concurrency", "object-order", "unknown")
SEP = "+"  # experiment names for a set of pins: `hash-seed+one-thread`


@dataclass(frozen=True)
class Pin:
    """One source held fixed: environment variables for the repeat and pin names the child applies."""

    name: str
    description: str
    env: dict[str, str] = field(default_factory=dict)
    child: tuple[str, ...] = ()


PINS: dict[str, Pin] = {p.name: p for p in (
    Pin("torch-rng", "the torch RNG (seeded by detaudit; the script's seeding calls fixed)",
        child=("torch-rng",)),
    Pin("numpy-rng", "the NumPy RNG (seeded; Generators given fixed seeds)", child=("numpy-rng",)),
    Pin("python-rng", "Python's `random` (seeded; seeding calls fixed)", child=("python-rng",)),
    Pin("hash-seed", "the string hash seed (PYTHONHASHSEED=0)", env={"PYTHONHASHSEED": "0"}),
    # RNGs are seeded too: a random value's size changes allocation sizes, and with them addresses
    Pin("address-layout", "the memory layout (address randomization off, PYTHONHASHSEED=0, RNGs seeded)",
        env={"PYTHONHASHSEED": "0"}, child=("address-layout", "torch-rng", "numpy-rng", "python-rng")),
    Pin("deterministic", "the kernels (torch.use_deterministic_algorithms(True))", child=("deterministic",)),
    Pin("one-thread", "one thread (set_num_threads(1), OMP/MKL_NUM_THREADS=1)",
        env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, child=("one-thread",)),
    Pin("cudnn", "cuDNN (benchmark off, deterministic on)", child=("cudnn",)),
    Pin("cublas", "cuBLAS (CUBLAS_WORKSPACE_CONFIG=:4096:8)", env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
    Pin("tf32-off", "float32 precision (TF32 off)", child=("tf32-off",)),
    Pin("zero-empty", "uninitialized memory (torch.empty and kin return zeros)", child=("zero-empty",)),
    Pin("nccl", "NCCL's algorithm and protocol (NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_NVLS_ENABLE=0)",
        env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_NVLS_ENABLE": "0"}),
)}


# the cause a pin isolates when no detector named it (id, summary, fix); ALL: a pair or more of sources
PIN_CAUSES: dict[str, tuple[str, str, str]] = {
    "torch-rng": ("unseeded-torch-rng", "the torch RNG differs between runs", "seed torch with a constant: "
                  "`torch.manual_seed(0)` at the start of the script"),
    "numpy-rng": ("unseeded-numpy-rng", "NumPy randomness differs between runs", "seed NumPy with a constant "
                  "(`np.random.seed(0)`, `np.random.default_rng(0)`)"),
    "python-rng": ("unseeded-python-rng", "Python `random` differs between runs", "seed it with a constant: "
                   "`random.seed(0)`"),
    "hash-seed": ("python-hash-seed", "string hash randomization changes an order derived from a set or dict",
                  "iterate `sorted(...)` instead of a set of strings (or set `PYTHONHASHSEED=0`)"),
    "address-layout": ("object-order", "iteration over objects hashed by identity (memory address)",
                       "keep the objects in a list, or sort them by a stable attribute, instead of a set"),
    "deterministic": ("nondeterministic-op", "an op accumulates in thread or atomic order",
                      "call `torch.use_deterministic_algorithms(True)` at the top of the script"),
    "one-thread": ("thread-count", "a multithreaded reduction sums in a run-dependent order",
                   "use a constant thread count, or `torch.use_deterministic_algorithms(True)`"),
    "cudnn": ("cudnn-benchmark", "cuDNN picks convolution algorithms per run",
              "set `torch.backends.cudnn.benchmark = False` and `torch.backends.cudnn.deterministic = True`"),
    "cublas": ("cublas-workspace", "cuBLAS splits matmuls in a run-dependent way",
               "run with `CUBLAS_WORKSPACE_CONFIG=:4096:8`"),
    "tf32-off": ("tf32", "TF32 precision", "turn TF32 off (`torch.set_float32_matmul_precision('highest')`)"),
    "zero-empty": ("uninitialized-memory", "memory read before it is written", "use `torch.zeros` instead of "
                   "`torch.empty`"),
    "nccl": ("collective-algorithm", "NCCL's reduction algorithm or protocol varies",
             "set `NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_NVLS_ENABLE=0` on every rank and run"),
    ALL: ("unknown", "several sources together: only pinning them all at once makes the repeats agree",
          "pin each of the named sources (see docs/causes.md for each pin's fix)"),
}


def pin_of(name: str) -> Pin:
    """A pin by name; `all` is every pin at once; `a+b` is the set of pins a and b."""
    if name == ALL:
        return _combined(ALL, "every source at once", list(PINS))
    if SEP in name:
        names = name.split(SEP)
        return _combined(name, " and ".join(PINS[n].description for n in names), names)
    return PINS[name]


def _combined(name: str, description: str, names: Sequence[str]) -> Pin:
    env: dict[str, str] = {}
    for n in names:
        env.update(PINS[n].env)
    return Pin(name, description, env, tuple(dict.fromkeys(c for n in names for c in PINS[n].child)))


def plan(causes: Sequence[Cause]) -> list[str]:
    """Pins to try: the experiment that separates a toss-up first, then in the order of the ranking."""
    names = [c.separating_pin for c in causes[:1] if c.separating_pin in PINS]
    for cause in causes:
        names.extend(p for p in cause.pins if p in PINS and p not in names)
    return [n for n in names if n is not None]


def covers(pin: str, other: str) -> bool:
    """Pinning `pin` also pins everything `other` does (address-layout covers hash-seed)."""
    a, b = pin_of(pin), pin_of(other)
    return b.env.items() <= a.env.items() and set(b.child) <= set(a.child)


def separating_pin(first: Sequence[str], second: Sequence[str]) -> str | None:
    """The pin whose experiment tells two causes apart: it pins one cause's source and not the other's."""
    for name in [*first, *second]:
        if name in PINS and any(covers(name, p) for p in first) != any(covers(name, p) for p in second):
            return name
    return None


# -- stored experiments ---------------------------------------------------------------------------
def _load(run_dir: Path) -> list[dict[str, Any]]:
    from detaudit.audit import read_json_record, repeat_results

    path = Path(run_dir) / EXPLAIN_FILE
    if not path.exists():
        return []
    data = read_json_record(path, "experiment record")
    if not isinstance(data, dict) or data.get("format") != EXPLAIN_FORMAT or data.get("version") != EXPLAIN_VERSION:
        raise TraceError(f"{path}: not an experiment record this detaudit reads")
    schema.check(data, schema.EXPLAIN_RECORD, str(path))
    experiments = list(data.get("experiments", []))
    for i, entry in enumerate(experiments):
        repeat_results(entry.get("results", []), path, f"experiments[{i}].results")
    return experiments


def _save(run_dir: Path, stored: list[dict[str, Any]]) -> None:
    write_text_atomically(Path(run_dir) / EXPLAIN_FILE, json.dumps(
        {"format": EXPLAIN_FORMAT, "version": EXPLAIN_VERSION, "experiments": stored}, indent=2), mode=0o600)


def _experiment(entry: dict[str, Any]) -> Experiment:
    return Experiment(entry["pin"], entry["description"], entry["verdict"], entry.get("first_divergence_index"),
                      entry.get("note", ""))


def apply_saved(report: Report, run_dir: Path) -> None:
    """Attach stored experiments to a rebuilt report and let them re-rank its causes."""
    stored = _load(run_dir)
    if stored:
        report.experiments = [_experiment(e) for e in stored]
        index = report.first_divergence.index if report.first_divergence is not None else -1
        report.causes = apply(report.causes, report.experiments, index)


def apply(causes: list[Cause], experiments: Sequence[Experiment], baseline_index: int) -> list[Cause]:
    """Confirm, qualify or demote each cause by the experiments that pinned its sources; re-rank.

    Only repeats that agree with the pin in place confirm; a first divergence that merely moved is
    reported, never counted (it moves by chance when, say, a loop's length depends on the clock).
    """
    done = {e.pin: e for e in experiments if e.verdict in ("deterministic", "divergent")}
    refuted: set[int] = set()
    for i, cause in enumerate(causes):
        for name in cause.pins:
            e = done.get(name)
            if e is None:
                continue
            if e.verdict == "deterministic":
                _confirm(cause, f"--explain: with {e.description} pinned alone, the repeats agree")
                break
            moved = e.first_divergence_index is not None and 0 <= baseline_index < e.first_divergence_index
            cause.evidence.append(f"--explain: with {e.description} pinned alone, the repeats still diverge"
                                  + (f" (the first divergence moved from #{baseline_index} to "
                                     f"#{e.first_divergence_index}, which is no evidence by itself)" if moved else ""))
            if cause.confidence != "confirmed":
                cause.confidence = "possible"
                refuted.add(i)
        separating = done.get(cause.separating_pin or "")
        if separating is not None and cause.separating_pin not in cause.pins and cause.confidence != "confirmed":
            if separating.verdict == "deterministic":  # the other cause of the toss-up explains it
                refuted.add(i)
            else:
                cause.confidence = "likely"
                cause.evidence.append(f"--explain: with {separating.description} pinned the repeats still diverge, "
                                      "which rules out the other explanation: this one remains (not confirmed)")
    _isolated(causes, experiments)
    everything = done.get(ALL)
    if everything is not None and everything.verdict == "divergent":
        line = "--explain: with every pin at once the repeats still diverge, which no pinnable source explains"
        order = [c for c in causes if c.id in ORDER_CAUSES]
        for c in order:
            c.evidence.append(line)
        if not order:
            causes.append(Cause("unknown", "possible", "a source no pin reaches (concurrency, object order, or one "
                                "detaudit does not know)", [line], "look for threads, processes, sets of objects "
                                "and external state (files, time) between the last agreeing and the first "
                                "divergent record"))
    ranked = sorted(range(len(causes)), key=lambda i: (causes[i].confidence != "confirmed", i in refuted, i))
    return [causes[i] for i in ranked]


def _confirm(cause: Cause, line: str) -> None:
    cause.confidence = "confirmed"
    cause.basis = "experiment"
    cause.evidence.append(line)


def _isolated(causes: list[Cause], experiments: Sequence[Experiment]) -> None:
    """A source the bisection isolated that no listed cause names: add it, confirmed by that experiment.

    Appended (the ranking puts confirmed causes first): callers hold indices into `causes`.
    """
    found = [e for e in experiments if e.verdict == "deterministic" and e.pin != ALL]
    sets = [set(e.pin.split(SEP)) for e in found]
    cut_short = any(e.verdict == "skipped" for e in experiments)
    for e, names_set in zip(found, sets):
        if any(other < names_set for other in sets):
            continue  # a smaller set also made the repeats agree: that one names the source
        names = e.pin.split(SEP)
        if any(set(names) & set(c.pins) for c in causes if c.confidence == "confirmed"):
            continue
        cause_id, summary, fix = PIN_CAUSES.get(names[0] if len(names) == 1 else ALL, PIN_CAUSES[ALL])
        line = f"--explain: no recorded evidence pointed here, but with {e.description} pinned the repeats agree"
        if len(names) > 1:
            line += ("; the budget ran out before the set was narrowed further (raise --budget)" if cut_short
                     else "; none of them can be left out")
        cause = Cause(cause_id, "possible", summary, [], fix, names)
        _confirm(cause, line)
        causes.append(cause)


# -- running experiments ----------------------------------------------------------------------------
def _free_prefix(run_dir: Path, base: str) -> str:
    prefix, n = base, 1
    while any(Path(run_dir).glob(f"{prefix}-*.trace")):
        n += 1
        prefix = f"{base}.{n}"
    return prefix


def _verdict(report: Report, baseline: Report) -> tuple[str, int | None, str]:
    """(verdict, first divergence index, note) of one experiment's repeats.

    Only repeats that all ran to the end, with complete traces and the exit status the baseline
    had, can confirm a pin: a crash or a missing trace proves nothing (`failed`), and exit
    statuses that still differ are a divergence.
    """
    baseline_index = baseline.first_divergence.index if baseline.first_divergence is not None else -1
    if report.verdict == "failed":
        return "failed", None, "the script failed in every pinned repeat"
    if report.timed_out:
        return "failed", None, "a pinned repeat timed out"
    ok_codes = {r.exit_code for r in baseline.runs}
    ended = report.outcome_divergence
    if ended is not None and ended.record is None and len(ok_codes) > 1:  # exit statuses differ, as before
        first = report.comparison.first_divergence
        return ("divergent", first.index if first is not None else None,
                f"the repeats still end differently ({ended.detail})")
    broken = [f"repeat {r.index} exited {r.exit_code}" for r in report.runs if r.exit_code not in ok_codes]
    broken += [f"repeat {r.index} left an incomplete or no trace" for r, complete
               in zip(report.runs, report.comparison.complete) if not complete]
    if broken:
        return "failed", None, f"inconclusive: {'; '.join(broken)}"
    first = report.comparison.first_divergence
    if first is None:
        if report.outcome_divergence is not None and baseline_index < 0:
            return "divergent", None, report.outcome_divergence.detail
        note = f"the output still differs ({report.outcome_divergence.detail})" if report.outcome_divergence else ""
        return "deterministic", None, note
    rec = first.record
    where = f"{rec.kind} {rec.name} step {rec.step}" if rec is not None else first.detail
    if baseline_index >= 0 and first.index > baseline_index:
        return "divergent", first.index, f"moved later, to #{first.index}: {where}"
    return "divergent", first.index, f"still at #{first.index}: {where}"


def cheap_pin(causes: Sequence[Cause]) -> str | None:
    """The one inexpensive, decisive experiment for the top cause (or the toss-up at the top), if there is one."""
    if not causes or causes[0].confidence == "confirmed":
        return None
    top = causes[0]
    candidates = [top.separating_pin] if top.separating_pin else list(dict.fromkeys(top.pins))
    return candidates[0] if len(candidates) == 1 and candidates[0] in CHEAP_PINS else None


def bisection_pins(devices: Sequence[str]) -> list[str]:
    """The pins a bisection splits: CUDA-only pins only when a repeat ran on a GPU."""
    return [p for p in PINS if p not in CUDA_PINS or "cuda" in devices]


def run_experiments(run_dir: Path, budget: int = DEFAULT_BUDGET, explain_all: bool = False,
                    repeats: int | None = None, jobs: int = 1,
                    on_done: Callable[[RepeatResult], None] | None = None,
                    on_experiment: Callable[[Experiment], None] | None = None,
                    script_args: Sequence[str] | None = None, cheap: bool = False) -> Report:
    """Run the experiments for a finished, divergent run and return its report with them applied.

    `repeats` per device and experiment defaults to the baseline's; `budget` bounds their total.
    `script_args`: the real arguments of a run recorded with --redact-args (its run.json has none).
    One explain at a time per run directory: a second one would pick the same file names and
    overwrite explain.json under the first. `cheap`: only the top cause's one inexpensive, decisive
    experiment (`cheap_pin`), with CHEAP_REPEATS repeats: the default confirmation after a divergent `run`.
    """
    with _exclusive(Path(run_dir)):
        return _run_experiments(run_dir, budget, explain_all, repeats, jobs, on_done, on_experiment, script_args,
                                cheap)


@contextlib.contextmanager
def _exclusive(run_dir: Path) -> Iterator[None]:
    """Hold `RUN_DIR/.explain.lock` (flock, released however the process ends) or refuse at once."""
    if not (run_dir / "run.json").is_file():  # not a run directory: leave no file in it (the caller says why)
        yield
        return
    try:
        fd = os.open(run_dir / ".explain.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise output_error(run_dir / ".explain.lock", exc) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"{run_dir}: another `detaudit explain` is running on this run directory; wait for "
                             "it to finish") from None
        yield
    finally:
        os.close(fd)


def _run_experiments(run_dir: Path, budget: int, explain_all: bool, repeats: int | None, jobs: int,
                     on_done: Callable[[RepeatResult], None] | None,
                     on_experiment: Callable[[Experiment], None] | None,
                     script_args: Sequence[str] | None, cheap: bool) -> Report:
    from detaudit.audit import AuditOptions, analyse, execute, load_run, read_run, tolerance_of
    from detaudit.stdout import recorded_mode

    run_dir = Path(run_dir).resolve()  # the repeats run in the script's directory, not ours
    report = load_run(run_dir)
    if report.verdict != "divergent" or report.first_divergence is None:
        raise UsageError(f"{run_dir}: the run is {report.verdict}; --explain needs a divergent run")
    if report.timed_out:
        raise UsageError(f"{run_dir}: a repeat timed out; --explain needs a run whose repeats all finished")
    record, _ = read_run(run_dir)
    redacted = bool(record.get("args_redacted"))
    if redacted and script_args is None and record.get("script_args"):
        raise UsageError(f"{run_dir}: the run was recorded with --redact-args, so its script arguments were not "
                         "stored and cannot be re-run; use `detaudit run ... --redact-args --explain`")
    stored = _load(run_dir)
    # as many repeats per device as the baseline had: fewer would let chance agreement "confirm" a pin
    repeats = CHEAP_REPEATS if cheap else repeats or max(MIN_REPEATS, int(record.get("repeats") or MIN_REPEATS))
    cwd = Path(record.get("cwd") or ".").resolve()
    script = Path(record["script"])
    args = list(record.get("script_args", []) if script_args is None else script_args)
    base = AuditOptions(
        script=script if script.is_absolute() else cwd / script, script_args=args,
        repeats=repeats, devices=list(record.get("devices") or ["cpu"]), timeout=record.get("timeout"), jobs=jobs,
        # the baseline's own kind of trace, so record indices compare (auto's base run is module)
        granularity="module" if record.get("granularity") in (None, "auto") else str(record["granularity"]),
        tolerance=tolerance_of(record), own_device=bool(record.get("own_device")),
        stdout=recorded_mode(record), module=record.get("module"), redact_args=redacted,
        max_steps=record.get("max_steps"), max_time=record.get("max_time"),
        **distributed.options_of(record),
    )
    # a toss-up's separating experiment can agree by chance (objects land in the same order 1 time in 8):
    # it gets SEPARATING_REPEATS repeats at least
    separating = report.causes[0].separating_pin if report.causes else None

    def repeats_for(name: str) -> int:
        return max(repeats, SEPARATING_REPEATS) if name == separating else repeats

    first = cheap_pin(report.causes) if cheap else None
    # the default confirmation: one experiment, whatever --budget says
    budget = repeats_for(first) * len(base.devices) if first is not None else budget
    spent = 0
    bisecting = False

    def run_pin(name: str) -> Experiment:
        """One experiment; one already run (and not skipped) is reused, not run again."""
        nonlocal spent
        done = next((e for e in stored if e["pin"] == name and e["verdict"] != "skipped"), None)
        if done is not None:
            return _experiment(done)
        pin = pin_of(name)
        stored[:] = [e for e in stored if e["pin"] != name]  # a pin skipped earlier, now run
        cost = repeats_for(name) * len(base.devices)
        if spent + cost > budget:
            experiment = Experiment(name, pin.description, "skipped", None,
                                    f"over the budget of {budget} extra repeats")
            stored.append(asdict(experiment))
            _save(run_dir, stored)
            if bisecting:
                raise _OverBudget
            return experiment
        spent += cost
        options = replace(base, repeats=repeats_for(name), env={**record.get("env", {}), **pin.env},
                          child_config={"pins": list(pin.child)})
        prefix = _free_prefix(run_dir, f"explain-{name}")
        results = execute(options, run_dir, on_done, prefix=prefix, cwd=cwd)
        sub = analyse(run_dir, {**record, "narrowing": None, "results": [r.to_dict() for r in results]}, results)
        verdict, index, note = _verdict(sub, report)
        experiment = Experiment(name, pin.description, verdict, index, note)
        stored.append({**asdict(experiment), "prefix": prefix, "results": [r.to_dict() for r in results]})
        _save(run_dir, stored)
        if on_experiment is not None:
            on_experiment(experiment)
        return experiment

    def agrees(name: str) -> bool:
        return run_pin(name).verdict == "deterministic"

    if cheap:
        if first is not None:
            run_pin(first)
    else:
        confirmed = any(e["verdict"] == "deterministic" and e["pin"] != ALL for e in stored)
        for name in plan(report.causes):
            if confirmed and not explain_all:
                break
            confirmed = agrees(name) or confirmed
        if (not confirmed or explain_all) and agrees(ALL) and not confirmed:
            bisecting = True
            with contextlib.suppress(_OverBudget):  # the skipped experiment says so in the report
                bisect(bisection_pins(base.devices), agrees)
    report = load_run(run_dir)
    write_json(report, run_dir / "report.json", mode=0o600)
    return report


class _OverBudget(Exception):
    """The budget ran out in the middle of a bisection: stop it there."""


def bisect(candidates: list[str], agrees: Callable[[str], bool]) -> list[str]:
    """Every pin at once makes the repeats agree and no single candidate did: narrow the set down.

    Halve while one half alone still makes the repeats agree; when neither half does (sources in
    both), drop one pin at a time while the rest still agree. Returns the smallest set found (one
    source, or a named pair or more); its experiment is recorded under the set's name.
    """
    while len(candidates) > 1:
        half = len(candidates) // 2
        part = next((p for p in (candidates[:half], candidates[half:]) if agrees(SEP.join(p))), None)
        if part is None:
            break
        candidates = part
    for name in list(candidates):
        if len(candidates) > 1:
            rest = [c for c in candidates if c != name]
            if agrees(SEP.join(rest)):
                candidates = rest
    return candidates
