"""Determinism flags, flag typos and collectives are recorded with their call sites in a real repeat."""

from __future__ import annotations

from pathlib import Path

import pytest

from detaudit.audit.pipeline import AuditOptions, Recording, Schedule, Target, execute
from detaudit.causes.context import load
from detaudit.events import CollectiveEvent, EnvironmentEvent, FlagEvent, FlagTypoEvent

SCRIPT = """\
import torch
import torch.distributed as dist

torch.backends.cudnn.determinstic = True
torch.use_deterministic_algorithms(True)


def trainer_setup():
    torch.use_deterministic_algorithms(True, warn_only=True)


trainer_setup()
torch.backends.cudnn.benchmark = False
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
x = torch.ones(3)
dist.all_reduce(x)
dist.destroy_process_group()
print(torch.nn.Linear(3, 1)(x).shape)
"""


@pytest.mark.process
@pytest.mark.slow
def test_flags_typos_and_collectives_are_recorded(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    options = AuditOptions(Target(script), Schedule(repeats=1),
                           Recording("step", child_config={"pins": ["deterministic"]}))
    [result] = execute(options, tmp_path, cwd=tmp_path)
    assert result.exit_code == 0, (tmp_path / result.stderr).read_text()
    events = load(tmp_path / result.trace, 0, "cpu")
    [typo] = events.of(FlagTypoEvent)
    assert (typo["module"], typo["name"], typo["meant"], typo["loc"]) == \
        ("torch.backends.cudnn", "determinstic", "deterministic", "train.py:4")
    # the pin forces the flag itself: its own calls are not the script's settings
    assert [(f["flag"], f["value"], f["loc"], f["by"]) for f in events.of(FlagEvent)] == [
        ("use_deterministic_algorithms", "True", "train.py:5", "train.py:5"),
        ("use_deterministic_algorithms", "True, warn_only=True", "train.py:9", "train.py:9"),
        ("cudnn.benchmark", "False", "train.py:13", "train.py:13"),
    ]
    collectives = events.of(CollectiveEvent)
    assert collectives[0]["what"] == "init_process_group"
    assert collectives[0]["backend"] == "gloo"
    assert collectives[1]["what"] == "all_reduce"
    assert collectives[1]["loc"] == "train.py:16"
    assert events.first(EnvironmentEvent)["git"] is None  # tmp_path is no git repository
