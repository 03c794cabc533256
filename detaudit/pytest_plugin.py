"""pytest plugin: `@pytest.mark.deterministic` and `pytest --detaudit` audit tests in fresh interpreters.

An audited test's body does not run in the pytest process. Instead each repeat is a fresh
`python -m pytest <that test>` under detaudit's recorder (never an in-process repeat, which
shares the hash seed, the RNG states and the address layout and so hides real nondeterminism),
and the test fails when the repeats diverge, naming the first divergence, the top cause and the
run directory; the top cause is confirmed by the same cheap experiment as after a divergent `detaudit run`
(audit/follow_up.py). Registered through the `pytest11` entry point; it imports neither torch nor the
audit machinery until a test is audited.

The re-runs are plain single-test sessions: the ini file's and PYTEST_ADDOPTS's options are
dropped, and pytest-randomly (which would reseed `random` and NumPy before the test and so hide an
unseeded RNG), xdist, pytest-rerunfailures and the cache are off in them. In the session itself an
audited test is never rerun by pytest-rerunfailures: a flaky result is the finding.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
import unittest
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the audit machinery is imported only once a test is audited
    from detaudit.compare.oprules import OpFinding
    from detaudit.report.model import Report
    from detaudit.results import Divergence

CHILD_ENV = "DETAUDIT_PYTEST_REPEAT"  # set in the re-runs: there the test body runs, unaudited
MARKER = "deterministic"
DEFAULT_OUT = Path(".detaudit") / "runs" / "pytest"
_MARKER_HELP = (
    f"{MARKER}(repeats=3, atol=None, rtol=None, max_steps=None, devices=None): re-run the test in fresh "
    "interpreters under detaudit and fail it when the runs diverge (atol/rtol: tolerance across devices)."
)
_MARKER_ARGS = ("repeats", "atol", "rtol", "max_steps", "devices")
# plugins that must not act in a re-run (blocking an absent plugin is harmless)
_BLOCKED_IN_REPEATS = ("randomly", "xdist", "rerunfailures", "cacheprovider")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("detaudit", "determinism audit (detaudit)")
    group.addoption("--detaudit", action="store_true", default=False,
                    help="Audit every selected test, marked `deterministic` or not.")
    group.addoption("--detaudit-repeats", type=int, default=3, metavar="N",
                    help="Fresh-interpreter runs per audited test unless its marker says (default 3, at least 2).")
    group.addoption("--detaudit-out", type=Path, default=None, metavar="DIR",
                    help=f"Where each audited test's run directory goes (default {DEFAULT_OUT}).")
    group.addoption("--detaudit-timeout", type=float, default=None, metavar="SECONDS",
                    help="Seconds allowed per re-run.")
    group.addoption("--detaudit-jobs", type=int, default=1, metavar="N", help="Re-runs in parallel per test.")
    group.addoption("--detaudit-granularity", default="auto", choices=("step", "module", "op", "auto"),
                    help="What each re-run records (as `detaudit run --granularity`; default auto).")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)
    if config.getoption("detaudit_repeats") < 2:
        raise pytest.UsageError("--detaudit-repeats must be at least 2")


def _audited(item: pytest.Item) -> bool:
    """A test function to audit here (not in a re-run; unittest.TestCase methods run as they are)."""
    return (isinstance(item, pytest.Function) and not os.environ.get(CHILD_ENV)
            and not (item.cls is not None and issubclass(item.cls, unittest.TestCase))
            and (item.get_closest_marker(MARKER) is not None or item.config.getoption("detaudit")))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run an audited test's protocol ourselves, so that no rerun plugin retries it into passing."""
    if not _audited(item):
        return None
    from _pytest.runner import runtestprotocol

    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    runtestprotocol(item, nextitem=nextitem, log=True)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Replace the body of an audited test with the audit of its fresh-interpreter re-runs."""
    if not _audited(pyfuncitem):
        return None
    from detaudit.errors import DetauditError

    try:
        report = audit_test(pyfuncitem)
    except DetauditError as exc:
        pytest.fail(f"detaudit could not audit this test: {exc}", pytrace=False)
    message = failure_message(report)
    if message:
        pytest.fail(message, pytrace=False)
    return True


@dataclasses.dataclass(frozen=True)
class MarkerArgs:
    """The `deterministic` marker's arguments (or the session defaults)."""

    repeats: int
    atol: float | None = None
    rtol: float | None = None
    max_steps: int | None = None
    devices: tuple[str, ...] = ()


