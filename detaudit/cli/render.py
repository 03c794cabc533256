"""Rich terminal rendering of a Report: the only module besides commands.py that knows about terminals."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any, Protocol

from rich.console import Console, Group
from rich.markup import escape as _markup_escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from detaudit.compare.oprules import VERDICTS, OpFinding, traced_note
from detaudit.report.model import Report, finite, where
from detaudit.results import Cause, Divergence, Ending, RecordInfo
from detaudit.safetext import printable

_VERDICT_STYLE = {"deterministic": "bold green", "divergent": "bold red", "failed": "bold yellow",
                  "timeout": "bold red", "inconclusive": "bold yellow", "repeated-randomness": "bold red"}
MAX_SPREAD_ROWS = 12
MAX_STDOUT_REPEATS = 2  # differing repeats whose stdout line the terminal shows
BELOW_THE_LINE = ("not-needed", "ruled-out")  # an experiment refuted the cause or made it unnecessary
BASIS_TEXT = {"experiment": "experiment", "op-records": "op-level records", "direct": "direct evidence",
              "circumstantial": "circumstantial", "no-evidence": "no evidence"}


def escape(text: str) -> str:
    """User text for the terminal: no rich markup, no terminal control sequences (names, paths and
    stderr come from the script or from a trace made elsewhere)."""
    return _markup_escape(printable(text))


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def verdict_line(report: Report) -> Text:
    devices = sorted({r.device for r in report.runs})
    text = Text(report.verdict.upper(), style=_VERDICT_STYLE[report.verdict])
    text.append(printable(_verdict_reason(report) + f" on {', '.join(devices)}"))
    for clause in _VERDICT_CLAUSES:
        said = clause(report)
        if said is not None:
            text.append(said[0], style=said[1])
    return text


def _verdict_reason(report: Report) -> str:
    """What the verdict rests on: the text after `DIVERGENT`, before the devices."""
    n = len(report.runs)
    sensitive = report.perturbation.sensitive if report.perturbation is not None else []
    if sensitive:
        return (f": the bits change with the settings varied ({', '.join(k.knob for k in sensitive)}), while "
                f"repeats with equal settings agree ({n} repeats)")
    if report.verdict == "divergent" and report.causes and report.causes[0].id == "environment-change":
        return ": the environment changed between the recordings, which is not run-to-run nondeterminism " \
               f"({report.causes[0].summary.split('(', 1)[-1].split(')', 1)[0]} differ)"
    if report.verdict == "deterministic":
        return f": {n} repeats agree {_agreement(report)}"
    if report.verdict == "repeated-randomness":
        return (f": {n} repeats agree {_agreement(report)}, but draws repeat where they should differ "
                "(--fail-on-repeated-randomness)")
    if report.verdict == "divergent":
        return f": repeats disagree ({n} repeats)" if report.first_divergence is not None \
            else f": the repeats agree, but DDP replicas differ across ranks ({n} repeats)"
    if report.verdict == "failed":
        return f": the script failed in every repeat ({n} repeats)"
    if report.verdict == "timeout":
        return f": repeat(s) {_timed_out(report)} of {n} timed out"
    return f": {report.inconclusive_reason} ({n} repeats)"


def _agreement(report: Report) -> str:
    """How closely deterministic repeats agree."""
    if not report.bitwise:
        return "within tolerance"
    if len({r.device for r in report.runs}) > 1:
        return "bit for bit on each device and within tolerance across devices"
    return "bit for bit"


def _timed_out(report: Report) -> str:
    return ", ".join(str(r.index) for r in report.runs if r.ending is Ending.TIMED_OUT)


# the clauses the verdict line goes on with, in order: each says its text and style, or None when it does not apply
_Clause = tuple[str, str | None]


def _timeout_scope(report: Report) -> _Clause | None:
    if report.verdict != "timeout":
        return None
    return (f"; the repeats agree on the {report.records_agreed()} all of them made before that, "
            "which says nothing about the rest", None)


def _late_repeats(report: Report) -> _Clause | None:
    if not report.timed_out or report.verdict == "timeout":
        return None
    return f" — repeat(s) {_timed_out(report)} timed out", "bold red"


def _incomplete(report: Report) -> _Clause | None:
    if all(report.comparison.complete) or report.timed_out or report.verdict == "inconclusive":
        return None
    return " (incomplete recordings are compared as far as they go)", None


def _bounded(report: Report) -> _Clause | None:
    stops = sorted({r.stopped_at_step for r in report.runs if r.stopped_at_step is not None
                    and r.stopped_by != "divergence"})
    if not stops:
        return None
    return (f"; bounded: repeats stopped after step {', '.join(map(str, stops))} (--max-steps/--max-time), "
            "the steps every repeat completed are compared", None)


def _stopped_early(report: Report) -> _Clause | None:
    early = [r for r in report.runs if r.stopped_by == "divergence"]
    if not early:
        return None
    steps = sorted({r.stopped_at_step for r in early if r.stopped_at_step is not None})
    reference = "; repeat 0, the others' reference, once all had" if any(r.index == 0 for r in early) else ""
    return (f"; repeat(s) {', '.join(str(r.index) for r in early)} stopped after step "
            f"{', '.join(map(str, steps))}, a few steps after diverging{reference} (their exit status and later "
            "stdout are not compared; --run-to-end runs every repeat to its end)", None)


def _recording_cut(report: Report) -> _Clause | None:
    cut = [r for r in report.runs if r.recording_stopped]
    if not cut:
        return None
    which = ", ".join(str(r.index) for r in cut)
    return (f"; recording stopped early in repeat(s) {which} ({cut[0].recording_stopped}): compared as far "
            "as every repeat recorded", "bold yellow")


def _rerun_alone(report: Report) -> _Clause | None:
    alone = [r for r in report.runs if r.rerun_alone]
    if not alone:
        return None
    which = ", ".join(str(r.index) for r in alone)
    return (printable(f"; repeat(s) {which} re-run one after another ({alone[0].rerun_alone}): "
                      "detaudit's own parallelism is never compared"), "bold yellow")


def _baseline_result(report: Report) -> _Clause | None:
    if report.baseline is None:
        return None
    if report.baseline.matches:
        return "; matches the baseline", ""
    return "; DIFFERS FROM THE BASELINE", "bold red"


_VERDICT_CLAUSES = (_timeout_scope, _late_repeats, _incomplete, _bounded, _stopped_early, _recording_cut,
                    _rerun_alone, _baseline_result)


def baseline_panel(report: Report) -> Panel | None:
    """Where the run first differs from the baseline, next to what changed in the environment."""
    check = report.baseline
    if check is None or (check.matches and not check.environment_changes):
        return None
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    d = check.divergence
    if d is None:
        grid.add_row("result", f"matches ({check.records_compared} records compared)")
    else:
        at = where(d)
        place = " ".join(x for x in (at.kind, at.name, f"in {at.module}" if at.module else "") if x)
        grid.add_row("first differs", escape(f"record #{d.index}" if d.index >= 0 else d.category))
        peak = finite(d.max_abs_diff)
        for key, value in (("at", place), ("step", at.step if (at.step or 0) >= 0 else None),
                           ("location", at.location), ("detail", d.detail),
                           ("max |diff|", _fmt(peak) if peak is not None else None),
                           ("differing", f"{check.records_differing} of {check.records_compared} records")):
            if value not in (None, ""):
                grid.add_row(key, escape(str(value)))
    if check.environment_changes:
        grid.add_row("changed since", "the baseline was recorded:")
        for c in check.environment_changes:
            grid.add_row(f"  {escape(c.field)}", escape(f"{_fmt(c.baseline)} → {_fmt(c.current)}"))
    elif d is not None:
        grid.add_row("environment", "unchanged: the numbers changed with the same software and settings")
    for sensitivity in check.sensitivities:
        grid.add_row(escape(sensitivity.setting), Text(
            printable(f"{', '.join(sensitivity.fields)}: {sensitivity.note}"),
            style={"sensitive": "bold red", "survived": "green"}.get(sensitivity.status, "yellow")))
    return Panel(grid, title=f"Baseline {escape(check.path)}", title_align="left",
                 border_style="green" if check.matches else "red", expand=False)


def runs_table(report: Report) -> Table:
    named = bool(report.recordings)  # `compare`: each recording by its own name, not as a repeat
    table = Table(title="Recordings compared" if named else "Repeats", title_justify="left", show_edge=False)
    perturbed = any(r.perturbation for r in report.runs)
    for col in ("recording" if named else "repeat", "device", "exit", "time (s)", "records", "trace",
                *(("settings",) if perturbed else ())):
        table.add_column(col, justify="right" if col in ("repeat", "exit", "time (s)", "records") else "left")
    comp = report.comparison
    for r in report.runs:
        exit_text = "timeout" if r.timed_out else "stopped" if r.interrupted else "?" if r.exit_code is None \
            else str(r.exit_code)
        if r.stopped_at_step is not None:
            exit_text = f"stopped@{r.stopped_at_step}" + (
                f" (diverged@{r.diverged_at_step})" if r.diverged_at_step is not None else "")
        records = comp.records[r.index] if r.index < len(comp.records) else 0
        complete = comp.complete[r.index] if r.index < len(comp.complete) else False
        settings = (" ".join(f"{k}={v}" for k, v in (r.perturbation or {}).items()),) if perturbed else ()
        table.add_row(escape(report.name_of(r.index)) if named else str(r.index), escape(r.device), exit_text,
                      "-" if r.duration_s is None else f"{r.duration_s:.2f}",
                      f"{records}{'' if complete else ' (incomplete)'}", escape(r.trace), *map(escape, settings))
    return table


def _brief(d: Divergence) -> str:
    """A divergence in one line: the record, its step and line (control characters escaped: names come from
    traces)."""
    rec = d.record
    if rec is None:
        return printable(d.detail or d.category)
    parts = (f"record #{rec.index}", rec.kind, rec.name, f"at step {rec.step}" if rec.step >= 0 else "",
             f"({rec.location})" if rec.location else "")
    return printable(" ".join(x for x in parts if x))


def perturbation_panel(report: Report) -> Panel | None:
    """`run --perturb`: each setting varied, its two groups of repeats, and whether it changed the bits."""
    p = report.perturbation
    if p is None:
        return None
    table = Table(show_edge=False, box=None, padding=(0, 2))
    for col in ("setting", "values", "repeats", "bits"):
        table.add_column(col, style="bold" if col == "setting" else "")
    for k in p.knobs:
        bits = Text("not told (equal settings differ already)", style="yellow") if p.control is not None \
            else Text("unchanged", style="green") if k.divergence is None \
            else Text(f"ENDED DIFFERENTLY: {printable(k.divergence.detail)}", style="bold red") \
            if k.divergence.category == "outcome" \
            else Text(f"CHANGED, first at {_brief(k.divergence)}", style="bold red")
        table.add_row(escape(k.knob), escape(f"{k.values[0]} vs {k.values[1]}"),
                      f"{', '.join(map(str, k.base))} vs {', '.join(map(str, k.changed))}", bits)
    for knob, why in p.not_tested.items():  # from run.json: escaped like anything read back
        table.add_row(escape(knob), "", "", Text(printable(f"not varied: {why}"), style="dim"))
    groups = "; ".join(", ".join(map(str, g)) for g in p.groups)
    control = Text(f"repeats with equal settings agree ({groups}): only the settings varied can change the bits",
                   style="green") if p.control is None else Text(
        f"repeats with equal settings already differ, first at {_brief(p.control)}: the run is nondeterministic "
        "on this machine, and no setting can be blamed; the causes below are those of that divergence",
        style="bold yellow")
    return Panel(Group(table, Text(""), control), title="Perturbed settings (--perturb)", title_align="left",
                 border_style="red" if p.sensitive else "green" if p.control is None else "yellow", expand=False)


def divergence_panel(report: Report) -> Panel | None:
    d = report.first_divergence
    if d is None:
        return None
    at = where(d, report.op_finding)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    # module, op and location are the op's behind the record when one was pinpointed (Where), so the
    # terminal, JSON and JUnit name the same file:line; the record's own line is shown beside it
    peak = finite(d.max_abs_diff)
    rows = [
        ("what", d.category + (f" — {d.detail}" if d.detail else "")),
        ("record", None if d.index < 0 else f"#{d.index}"),
        ("step", at.counted_step),
        ("kind", at.kind),
        ("name", at.name),
        ("module", at.module),
        ("op", f"{at.op} ({at.phase})" if at.op else None),
        ("location", at.location),
        ("recorded at", at.record_location if at.record_location != at.location else None),
        *_stdout_rows(report),
        ("tensor", f"{at.dtype}[{at.shape}]" if at.dtype else None),
        ("repeats" if not report.recordings else "recordings",
         f"{', '.join(map(report.name_of, d.repeats))} differ from {report.name_of(d.reference)}"
         if report.recordings else f"{', '.join(map(str, d.repeats))} differ from repeat {d.reference}"),
        ("max |diff|", _fmt(peak) if peak is not None else None),
        ("max ULP", _fmt(d.max_ulp_diff) if d.max_ulp_diff is not None else None),
    ]
    for key, value in rows:
        if value is not None and value != "":
            grid.add_row(key, escape(str(value)))
    return Panel(grid, title="First divergence", title_align="left", border_style="red",
                 expand=False)


def carried_panel(report: Report) -> Panel | None:
    """A stdout difference explained by state carried between repeats: shown, though not a divergence."""
    carried = report.carried_output
    if carried is None:
        return None
    diff = carried.divergence.stdout
    if diff is None:  # a saved value that is no tensor (a checkpoint's path)
        saved = carried.divergence
        lines = [f"{saved.detail}, and each of those repeats read state an earlier repeat of this audit left: "
                 "not counted as a divergence",
                 *(f"• {line}" for line in carried.evidence[:6])]
        return Panel(escape("\n".join(lines)), title="Saved values that follow state carried between repeats",
                     title_align="left", border_style="yellow", expand=False)
    lines = [f"stdout line {diff.line} differs" + (f" at {diff.field}" if diff.field else "")
             + f" in repeat(s) {', '.join(map(str, diff.repeats))}, every recorded tensor agrees, and each of "
             "those repeats read state an earlier repeat of this audit left: not counted as a divergence"]
    lines += [f"repeat {i}: {'(output ended)' if t is None else repr(t)}"
              for i, t in list(diff.lines.items())[:MAX_STDOUT_REPEATS + 1]]
    lines += [f"• {line}" for line in carried.evidence[:6]]
    lines.append("a run from a clean directory prints the same in every repeat (docs/stdout.md)")
    return Panel(escape("\n".join(lines)), title="Output that follows state carried between repeats",
                 title_align="left", border_style="yellow", expand=False)


def _stdout_rows(report: Report) -> list[tuple[str, str | None]]:
    """The first differing stdout line as each repeat printed it."""
    first = report.first_divergence
    diff = first.stdout if first is not None else None
    if diff is None:
        return []
    rows: list[tuple[str, str | None]] = [("line", f"{diff.line} of stdout ({diff.mode} comparison)")]
    shown = [diff.reference, *diff.repeats[:MAX_STDOUT_REPEATS]]
    for index in shown:
        text = diff.lines[index]
        rows.append((report.name_of(index), "(output ended)" if text is None else repr(text)))
    if len(diff.repeats) > MAX_STDOUT_REPEATS:
        rows.append(("", f"… and in {len(diff.repeats) - MAX_STDOUT_REPEATS} more repeats (all in the JSON report)"))
    return rows


MAX_TOKEN_SEQUENCES = 4  # differing sequences the terminal names; the JSON report lists them all


def tokens_block(report: Report) -> Text | None:
    """A decoding script's answer in tokens (compare/tokens.py): distinct outputs, each differing sequence's first
    divergent token, and whether the first divergent record came before it."""
    t = report.tokens
    if t is None:
        return None
    text = t.answer(f"{t.repeats} repeats", report.name_of, MAX_TOKEN_SEQUENCES)
    if t.divergences:
        text += f"\n  {_token_cause(report)}"
    return Text(printable(text), style="bold")


def _token_cause(report: Report) -> str:
    """The earliest divergent token tied to the first divergent record (and the op behind it, when known)."""
    assert report.tokens is not None
    d = report.tokens.earliest
    first = report.comparison.first_divergence
    f = report.op_finding
    op = f" (op {f.record.op}{' at ' + f.record.location if f.record.location else ''})" if f is not None else ""
    if first is not None and d.follows(first.index):
        return (f"token {d.position} was chosen after record #{first.index} already differed, the first "
                f"divergence{op}")
    return (f"token {d.position} differs before any recorded tensor does: the choice itself is the first "
            f"difference{op}")


def summary_line(report: Report) -> Text:
    """Verdict, first divergence, top cause and run directory on one line: printed last, so it stays in view."""
    text = Text(report.verdict.upper(), style=_VERDICT_STYLE[report.verdict])
    parts = []
    d = report.first_divergence
    if d is not None:
        rank = f" on rank {report.distributed.rank}" if report.distributed is not None else ""
        parts.append(f"first divergence: {where(d, report.op_finding).place(d.category, rank)}")
    elif report.replica_divergence is not None:
        r = report.replica_divergence
        parts.append(f"DDP replica {r.name} differs on rank(s) {', '.join(map(str, r.ranks))} after step {r.step}")
    elif report.agreement == "deterministic":
        parts.append(f"{len(report.runs)} repeats agree on {report.records_agreed()}")
        if report.verdict == "repeated-randomness":
            parts.append("but draws repeat where they should differ: "
                         + ", ".join(f"{x.site} (across {x.across})" for x in report.repeated_randomness))
        survived = report.perturbation.survived if report.perturbation is not None else []
        if survived:
            parts.append(f"unchanged by --perturb {','.join(k.knob for k in survived)}")
        baseline = report.baseline
        if baseline is not None and baseline.divergence is not None:  # exit 1: the line must say why
            moved = baseline.divergence
            parts.append(f"but DIFFER FROM THE BASELINE: {where(moved).place(moved.category)}")
    elif report.verdict == "failed":
        parts.append("the script failed in every repeat")
    elif report.verdict == "inconclusive":
        parts.append(report.inconclusive_reason.split(":")[0])
    if report.causes:
        parts.append(report.cause_headline())
    # recordings compared (`detaudit compare`) have no one command line and no run directory of their own
    parts.append(f"run: {report.run_dir}" if report.argv is not None else f"compared: {report.script}")
    text.append(printable(" · " + " · ".join(parts)))
    return text


def argv_line(report: Report) -> Text | None:
    """The script's command line exactly as the script received it (sys.argv), shell-quoted."""
    return None if report.argv is None else Text(f"script argv: {shlex.join(report.argv)}", style="dim")


