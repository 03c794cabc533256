"""The report of `detaudit batch` (BatchReport): its verdict and exit code, its JSON form
(`detaudit-batch` version 2, docs/batch.md) and a self-contained HTML page."""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from detaudit.batch.decoding import BatchTokens
from detaudit.batch.finding import BatchFinding, FirstVariant, Spot
from detaudit.codec import Codable, FileFormat
from detaudit.errors import ExitCode
from detaudit.results import Cause, Ending, RepeatResult

# version 2: settings.batch_dim is null unless --batch-dim was given (it was 0 by default); adds batch_dims, harness,
# not_compared, train_mode_calls and subsets' `ladder`; `tokens` added within version 2 (readers ignore it)
BATCH = FileFormat("detaudit-batch", 2, "batch report")
# run-to-run-divergent: every probe agrees, but with --repeats the repeats differ from each other
BatchReportVerdict = Literal["batch-invariant", "batch-variant", "inconclusive", "script-failed", "timeout",
                             "run-to-run-divergent"]
_EXIT: dict[BatchReportVerdict, ExitCode] = {
    "batch-invariant": ExitCode.DETERMINISTIC, "batch-variant": ExitCode.DIVERGENT,
    "run-to-run-divergent": ExitCode.DIVERGENT, "inconclusive": ExitCode.INCONCLUSIVE,
    "script-failed": ExitCode.SCRIPT_FAILED, "timeout": ExitCode.TIMEOUT}


@dataclass(frozen=True)
class BatchSettings:
    """What was probed: `--module` (None: the outermost modules), `--batch-dim` (None: decided per call,
    recorder/batchdim.py), `--sizes` (empty: default)."""

    module: str | None = None
    batch_dim: int | None = None
    sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class BatchReport(Codable):
    """Everything the renderers need; built once by batch/auditing.py."""

    script: str
    script_args: list[str]
    run_dir: str
    settings: BatchSettings
    results: list[RepeatResult]
    finding: BatchFinding
    causes: list[Cause] = field(default_factory=list)
    run_to_run: str | None = None  # with --repeats > 1: `deterministic`, `divergent`, or why not compared
    run_to_run_detail: str | None = None  # the first divergence, in words

    @property
    def verdict(self) -> BatchReportVerdict:
        endings = {r.ending for r in self.results}
        if Ending.TIMED_OUT in endings:
            return "timeout"
        if endings == {Ending.FAILED}:
            return "script-failed"
        if self.finding.verdict == "batch-invariant" and self.run_to_run == "divergent":
            return "run-to-run-divergent"
        return self.finding.verdict

    @property
    def exit_code(self) -> int:
        """The verdict's code (one verdict, one code: docs/batch.md)."""
        return int(_EXIT[self.verdict])

    @property
    def inconclusive_reason(self) -> str | None:
        if self.verdict != "inconclusive":
            return None
        skipped = self.finding.skipped
        if not skipped:
            return "the script never called a module (nothing to probe)"
        return "no call could be probed: " + "; ".join(f"{n} {why}" for why, n in sorted(skipped.items()))


def _spot(spot: Spot | None) -> dict[str, Any] | None:
    return None if spot is None else asdict(spot)


def _first_variant(first: FirstVariant | None) -> dict[str, Any] | None:
    """The issue's `{module, op, location, max_abs_diff, max_ulp}` and what they rest on."""
    if first is None:
        return None
    spot = first.op or first.module
    return {
        "module": first.module.name if first.module is not None else first.call_module,
        "op": first.op.name if first.op is not None else None,
        "location": (spot.location if spot is not None else "") or first.location,
        "max_abs_diff": spot.max_abs_diff if spot is not None else first.max_abs_diff,
        "max_ulp": spot.max_ulp if spot is not None else first.max_ulp,
        "large": first.large,
        "call": {"module": first.call_module, "index": first.call, "rows": first.rows, "location": first.location,
                 "max_abs_diff": first.max_abs_diff, "max_ulp": first.max_ulp, "scale": first.scale,
                 "dtype": first.dtype},
        "differ": list(first.differ), "agree": list(first.agree), "sizes": first.sizes_text,
        "first_module": _spot(first.module), "first_op": _spot(first.op),
        "searched_size": first.searched_size, "note": first.note,
    }


MAX_TOKENS = 50  # first divergent tokens listed in the JSON (the earliest first)


def _tokens(tokens: BatchTokens | None, first: FirstVariant | None) -> dict[str, Any] | None:
    """The token answer (docs/batch.md "Token answers"): each sequence's first divergent token per probe size,
    tied to the op the origin search named."""
    if tokens is None:
        return None
    op = first.op if first is not None else None
    module = first.module if first is not None else None
    spot = op or module
    return {"decode_steps": tokens.steps, "tied_calls": tokens.tied, "untied_calls": tokens.untied,
            "op": op.name if op is not None else None, "module": module.name if module is not None else None,
            "location": spot.location if spot is not None else None,
            "first": None if tokens.earliest is None else asdict(tokens.earliest),
            "divergent": [asdict(t) for t in tokens.first[:MAX_TOKENS]], "divergent_total": len(tokens.first)}