def marker_args(item: pytest.Item) -> MarkerArgs:
    """The marker's keyword arguments, validated (a typo must not silently audit something else)."""
    marker = item.get_closest_marker(MARKER)
    kwargs = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER} takes keyword arguments only "
                                f"({', '.join(_MARKER_ARGS)})")
    unknown = sorted(set(kwargs) - set(_MARKER_ARGS))
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: unknown @pytest.mark.{MARKER} argument(s) {', '.join(unknown)}; "
                                f"it takes {', '.join(_MARKER_ARGS)}")
    repeats = kwargs.pop("repeats", item.config.getoption("detaudit_repeats"))
    if not isinstance(repeats, int) or repeats < 2:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER}(repeats=...) must be an integer of at least 2")
    devices = kwargs.pop("devices", None) or ()
    return MarkerArgs(repeats=repeats, devices=(devices,) if isinstance(devices, str) else tuple(devices), **kwargs)


def repeat_argv(item: pytest.Item) -> list[str]:
    """pytest's arguments for one re-run of `item`: that test alone, in a plain session.

    The test is named by its absolute path so the re-run finds it from the session's working
    directory (which it keeps: the test sees the same cwd), and the same rootdir and ini file.
    """
    config = item.config
    _, sep, rest = item.nodeid.partition("::")
    argv = [f"{item.path}{sep}{rest}", "--rootdir", str(config.rootpath), "-o", "addopts=", "-q", "--no-header"]
    if config.inipath is not None:
        argv += ["-c", str(config.inipath)]
    argv += [f"--import-mode={config.getoption('importmode')}"]
    for name in _BLOCKED_IN_REPEATS:
        argv += ["-p", f"no:{name}"]
    return argv


def run_dir_for(item: pytest.Item) -> Path:
    """A new, empty run directory named after the test (parametrize ids made file-safe)."""
    base = item.config.getoption("detaudit_out") or item.config.rootpath / DEFAULT_OUT
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid).strip("_")[:120]
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"
    candidate, n = Path(base) / stem, 1
    while True:
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            n += 1
            candidate = Path(base) / f"{stem}-{n}"


def audit_test(item: pytest.Item) -> Report:
    """Run `item` in fresh interpreters under the recorder and return detaudit's Report."""
    import importlib.util

    from detaudit.audit.follow_up import FollowUp, run_audit
    from detaudit.audit.pipeline import AuditOptions, Checks, Recording, Schedule, Target
    from detaudit.explain.confirmation import PinnedExperiments
    from detaudit.results import Tolerance
    from detaudit.run.devices import own_device, resolve_devices

    args = marker_args(item)
    spec = importlib.util.find_spec("pytest.__main__")
    if spec is None or spec.origin is None:
        raise pytest.UsageError("detaudit: cannot locate pytest's __main__ module to re-run the test")
    defaults = Tolerance()
    extra: dict[str, Any] = {}
    if args.max_steps is not None:
        # bounded audits come with `detaudit run --max-steps`; without it the bound cannot be honoured
        if "max_steps" not in {f.name for f in dataclasses.fields(Recording)}:
            raise pytest.UsageError("@pytest.mark.deterministic(max_steps=...) needs a detaudit with --max-steps")
        extra["max_steps"] = args.max_steps
    config = item.config
    options = AuditOptions(
        Target(Path(spec.origin), repeat_argv(item), module="pytest", env={CHILD_ENV: "1", "PYTEST_ADDOPTS": ""}),
        Schedule(args.repeats, resolve_devices(args.devices), own_device(args.devices),
                 timeout=config.getoption("detaudit_timeout"), jobs=max(1, config.getoption("detaudit_jobs"))),
        Recording(config.getoption("detaudit_granularity"), **extra),
        # pytest prints its own timings; the test's exit status and tensors are what is compared
        Checks(Tolerance(defaults.atol if args.atol is None else args.atol,
                         defaults.rtol if args.rtol is None else args.rtol), stdout="ignore"),
        out_dir=run_dir_for(item),
    )
    # the follow-up `run` gives a divergence: the top cause's cheap confirmation, the op-level re-run
    report = run_audit(options, follow_up=FollowUp(cheap=True, jobs=options.schedule.jobs),
                       experimenter=PinnedExperiments())
    if report.verdict != "deterministic":
        _write_html(report)
    return report


