"""The records detaudit keeps on disk, as types: the run record (run.json), the stored `--explain`
experiments (explain.json) and a baseline's manifest (baseline.json).

One module owns these formats (the pattern of pip's `models/direct_url.py`): each declares its
`FileFormat` (codec.py), whose name and version are checked before any other field: a foreign file, or
one from a newer detaudit, is refused by name. Each record is a frozen dataclass, read by `from_dict`
and written by `to_dict`, its round trip; a wrong field is one TraceError (exit 4) naming the file and
the key. baseline.json is read by its fields' declared types (`FileFormat.read`); run.json and
explain.json, whose files are not shaped as their types, field by field through typed getters
(`_Fields`). Nothing else in detaudit indexes these files as dicts: the rest of
the code holds a `RunRecord`, an `ExplainRecord` or a `BaselineManifest` (tests/test_records.py
checks). Keys a record does not know are ignored (a newer writer may add some); a key that is
present must have its type. Files themselves are opened in run/rundir.py and report/baseline.py.

The files and what they hold: run/rundir.py (run.json, explain.json) and docs/trace-format.md ("Baselines").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, cast, get_args

from detaudit import schema
from detaudit.codec import AT_LEAST_0, FINITE, FileFormat
from detaudit.errors import TraceError
from detaudit.pin import Perturb
from detaudit.results import Experiment, ExperimentVerdict, RepeatResult, SelfCheck, Tolerance

RUN = FileFormat("detaudit-run", 1, "run record")
EXPLAIN = FileFormat("detaudit-explain", 1, "experiment record")
BASELINE = FileFormat("detaudit-baseline", 1, "baseline manifest")
# `detaudit watch`: the events file the replay appends to (recorder/replay.py), its first line the header
WATCH_EVENTS = FileFormat("detaudit-watch-events", 1, "watch events file")
OPS_PREFIX = "ops"  # traces of the op-level re-run under --granularity auto

_MISSING = object()
Scalar = str | int | Annotated[float, FINITE] | bool | None  # a JSON scalar (a finite number)


def is_plain_name(name: str) -> bool:
    """A file name with no directory part: it can only resolve inside the run directory."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


