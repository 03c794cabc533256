"""What SARIF 2.1.0 requires of a document detaudit writes (report/sarif.py), checked by hand: the fields the
schema marks required, their types, and what GitHub code scanning needs to show a result on a line."""

from __future__ import annotations

from typing import Any

LEVELS = {"none", "note", "warning", "error"}


def sarif_errors(doc: Any) -> list[str]:
    """Every way `doc` departs from the SARIF 2.1.0 shape detaudit promises; [] when none."""
    errors = []
    if doc.get("version") != "2.1.0" or not str(doc.get("$schema", "")).startswith("https://"):
        errors.append("version 2.1.0 and an https $schema are required")
    runs = doc.get("runs")
    if not isinstance(runs, list) or len(runs) != 1:
        return [*errors, "one run is required"]
    driver = runs[0].get("tool", {}).get("driver", {})
    if driver.get("name") != "detaudit" or not driver.get("version") or \
            not str(driver.get("informationUri", "")).startswith("https://"):
        errors.append("tool.driver needs name, version and an absolute informationUri")
    rules = [rule.get("id") for rule in driver.get("rules", [])]
    if len(set(rules)) != len(rules) or not all(isinstance(r, str) and r for r in rules):
        errors.append(f"rule ids must be distinct strings: {rules}")
    for i, result in enumerate(runs[0].get("results", [])):
        errors += [f"results[{i}]: {e}" for e in _result_errors(result, rules)]
    return errors


def _result_errors(result: dict[str, Any], rules: list[str]) -> list[str]:
    errors = []
    if result.get("ruleId") not in rules or rules.index(result["ruleId"]) != result.get("ruleIndex"):
        errors.append(f"ruleId {result.get('ruleId')!r} and ruleIndex must name a rule of the driver")
    if result.get("level") not in LEVELS:
        errors.append(f"level {result.get('level')!r}")
    if not isinstance(result.get("message", {}).get("text"), str) or not result["message"]["text"]:
        errors.append("message.text is required")
    locations = result.get("locations") or []
    if not locations:
        errors.append("code scanning needs at least one location")
    for location in locations:
        physical = location.get("physicalLocation", {})
        artifact, region = physical.get("artifactLocation", {}), physical.get("region", {})
        if not isinstance(artifact.get("uri"), str) or not artifact["uri"]:
            errors.append("artifactLocation.uri is required")
        if not isinstance(region.get("startLine"), int) or region["startLine"] < 1:
            errors.append(f"region.startLine must be a positive integer: {region.get('startLine')!r}")
    return errors