def _write_html(report: Report) -> None:
    """A failing audit leaves its HTML report next to report.json, for CI artifacts."""
    from detaudit.report.html import write_html

    write_html(report, Path(report.run_dir) / "report.html")


def failure_message(report: Report) -> str:
    """Why the audited test fails, in a few lines; "" when it passes."""
    verdict = report.verdict
    if verdict == "deterministic" and report.exit_code == 0:
        return ""
    runs = len(report.runs)
    lines: list[str] = []
    if verdict == "failed":
        lines.append(f"the test failed in every one of {runs} fresh-interpreter re-runs:")
        lines.append(_output_tail(Path(report.run_dir) / report.runs[0].stdout) or report.failure or "(no output)")
    elif verdict == "timeout":
        lines.append("a re-run timed out before the re-runs diverged (--detaudit-timeout)")
    elif verdict != "divergent":  # a verdict that settles nothing is no pass
        reason = report.inconclusive_reason
        lines.append(f"detaudit could not show that this test is deterministic: verdict {verdict}"
                     + (f" ({reason})" if reason else ""))
    else:
        lines.append(f"not deterministic: {runs} fresh-interpreter runs of this test diverge")
        first = report.first_divergence
        if first is not None:
            lines.append("first divergence: " + describe_divergence(first, report.op_finding))
        if report.causes:
            cause = report.causes[0]
            lines.append(f"top cause: [{cause.confidence}] {cause.id}: {cause.summary}")
            lines.append(f"  fix: {cause.fix}")
    lines.append(f"run directory: {report.run_dir} (`detaudit report` it; report.html there)")
    return "\n".join(lines)


def _output_tail(path: Path, lines: int = 40) -> str:
    """The end of a re-run's pytest output (pytest reports a failing test on stdout): its last 64 KB, a
    regular file of the run directory, never read through a link."""
    from detaudit.run.failure import capture_tail

    text = capture_tail(path, "stdout capture", 64 << 10)
    return "\n".join(text.rstrip().splitlines()[-lines:])


def describe_divergence(first: Divergence, finding: OpFinding | None = None) -> str:
    """One line: which record, where (the op behind it, `finding`, when one was pinpointed), how large."""
    if first.index < 0:  # the re-runs ended differently (exit status): no record to name
        return f"{first.category} — {first.detail}"
    from detaudit.report.model import where

    at = where(first, finding)
    parts = [f"record #{first.index}"]
    if at.kind:
        parts.append(f"{at.kind} {at.name}")
    if at.module:
        parts.append(f"in {at.module}")
    if at.op:
        parts.append(f"from op {at.op}")
    if at.counted_step is not None:
        parts.append(f"at step {at.counted_step}")
    if at.location:
        parts.append(f"({at.location})")
    text = " ".join(parts)
    text += f"; repeat(s) {', '.join(map(str, first.repeats))} differ from repeat {first.reference}"
    if first.max_abs_diff is not None and math.isfinite(first.max_abs_diff):
        text += f", max |diff| {first.max_abs_diff:.3g}"
    if first.detail:
        text += f" — {first.detail}"
    return text
