"""The command line's options and their translation into library values: the option types and the
option groups several commands share, and the checks and conversions a command makes before it calls
the core (AuditOptions for `run` and `demo`, a tolerance for `compare`). No terminal output here:
commands.py holds the commands, session.py what they print while the library works.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from detaudit.results import Tolerance

if TYPE_CHECKING:
    from detaudit.audit.pipeline import AuditOptions
    from detaudit.results import StdoutMode
    from detaudit.run.perturb_plan import Perturbation

DEFAULT_GRANULARITY = "auto"  # module cost unless the repeats diverge (docs/granularity.md)


class FiniteFloat(click.ParamType):
    """A finite float (nan and inf are refused: they would compare as nothing and write invalid JSON),
    above `minimum` (or at least it, `inclusive`)."""

    name = "float"

    def __init__(self, minimum: float | None = None, inclusive: bool = False) -> None:
        self.minimum = minimum
        self.inclusive = inclusive

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.minimum is not None and (number < self.minimum if self.inclusive else number <= self.minimum):
            self.fail(f"{value!r} must be {'at least' if self.inclusive else 'greater than'} {self.minimum:g}",
                      param, ctx)
        return number


TOLERANCE = FiniteFloat(minimum=0, inclusive=True)  # --atol/--rtol: a negative tolerance would refuse equal values


class RunCommand(click.Command):
    """`run`: after SCRIPT, options detaudit does not know are the script's (detaudit/run/scriptargs.py)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from detaudit.run.scriptargs import OptionSpec, script_options, split_run_args

        specs = [OptionSpec(frozenset(p.opts + p.secondary_opts), not p.is_flag and not p.count, p.multiple)
                 for p in self.params if isinstance(p, click.Option)]
        split = split_run_args(args, specs, lambda script: script_options(Path(script)), prog=ctx.command_path)
        return super().parse_args(ctx, split.for_parser())


def stdout_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--stdout and its older alias --ignore-stdout (docs/stdout.md)."""
    from detaudit.compare.stdout import STDOUT_MODES

    command = click.option("--ignore-stdout", is_flag=True, help="Same as --stdout ignore.")(command)
    return click.option("--stdout", "stdout_mode", type=click.Choice(STDOUT_MODES), default=None,
                        help="How to compare what the repeats print: masked (default for `run`: line by line, "
                             "timings, rates, timestamps, pids and addresses masked), strict (byte for byte) or "
                             "ignore. `report` and `compare` default to what the runs were recorded with "
                             "(docs/stdout.md).")(command)


def stdout_mode_of(stdout_mode: str | None, ignore_stdout: bool) -> StdoutMode | None:
    """The --stdout mode asked for (None: the command's default), with --ignore-stdout as its alias."""
    if ignore_stdout and stdout_mode not in (None, "ignore"):
        raise click.UsageError(f"--ignore-stdout contradicts --stdout {stdout_mode}; give one of them")
    return "ignore" if ignore_stdout else cast("StdoutMode | None", stdout_mode)


perturb_option = click.option(
    "--perturb", default=None, metavar="SETTINGS",
    help="Make the repeats differ on purpose in settings that differ between machines, to find what only another "
         "machine would show: a comma list of threads, hash-seed, cudnn-benchmark, cublas-workspace, allocator, or "
         "all. Each setting gets its own group of --repeats repeats; repeats with equal settings are each other's "
         "control (docs/perturb.md).")


def script_arguments(command: Callable[..., Any]) -> Callable[..., Any]:
    """SCRIPT and its ARGS: every command that runs a script (SCRIPT a str, kept as typed: its sys.argv[0])."""
    command = click.argument("script_args", nargs=-1, type=click.UNPROCESSED)(command)
    return click.argument("script", type=click.Path())(command)


def repeats_option(help: str, minimum: int = 2, default: int = 3) -> Callable[..., Any]:
    return click.option("-n", "--repeats", type=click.IntRange(min=minimum), default=default, show_default=True,
                        help=help)


def devices_option(help: str, once: bool = False, default: str | None = None) -> Callable[..., Any]:
    """--device, repeatable; `once`: given at most once, and handed on as a tuple all the same (the devices
    asked for, as `audit_options` takes them)."""
    choice = click.Choice(["cpu", "cuda", "auto"])
    if not once:
        return click.option("--device", "devices", type=choice, multiple=True, help=help)
    return click.option("--device", "devices", type=choice, default=default, show_default=default is not None,
                        callback=_as_devices, help=help)


def _as_devices(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    return () if value is None else (value,)


def timeout_option(help: str = "Seconds allowed per repeat.") -> Callable[..., Any]:
    return click.option("--timeout", type=FiniteFloat(minimum=0), default=None, help=help)


out_option = click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
                          help="Run directory (default: a new folder under .detaudit/runs/).")


def jobs_option(help: str = "Repeats run in parallel.") -> Callable[..., Any]:
    return click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help=help)


