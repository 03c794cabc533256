"""The pytest plugin (detaudit/pytest_plugin.py), tested by running pytest itself (`pytester`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import WARM, WARM_SERVERS, interpreters

from detaudit.pytest_plugin import describe_divergence, marker_args, repeat_argv
from detaudit.results import Divergence, RecordInfo

TRAINING_TESTS = '''
import pytest
import torch


def fit(seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 6)
    for _ in range(2):
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    return model


@pytest.mark.deterministic(repeats=2)
@pytest.mark.parametrize("seed", [0, 1])
def test_seeded(seed, tmp_path):
    torch.save(fit(seed).state_dict(), tmp_path / "model.pt")


@pytest.mark.deterministic(repeats=2)
def test_unseeded():
    fit()


def test_plain():
    assert True


def test_deselected():
    raise AssertionError("deselected with -k")
'''


def _run_pytest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> pytest.RunResult:
    """`pytest ARGS` in a subprocess, the plugin's repeats forked from the suite's warm servers unless the test
    runs fresh interpreters (conftest.interpreters)."""
    if interpreters() == "warm":
        (pytester.path / "warm_plugin.py").write_text((WARM / "warm_plugin.py").read_text())
        monkeypatch.setenv("DETAUDIT_TEST_WARM", f"{WARM},{WARM_SERVERS.folder()}")
        args = ("-p", "warm_plugin", *args)
    return pytester.runpytest_subprocess(*args)


def _outcomes(result: pytest.RunResult) -> dict[str, int]:
    return result.parseoutcomes()


def _check_unseeded_failure(result: pytest.RunResult) -> Path:
    """The unseeded test's failure names the first divergence, the top cause (confirmed by the cheap experiment, as
    `detaudit run` confirms it) and the run directory."""
    text = result.stdout.str()
    assert "not deterministic: 2 fresh-interpreter runs of this test diverge" in text
    assert re.search(r"first divergence: record #0 input .* at step 0 \(test_training\.py:\d+\)", text), text
    assert "top cause: [confirmed] unseeded-torch-rng" in text, text
    match = re.search(r"run directory: (\S+) ", text)
    assert match, text
    run_dir = Path(match.group(1))
    assert (run_dir / "report.json").is_file()
    assert (run_dir / "report.html").is_file()
    return run_dir


@pytest.mark.process
@pytest.mark.slow
def test_marked_tests_audited_under_xdist_beside_randomly_and_rerunfailures(pytester: pytest.Pytester,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """One session with all three plugins (pytest itself in a subprocess, and each audited test's repeats, cost
    interpreters): xdist's two workers each audit their tests, pytest-randomly orders them, and no rerun
    plugin retries an audited test into passing."""
    pytest.importorskip("xdist")
    pytest.importorskip("pytest_randomly")
    pytest.importorskip("pytest_rerunfailures")
    pytester.makepyfile(test_training=TRAINING_TESTS)
    result = _run_pytest(pytester, monkeypatch, "-n", "2", "-p", "randomly", "--reruns", "2", "-k", "not deselected",
                         "--detaudit-granularity", "module", "-rf")
    assert "Using --randomly-seed=" in result.stdout.str()  # pytest-randomly was active in the session
    outcomes = _outcomes(result)
    # seeded (both parameters, with tmp_path) and the unmarked test pass; the unseeded one fails, never rerun
    assert outcomes.get("passed") == 3, outcomes
    assert outcomes.get("failed") == 1, outcomes
    assert "rerun" not in outcomes
    assert "FAILED test_training.py::test_unseeded" in result.stdout.str()
    run_dir = _check_unseeded_failure(result)
    runs = pytester.path / ".detaudit" / "runs" / "pytest"
    assert run_dir.is_relative_to(runs)
    assert len(list(runs.iterdir())) == 3  # one run directory per audited test, none shared between workers


@pytest.mark.process
@pytest.mark.slow
def test_session_wide_audit_with_exitfirst(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--detaudit` audits unmarked tests too; `-x` stops at the first divergent one."""
    pytester.makepyfile(test_training=TRAINING_TESTS.replace("@pytest.mark.deterministic(repeats=2)\n", ""))
    out = pytester.path / "audits"
    result = _run_pytest(pytester, monkeypatch, "--detaudit", "--detaudit-repeats", "2", "-x", "-p", "no:randomly",
                         "-k", "unseeded or plain", "--detaudit-granularity", "module", "--detaudit-out", str(out))
    outcomes = _outcomes(result)
    assert outcomes.get("failed") == 1, outcomes
    assert "passed" not in outcomes, outcomes
    assert _check_unseeded_failure(result).parent == out  # --detaudit-out: where the run directories go


@pytest.mark.process
@pytest.mark.slow
def test_a_test_that_fails_in_every_rerun_fails_with_its_own_output(pytester: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_broken='''
import pytest


@pytest.mark.deterministic(repeats=2)
def test_broken():
    assert 1 + 1 == 3, "arithmetic is off"
''')
    result = _run_pytest(pytester, monkeypatch, "-p", "no:randomly")
    assert _outcomes(result).get("failed") == 1
    text = result.stdout.str()
    assert "the test failed in every one of 2 fresh-interpreter re-runs" in text
    assert "arithmetic is off" in text


def test_marker_arguments_are_validated(pytester: pytest.Pytester) -> None:
    items = {item.name: item for item in pytester.getitems("""
import pytest

@pytest.mark.deterministic(repeats=4, atol=1e-4)
def test_ok(): pass

@pytest.mark.deterministic(repetitions=3)
def test_unknown(): pass

@pytest.mark.deterministic(repeats=1)
def test_one_repeat(): pass

@pytest.mark.deterministic(3)
def test_positional(): pass
""")}
    args = marker_args(items["test_ok"])
    assert (args.repeats, args.atol, args.rtol, args.max_steps) == (4, 1e-4, None, None)
    for name in ("test_unknown", "test_one_repeat", "test_positional"):
        with pytest.raises(pytest.UsageError):
            marker_args(items[name])


def test_rerun_is_one_plain_test_session(pytester: pytest.Pytester) -> None:
    source = "import pytest\n@pytest.mark.parametrize('x', ['a b'])\ndef test_a(x): pass\n"
    item = pytester.getitem(source, "test_a[a b]")
    argv = repeat_argv(item)
    assert argv[0] == f"{item.path}::test_a[a b]"  # absolute: found from the session's working directory
    assert argv[argv.index("-o"):argv.index("-o") + 2] == ["-o", "addopts="]  # no -n, --reruns from the ini
    for plugin in ("randomly", "xdist", "rerunfailures", "cacheprovider"):
        assert f"no:{plugin}" in argv


def test_divergence_line() -> None:
    record = RecordInfo(7, "output", "fc", "fc", "test_x.py:9", 2, "4", "float32", "", backward=False)
    line = describe_divergence(Divergence(7, "content", record, [1, 2], 0, max_abs_diff=0.25, detail="bits differ"))
    assert line == ("record #7 output fc in fc at step 2 (test_x.py:9); repeat(s) 1, 2 differ from repeat 0, "
                    "max |diff| 0.25 — bits differ")


def test_divergence_line_for_reruns_that_end_differently() -> None:
    line = describe_divergence(Divergence(-1, "outcome", None, [1], 0,
                                          detail="exit status differs: repeat 0 exited 0, repeat 1 exited 1"))
    assert line == "outcome — exit status differs: repeat 0 exited 0, repeat 1 exited 1"