def _op_why(report: Report, f: OpFinding) -> str:
    """The op verdict in words; under `run --perturb` an op whose output differs only between settings is no
    nondeterministic kernel: repeats with equal settings agree."""
    sensitive = report.perturbation.sensitive if report.perturbation is not None else []
    if sensitive and f.verdict == "nondeterministic-op":
        return (f"its inputs match in every repeat and its output differs between the settings varied "
                f"({', '.join(k.knob for k in sensitive)}), never between repeats with equal settings")
    return f"{f.verdict}: {VERDICTS[f.verdict]}"


def op_panel(report: Report) -> Panel | Text | None:
    """The op behind the first divergence, with the input/output match table around it; where `auto` named none,
    the one line that says why (Report.op_level)."""
    first = report.first_divergence
    f = report.op_finding if first is not None else None
    if f is None:
        return Text(printable(report.op_level)) if report.op_level and first is not None else None
    if f.verdict == "inputs-differ" and f.origin is not None and f.origin.kind == "input":
        # No recorded op made the differing data: the table would only show ops that consumed it.
        return Panel(escape(_made_outside_torch(f, f.origin)), title="The op behind it", title_align="left",
                     border_style="magenta", expand=False)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key, value in _op_rows(report, f):
        if value is not None and value != "":
            grid.add_row(key, escape(str(value)))
    return Panel(Group(grid, Text(""), _neighbours_table(f)), title="The op behind it", title_align="left",
                 border_style="magenta", expand=False)