class _Fields:
    """One JSON object of a record being read: typed getters that name the file and the key they fail on."""

    def __init__(self, data: object, where: str, path: str = "") -> None:
        schema.check(data, dict, where, path)
        assert isinstance(data, dict)
        self.data: dict[str, Any] = data
        self.where = where
        self.path = path

    def _key(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, spec: schema.Spec, required: bool) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING:
            if required:
                raise TraceError(f"{self.where}: field `{self._key(key)}` is missing")
            return None
        return schema.check(value, spec, self.where, self._key(key))

    def text(self, key: str, default: str | None = None) -> str:
        """A string; required unless it has a default."""
        value = self._get(key, str, default is None)
        return default if value is None and default is not None else str(value)

    def optional_text(self, key: str) -> str | None:
        value = self._get(key, schema.STR_OR_NONE, False)
        return None if value is None else str(value)

    def choice(self, key: str, options: Sequence[str]) -> str:
        """A required string that must be one of `options` (a value a newer detaudit may write is refused)."""
        value = self.text(key)
        if value not in options:
            raise TraceError(f"{self.where}: field `{self._key(key)}` must be one of {', '.join(options)}, "
                             f"not {value!r}")
        return value

    def integer(self, key: str, minimum: int | None = None) -> int:
        return int(self._get(key, schema.Int(minimum), True))

    def optional_integer(self, key: str, minimum: int | None = None) -> int | None:
        value = self._get(key, schema.OneOf((schema.Int(minimum), schema.NONE)), False)
        return None if value is None else int(value)

    def number(self, key: str, default: float) -> float:
        value = self._get(key, schema.Number(), False)
        return default if value is None else float(value)

    def optional_number(self, key: str) -> float | None:
        value = self._get(key, schema.NUMBER_OR_NONE, False)
        return None if value is None else float(value)

    def flag(self, key: str) -> bool:
        """A boolean; absent is False."""
        return bool(self._get(key, bool, False))

    def texts(self, key: str) -> tuple[str, ...]:
        return tuple(self._get(key, schema.ListOf(str), False) or ())

    def optional_integers(self, key: str, max_len: int | None = None) -> list[int] | None:
        value = self._get(key, schema.OneOf((schema.ListOf(schema.Int(0), max_len), schema.NONE)), False)
        return None if value is None else [int(v) for v in value]

    def text_map(self, key: str) -> dict[str, str]:
        return dict(self._get(key, schema.MapOf(str), False) or {})

    def obj(self, key: str, required: bool = False) -> _Fields | None:
        """A nested object, read with the same getters (None when absent or null and not required)."""
        value = self._get(key, schema.OneOf((dict, schema.NONE)) if not required else dict, required)
        return None if value is None else _Fields(value, self.where, self._key(key))

    def objects(self, key: str) -> list[_Fields]:
        """A list of objects (absent: none)."""
        entries = self._get(key, schema.ListOf(dict), False) or []
        return [_Fields(e, self.where, f"{self._key(key)}[{i}]") for i, e in enumerate(entries)]

    def results(self, key: str, required: bool = False) -> tuple[RepeatResult, ...] | None:
        """Repeat results (run.json `results`...), each naming its files as plain names inside the run directory."""
        entries = self._get(key, schema.OneOf((schema.ListOf(schema.REPEAT_RESULT), schema.NONE)), required)
        if entries is None:
            return None
        results = tuple(RepeatResult.from_dict(e) for e in entries)
        settings = [p.value for p in Perturb]
        for i, r in enumerate(results):
            for name, value in (("trace", r.trace), ("stdout", r.stdout), ("stderr", r.stderr)):
                if not is_plain_name(value):
                    raise TraceError(f"{self.where}: field `{self._key(key)}[{i}].{name}` must name a file inside "
                                     f"the run directory, not {value!r}")
            unknown = [k for k in r.perturbation or {} if k not in settings]
            if unknown:
                raise TraceError(f"{self.where}: field `{self._key(key)}[{i}].perturbation` names {unknown[0]!r}, "
                                 f"which is no --perturb setting ({', '.join(settings)})")
        return results



@dataclass(frozen=True)
class Host:
    """The machine detaudit ran on (run.json `environment`)."""

    detaudit: str | None = None
    python: str | None = None
    platform: str | None = None
    machine: str | None = None
    cpu_count: int | None = None

    @classmethod
    def from_fields(cls, f: _Fields) -> Host:
        return cls(f.optional_text("detaudit"), f.optional_text("python"), f.optional_text("platform"),
                   f.optional_text("machine"), f.optional_integer("cpu_count"))

    def to_dict(self) -> dict[str, Any]:
        """The facts known (a hand-written or older record may hold fewer; `cpu_count` may be unknown)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Narrowing:
    """Under `--granularity auto`, the op-level re-run of a divergent run: the steps it recorded ops in
    (`window`), its repeat files' prefix and its results."""

    results: tuple[RepeatResult, ...]
    window: list[int] | None = None
    prefix: str = OPS_PREFIX

    @classmethod
    def from_fields(cls, f: _Fields) -> Narrowing:
        return cls(f.results("results", required=True) or (), f.optional_integers("window", 2),
                   f.text("prefix", OPS_PREFIX))

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "prefix": self.prefix, "results": [r.to_dict() for r in self.results]}


def _self_check(f: _Fields) -> SelfCheck:
    """run.json `self_check`: the record changed and where the change was seen; one that could not be
    made (`not_run`, why) names the record only when one was chosen."""
    not_run = f.text("not_run", "")
    if not_run:
        return SelfCheck(f.optional_integer("record", 0), f.optional_integer("step"), f.optional_text("name"), None,
                         not_run)
    return SelfCheck(f.integer("record", 0), f.integer("step"), f.text("name"), f.optional_integer("detected_at"))


