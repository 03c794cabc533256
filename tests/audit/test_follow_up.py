"""audit/follow_up.py: what follows an audit (the policy, over synthetic runs with a fake experimenter), and that a
default divergent `run` compares its repeats' traces once (the real CLI in process, its repeats forked warm)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import WARM_SERVERS, interpreters
from synthetic import training_records, write_run

from detaudit.audit import follow_up
from detaudit.audit.analysis import Analysis
from detaudit.audit.follow_up import FollowUp
from detaudit.audit.pipeline import AuditOptions, Recording, Target, loaded
from detaudit.compare import traces as compare_traces_module
from detaudit.records import RunRecord


def _record(**fields: Any) -> RunRecord:
    return RunRecord(script="train.py", **fields)


def test_the_cheap_confirmation_follows_a_plain_run() -> None:
    assert FollowUp(cheap=True).confirms(_record())


def test_no_cheap_confirmation_where_explain_runs_the_experiments() -> None:
    assert not FollowUp(cheap=True, explain=True).confirms(_record())


def test_no_cheap_confirmation_of_a_perturbed_run() -> None:
    assert not FollowUp(cheap=True).confirms(_record(perturb=("threads",)))


def test_no_cheap_confirmation_of_one_node_of_several() -> None:
    assert not FollowUp(cheap=True).confirms(_record(nproc_per_node=2, torchrun_args=("--nnodes", "2")))


def test_no_follow_up_unless_asked() -> None:
    assert not follow_up.NONE.confirms(_record())


def test_explain_follows_unless_the_run_is_perturbed() -> None:
    assert [FollowUp(explain=True).explains(_record(perturb=p)) for p in ((), ("threads",))] == [True, False]


@dataclass
class FakeExperimenter:
    """Records which follow-up ran, in order; each returns the Analysis it was handed."""

    calls: list[str]

    def confirm(self, analysis: Analysis, plan: FollowUp) -> Analysis:
        self.calls.append("confirm")
        return analysis

    def explain(self, analysis: Analysis, plan: FollowUp) -> Analysis:
        self.calls.append("explain")
        return analysis


def _followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: FollowUp, divergent: bool = True) -> list[str]:
    """The follow-up `audit` gives a synthetic module-level run (its repeats not run): the experimenter's calls."""
    recs = training_records()
    other = [r.but(digest=123) if i == 5 and divergent else r for i, r in enumerate(recs)]
    analysis = loaded(write_run(tmp_path / "run", [recs, other]))
    options = AuditOptions(Target(tmp_path / "train.py"), recording=Recording(granularity="module"))
    monkeypatch.setattr(follow_up, "recorded_audit", lambda *args: (options, analysis))
    experimenter = FakeExperimenter([])
    follow_up.audit(options, follow_up=plan, experimenter=experimenter)
    return experimenter.calls


def test_a_divergent_run_is_confirmed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _followed(tmp_path, monkeypatch, FollowUp(cheap=True)) == ["confirm"]


def test_explain_runs_in_place_of_the_confirmation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _followed(tmp_path, monkeypatch, FollowUp(cheap=True, explain=True)) == ["explain"]


def test_an_agreeing_run_is_followed_by_no_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _followed(tmp_path, monkeypatch, FollowUp(cheap=True, explain=True), divergent=False) == []


def test_the_audits_report_is_written_after_its_follow_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _followed(tmp_path, monkeypatch, FollowUp(cheap=True))
    assert json.loads((tmp_path / "run" / "report.json").read_text())["verdict"] == "divergent"


# --- a default divergent `run`, counted ---------------------------------------------------------------------------

UNSEEDED = """
import torch

model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(8, 6)
for _ in range(3):
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
"""


@dataclass(frozen=True)
class Counted:
    """A default divergent `detaudit run -n 2` and the trace files of each `compare_traces` call it made."""

    calls: Sequence[tuple[str, ...]]
    run_dir: Path
    exit_code: object


def _names(traces: Sequence[Any]) -> tuple[str, ...]:
    return tuple(Path(getattr(t, "path", t)).name for t in traces)


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Counted]:
    """Every binding of compare_traces in detaudit's modules counts its calls; the repeats fork from the warm
    servers (tests/warm/), as the CLI's do in the end-to-end tests."""
    from detaudit.cli.commands import main
    from detaudit.run import distributed, launcher

    tmp = tmp_path_factory.mktemp("counted")
    (tmp / "train.py").write_text(UNSEEDED)
    real = compare_traces_module.compare_traces
    calls: list[tuple[str, ...]] = []

    def counting(paths: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        calls.append(_names(paths))
        return real(paths, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        for module in [m for name, m in sys.modules.items() if name.startswith("detaudit.") and m is not None]:
            if getattr(module, "compare_traces", None) is real:
                patch.setattr(module, "compare_traces", counting)
        if interpreters() == "warm":
            folder = WARM_SERVERS.folder()
            from pool import through_client  # importable once the servers started

            child = launcher.child_command
            patch.setattr(launcher, "child_command",
                          lambda *args, **kwargs: through_client(folder, child(*args, **kwargs)))
            patch.setattr(distributed, "child_command", launcher.child_command)
        patch.chdir(tmp)
        try:
            main(["run", "-n", "2", "-q", "--out", "run", "train.py"])
            code: object = 0
        except SystemExit as exc:
            code = exc.code
    yield Counted(calls, tmp / "run", code)


@pytest.mark.process
def test_a_default_run_of_an_unseeded_script_diverges(counted: Counted) -> None:
    assert counted.exit_code == 1


@pytest.mark.process
def test_its_top_cause_is_confirmed_by_the_cheap_experiment(counted: Counted) -> None:
    report = json.loads((counted.run_dir / "report.json").read_text())
    assert [c["confidence"] for c in report["causes"][:1]] == ["confirmed"]


@pytest.mark.process
def test_the_audits_own_traces_are_compared_once(counted: Counted) -> None:
    """Once: one compare_traces call reads the audit's repeat-N.trace files (the experiments' explain-* and the
    op-level re-run's ops-* traces are new recordings, compared on their own)."""
    assert [names for names in counted.calls if any(n.startswith("repeat-") for n in names)] == [
        ("repeat-0.trace", "repeat-1.trace")]


@pytest.mark.process
def test_the_experiments_traces_are_compared_once(counted: Counted) -> None:
    assert [names for names in counted.calls if any(n.startswith("explain-") for n in names)] == [
        ("explain-torch-rng-0.trace", "explain-torch-rng-1.trace")]

