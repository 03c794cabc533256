"""The shared scenario audits (tests/audits.py): one run per distinct audit, however many tests read it."""

from __future__ import annotations

from pathlib import Path

import pytest
from audits import DETERMINISTIC, Audit, Cache, cache_root
from conftest import SCRIPTS, _interpreters_started, detaudit_command


def test_an_audit_is_keyed_by_everything_that_can_change_its_outcome(tmp_path: Path) -> None:
    base = Audit("train_mlp.py")
    assert base.command() == ["run", "-n", "2", "--out", "run", "--json", "run.json", "--sarif", "run.sarif",
                              str(SCRIPTS / "train_mlp.py")]
    assert Audit("train_mlp.py", script_args=("--lr", "1")).command()[-3:] == ["--", "--lr", "1"]
    variants = [base, Audit("train_mlp.py", DETERMINISTIC), Audit("predict.py"), base.with_env({"X": "1"}),
                base.retry(1), Audit("train_mlp.py", script_args=("--lr", "1"))]
    assert len({Cache(tmp_path).key(v) for v in variants}) == len(variants)
    assert base.with_env({"B": "2", "A": "1"}) == Audit("train_mlp.py", env=(("A", "1"), ("B", "2")))


def test_the_cache_is_the_sessions_not_a_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert cache_root(tmp_path / "popen-gw1") == tmp_path / "shared-audits"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert cache_root(tmp_path) == tmp_path / "shared-audits"


@pytest.mark.process
def test_an_audit_and_its_follow_up_run_once_however_often_they_are_read(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    audit = Audit("show_env.py", DETERMINISTIC)  # no torch: the cheapest real audit (it exits 7: failed, 3)
    detaudit_command()  # the warm server (tests/warm/server.py), when there is one, is already up: not counted
    with _interpreters_started() as started:
        first, again = cache.run(audit), cache.run(audit)
        follow = [cache.then(first, ["report", "run", "--json", "again.json"]) for _ in range(2)]
    assert len(started) == 2, started  # one `run`, one `report`: the CLI, each once
    assert first == again
    assert follow[0] == follow[1]
    assert first.result.returncode == 3
    assert first.report["verdict"] == "failed"
    assert follow[0].result.returncode == 3
    assert follow[0].cwd != first.cwd
    assert (follow[0].cwd / "again.json").is_file()
    assert not (first.cwd / "again.json").exists()
    own = first.copy_to(tmp_path / "mine")
    assert sorted(p.name for p in own.iterdir()) == sorted(p.name for p in first.run_dir.iterdir())
