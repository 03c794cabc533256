"""The report as one self-contained HTML file, plots included (`--html PATH`).

Reads the Report's typed values, as every renderer does (a renamed field is a type error here, not a
blank cell). No terminal code, and nothing loaded from the
network: styles are inline and the plots are SVG written here. A plotting library would either
pull a megabyte of JavaScript into every report or need a CDN to render offline; three small
charts (two log-scale series and a heat strip) are a few dozen lines of SVG. Every plotted
point carries its value in `data-*` attributes and a `<title>` tooltip, so the numbers can be
read (and tested) from the file itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from detaudit import __version__
from detaudit.causes.repetition import RepeatedRandomness
from detaudit.compare.baseline_diff import BaselineCheck
from detaudit.compare.oprules import VERDICTS, OpFinding, OpRow, traced_note
from detaudit.compare.perturb import KnobOutcome, PerturbationFinding
from detaudit.compare.traces import ROOT_MODULE, StepSpread
from detaudit.pin import Pin
from detaudit.report.model import SCHEMA_VERSION, CarriedOutput, Report, finite, where
from detaudit.results import Cause, Divergence, Latent, RepeatResult
from detaudit.run.files import write_output

WIDTH, HEIGHT = 760, 210
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 14, 34
MAX_STRIP_MODULES = 24  # heat strip rows: the modules with the most differing records
MAX_STRIP_CELLS = 300  # heat strip columns at most: longer runs group steps into cells
_COLOURS = {"deterministic": "#1a7f37", "divergent": "#cf222e", "failed": "#9a6700", "timeout": "#cf222e",
            "inconclusive": "#9a6700", "repeated-randomness": "#cf222e"}

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1000px;color:#1f2328;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
.verdict{font-weight:700;color:#fff;padding:2px 10px;border-radius:6px}
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px;border-bottom:1px solid #eaeef2;text-align:left;
vertical-align:top}th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12.5px}
.kv th{background:none;width:130px}.muted{color:#656d76}.differ{color:#cf222e;font-weight:600}
.cause{border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;margin:8px 0}
.confirmed{border-color:#8250df}.fix{color:#1a7f37}.chosen{background:#fff8c5}
.changed td{background:#fff1e5}svg{display:block;margin:4px 0 12px}svg text{font:11px system-ui,sans-serif}
.wide{max-width:100%;overflow-x:auto}.wide table{table-layout:fixed;width:100%}
.wide td,.kv td{overflow-wrap:anywhere}
"""


def render_html(report: Report) -> str:
    """The whole report page of a Report."""
    verdict = report.verdict
    title = f"detaudit: {verdict} — {Path(report.script).name}"
    body = [
        f"<h1>detaudit report {verdict_badge(verdict, _COLOURS.get(verdict, '#57606a'))}</h1>",
        f"<p class='mono'>{escape(' '.join([report.script, *report.script_args]))}</p>",
        f"<p>{escape(_summary(report))}</p>",
        _runs_section(report),
        _failure_section(report),
        _divergence_section(report),
        _perturbation_section(report.perturbation),
        _carried_section(report.carried_output),
        _baseline_section(report.baseline),
        _op_section(report),
        _plots_section(report),
        _causes_section(report),
        _candidates_section(report.not_ruled_out),
        _latent_section(report.latent),
        _repeats_section(report.repeated_randomness),
        _environment_section(report.environment),
        f"<p class='muted'>run directory <span class='mono'>{escape(report.run_dir)}</span> · "
        f"detaudit {escape(__version__)} · report schema {SCHEMA_VERSION}</p>",
    ]
    return page(title, body)


def page(title: str, body: Sequence[str]) -> str:
    """A self-contained page of the report's style around `body`'s sections (the empty ones left out)."""
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(b for b in body if b) + "\n</body></html>\n")


def verdict_badge(verdict: str, colour: str) -> str:
    """The verdict in capitals on its colour, as every report page's heading shows it."""
    return f"<span class='verdict' style='background:{colour}'>{escape(verdict.upper())}</span>"


def write_html(report: Report, path: Path) -> None:
    """Write the HTML report of `report` to `path` (`-`: stdout)."""
    write_output(path, render_html(report))