def max_steps_option(help: str) -> Callable[..., Any]:
    return click.option("--max-steps", type=click.IntRange(min=1), default=None, help=help)


def max_time_option(help: str) -> Callable[..., Any]:
    return click.option("--max-time", type=FiniteFloat(minimum=0), default=None, help=help)


def nproc_option(help: str) -> Callable[..., Any]:
    return click.option("--nproc-per-node", type=click.IntRange(min=1), default=None, help=help)


def torchrun_args_option(help: str) -> Callable[..., Any]:
    return click.option("--torchrun-args", default="", metavar="ARGS", help=help)


json_option = click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
                           help="Write the JSON report.")
junit_option = click.option("--junit", "junit_path", type=click.Path(path_type=Path), default=None,
                            help="Write JUnit XML.")


sarif_option = click.option("--sarif", "sarif_path", type=click.Path(path_type=Path), default=None,
                            help="Write SARIF 2.1.0: each finding at its file:line, for GitHub code scanning "
                                 "(docs/ci.md).")


def html_option(help: str = "Write a self-contained HTML report with plots.") -> Callable[..., Any]:
    return click.option("--html", "html_path", type=click.Path(path_type=Path), default=None, help=help)


def quiet_option(help: str = "Print only the verdict line.") -> Callable[..., Any]:
    return click.option("-q", "--quiet", is_flag=True, help=help)


def report_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--json, --junit, --html, --sarif and --quiet: how every command that produces an audit's report delivers it."""
    return json_option(junit_option(html_option()(sarif_option(quiet_option()(command)))))


def check_outputs(json_path: Path | None, junit_path: Path | None, html_path: Path | None = None, *,
                  inputs: Mapping[str, Path] | None = None, save_baseline: Path | None = None,
                  out_dir: Path | None = None, sarif_path: Path | None = None) -> None:
    """Before any repeat runs: the report files can be written (else exit 7 now, not after the run), and
    none would overwrite what the command reads or writes otherwise (else exit 2, `check_distinct`).

    `inputs`: what the command reads, by how the user gave it ("the script", "RUN_DIR"...);
    `save_baseline` and `out_dir`: the directories it writes besides the reports.
    """
    from detaudit.report.baseline import check_destination
    from detaudit.run.files import check_writable

    given = {option: path for option, path in (("--json", json_path), ("--junit", junit_path), ("--html", html_path),
                                               ("--sarif", sarif_path)) if path is not None}
    on_stdout = [option for option, path in given.items() if str(path) == "-"]
    if len(on_stdout) > 1:
        raise click.UsageError(f"{' - and '.join(on_stdout)} - cannot {'both' if len(on_stdout) == 2 else 'all'} "
                               "write to stdout")
    reports = {option: path for option, path in given.items() if str(path) != "-"}
    directories = {option: path for option, path in (("--save-baseline", save_baseline), ("--out", out_dir))
                   if path is not None}
    check_distinct(reports, directories, dict(inputs or {}))
    if save_baseline is not None:
        check_destination(save_baseline)
    for path in reports.values():
        check_writable(path)


