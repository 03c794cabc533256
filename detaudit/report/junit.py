"""The JUnit XML rendering of a report, for CI systems that show test failures: one test case per
repeat, one for the comparison, and one each for the DDP replica check and the baseline when there are.

Built from report.to_dict, so it says nothing the JSON report does not.
"""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree as ET

from detaudit.report.model import Report, to_dict
from detaudit.run.files import write_output

# Characters XML 1.0 cannot carry even escaped (names and details come from user code).
_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def to_junit(report: Report) -> str:
    """One test suite, one test case per repeat plus one for the comparison: CI systems show failures."""
    data = to_dict(report)
    suite = ET.Element("testsuite", name=f"detaudit {Path(report.script).name}")
    cases = 0
    failures = errors = 0
    for run in data["runs"]:
        name = run.get("recording") or f"repeat-{run['repeat']}"  # `compare`: the recording's own name
        case = ET.SubElement(suite, "testcase", classname="detaudit.repeat", name=f"{name} ({run['device']})")
        if run["duration_s"] is not None:  # a baseline keeps no time
            case.set("time", str(run["duration_s"]))
        cases += 1
        if run["timed_out"]:
            ET.SubElement(case, "error", message="timed out")
            errors += 1
        elif run["exit_code"] not in (0, None) and run["stopped_at_step"] is None:
            ET.SubElement(case, "failure", message=f"script exited with {run['exit_code']}")
            failures += 1
    case = ET.SubElement(suite, "testcase", classname="detaudit.determinism", name="repeats agree")
    cases += 1
    first = data["first_divergence"]
    if first is not None:
        failures += 1
        step = f"step {first['step']}" if first["step"] is not None and first["step"] >= 0 else ""
        where = " ".join(str(x) for x in (first["kind"], first["name"], step, first["location"] or "") if x)
        at = f" at record {first['index']}" if first["index"] >= 0 else ""
        failure = ET.SubElement(case, "failure", message=f"first divergence{at}: {where or first['category']}")
        printed = first["stdout"]
        shown = [f"stdout line {printed['line']}, repeat {i}: {text!r}" for i, text in printed["lines"].items()] \
            if printed else []
        failure.text = "\n".join(
            [first["detail"] or "", *shown] + [f"[{c['confidence']}, {c['basis']}] {c['id']}: {c['summary']}\n"
                                               f"fix: {c['fix']}" for c in data["causes"]]
        )
    replica = data.get("replica_divergence")
    if "replica_divergence" in data:  # a torchrun run: DDP replicas compared across ranks in every repeat
        case = ET.SubElement(suite, "testcase", classname="detaudit.run.distributed", name="DDP replicas agree")
        cases += 1
        if replica is not None:
            failures += 1
            ET.SubElement(case, "failure", message=f"after step {replica['step']}, {replica['name']} on rank(s) "
                          f"{', '.join(map(str, replica['ranks']))} differs from rank {replica['reference']}")
    if data["baseline"] is not None:
        case = ET.SubElement(suite, "testcase", classname="detaudit.report.baseline", name="matches the baseline")
        cases += 1
        base = data["baseline"]
        if not base["matches"]:
            failures += 1
            first = base["first_divergence"] or {}
            failure = ET.SubElement(case, "failure", message=f"differs from the baseline {base['path']} at record "
                                    f"{first.get('index')}: {first.get('kind') or ''} {first.get('name') or ''}")
            failure.text = "\n".join(f"{c['field']}: {c['baseline']} -> {c['current']}"
                                     for c in base["environment_changes"])
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    xml = ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
    return _XML_INVALID.sub(lambda m: f"\\x{ord(m.group()):02x}", xml)


def write_junit(report: Report, path: Path) -> None:
    write_output(path, to_junit(report))