def _summary(report: Report) -> str:
    devices = ", ".join(sorted({r.device for r in report.runs}))
    comp = report.comparison
    shape_only = report.match.records_without_contents if report.match is not None else 0
    text = f"{len(report.runs)} repeats on {devices}; {comp.records_differing} of " \
           f"{comp.records_compared} aligned records differ" \
           + (f" ({shape_only} of them compared by dtype and shape only)." if shape_only else ".")
    if report.baseline is not None:
        text += " The repeats " + ("match" if report.baseline.matches else "differ from") + " the baseline."
    return text


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[str] = (),
           row_class: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    lines = []
    for i, row in enumerate(rows):
        cells = "".join(f"<td class='num'>{_cell(v)}</td>" if headers[j] in numeric else f"<td>{_cell(v)}</td>"
                        for j, v in enumerate(row))
        cls = f" class='{row_class[i]}'" if row_class and row_class[i] else ""
        lines.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(lines)}</table>"


def _cell(value: Any) -> str:
    if value is None:
        return "<span class='muted'>-</span>"
    if isinstance(value, float):
        return escape(f"{value:.4g}")
    return escape(str(value))


def kv(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{escape(k)}</th><td>{_cell(v)}</td></tr>" for k, v in rows if v not in (None, ""))
    return f"<table class='kv'>{body}</table>"


def _runs_section(report: Report) -> str:
    comp = report.comparison

    def records(r: RepeatResult) -> int:
        return comp.records[r.index] if r.index < len(comp.records) else 0

    if any(report.recordings):  # `compare`: the recordings by their own names
        rows = [[report.name_of(r.index), r.device, r.exit_code, r.duration_s, records(r), r.trace]
                for r in report.runs]
        return "<h2>Recordings compared</h2>" + table(["recording", "device", "exit", "time (s)", "records", "trace"],
                                                       rows, numeric=["time (s)", "records"])
    perturbed = any(r.perturbation for r in report.runs)  # `run --perturb`: each repeat's settings
    complete = [r.index < len(comp.complete) and comp.complete[r.index] for r in report.runs]
    rows = [[r.index, r.device, "timeout" if r.timed_out else _stopped(r) or r.exit_code, r.duration_s,
             f"{records(r)}{'' if whole else ' (incomplete)'}", r.trace,
             *([" ".join(f"{k}={v}" for k, v in (r.perturbation or {}).items())] if perturbed else [])]
            for r, whole in zip(report.runs, complete)]
    unseen = report.match.not_compared if report.match is not None else []
    notes = "".join(f"<p class='muted'>Not compared: {escape(line)}</p>" for line in unseen)
    headers = ["repeat", "device", "exit", "time (s)", "records", "trace", *(["settings"] if perturbed else [])]
    return "<h2>Repeats</h2>" + table(headers, rows, numeric=["repeat", "time (s)", "records"]) + notes


def _bits(knob: KnobOutcome, told: bool) -> str:
    """Whether a perturbed setting changed the bits, and where first (`told`: the control agrees)."""
    if not told:
        return "not told (equal settings differ already)"
    d = knob.divergence
    if d is None:
        return "unchanged"
    if d.category == "outcome":  # one group exited early or failed: no record to name
        return f"ENDED DIFFERENTLY: {d.detail}"
    at = where(d)
    place = " ".join(x for x in (at.kind, at.name, f"at step {at.counted_step}" if at.counted_step is not None
                                 else "", f"({at.location})" if at.location else "") if x)
    return f"CHANGED, first at record #{d.index} {place}"


def _perturbation_section(p: PerturbationFinding | None) -> str:
    """`run --perturb`: each setting varied, its two groups of repeats, and whether the bits changed."""
    if p is None:
        return ""
    told = p.control is None
    rows = [[k.knob, " vs ".join(k.values), f"{', '.join(map(str, k.base))} vs {', '.join(map(str, k.changed))}",
             _bits(k, told)] for k in p.knobs]
    rows += [[knob, "", "", f"not varied: {why}"] for knob, why in p.not_tested.items()]
    groups = "; ".join(", ".join(map(str, g)) for g in p.groups)
    control = f"Repeats with equal settings agree ({groups}): only the settings varied can change the bits." \
        if told else ("Repeats with equal settings already differ: the run is nondeterministic "
                      "on this machine, and no setting can be blamed.")
    return ("<h2>Perturbed settings (--perturb)</h2>" + table(["setting", "values", "repeats", "bits"], rows,
            row_class=["changed" if told and k.divergence is not None else "" for k in p.knobs]
            + [""] * len(p.not_tested)) + f"<p>{escape(control)}</p>")


def _stopped(run: RepeatResult) -> str:
    """Where a repeat stopped at a step boundary, and why ("" when it ran to its end)."""
    step = run.stopped_at_step
    if step is None:
        return ""
    if run.stopped_by == "divergence":
        diverged = run.diverged_at_step
        return f"stopped after step {step}" + (f", diverged at step {diverged}" if diverged is not None else "")
    return f"stopped after step {step} ({run.stopped_by or '--max-steps/--max-time'})"


def _failure_section(report: Report) -> str:
    if report.failure:
        return f"<h2>The script's error (repeat 0)</h2><pre>{escape(report.failure)}</pre>"
    errors = [(r.index, r.exit_code, report.repeat_errors[r.index]) for r in report.runs
              if report.repeat_errors.get(r.index)]
    return "".join(f"<h2>Repeat {i} ended differently (exit {code}): its stderr</h2><pre>{escape(err)}</pre>"
                   for i, code, err in errors[:2])


def _divergence_section(report: Report) -> str:
    d = report.first_divergence
    if d is None:
        return ""
    rows = _divergence_rows(d, report.op_finding)
    if any(report.recordings) and d.repeats:  # `compare`: the recordings by their own names
        rows = [("recordings", f"{', '.join(report.name_of(i) for i in d.repeats)} differ from "
                               f"{report.name_of(d.reference)}") if k == "repeats" else (k, v) for k, v in rows]
    return "<h2>First divergence</h2>" + kv(rows)


def _carried_section(c: CarriedOutput | None) -> str:
    """A stdout difference explained by state carried between repeats: shown, though not a divergence."""
    if c is None:
        return ""
    out = c.divergence.stdout
    lines = out.lines.items() if out is not None else ()
    rows = [("what", c.divergence.detail), ("field", out.field if out is not None else None),
            *((f"repeat {i}", "(output ended)" if t is None else repr(t)) for i, t in lines)]
    items = "".join(f"<li>{escape(line)}</li>" for line in c.evidence)
    return ("<h2>Output that follows state carried between repeats (not a divergence)</h2>" + kv(rows)
            + f"<ul>{items}</ul>")


def _divergence_rows(d: Divergence, finding: OpFinding | None) -> list[tuple[str, Any]]:
    # as the terminal shows it: module, op and location name the op behind the record when one was pinpointed,
    # and the record's own line beside them when it is another
    at = where(d, finding)
    return [
        ("what", d.category + (f" — {d.detail}" if d.detail else "")),
        ("record", None if d.index < 0 else f"#{d.index}"),
        ("step", at.counted_step), ("kind", at.kind), ("name", at.name), ("module", at.module),
        ("op", f"{at.op} ({at.phase})" if at.op else None),
        ("location", at.location),
        ("recorded at", at.record_location if at.record_location != at.location else None),
        ("tensor", f"{at.dtype}[{at.shape}]" if at.dtype else None),
        ("repeats", f"{', '.join(map(str, d.repeats))} differ from {d.reference}" if d.repeats else None),
        ("max |diff|", finite(d.max_abs_diff)), ("max ULP", d.max_ulp_diff),
    ]


def _baseline_section(b: BaselineCheck | None) -> str:
    if b is None:
        return ""
    parts = [f"<h2>Baseline</h2><p>compared with <span class='mono'>{escape(b.path)}</span>: "
             f"<b>{'matches' if b.matches else 'differs'}</b></p>"]
    if b.divergence is not None:
        parts.append(kv(_divergence_rows(b.divergence, None)))
    changes = b.environment_changes
    if changes:
        parts.append("<p>The environment changed since the baseline was recorded:</p>")
        parts.append(table(["field", "baseline", "now"], [[c.field, c.baseline, c.current] for c in changes],
                            row_class=["changed"] * len(changes)))
    if b.sensitivities:
        parts.append("<p>Changes that a <span class='mono'>--perturb</span> setting stands for:</p>")
        parts.append(table(["setting", "fields", "known"], [[s.setting, ", ".join(s.fields), s.note]
                                                             for s in b.sensitivities],
                            row_class=["changed" if s.status == "sensitive" else "" for s in b.sensitivities]))
    return "".join(parts)


def _op_section(report: Report) -> str:
    f = report.op_finding
    if f is None or report.first_divergence is None:
        return ""
    op, origin = f.record, f.origin
    if f.verdict == "inputs-differ" and origin is not None and origin.kind == "input":
        # no recorded op made the differing data: the neighbour table would only show its consumers
        window = f" in steps {f.window[0]}–{f.window[1]}" if f.window else ""
        where = f" ({origin.location})" if origin.location else ""
        return (f"<h2>The op behind it</h2><p>No op recorded{escape(window)} produced the differing data: it "
                f"first appears as the model's input {escape(origin.name)}{escape(where)}, so it was made "
                f"outside torch (NumPy, Python, a file...) or before the recorded steps. The first op to use it is "
                f"<code>{escape(str(op.op or None))}</code>.</p>")
    table = _neighbour_table(f.neighbours) if f.neighbours else ""
    return "<h2>The op behind it</h2>" + kv(_op_rows(f)) + f"<div class='wide'>{table}</div>"


def _op_rows(f: OpFinding) -> list[tuple[str, Any]]:
    """The op behind the divergence, why it was chosen, and where it was recorded."""
    op, origin = f.record, f.origin
    return [
        ("op", f"{op.op or None} ({op.phase}{', autograd node ' + op.node if op.node else ''})"),
        ("module", op.module), ("location", op.location), ("step", op.step),
        ("why", f"{f.verdict}: {VERDICTS.get(f.verdict, '')}"), ("summary", f.summary),
        ("origin", f"{origin.kind} {origin.name}" + (f" ({origin.location})" if origin.location else "")
         if origin else None),
        ("traced from", traced_note(f)),
        ("recorded in", f"an op-level re-run ({f.traces}-*.trace), ops in steps {f.window[0]}–{f.window[1]}"
         if f.traces and f.window else None),
    ]


def _neighbour_table(neighbours: Sequence[OpRow]) -> str:
    """The input/output match table around the op (`>>`: the op chosen)."""
    return table(["", "#", "record", "phase", "module", "location", "inputs", "output"],
                  [[">>" if n.chosen else "", n.record.index, n.record.op or f"{n.record.kind} {n.record.name}",
                    n.record.phase, n.record.module or None, n.record.location or None, n.inputs or None, n.output]
                   for n in neighbours],
                  row_class=["chosen" if n.chosen else "" for n in neighbours])


def _causes_section(report: Report) -> str:
    parts = []
    for i, c in enumerate(report.causes, 1):
        evidence = "".join(f"<li>{escape(e)}</li>" for e in c.evidence)
        parts.append(f"<div class='cause {escape(c.confidence)}'><b>{i}. [{escape(c.confidence)}] "
                     f"{escape(c.id)}</b>: {escape(c.summary)}<ul>{evidence}</ul>"
                     f"<div class='fix'>fix: {escape(c.fix)}</div></div>")
    if report.experiments:
        parts.append("<h3>Experiments (--explain)</h3>" + table(
            ["pinned", "result", "first divergence", "note"],
            [[e.description, e.verdict, e.first_divergence_index, e.note] for e in report.experiments]))
    return "<h2>Likely causes</h2>" + "".join(parts) if parts else ""


def _candidates_section(candidates: Sequence[Cause]) -> str:
    """Candidates no evidence of this run supports: what would rule each in or out (never a cause)."""
    rows = [[c.id, c.summary, ", ".join(Pin(p).value for p in c.pins) or "-"] for c in candidates]
    return "<h2>Not ruled out (no evidence of their mechanism)</h2>" + table(
        ["candidate", "what it would be", "`detaudit explain` pins"], rows) if rows else ""


def _repeats_section(found: Sequence[RepeatedRandomness]) -> str:
    """Randomness that repeats where it should differ (it never changes the verdict)."""
    parts = [f"<div class='cause'><b>{escape(item.site)}</b>: repeats across {escape(item.across)}"
             + (f" (state created or seeded at {escape(item.created_at)})" if item.created_at else "")
             + f"<ul>{''.join(f'<li>{escape(e)}</li>' for e in item.evidence)}</ul>"
             f"<div class='fix'>fix: {escape(item.fix)}</div></div>" for item in found]
    return "<h2>Randomness that repeats</h2>" + "".join(parts) if parts else ""


def _latent_section(latent: Sequence[Latent]) -> str:
    """Thread races, and settings and ops deterministic on this CPU, not on CUDA (causes/latent.py)."""
    parts = [f"<div class='cause'><b>{escape(item.id)}</b>: {escape(item.summary)}"
             f"<ul>{''.join(f'<li>{escape(e)}</li>' for e in item.evidence)}</ul>"
             f"<div class='fix'>fix: {escape(item.fix)}</div></div>" for item in latent]
    return "<h2>Latent: deterministic in these repeats, not everywhere</h2>" + "".join(parts) if parts else ""


def _environment_section(env: dict[str, Any]) -> str:
    if not env:
        return ""
    # a version the trace recorded as null (no CUDA in a CPU build of torch) is shown, not left out
    return "<h2>Environment</h2>" + kv([(k, "none" if env[k] is None else
                                          env[k] if not isinstance(env[k], (dict, list)) else str(env[k]))
                                         for k in sorted(env)])


# -- plots ----------------------------------------------------------------------------------------
def _plots_section(report: Report) -> str:
    """The spread between the repeats; when they agree but differ from a baseline, the spread from it."""
    steps = [s for s in report.comparison.by_step if s.step >= 0]
    against = "between the repeats"
    if not any(s.differing for s in steps) and report.baseline is not None:
        steps = [s for s in report.baseline.by_step if s.step >= 0]
        against = "from the baseline (repeat 0 against it)"
    if not any(s.differing for s in steps):
        return ""
    peaks = [(s.step, peak) for s in steps if s.differing and (peak := finite(s.max_abs_diff)) is not None]
    counts = [(s.step, s.differing) for s in steps if s.differing]
    xs = [s.step for s in steps]
    return (f"<h2>How the divergence spreads</h2><p class='muted'>Differences {against}, per training step "
            "(optimizer steps completed), over the records compared. Max |diff| is measured on sampled elements.</p>"
            + series_or_constant("max-abs-diff", "max |diff| per step (log scale)", "max |diff|", xs, peaks)
            + series_or_constant("differing", "differing records per step (log scale)", "differing records", xs,
                                 counts)
            + heat_strip_svg(steps))


def series_or_constant(name: str, title: str, what: str, xs: Sequence[int], points: Sequence[tuple[int, float]]) -> str:
    """The series as a plot, or, when it is the same at every differing step, that in one sentence: a flat
    line on a log axis carries no information."""
    values = {v for _, v in points}
    if len(points) < 2 or len(values) > 1:
        return log_series_svg(name, title, xs, points)
    steps = [x for x, _ in points]
    return (f"<p class='constant' data-constant='{name}' data-value='{points[0][1]!r}' data-steps='"
            f"{' '.join(map(str, steps))}'>{escape(what)}: constant {_cell(points[0][1])} at every differing step "
            f"({len(steps)} steps, {steps[0]}–{steps[-1]})</p>")


def _x_scale(xs: Sequence[int]) -> Any:
    lo, hi = min(xs), max(xs)
    span = max(hi - lo, 1)
    inner = WIDTH - MARGIN_LEFT - MARGIN_RIGHT

    def at(x: float) -> float:
        return MARGIN_LEFT + (x - lo) / span * inner if hi > lo else MARGIN_LEFT + inner / 2

    return at


def _x_axis(xs: Sequence[int], at: Any, y: float) -> list[str]:
    lo, hi = min(xs), max(xs)
    ticks = sorted({lo, hi, *range(lo, hi + 1, max(1, math.ceil((hi - lo) / 8)))})
    out = [f"<line x1='{MARGIN_LEFT}' y1='{y}' x2='{WIDTH - MARGIN_RIGHT}' y2='{y}' stroke='#8c959f'/>"]
    out += [f"<text x='{at(t):.1f}' y='{y + 14}' text-anchor='middle'>{t}</text>" for t in ticks]
    out.append(f"<text x='{(MARGIN_LEFT + WIDTH - MARGIN_RIGHT) / 2}' y='{y + 28}' text-anchor='middle'>step</text>")
    return out


def log_series_svg(name: str, title: str, xs: Sequence[int], points: Sequence[tuple[int, float]]) -> str:
    """A log-scale series over steps; zero values sit on the floor line, marked hollow."""
    if not points:
        return ""
    positive = [v for _, v in points if v > 0]
    lo_exp = math.floor(math.log10(min(positive))) if positive else 0
    hi_exp = math.ceil(math.log10(max(positive))) if positive else 1
    if hi_exp <= lo_exp:
        hi_exp = lo_exp + 1
    top, bottom = MARGIN_TOP + 16, HEIGHT - MARGIN_BOTTOM
    at = _x_scale(xs)

    def y_of(v: float) -> float:
        if v <= 0:
            return bottom
        return bottom - (math.log10(v) - lo_exp) / (hi_exp - lo_exp) * (bottom - top)

    out = [f"<svg class='plot' data-plot='{name}' width='{WIDTH}' "
           f"height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}' role='img' aria-label='{escape(title)}'>",
           f"<text x='{MARGIN_LEFT}' y='{MARGIN_TOP}' font-weight='600'>{escape(title)}</text>"]
    for e in range(lo_exp, hi_exp + 1):
        y = y_of(10.0 ** e)
        out.append(f"<line x1='{MARGIN_LEFT}' y1='{y:.1f}' x2='{WIDTH - MARGIN_RIGHT}' y2='{y:.1f}' stroke='#eaeef2'/>")
        out.append(f"<text x='{MARGIN_LEFT - 6}' y='{y + 4:.1f}' text-anchor='end'>1e{e}</text>")
    out += _x_axis(xs, at, bottom)
    coords = [(at(x), y_of(v)) for x, v in points]
    if len(coords) > 1:
        out.append("<polyline fill='none' stroke='#cf222e' stroke-width='1.5' points='"
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords) + "'/>")
    for (x, v), (cx, cy) in zip(points, coords):
        fill = "#cf222e" if v > 0 else "#fff"
        out.append(f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='3' fill='{fill}' stroke='#cf222e' "
                   f"data-step='{x}' data-value='{v!r}'><title>step {x}: {v:.4g}</title></circle>")
    out.append("</svg>")
    return "".join(out)


