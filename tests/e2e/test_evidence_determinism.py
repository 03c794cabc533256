"""Evidence is itself deterministic: repeats whose state is the same record the same evidence.

A fully seeded script (Python `random`, NumPy's global RNG and a Generator, torch, DataLoader
workers seeded from torch) runs in two fresh interpreters, each with another hash seed and
address randomization on. Every evidence event must be identical across them, except the two
fields whose job is to record the hash seed itself and the RNG states snapshotted at import, before
the script seeded anything. A digest built on `hash()`, `id()`, an
object's repr or the clock would differ here (the Python RNG digest once did: `hash(None)` is an
address on Python <= 3.11).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import SCRIPTS

from detaudit.audit.pipeline import AuditOptions, Recording, Schedule, Target, execute
from detaudit.causes.context import load
from detaudit.recorder.evidence import python_rng_digest

HASH_SEEDS = ("1", "2")  # two interpreters that differ in both: an event built on either differs between them


# snapshots taken when torch or numpy is imported, before the script's own seeding calls: their RNG
# states are OS entropy in every run (the difference unseeded-* rests on), not the same state
BEFORE_SEEDING = ("import", "numpy-import")


def normalised(event: dict[str, Any]) -> str:
    """The event as compared: only what records the hash seed, or a state before seeding, may differ."""
    if event.get("type") == "environment":
        event = {**event, "env": {k: v for k, v in event.get("env", {}).items() if k != "PYTHONHASHSEED"}}
    if event.get("type") == "state" and event.get("when") in BEFORE_SEEDING:
        event = {k: v for k, v in event.items() if k != "rng"}
    return json.dumps(event, sort_keys=True)


@pytest.mark.process
@pytest.mark.slow
def test_every_evidence_event_is_identical_across_hash_seeds_and_address_layouts(tmp_path: Path) -> None:
    per_run: list[list[str]] = []
    for seed in HASH_SEEDS:
        options = AuditOptions(Target(SCRIPTS / "train_mixed_sources.py", env={"PYTHONHASHSEED": seed}),
                               Schedule(repeats=1), Recording("module"))
        [result] = execute(options, tmp_path, prefix=f"seed{seed}", cwd=tmp_path)
        assert result.exit_code == 0, (tmp_path / result.stderr).read_text()
        evidence = load(tmp_path / result.trace, 0, "cpu")
        hashes = [e for e in evidence.events if e["type"] == "hash"]
        assert [h["PYTHONHASHSEED"] for h in hashes] == [seed]  # the seed really changed
        kept = [e for e in evidence.events if e["type"] != "hash"]
        assert {e["type"] for e in kept} >= {"seed", "generator", "state", "environment", "dataloader", "draw"}
        assert any(e.get("type") == "worker-start" for e in evidence.worker_events)
        per_run.append([normalised(e) for e in kept] + [normalised(e) for e in evidence.worker_events])
    for other in per_run[1:]:
        assert len(other) == len(per_run[0])
        for a, b in zip(per_run[0], other):
            assert a == b


def test_python_rng_digest_depends_on_the_state_values_only() -> None:
    import random

    first = random.Random(5).getstate()
    assert python_rng_digest(first) == python_rng_digest(random.Random(5).getstate())
    assert python_rng_digest(first) != python_rng_digest(random.Random(6).getstate())
    gen = random.Random(5)
    gen.gauss(0, 1)  # caches the second Gaussian: the state's last field is a float, not None
    assert python_rng_digest(gen.getstate()) != python_rng_digest(random.Random(5).getstate())