def _made_outside_torch(f: OpFinding, origin: RecordInfo) -> str:
    """Why no op is shown: the differing data first appears as the model's input (`origin`)."""
    window = f" in steps {f.window[0]}–{f.window[1]}" if f.window else ""
    return (f"No op recorded{window} produced the differing data: it first appears as the model's input "
            f"{origin.name}" + (f" ({origin.location})" if origin.location else "") +
            ", so it was made outside torch (NumPy, Python, a file...) or before the recorded steps. "
            f"The first op to use it is {f.record.op}.")


def _op_rows(report: Report, f: OpFinding) -> list[tuple[str, object]]:
    """The op panel's rows: key and value, an empty or None value left out."""
    r = f.record
    return [
        ("op", f"{r.op} ({r.phase}{', autograd node ' + r.node if r.node else ''})"),
        ("module", r.module),
        ("location", r.location + (" (the forward line that created its autograd node)" if r.backward else "")
         if r.location else None),
        ("step", r.step),
        ("why", _op_why(report, f)),
        ("origin", f"{f.origin.kind} {f.origin.name}" + (f" ({f.origin.location})" if f.origin.location else "")
         if f.origin is not None else None),
        ("elsewhere", ", ".join(f"repeat {i} ran {o.op or o.name}" for i, o in sorted(f.others.items()))),
        ("traced from", traced_note(f)),
        ("recorded in", f"an op-level re-run ({f.traces}-*.trace), ops in steps {f.window[0]}–{f.window[1]}"
         if f.traces and f.window else None),
    ]


