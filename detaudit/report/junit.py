"""The JUnit XML rendering of a report, for CI systems that show test failures: one test case per
repeat, one for the comparison, and one each for the DDP replica check and the baseline when there are.

Read from the Report's typed values, as the other renderers are.
"""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree as ET

from detaudit.report.model import Report, where
from detaudit.results import Divergence, Ending
from detaudit.run.files import write_output

# Characters XML 1.0 cannot carry even escaped (names and details come from user code).
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def to_junit(report: Report) -> str:
    """One test suite, one test case per repeat plus one for the comparison: CI systems show failures."""
    suite = ET.Element("testsuite", name=f"detaudit {Path(report.script).name}")
    cases = failures = errors = 0
    for run in report.runs:
        # `compare`: the recording's own name
        name = report.recordings[run.index] if run.index < len(report.recordings) else f"repeat-{run.index}"
        case = ET.SubElement(suite, "testcase", classname="detaudit.repeat", name=f"{name} ({run.device})")
        if run.duration_s is not None:  # a baseline keeps no time
            case.set("time", str(run.duration_s))
        cases += 1
        if run.ending is Ending.TIMED_OUT:
            ET.SubElement(case, "error", message="timed out")
            errors += 1
        elif run.ended_with_error:
            ET.SubElement(case, "failure", message=f"script exited with {run.exit_code}")
            failures += 1
    case = ET.SubElement(suite, "testcase", classname="detaudit.determinism", name="repeats agree")
    cases += 1
    first = report.first_divergence
    if first is not None:
        failures += 1
        _divergence_failure(case, first, report)
    elif report.verdict == "inconclusive":  # exit 6: agreement that proves nothing is no passed test
        errors += 1
        ET.SubElement(case, "error", message=f"inconclusive: {report.inconclusive_reason}")
    if report.distributed is not None:  # a torchrun run: DDP replicas compared across ranks in every repeat
        case = ET.SubElement(suite, "testcase", classname="detaudit.run.distributed", name="DDP replicas agree")
        cases += 1
        replica = report.distributed.replica_divergence
        if replica is not None:
            failures += 1
            ET.SubElement(case, "failure", message=f"after step {replica.step}, {replica.name} on rank(s) "
                          f"{', '.join(map(str, replica.ranks))} differs from rank {replica.reference}")
    if report.fail_on_repeats:  # --fail-on-repeated-randomness: the gate is a test of its own
        case = ET.SubElement(suite, "testcase", classname="detaudit.repetition", name="draws differ where they should")
        cases += 1
        if report.repeated_randomness:
            failures += 1
            ET.SubElement(case, "failure", message="draws repeat where they should differ: " + ", ".join(
                f"{x.site} (across {x.across})" for x in report.repeated_randomness))
    if report.baseline is not None:
        case = ET.SubElement(suite, "testcase", classname="detaudit.report.baseline", name="matches the baseline")
        cases += 1
        base = report.baseline
        if not base.matches:
            failures += 1
            moved = base.divergence
            at = where(moved) if moved is not None else None
            failure = ET.SubElement(case, "failure", message=f"differs from the baseline {base.path} at record "
                                    f"{moved.index if moved else None}: {at.kind if at and at.kind else ''} "
                                    f"{at.name if at and at.name else ''}")
            failure.text = "\n".join(f"{c.field}: {c.baseline} -> {c.current}" for c in base.environment_changes)
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    xml = ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
    return _XML_INVALID.sub(lambda m: f"\\x{ord(m.group()):02x}", xml)


def _divergence_failure(case: ET.Element, first: Divergence, report: Report) -> None:
    """The first divergence as a failure: where (the op behind it when one was pinpointed), what each repeat
    printed when stdout differs, and the causes."""
    at = where(first, report.op_finding)
    step = f"step {at.counted_step}" if at.counted_step is not None else ""
    place = " ".join(x for x in (at.kind, at.name, step, at.location) if x)
    record = f" at record {first.index}" if first.index >= 0 else ""
    failure = ET.SubElement(case, "failure", message=f"first divergence{record}: {place or first.category}")
    printed = first.stdout
    shown = [f"stdout line {printed.line}, repeat {i}: {text!r}" for i, text in printed.lines.items()] \
        if printed else []
    failure.text = "\n".join([first.detail, *shown] + [f"[{c.confidence}, {c.basis}] {c.id}: {c.summary}\n"
                                                         f"fix: {c.fix}" for c in report.causes])


def write_junit(report: Report, path: Path) -> None:
    write_output(path, to_junit(report))
