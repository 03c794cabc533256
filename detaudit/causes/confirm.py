"""What `--explain` experiments mean for the causes: the re-ranking.

A pure function of the causes and the experiments it is handed (it reads no file): the audit reads a
run's stored experiments (run/rundir.py `read_experiments`) and hands them in; explain/runner.py runs
new ones. A cause whose pin alone made the repeats agree is confirmed (a pin that also holds other
sources fixed, only when those alone do not); one whose pin left them diverging is ruled out; once a
source is confirmed, the others are not needed; the experiment that separates a toss-up settles it; a
source the bisection isolated that no cause named is added. A control that agreed with nothing pinned
voids every confirmation (`not-reproduced`), and is weak evidence beside a top cause with evidence at
the first divergence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from detaudit.cause_table import CAUSES, ISOLATED, CauseId
from detaudit.pin import ALL, CONTROL, PINS, SEP, Pin, also_pins
from detaudit.results import Cause, Experiment

# causes that "everything pinned still diverges" supports (cause_table.CauseSpec.beyond_pins)
ORDER_CAUSES = tuple(s.id.value for s in CAUSES.values() if s.beyond_pins)
# a set of sources only pinned together made the repeats agree (ALL): reported as `unknown` with this summary and fix
SEVERAL_SOURCES = ("several sources together: only pinning them all at once makes the repeats agree",
                   "pin each of the named sources (see docs/causes.md for each pin's fix)")


def apply(causes: Sequence[Cause], experiments: Sequence[Experiment], baseline_index: int) -> list[Cause]:
    """Confirm, qualify or rule out each cause by the experiments that pinned its sources; re-rank.

    Only repeats that agree with the pin in place confirm; a first divergence that merely moved is
    reported, never counted (it moves by chance when, say, a loop's length depends on the clock). An
    experiment confirms a cause only when it changed that cause's source alone: one that also pins
    other sources (address-layout: the hash seed and the RNGs too) confirms only when those others,
    pinned without it, leave the repeats diverging. A cause whose own experiment failed is `ruled-out`;
    one that another experiment made unnecessary is `not-needed`; both are listed after the others.
    """
    done = {e.pin: e for e in experiments if e.verdict in ("deterministic", "divergent")}
    control = done.get(CONTROL)
    if control is not None and control.verdict == "deterministic":
        return _not_reproduced(causes)
    refuted: set[int] = set()
    unneeded: set[int] = set()
    judged: list[Cause] = []
    for i, cause in enumerate(causes):
        cause, verdicts = _by_own_pins(cause, done, baseline_index)
        cause, separated = _by_separating_pin(cause, done, causes)
        if "ruled-out" in verdicts:
            refuted.add(i)
        if "not-needed" in (*verdicts, separated):
            unneeded.add(i)
        judged.append(cause)
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
    judged = _below_the_line(judged, refuted, unneeded)
    rank = {"confirmed": 0, "not-needed": 2, "ruled-out": 3}
    return sorted(judged, key=lambda c: rank.get(c.confidence, 1))  # stable: the ranking within each group


def _by_own_pins(cause: Cause, done: dict[str, Experiment], baseline_index: int) -> tuple[Cause, set[str]]:
    """The cause with what the experiments of its own pins say, and what they come to: "ruled-out" (a pin left
    the repeats diverging), then "confirmed" or "not-needed" (another source explains the agreement)."""
    evidence = list(cause.evidence)
    verdicts: set[str] = set()
    for name in cause.pins:
        e = done.get(name)
        if e is None:
            continue
        if e.verdict == "deterministic":
            settled, line = _alone(name, e, done)
            if settled == "confirmed":
                return _confirmed(replace(cause, evidence=evidence), line), {*verdicts, "confirmed"}
            evidence.append(line)
            if settled == "not-needed":
                return replace(cause, evidence=evidence), {*verdicts, "not-needed"}
            continue
        moved = e.first_divergence_index is not None and 0 <= baseline_index < e.first_divergence_index
        evidence.append(f"--explain: with {e.description} pinned alone, the repeats still diverge"
                        + (f" (the first divergence moved from #{baseline_index} to "
                           f"#{e.first_divergence_index}, which is no evidence by itself)" if moved else ""))
        if cause.confidence != "confirmed":
            verdicts.add("ruled-out")
    return replace(cause, evidence=evidence), verdicts


def _by_separating_pin(cause: Cause, done: dict[str, Experiment], causes: Sequence[Cause]) -> tuple[Cause, str]:
    """The cause with what the experiment that separates its toss-up says when that pin is the other cause's:
    "not-needed" when it agreed (the other explains it), else the cause kept, `likely` by elimination only
    when the pair were the only explanations offered."""
    separating = done.get(cause.separating_pin or "")
    if separating is None or cause.separating_pin in cause.pins or cause.confidence == "confirmed":
        return cause, ""
    if separating.verdict == "deterministic":  # the other cause of the toss-up explains it
        return cause, "not-needed"
    rivals = [c.id for c in causes if c.separating_pin != cause.separating_pin]
    remains = f"this one remains beside {', '.join(rivals)} (not confirmed)" if rivals else \
        "this one remains (not confirmed)"
    line = (f"--explain: with {separating.description} pinned the repeats still diverge, which rules out the other "
            f"explanation of the pair: {remains}")
    return replace(cause, confidence="possible" if rivals else "likely", evidence=[*cause.evidence, line]), ""


def _alone(name: str, e: Experiment, done: dict[str, Experiment]) -> tuple[str, str]:
    """What an agreeing experiment says about its own source: (confirmed | not-needed | narrowed, the line)."""
    others = also_pins(name)
    if not others:
        return "confirmed", f"--explain: with {e.description} pinned alone, the repeats agree"
    rest = done.get(SEP.join(others))
    changed = ", ".join(others)
    if rest is None:
        return "narrowed", (f"--explain: with {e.description} pinned the repeats agree, but that experiment also "
                            f"pins {changed}: it narrows the source to these and confirms none of them alone")
    if rest.verdict == "deterministic":
        return "not-needed", (f"--explain: not needed: the {name} experiment also pins {changed}, and with those "
                              "pinned without it the repeats agree too")
    return "confirmed", (f"--explain: with {e.description} pinned the repeats agree, and with only the rest of what "
                         f"it pins ({changed}) they still diverge")


def _below_the_line(causes: list[Cause], refuted: set[int], unneeded: set[int]) -> list[Cause]:
    """Causes an experiment ruled out or made unnecessary, marked as such. Once a source is confirmed, every
    cause not confirmed is unnecessary; one pinned among a confirmed set of sources (each alone failing,
    together agreeing) stays possible."""
    confirmed = [c for c in causes if c.confidence == "confirmed"]
    together = {p for c in confirmed if len(c.pins) > 1 for p in c.pins}
    marked = []
    for i, cause in enumerate(causes):
        if cause.confidence == "confirmed":
            marked.append(cause)
        elif i in refuted and together & set(cause.pins):
            marked.append(replace(cause, confidence="possible", evidence=[
                *cause.evidence, "--explain: one of the sources that only pinned together make the repeats agree"]))
        elif i in refuted:
            marked.append(replace(cause, confidence="ruled-out"))
        elif i in unneeded:
            marked.append(replace(cause, confidence="not-needed"))
        elif confirmed:
            marked.append(replace(cause, confidence="not-needed", evidence=[
                *cause.evidence, f"--explain: not needed to explain this divergence: {confirmed[0].id} was confirmed "
                                 "by an experiment that did not pin this cause's source"]))
        else:
            marked.append(cause)
    return marked


def _not_reproduced(causes: Sequence[Cause]) -> list[Cause]:
    """The control agreed: no experiment confirms anything. When the top cause's own evidence touches the first
    divergence (direct or op-level), that evidence still leads: one agreeing control, for a source that fires by
    chance (a random value that only sometimes takes the other branch, a race), is weak evidence against it."""
    marked = [replace(c, evidence=[*c.evidence, NOT_REPRODUCED.evidence[0]]) for c in causes]
    if marked and marked[0].basis in ("op-records", "direct"):
        weak = replace(NOT_REPRODUCED, confidence="possible", evidence=[
            *NOT_REPRODUCED.evidence, f"weak evidence: {marked[0].id} has evidence at the first divergence, and a "
            "source that fires by chance can agree in one control"])
        return [marked[0], weak, *marked[1:]]
    return [NOT_REPRODUCED, *marked]


# the control (explain.py) agreed: the original repeats' disagreement did not come back with nothing pinned
NOT_REPRODUCED = Cause(
    "not-reproduced", "likely", "the divergence did not reproduce: re-run with nothing pinned, the repeats agree, so "
    "no experiment can confirm a source",
    ["--explain: a control with nothing pinned agreed, so a pinned experiment that agreed proves nothing"],
    "look for state one run leaves for the next (a resume or checkpoint file, a cache, a download) and start each "
    "run from the same state; a rare race shows only in more repeats (`--repeats 5`)", [], "experiment")


def _confirmed(cause: Cause, line: str) -> Cause:
    return replace(cause, confidence="confirmed", basis="experiment", evidence=[*cause.evidence, line])


def _isolated_cause(names: Sequence[str]) -> tuple[str, str, str]:
    """(id, summary, fix) of the source the experiment pinning `names` isolated: the cause its one pin isolates
    (cause_table.ISOLATED), else `unknown` for several sources together."""
    spec = ISOLATED.get(Pin(names[0])) if len(names) == 1 and names[0] in PINS else None
    if spec is None or spec.isolation is None:
        return (CauseId.UNKNOWN.value, *SEVERAL_SOURCES)
    return spec.id.value, spec.isolation.summary, spec.isolation.fix


def _isolated(causes: Sequence[Cause], experiments: Sequence[Experiment]) -> list[Cause]:
    """Sources the bisection isolated that no listed cause names, each confirmed by its experiment.

    Appended by the caller (the ranking puts confirmed causes first), after the listed ones.
    """
    found = [e for e in experiments if e.verdict == "deterministic" and e.pin != ALL]
    done = {e.pin: e for e in experiments if e.verdict in ("deterministic", "divergent")}
    sets = [set(e.pin.split(SEP)) for e in found]
    cut_short = any(e.verdict == "skipped" for e in experiments)
    added: list[Cause] = []
    for e, names_set in zip(found, sets):
        if any(other < names_set for other in sets):
            continue  # a smaller set also made the repeats agree: that one names the source
        names = e.pin.split(SEP)
        if len(names) == 1 and also_pins(names[0]) and _alone(names[0], e, done)[0] != "confirmed":
            continue  # it also pinned other sources, and pinning those alone did not leave the repeats diverging
        pins = [Pin(name) for name in names if name in PINS]  # `all` pins every source: no one pin
        if any(set(pins) & set(c.pins) for c in [*causes, *added] if c.confidence == "confirmed"):
            continue
        cause_id, summary, fix = _isolated_cause(names)
        line = f"--explain: no recorded evidence pointed here, but with {e.description} pinned the repeats agree"
        if len(names) > 1:
            line += ("; the budget ran out before the set was narrowed further (raise --budget)" if cut_short
                     else "; none of them can be left out")
        added.append(_confirmed(Cause(cause_id, "possible", summary, [], fix, pins), line))
    return added