def check_distinct(reports: Mapping[str, Path], directories: Mapping[str, Path], inputs: Mapping[str, Path]) -> None:
    """Refuse (UsageError, exit 2) an output that would overwrite the user's work or detaudit's own: a report
    path that is an input of the command (the audited script, a recording), another output of the same
    command, or inside an output directory or an input directory; and any output inside a recording (a
    directory holding run.json, baseline.json or drift.json: `--json RUN/run.json` would make that run
    unreadable)."""
    seen: dict[str, str] = {}
    for option, path in {**reports, **directories}.items():
        where = os.path.realpath(path)
        if where in seen:
            raise click.UsageError(f"{option} {path} and {seen[where]} name the same path: each output needs its own")
        seen[where] = f"{option} {path}"
        for name, other in {**inputs, **(directories if option in reports else {})}.items():
            there = os.path.realpath(other)
            if where == there:
                raise click.UsageError(f"{option} {path} is {name}: it would be overwritten; write it elsewhere")
            if option in reports and where.startswith(there.rstrip(os.sep) + os.sep):
                raise click.UsageError(f"{option} {path} is inside {name} ({other}): write the report elsewhere")
        holder = _recording_holding(Path(path))
        if holder is not None:
            raise click.UsageError(f"{option} {path} is inside {holder}, a detaudit run directory or baseline: "
                                   "it would replace or add to the files detaudit reads there; write it elsewhere")


def _recording_holding(path: Path) -> Path | None:
    """The run directory or baseline `path` would be written into: its nearest existing directory above,
    when that holds detaudit's run.json, baseline.json or drift.json (a user's own report named run.json does
    not make its folder a run directory)."""
    from detaudit.drift.drift_report import DRIFT_FILE, DRIFT_FORMAT
    from detaudit.records import BASELINE, RUN
    from detaudit.report.baseline import MANIFEST
    from detaudit.run.rundir import RUN_FILE

    above = next((p for p in Path(os.path.abspath(path)).parents if p.is_dir()), None)
    kept = ((RUN_FILE, RUN.name), (MANIFEST, BASELINE.name), (DRIFT_FILE, DRIFT_FORMAT))
    if above is not None and any(_declares(above / name, fmt) for name, fmt in kept):
        return above
    return None


def _declares(path: Path, fmt: str) -> bool:
    """`path` is detaudit's record of format `fmt` (which it writes first), or a link planted in its place."""
    if os.path.islink(path):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return f'"format": "{fmt}"'.encode() in head


def audit_options(script: Path | str, script_args: tuple[str, ...] = (), *, repeats: int = 3,
                  devices: tuple[str, ...] = (), timeout: float | None = None, out_dir: Path | None = None,
                  jobs: int = 1, atol: float = Tolerance.atol, rtol: float = Tolerance.rtol,
                  stdout_mode: str | None = None, ignore_stdout: bool = False, granularity: str = "module",
                  baseline_dir: Path | None = None, save_baseline: Path | None = None, redact_args: bool = False,
                  max_steps: int | None = None, max_time: float | None = None, self_check: bool = False,
                  nproc_per_node: int | None = None, torchrun_args: str = "", run_to_end: bool = False,
                  perturb: str | None = None, fail_on_repeats: bool = False) -> AuditOptions:
    """The options of a command that audits a script (`run`, `fix`, `batch`, `resume`) as the library's
    AuditOptions (a contradiction among them is a UsageError); an option the command lacks keeps its default."""
    from detaudit.audit.pipeline import AuditOptions, Checks, Recording, Schedule, Target
    from detaudit.compare.stdout import DEFAULT_STDOUT
    from detaudit.run.devices import own_device, resolve_devices

    resolved = resolve_devices(devices)
    perturbation = _perturbation(perturb, resolved, nproc_per_node)
    return AuditOptions(
        Target(Path(script), list(script_args), redact_args=redact_args, argv0=str(script)),
        # --perturb: --repeats repeats for every combination of settings
        Schedule(repeats=repeats * (len(perturbation.groups) if perturbation else 1), devices=resolved,
                 own_device=own_device(devices), timeout=timeout, jobs=jobs, perturbation=perturbation,
                 **_torchrun(nproc_per_node, torchrun_args, baseline_dir is not None or save_baseline is not None,
                             max_time is not None, granularity == "auto" or self_check)),
        Recording(granularity=granularity, max_steps=max_steps, max_time=max_time, run_to_end=run_to_end),
        Checks(tolerance=Tolerance(atol, rtol), stdout=stdout_mode_of(stdout_mode, ignore_stdout) or DEFAULT_STDOUT,
               baseline=baseline_dir, self_check=self_check, fail_on_repeats=fail_on_repeats),
        out_dir=out_dir,
    )


