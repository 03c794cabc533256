"""One configuration's repeats, run and recorded as `run` records them (the launcher through
`audit.pipeline.execute`), into the drift run directory as `<prefix>-N`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from detaudit.audit.pipeline import AuditOptions, execute
from detaudit.drift.configurations import Configuration
from detaudit.results import RepeatResult
from detaudit.run.devices import own_device, resolve_devices
from detaudit.run.perturb_plan import Perturbation


def record(options: AuditOptions, config: Configuration, run_dir: Path, repeats: int,
           perturbation: Perturbation | None, on_done: Callable[[RepeatResult], None] | None,
           prefix: str | None = None, **recording: Any) -> list[RepeatResult]:
    """Run `config`'s repeats (every one to its end) over the common options; `recording`: Recording fields and
    child_config entries to change (AuditOptions.recorded); `prefix`: default the configuration's label."""
    requested = (config.device,)
    target = replace(options.target, script_args=[*options.target.script_args, *config.args],
                     env={**options.target.env, **config.environment()}, python=config.python)
    schedule = replace(options.schedule, repeats=repeats, devices=resolve_devices(requested),
                       own_device=own_device(requested), perturbation=perturbation, nproc_per_node=config.nproc)
    recorded = replace(options, target=target, schedule=schedule).recorded(run_to_end=True, **recording)
    return execute(recorded, run_dir, on_done, prefix=prefix or config.label.lower())