def heat_strip_svg(steps: Sequence[StepSpread]) -> str:
    """Which modules hold differing records at each step: one row per module, one cell per step
    (per run of steps when there are more steps than MAX_STRIP_CELLS, so a long run stays small)."""
    totals: dict[str, int] = {}
    for s in steps:
        for module, hits in s.modules.items():
            totals[module] = totals.get(module, 0) + hits
    if not totals:
        return ""
    modules = sorted(totals, key=lambda m: (-totals[m], m))[:MAX_STRIP_MODULES]
    xs = [s.step for s in steps]
    lo, hi = min(xs), max(xs)
    width = math.ceil((hi - lo + 1) / MAX_STRIP_CELLS)  # steps per cell
    cells: dict[str, dict[int, int]] = {module: {} for module in modules}  # module -> cell -> differing
    for s in steps:
        for module, hits in s.modules.items():
            if module in cells:
                cell = (s.step - lo) // width
                cells[module][cell] = cells[module].get(cell, 0) + hits
    row_h, left = 16, 190
    height = MARGIN_TOP + 18 + row_h * len(modules) + MARGIN_BOTTOM
    inner = WIDTH - left - MARGIN_RIGHT
    cell_w = inner / math.ceil((hi - lo + 1) / width)
    peak = max(hits for row in cells.values() for hits in row.values())
    title = "modules with differing records, per step" + (f" (cells of {width} steps)" if width > 1 else "")
    dropped = len(totals) - len(modules)
    out = [f"<svg class='plot' data-plot='modules' width='{WIDTH}' "
           f"height='{height}' viewBox='0 0 {WIDTH} {height}' role='img' aria-label='{title}'>",
           f"<text x='{MARGIN_LEFT}' y='{MARGIN_TOP}' font-weight='600'>{title}"
           + (f" (top {len(modules)} of {len(totals)})" if dropped else "") + "</text>"]
    top = MARGIN_TOP + 12
    for row, module in enumerate(modules):
        y = top + row * row_h
        label = module or "(outside any module)"
        if module == ROOT_MODULE:  # the model's own parameters (`weight`, not `net.0.weight`)
            label = "parameters of the root module"
        out.append(f"<text x='{left - 6}' y='{y + row_h - 4}' text-anchor='end'>{escape(label[-30:])}</text>")
        out.append(f"<rect x='{left}' y='{y}' width='{inner:.1f}' height='{row_h - 2}' fill='#f6f8fa'/>")
        for cell, hits in sorted(cells[module].items()):
            first = lo + cell * width
            span = f"steps {first}–{first + width - 1}" if width > 1 else f"step {first}"
            shade = 0.25 + 0.75 * math.log1p(hits) / math.log1p(peak)
            out.append(f"<rect x='{left + cell * cell_w:.1f}' y='{y}' width='{max(cell_w, 1.0):.1f}' "
                       f"height='{row_h - 2}' fill='#cf222e' fill-opacity='{shade:.2f}' data-step='{first}' "
                       f"data-steps='{width}' data-module='{escape(module)}' data-count='{hits}'>"
                       f"<title>{span}: {escape(label)}, {hits} differing</title></rect>")
    bottom = top + row_h * len(modules) + 2
    out.append(f"<text x='{left}' y='{bottom + 14}'>step {lo}</text>")
    out.append(f"<text x='{WIDTH - MARGIN_RIGHT}' y='{bottom + 14}' text-anchor='end'>step {hi}</text>")
    out.append("</svg>")
    return "".join(out)
