"""The experiments that follow an audit, as the core's `Experimenter` (audit/follow_up.py): the top cause's one
cheap confirmation and --explain's experiments, run by explain/runner.py on the audit's Analysis in memory; and
why a divergent run gets no cheap confirmation (`cheap_skipped`), for the front end to say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from detaudit.audit.analysis import Analysis
from detaudit.audit.follow_up import FollowUp
from detaudit.causes import NO_EVIDENCE, UNKNOWN, leads
from detaudit.explain.runner import CHEAP_REPEATS, DEFAULT_BUDGET, cheap_pin, cheap_pin_of, experiment_on, unsupported
from detaudit.report.model import Report
from detaudit.results import Experiment, RepeatProgress, RepeatResult


@dataclass(frozen=True)
class PinnedExperiments:
    """explain/runner.py's experiments as the audit's Experimenter. The front end hears of them (each optional):
    each repeat that ended and where each running one stands (audit.execute), each experiment's result, a round
    of pinned repeats starting (`on_round(cheap, its repeats at most)`), and why a divergent run gets no cheap
    confirmation (`on_skipped`)."""

    on_done: Callable[[RepeatResult], None] | None = None
    on_progress: Callable[[RepeatProgress], None] | None = None
    on_experiment: Callable[[Experiment], None] | None = None
    on_round: Callable[[bool, int], None] | None = None
    on_skipped: Callable[[str], None] | None = None

    def confirm(self, analysis: Analysis, follow_up: FollowUp) -> Analysis:
        """The top cause's cheap experiment (runner.cheap_pin), unless experiments ran already or it has none."""
        report = analysis.report_made()
        if report.experiments or cheap_pin_of(report) is None:
            why = "" if report.experiments else cheap_skipped(report)
            if why and self.on_skipped is not None:
                self.on_skipped(why)
            return analysis
        return self._run(analysis, replace(follow_up, cheap=True), CHEAP_REPEATS)

    def explain(self, analysis: Analysis, follow_up: FollowUp) -> Analysis:
        """--explain's experiments, up to the first confirmation (every candidate's with `explain_all`)."""
        return self._run(analysis, replace(follow_up, cheap=False), follow_up.budget or DEFAULT_BUDGET)

    def _run(self, analysis: Analysis, follow_up: FollowUp, most: int) -> Analysis:
        if self.on_round is not None:
            self.on_round(follow_up.cheap, most)
        return experiment_on(analysis, follow_up, self.on_done, self.on_progress, self.on_experiment)


def cheap_skipped(report: Report) -> str:
    """Why a divergent run gets no cheap confirmation, in one line, where the top cause has no pin (nothing holds
    a clock read or a race fixed) and nothing else is worth a pinned re-run; "" otherwise (the experiment runs,
    or the top cause's pins are `detaudit explain`'s to run)."""
    causes = leads(report.causes, report.not_ruled_out)
    if causes and causes[0].basis == NO_EVIDENCE and causes[0].confidence != "confirmed":
        return (f"no evidence points at any cause's mechanism, so no experiment tests a guess; `detaudit explain` "
                f"tests the candidates not ruled out ({', '.join(c.id for c in report.not_ruled_out)})")
    if not causes or causes[0].id == UNKNOWN or causes[0].pins or cheap_pin(causes) is not None \
            or causes[0].confidence == "confirmed":
        return ""
    top = causes[0]
    guesses = [c.id for c in causes[1:] if unsupported(c, top)]
    untested = (f"; the candidates with no evidence of their mechanism ({', '.join(guesses)}) are not tested in its "
                "place") if guesses else ""
    return f"no experiment pins {top.id}'s source, so none can confirm it{untested}"