def report_json(report: BatchReport) -> dict[str, Any]:
    """The batch report's documented JSON (docs/batch.md); `report.to_dict()` is its complete typed form."""
    finding = report.finding
    return {
        **BATCH.stamp(),
        "verdict": report.verdict, "exit_code": report.exit_code, "inconclusive_reason": report.inconclusive_reason,
        "script": report.script, "script_args": report.script_args, "run_dir": report.run_dir,
        "settings": {"module": report.settings.module, "batch_dim": report.settings.batch_dim,
                     "sizes": list(report.settings.sizes)},
        "batch_dims": [asdict(u) for u in finding.batch_dims],
        "probed_calls": finding.probed_calls, "variant_calls": finding.variant_calls,
        "not_reproduced": finding.not_reproduced,
        "not_probed": dict(finding.skipped), "not_probed_details": dict(finding.skip_details),
        "harness": {"status": finding.harness.status, "reason": finding.harness.reason,
                    "sizes": [{"size": k.size, "status": k.status, "calls": k.calls, "failed": k.failed}
                              for k in finding.harness.sizes]},
        "subsets": [{"kind": s.kind, "size": s.size, "ladder": s.ladder, "agree": s.agree, "probes": s.probes,
                     "agreed": s.agreed, "rows_differ": s.rows_differ, "max_abs_diff": s.max_abs_diff,
                     "max_ulp": s.max_ulp} for s in finding.subsets],
        "not_compared": dict(finding.not_compared), "train_mode_calls": finding.train_mode_calls,
        "first_variant": _first_variant(finding.first_variant),
        "tokens": _tokens(finding.tokens, finding.first_variant),
        "causes": [asdict(c) for c in report.causes],
        "run_to_run": report.run_to_run, "run_to_run_detail": report.run_to_run_detail,
        "repeats": [r.to_dict() for r in report.results],
    }


def write_json(report: BatchReport, path: Path, mode: int | None = None) -> None:
    from detaudit.run.files import write_output

    write_output(path, json.dumps(report_json(report), indent=2) + "\n", mode)


def render_html(report: BatchReport) -> str:
    """The report as one self-contained page (no script, no external resource)."""
    e = html.escape
    finding = report.finding
    rows = "".join(f"<tr><td>{e(s.kind)}</td><td>{s.size}</td><td>{'agree' if s.agree else 'differ'}</td>"
                   f"<td>{s.rows_differ}</td><td>{s.max_abs_diff:.3g}</td><td>{s.max_ulp}</td></tr>"
                   for s in finding.subsets)
    first = finding.first_variant
    where = ""
    if first is not None:
        spot = first.op or first.module
        module = first.module.name if first.module is not None else first.call_module
        op = first.op.name if first.op is not None else None
        location = (spot.location if spot is not None else "") or first.location
        max_abs_diff, max_ulp = (spot.max_abs_diff, spot.max_ulp) if spot is not None \
            else (first.max_abs_diff, first.max_ulp)
        where = (f"<h2>Where it starts</h2><p>{e(first.sizes_text)}</p><ul>"
                 f"<li>module: <code>{e(module)}</code></li>"
                 f"<li>op: <code>{e(str(op))}</code> at <code>{e(location)}</code></li>"
                 f"<li>max |diff| {max_abs_diff:.3g}, {max_ulp} ULP</li></ul>")
    tokens = finding.tokens.earliest if finding.tokens is not None else None
    if tokens is not None:
        where += (f"<h2>First divergent token</h2><p>sequence {tokens.sequence} at position {tokens.position} "
                  f"(<code>{e(tokens.loc)}</code>): {tokens.token} in the whole batch, {tokens.other} in "
                  f"{e(tokens.subset)} {tokens.size}</p>")
    causes = "".join(f"<li><b>{e(c.id)}</b> ({e(c.confidence)}): {e(c.summary)}<br>"
                     f"<i>fix:</i> {e(c.fix)}<ul>{''.join(f'<li>{e(x)}</li>' for x in c.evidence)}</ul></li>"
                     for c in report.causes)
    skipped = "".join(f"<li>{n} {e(why)}: {e(finding.skip_details.get(why, ''))}</li>"
                      for why, n in finding.skipped.items())
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>detaudit batch: {e(report.verdict)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:2px 8px;text-align:left}"
        "</style></head><body>"
        f"<h1>detaudit batch: {e(report.verdict)}</h1><p><code>{e(report.script)}</code> — "
        f"{finding.probed_calls} calls probed, {finding.variant_calls} batch-variant; PyTorch's harness: "
        f"<code>{e(finding.harness.status)}</code></p>"
        "<table><tr><th>probe</th><th>size</th><th></th><th>rows differ</th><th>max |diff|</th><th>max ULP</th></tr>"
        f"{rows}</table>{where}"
        + (f"<h2>Causes</h2><ul>{causes}</ul>" if causes else "")
        + (f"<h2>Not probed or not comparable</h2><ul>{skipped}</ul>" if skipped else "")
        + "</body></html>\n")


def write_html(report: BatchReport, path: Path) -> None:
    from detaudit.run.files import write_output

    write_output(path, render_html(report))