@dataclass(frozen=True)
class RunRecord:
    """run.json: how the script was run, the host, and once the repeats ended their results.

    Defaults are what a record without the key means (older or hand-written records; detaudit
    writes every key but the optional ones at the end).
    """

    script: str
    script_args: tuple[str, ...] = ()  # or `<redacted>` each, under --redact-args
    args_redacted: bool = False
    cwd: str | None = None  # the script's working directory
    repeats: int | None = None  # per device
    devices: tuple[str, ...] = ()
    granularity: str | None = None
    timeout: float | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)
    env: Mapping[str, str] = field(default_factory=dict)  # variables added to each repeat's environment
    own_device: bool = False
    stdout: str | None = None  # how stdout is compared (compare.stdout.recorded_mode reads it)
    module: str | None = None
    max_steps: int | None = None
    max_time: float | None = None
    run_to_end: bool = False  # --run-to-end: no repeat was stopped after diverging (nor are --explain's)
    baseline: str | None = None  # --baseline, resolved
    results: tuple[RepeatResult, ...] | None = None  # None until the repeats end
    nproc_per_node: int | None = None  # a torchrun run (docs/distributed.md)
    torchrun_args: tuple[str, ...] = ()
    environment: Host = field(default_factory=Host)
    started: float | None = None
    interrupted: bool = False  # stopped by Ctrl-C/SIGTERM/SIGHUP: `results` hold what the repeats recorded
    narrowing: Narrowing | None = None
    self_check: SelfCheck | None = None
    ignore_stdout: bool = False  # older runs' spelling of `stdout: ignore` (read, written back, never set)
    perturb: tuple[str, ...] = ()  # `--perturb`: the settings varied (each repeat's values: its `perturbation`)
    not_perturbed: Mapping[str, str] = field(default_factory=dict)  # asked for, not varied here: why
    fail_on_repeats: bool = False  # --fail-on-repeated-randomness: the verdict's gate (report/model.py)

    @classmethod
    def from_dict(cls, data: object, where: str) -> RunRecord:
        """The record of a run.json's JSON (`where`: its path, named in every error)."""
        RUN.check(data, where)
        f = _Fields(data, where)
        tolerance = f.obj("tolerance")
        narrowing = f.obj("narrowing")
        host = f.obj("environment")
        checked = f.obj("self_check")
        self_check = None if checked is None else _self_check(checked)
        return cls(
            script=f.text("script"), script_args=f.texts("script_args"), args_redacted=f.flag("args_redacted"),
            cwd=f.optional_text("cwd"), repeats=f.optional_integer("repeats", 1), devices=f.texts("devices"),
            granularity=f.optional_text("granularity"), timeout=f.optional_number("timeout"),
            tolerance=Tolerance() if tolerance is None else Tolerance(
                tolerance.number("atol", Tolerance.atol), tolerance.number("rtol", Tolerance.rtol)),
            env=f.text_map("env"), own_device=f.flag("own_device"), stdout=f.optional_text("stdout"),
            module=f.optional_text("module"), max_steps=f.optional_integer("max_steps"),
            max_time=f.optional_number("max_time"), baseline=f.optional_text("baseline"),
            results=f.results("results"), nproc_per_node=f.optional_integer("nproc_per_node", 1),
            torchrun_args=f.texts("torchrun_args"),
            environment=Host() if host is None else Host.from_fields(host),
            started=f.optional_number("started"), interrupted=f.flag("interrupted"),
            narrowing=None if narrowing is None else Narrowing.from_fields(narrowing), self_check=self_check,
            ignore_stdout=f.flag("ignore_stdout"), run_to_end=f.flag("run_to_end"),
            perturb=f.texts("perturb"), not_perturbed=f.text_map("not_perturbed"),
            fail_on_repeats=f.flag("fail_on_repeated_randomness"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON of run.json, key for key as detaudit has always written it (optional keys only when set)."""
        data: dict[str, Any] = {
            **RUN.stamp(), "script": self.script,
            "script_args": list(self.script_args), "args_redacted": self.args_redacted, "cwd": self.cwd,
            "repeats": self.repeats, "devices": list(self.devices), "granularity": self.granularity,
            "timeout": self.timeout, "tolerance": asdict(self.tolerance), "env": dict(self.env),
            "own_device": self.own_device, "stdout": self.stdout, "module": self.module, "max_steps": self.max_steps,
            "max_time": self.max_time, "baseline": self.baseline,
            "results": None if self.results is None else [r.to_dict() for r in self.results],
        }
        if self.nproc_per_node:
            data.update(nproc_per_node=self.nproc_per_node, torchrun_args=list(self.torchrun_args))
        data.update(environment=self.environment.to_dict(), started=self.started)
        if self.ignore_stdout:
            data["ignore_stdout"] = True
        if self.interrupted:
            data["interrupted"] = True
        if self.run_to_end:
            data["run_to_end"] = True
        if self.narrowing is not None:
            data["narrowing"] = self.narrowing.to_dict()
        if self.self_check is not None:
            data["self_check"] = asdict(self.self_check)
        if self.perturb or self.not_perturbed:
            data.update(perturb=list(self.perturb), not_perturbed=dict(self.not_perturbed))
        if self.fail_on_repeats:
            data["fail_on_repeated_randomness"] = True
        return data


EXPERIMENT_VERDICTS: tuple[str, ...] = get_args(ExperimentVerdict)


@dataclass(frozen=True)
class StoredExperiment:
    """One explain.json entry: the experiment, and for one that ran its repeats' file prefix and results."""

    experiment: Experiment
    prefix: str | None = None  # None: skipped (over the budget), nothing ran
    results: tuple[RepeatResult, ...] | None = None

    @classmethod
    def from_fields(cls, f: _Fields) -> StoredExperiment:
        verdict = cast(ExperimentVerdict, f.choice("verdict", EXPERIMENT_VERDICTS))
        experiment = Experiment(f.text("pin"), f.text("description"), verdict,
                                f.optional_integer("first_divergence_index"), f.text("note", ""))
        return cls(experiment, f.optional_text("prefix"), f.results("results"))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self.experiment)
        if self.prefix is not None:
            data["prefix"] = self.prefix
        if self.results is not None:
            data["results"] = [r.to_dict() for r in self.results]
        return data


@dataclass(frozen=True)
class ExplainRecord:
    """explain.json: the `--explain` experiments run so far on a run directory, in the order they ran."""

    experiments: tuple[StoredExperiment, ...] = ()

    @classmethod
    def from_dict(cls, data: object, where: str) -> ExplainRecord:
        EXPLAIN.check(data, where)
        f = _Fields(data, where)
        return cls(tuple(StoredExperiment.from_fields(e) for e in f.objects("experiments")))

    def to_dict(self) -> dict[str, Any]:
        return {**EXPLAIN.stamp(), "experiments": [e.to_dict() for e in self.experiments]}


@dataclass(frozen=True)
class Reference:
    """A baseline's recorded repeat (baseline.json `reference`): its trace file and how it ended."""

    trace: str  # a file name inside the baseline directory
    sha256: str
    device: str
    exit_code: int
    stdout_digest: str
    records: Annotated[int, AT_LEAST_0] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "sha256": self.sha256, "records": self.records, "device": self.device,
                "exit_code": self.exit_code, "stdout_digest": self.stdout_digest}


@dataclass(frozen=True)
class BaselineManifest:
    """baseline.json: how the kept run was made, its reference repeat, and its environment fingerprint."""

    script: str  # the script's file name
    script_args: tuple[str, ...]
    granularity: str
    reference: Reference
    environment: Mapping[str, Scalar]  # compare/baseline_diff.fingerprint: field -> JSON scalar
    detaudit_version: str | None = None
    created: str | None = None
    # `run --perturb`: the settings the recorded run varied without a bit changing, with the values tried
    survived: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: object, where: str) -> BaselineManifest:
        """The manifest of a baseline.json's JSON, its fields read as declared (codec.py)."""
        return BASELINE.read(cls, data, where)

    def to_dict(self) -> dict[str, Any]:
        return {**BASELINE.stamp(), "detaudit_version": self.detaudit_version,
                "created": self.created, "script": self.script, "script_args": list(self.script_args),
                "granularity": self.granularity, "reference": self.reference.to_dict(),
                "environment": dict(self.environment),
                **({"survived": {k: list(v) for k, v in self.survived.items()}} if self.survived else {})}