def _perturbation(perturb: str | None, devices: list[str], nproc_per_node: int | None) -> Perturbation | None:
    """--perturb KNOBS as the settings the repeats will vary (run/perturb_plan.py); None without it."""
    from detaudit.pin import perturb_knobs
    from detaudit.run import perturb_plan as perturbing

    if perturb is None:
        return None
    if nproc_per_node:
        raise click.UsageError("--perturb does not support --nproc-per-node yet: each rank of a torchrun launch "
                               "would need the repeat's settings")
    try:
        knobs = perturb_knobs(perturb)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--perturb") from None
    return perturbing.plan(knobs, devices, os.cpu_count())


def option_group(build: Callable[..., Any], into: str, keep: tuple[str, ...] = (),
                 **fixed: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Options that describe one library value reach the command as that value, its parameter `into`: the
    parameters of `build` the command declares are taken from its arguments (those in `keep` are handed on
    too), `fixed` are what the command sets itself, and the rest keep `build`'s defaults."""
    names = set(inspect.signature(build).parameters) - fixed.keys()

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def grouped(**kwargs: Any) -> Any:
            taken = {name: kwargs[name] for name in names & kwargs.keys()}
            rest = {name: value for name, value in kwargs.items() if name not in taken or name in keep}
            return command(**{into: build(**taken, **fixed)}, **rest)

        return grouped

    return decorate


def audit_option_group(**fixed: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A command's options that describe the audit (parameters of `audit_options`) reach it as one
    AuditOptions, `options`; `fixed`: what the command sets itself (`fix` records modules). --save-baseline
    stays the command's own too (`run` also saves with it)."""
    return option_group(audit_options, "options", keep=("save_baseline",), **fixed)


def demo_options(script: Path, repeats: int, out_dir: Path | None) -> AuditOptions:
    """The shipped demo script on this machine's device, two repeats at a time unless that oversubscribes it."""
    from detaudit.audit.pipeline import AuditOptions, Recording, Schedule, Target
    from detaudit.run.devices import oversubscription, own_device, resolve_devices

    devices = resolve_devices(())
    jobs = 2 if oversubscription(2, devices, os.environ, os.cpu_count()) is None else 1
    return AuditOptions(Target(script), Schedule(repeats, devices, own_device(()), timeout=120.0, jobs=jobs),
                        Recording(DEFAULT_GRANULARITY), out_dir=out_dir)


def compare_tolerance(atol: float | None, rtol: float | None) -> Tolerance | None:
    """`compare`: bitwise (None) unless --atol or --rtol is given (the other is then 0)."""
    if atol is None and rtol is None:
        return None
    return Tolerance(atol if atol is not None else 0.0, rtol if rtol is not None else 0.0)


def _torchrun(nproc_per_node: int | None, torchrun_args: str, baseline: bool, max_time: bool,
              follow_up: bool) -> dict[str, Any]:
    """Schedule fields of --nproc-per-node/--torchrun-args. `follow_up`: the run may launch again after its
    repeats (granularity auto's op-level re-run, --self-check), which several nodes cannot do together."""
    from detaudit.run.distributed import NODES_FOLLOW_UP, multi_node, parse_torchrun_args

    if not nproc_per_node:
        if torchrun_args:
            raise click.UsageError("--torchrun-args needs --nproc-per-node")
        return {}
    if baseline:
        raise click.UsageError("--baseline and --save-baseline do not support --nproc-per-node yet (a baseline "
                               "keeps one trace; a torchrun run has one per rank)")
    if max_time:
        raise click.UsageError("--max-time cannot bound a torchrun run: each rank would stop by its own clock, "
                               "at different steps, and leave the others waiting in a collective; use --max-steps")
    args = parse_torchrun_args(torchrun_args)
    if follow_up and multi_node(args):
        raise click.UsageError(NODES_FOLLOW_UP.format("--granularity auto (the default) and --self-check")
                               + "; give --granularity module or op")
    return {"nproc_per_node": nproc_per_node, "torchrun_args": args}