def _neighbours_table(f: OpFinding) -> Table:
    """The ops around the chosen one, with whether their inputs and output match across repeats."""
    table = Table(show_edge=False, box=None, padding=(0, 1))
    for col in ("", "#", "record", "phase", "module", "location", "inputs", "output"):
        table.add_column(col)
    for n in f.neighbours:
        x = n.record
        table.add_row(">>" if n.chosen else "", str(x.index), escape(x.op or f"{x.kind} {x.name}"),
                      x.phase or "", escape(x.module), escape(x.location), n.inputs or "-",
                      Text(n.output, style="red" if n.output == "differ" else ""))
    return table


def spread_table(report: Report) -> Table | None:
    comp = report.comparison
    steps = [s for s in comp.by_step if s.differing]
    if not steps:
        return None
    table = Table(title=f"Spread: {comp.records_differing} of {comp.records_compared} aligned records differ",
                  title_justify="left", show_edge=False)
    for col in ("step", "differing", "records", "max |diff| (sampled)"):
        table.add_column(col, justify="right")
    shown = steps if len(steps) <= MAX_SPREAD_ROWS else steps[: MAX_SPREAD_ROWS // 2] + steps[-MAX_SPREAD_ROWS // 2:]
    for i, s in enumerate(shown):
        if len(steps) > MAX_SPREAD_ROWS and i == MAX_SPREAD_ROWS // 2:
            table.add_row("…", "", "", "")
        table.add_row(str(s.step), str(s.differing), str(s.records), _fmt(s.max_abs_diff))
    if not comp.aligned_to_end:
        table.caption = "records after a structural divergence are not aligned and not counted"
    return table


class HasCauses(Protocol):
    """A report of any kind that ranks causes (Report, ResumeReport, FixReport)."""

    @property
    def causes(self) -> Sequence[Cause]: ...


def causes_block(report: HasCauses) -> Group | None:
    if not report.causes:
        return None
    confirmed = [c.id for c in report.causes if c.confidence == "confirmed"]
    below = [c.id for c in report.causes if c.confidence in BELOW_THE_LINE]
    # a conclusion of the experiments that confirms no source (not-reproduced) is neither
    inferred = [c.id for c in report.causes if c.confidence not in ("confirmed", *BELOW_THE_LINE)
                and c.basis != "experiment"]
    title = Text("Likely causes", style="bold")
    title.append(f" — confirmed by experiment: {', '.join(confirmed) or 'none'}; inferred from the evidence: "
                 f"{', '.join(inferred) or 'none'}" + (f"; ruled out or not needed: {', '.join(below)}" if below
                                                       else ""), style="")
    parts: list[Any] = [title]
    for i, cause in enumerate(report.causes, 1):
        if cause.confidence in BELOW_THE_LINE and (i == 1 or report.causes[i - 2].confidence not in BELOW_THE_LINE):
            parts.append(Text("   ── ruled out by their own experiment, or not needed once another was confirmed ──",
                              style="dim"))
        head = Text(f"{i}. [{cause.confidence} · {BASIS_TEXT[cause.basis]}] ",
                    style="bold magenta" if cause.confidence == "confirmed" else "bold")
        head.append(f"{cause.id}: ", style="bold")
        head.append(printable(cause.summary))
        if cause.confidence == "ruled-out" and cause.basis == "no-evidence":  # a guess refuted: one line, no fix
            tested = next((line for line in reversed(cause.evidence) if line.startswith("--explain:")), "")
            head.append(printable(f" — {tested}" if tested else ""))
            parts.append(head)
            continue
        parts.append(head)
        for line in cause.evidence:
            parts.append(Text(printable(f"   • {line}")))
        parts.append(Text(printable(f"   fix: {cause.fix}"), style="green"))
    return Group(*parts)


def not_ruled_out_block(report: Report) -> Group | None:
    """Candidates with no evidence of their mechanism in this run: not causes, each with the experiment to test it."""
    if not report.not_ruled_out:
        return None
    parts: list[Any] = [Text("Not ruled out — no evidence of their mechanism in this run; not causes:", style="dim")]
    parts.extend(Text(printable(f"   • {c.id}: {c.summary} (`detaudit explain` pins "
                                f"{', '.join(c.pins) or 'nothing: no pin reaches it'})"), style="dim")
                 for c in report.not_ruled_out)
    return Group(*parts)


def latent_block(report: Report) -> Group | None:
    """Thread races, and on the CPU what CUDA would vary: deterministic in these repeats only (causes/latent.py)."""
    if not report.latent:
        return None
    parts: list[Any] = [Text("Latent — deterministic in these repeats, not everywhere", style="bold yellow")]
    for item in report.latent:
        head = Text(f"• {item.id}: ", style="bold")
        head.append(printable(item.summary))
        parts.append(head)
        parts.extend(Text(printable(f"   • {line}")) for line in item.evidence)
        parts.append(Text(printable(f"   fix: {item.fix}"), style="green"))
    return Group(*parts)


def repeats_block(report: Report) -> Group | None:
    """Randomness that repeats where it should differ (causes/repetition.py): beside the verdict, in it only under
    --fail-on-repeated-randomness."""
    if not report.repeated_randomness:
        return None
    parts: list[Any] = [Text("Randomness that repeats — draws equal where they should differ", style="bold yellow")]
    for item in report.repeated_randomness:
        head = Text(f"• {item.site}: ", style="bold")
        head.append(printable(f"repeats across {item.across}"
                              + (f" (state from {item.created_at})" if item.created_at else "")))
        parts.append(head)
        parts.extend(Text(printable(f"   • {line}")) for line in item.evidence)
        parts.append(Text(printable(f"   fix: {item.fix}"), style="green"))
    return Group(*parts)


def experiments_table(report: Report) -> Table | None:
    if not report.experiments:
        return None
    table = Table(title="Experiments (--explain)", title_justify="left", show_edge=False)
    for col in ("pinned", "result", "first divergence", "note"):
        table.add_column(col)
    for e in report.experiments:
        table.add_row(escape(e.description), e.verdict, _fmt(e.first_divergence_index), escape(e.note))
    return table


def ranks_table(report: Report) -> Table | None:
    """A torchrun run: each rank's own first divergence and role, and teardown crashes."""
    dist = report.distributed
    if dist is None:
        return None
    table = Table(title=f"Ranks ({dist.nproc_per_node} per node; each compared across repeats in its own order)",
                  title_justify="left", show_edge=False)
    for col in ("rank", "role", "first divergence", "step", "causes"):
        table.add_column(col, justify="right" if col in ("rank", "step") else "left")
    for s in dist.ranks:
        d = s.first_divergence
        rec = d.record if d is not None else None
        where = "-" if d is None else f"{rec.kind} {rec.name}" if rec is not None else d.category
        role = "-" if s.role is None else s.role + (" (reported)" if s.rank == dist.rank else "")
        table.add_row(str(s.rank), role, escape(where), _fmt(rec.step if rec is not None and rec.step >= 0 else None),
                      escape(", ".join(c.id for c in s.report.causes)) or "-")
    captions = [f"repeat {c.repeat}: rank(s) {', '.join(map(str, c.ranks)) or '?'} crashed in interpreter teardown "
                f"({c.signal or f'exit {c.exit_code}'}) after finishing the script; counted as finished"
                for c in dist.teardown_crashes] + [f"note: {note}" for note in dist.notes]
    if captions:
        table.caption = escape("\n".join(captions))
    return table


def replica_panel(report: Report) -> Panel | None:
    replica = report.replica_divergence
    if replica is None:
        return None
    text = (f"after optimizer step {replica.step}, DDP parameter {replica.name} on rank(s) "
            f"{', '.join(map(str, replica.ranks))} differs from rank {replica.reference} "
            f"(max |diff| {_fmt(replica.max_abs_diff)}, sampled) in repeat(s) {', '.join(map(str, replica.repeats))}. "
            "DDP keeps replicas bitwise identical; something changed one rank's copy outside DDP's all-reduce.")
    return Panel(escape(text), title="DDP replicas differ", title_align="left", border_style="red", width=110)


def match_block(report: Report) -> Group | None:
    """What an agreeing verdict rests on, and what it could not have seen (inconclusive: why it proves nothing)."""
    m = report.match
    if m is not None and m.not_compared and report.agreement not in ("deterministic", "timeout", "inconclusive"):
        return Group(Text("What the verdict rests on", style="bold"),
                     *[Text(f"   not compared: {line}") for line in m.not_compared])
    if m is None or report.agreement not in ("deterministic", "timeout", "inconclusive"):
        return None
    kinds = ", ".join(f"{n} {kind}" for kind, n in m.records_by_kind.items()) or "no records"
    stdout = "not compared" if m.stdout_compared == "no" else f"compared ({m.stdout_compared})"
    exit_status = "compared" if m.exit_status_compared else "not compared (a repeat was stopped)"
    how = m.comparison + (f" (atol {m.tolerance['atol']:g}, rtol {m.tolerance['rtol']:g})" if m.tolerance else "")
    parts: list[Any] = [Text("What the verdict rests on", style="bold"),
                        Text(f"   compared: {kinds} — {how}, {m.granularity} granularity, {m.steps_covered} "
                             f"optimizer steps; exit status {exit_status}; stdout {stdout}")]
    parts += [Text(f"   not observed: {line}") for line in m.not_observed]
    parts += [Text(f"   not compared: {line}") for line in m.not_compared]
    check = m.self_check
    if check is not None:
        if check.not_run:
            parts.append(Text(f"   self-check NOT RUN: {check.not_run}: do not trust this verdict", style="bold red"))
        elif check.passed:
            parts.append(Text(f"   self-check passed: a one-ULP change injected at record #{check.record} "
                              f"({check.name}, step {check.step}) was reported at exactly that record",
                              style="green"))
        else:
            seen = "not at all" if check.detected_at is None else f"at record #{check.detected_at}"
            parts.append(Text(f"   self-check FAILED: a one-ULP change injected at record #{check.record} "
                              f"({check.name}) was seen {seen}: do not trust this verdict", style="bold red"))
    return Group(*parts)


def render(report: Report, console: Console, notes: Sequence[str] = ()) -> None:
    """The whole report; `notes` go just before the closing summary line, which is always printed last."""
    console.print(verdict_line(report))
    tokens = tokens_block(report)
    if tokens is not None:
        console.print(tokens, soft_wrap=True)
    argv = argv_line(report)
    if argv is not None:
        console.print(argv, soft_wrap=True)
    console.print(runs_table(report))
    if report.verdict == "failed":
        console.print(Panel(escape(report.failure or "(no output on stderr)"), title="The script's error (repeat 0)",
                            title_align="left", border_style="yellow", expand=False))
    elif report.repeat_errors:
        alike = len({r.exit_code for r in report.runs if r.ending is not Ending.TIMED_OUT}) == 1
        for index, error in sorted(report.repeat_errors.items())[:2]:
            code = report.runs[index].exit_code
            how = f"exited {code}" if alike else f"ended differently (exit {code})"
            console.print(Panel(escape(error or "(no output on stderr)"), title_align="left", border_style="yellow",
                                expand=False, title=f"Repeat {index} {how}: its stderr"))
    for block in (ranks_table(report), replica_panel(report), match_block(report),
                  divergence_panel(report), perturbation_panel(report), carried_panel(report), baseline_panel(report),
                  op_panel(report),
                  spread_table(report), causes_block(report), not_ruled_out_block(report), experiments_table(report),
                  latent_block(report), repeats_block(report)):
        if block is not None:
            console.print(block)
    for note in notes:
        console.print(Text(printable(note), style="bold"))
    console.print(summary_line(report), soft_wrap=True)
