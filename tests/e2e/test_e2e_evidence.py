"""End to end, through the real CLI: a cause needs evidence of its mechanism (issue 35), each with a script of its own.

The summary line (what a CI log shows) names a cause only when the run recorded an event of the kind that cause
declares (cause_table), or the op-level re-run or an experiment proved it; candidates with no evidence are
listed apart (`not_ruled_out`), never in that line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import SCRIPTS, CliResult, diverges_within, run_cli

from detaudit.cause_table import CAUSES, CauseId
from detaudit.causes.context import load

# a thread-pool inference server that saves its results in completion order: no set, no dict
POOL_SERVER = """\
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
requests = [torch.full((1, 4), float(i)) for i in range(8)]


def serve(i):
    time.sleep(0.002 * ((i * 7 + time.perf_counter_ns()) % 5))
    with torch.no_grad():
        return model(requests[i])


with ThreadPoolExecutor(4) as pool:
    pending = [pool.submit(serve, i) for i in range(8)]
    answers = [f.result() for f in as_completed(pending)]
torch.save(torch.cat(answers), "answers.pt")
"""

# noise from RNGs seeded with the process id: a torch.Generator and a NumPy bit generator
PID_SEEDED = """\
import os

import numpy as np
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
noise = torch.Generator()
noise.manual_seed(os.getpid())
jitter = np.random.Generator(np.random.PCG64(os.getpid()))
x = torch.ones(3, 4) + torch.from_numpy(jitter.standard_normal((3, 4)).astype("float32"))
with torch.no_grad():
    model.weight.add_(torch.randn(2, 4, generator=noise))
model(x).sum().backward()
"""

# a seeded training step whose loss the clock scales, seeded through the project's own helper
CLOCK_SCALED = """\
import random
import time

import torch


def seed_all(seed):
    random.seed(seed)
    torch.manual_seed(seed)


seed_all(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.ones(3, 4)
for _ in range(2):
    optimizer.zero_grad()
    (model(x).sum() * (1.0 + time.time() % 1.0)).backward()
    optimizer.step()
"""

# a seeded script that adapts its learning rate to the size of a file each run appends to (asked, never opened)
SIZE_TUNED = """\
import os

import torch

log = "history.txt"
size = os.path.getsize(log) if os.path.exists(log) else 0
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1 / (1 + size))
x = torch.ones(3, 4)
for _ in range(2):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
with open(log, "a") as f:
    f.write("run\\n")
"""


# columns gathered in a loop over a set of their names (line 8, built at line 6), concatenated at line 11
SET_GATHERED = """\
import torch

torch.manual_seed(0)
table = {name: torch.randn(8, 1) for name in ("age", "income", "tenure", "visits", "balance", "region", "plan")}

features = set(table) - {"plan"}
columns = []
for name in features:
    columns.append((table[name] - table[name].mean()) / table[name].std())
model = torch.nn.Linear(len(features), 1)
x = torch.cat(columns, dim=1)
with torch.no_grad():
    model(x)
"""


def audit(tmp_path: Path, name: str, source: str, *args: str) -> CliResult:
    (tmp_path / name).write_text(source)
    result = run_cli(["run", "-n", "2", "--no-explain", *args, "--json", "r.json", "--out", "run", name],
                     cwd=tmp_path, timeout=600)
    assert result.returncode == 1, result.output
    assert result.report is not None
    return result


def summary_line(result: CliResult) -> str:
    return next(line for line in reversed(result.stdout.splitlines()) if line.startswith("DIVERGENT"))


def assert_summary_cause_has_evidence(tmp_path: Path, result: CliResult) -> str:
    """The cause the summary line names was proved (an experiment, the op-level records) or has an evidence event
    of the kind it declares in a compared repeat; returns its id ("" when the line names none)."""
    found = re.search(r"top cause: (\S+) \(", summary_line(result))
    if found is None:
        assert "cause not identified" in summary_line(result)
        return ""
    report: dict[str, Any] = result.report or {}
    top = report["causes"][0]
    assert top["id"] == found.group(1)
    if top["basis"] in ("experiment", "op-records"):
        return str(top["id"])
    kinds = CAUSES[CauseId(top["id"])].mechanism
    events = [e for i, run in enumerate(report["runs"])
              for e in load(tmp_path / "run" / f"repeat-{run['repeat']}.trace", i, "cpu").events]
    assert not kinds or any(e["type"] in kinds for e in events), (top, kinds)
    return str(top["id"])


@pytest.mark.process
@pytest.mark.race  # the threads finish in an order of their own: it may happen to repeat
def test_a_thread_pool_saving_in_completion_order_leads_with_concurrency(tmp_path: Path) -> None:
    result = audit(tmp_path, "serve.py", POOL_SERVER, "-j", "1")
    line = summary_line(result)
    assert "top cause: concurrency (likely)" in line
    assert "object-order" not in line
    assert assert_summary_cause_has_evidence(tmp_path, result) == "concurrency"


@pytest.mark.process
def test_a_pid_seeded_generator_is_a_varying_seed_with_its_values_and_line(tmp_path: Path) -> None:
    result = audit(tmp_path, "noisy.py", PID_SEEDED)
    assert result.report is not None
    top = result.report["causes"][0]
    assert top["id"] == "varying-seed"
    for made in (r"Generator\.manual_seed at noisy\.py:9 seeded a torch\.Generator",
                 r"np\.random\.PCG64 at noisy\.py:10 seeded a NumPy generator"):
        assert any(re.search(made + r" with \d+ in repeat 0, \d+ in repeat 1", e) for e in top["evidence"]), made
    assert assert_summary_cause_has_evidence(tmp_path, result) == "varying-seed"


@pytest.mark.process
def test_a_pid_seeded_generator_drawn_through_nn_init_is_a_varying_seed_at_its_line(tmp_path: Path) -> None:
    """nn.init's one uniform_ line draws for nn.Linear from the global RNG, then for kaiming_uniform_ from the
    script's Generator: that second draw ties the Generator to the divergence (once only outside-value)."""
    text = (SCRIPTS / "train_reinit_head.py").read_text()
    result = audit(tmp_path, "train_reinit_head.py", text)
    assert result.report is not None
    top = result.report["causes"][0]
    assert top["id"] == "varying-seed"
    assert top["basis"] in ("op-records", "direct")  # op-records when the op-level re-run saw the random op
    assert top["summary"] == ("this torch.Generator is seeded from the process id at train_reinit_head.py:10, so "
                              "its seed differs in every run")
    assert top["fix"].startswith("seed it with a constant at train_reinit_head.py:10: `.manual_seed(0)`")


@pytest.mark.process
def test_a_clock_scaled_gradient_is_an_outside_value_with_no_hash_seed_filler(tmp_path: Path) -> None:
    result = audit(tmp_path, "clocked.py", CLOCK_SCALED)
    assert result.report is not None
    assert [c["id"] for c in result.report["causes"]] == ["outside-value"]
    assert {c["id"] for c in result.report["not_ruled_out"]} <= {"python-hash-seed", "object-order"}
    assert "python-hash-seed" not in summary_line(result)
    assert "Not ruled out — no evidence of their mechanism in this run" in result.stdout
    assert assert_summary_cause_has_evidence(tmp_path, result) == "outside-value"


@pytest.mark.process
def test_a_size_asked_of_a_file_an_earlier_repeat_wrote_is_carried_state_not_a_hash_seed(tmp_path: Path) -> None:
    result = audit(tmp_path, "tuned.py", SIZE_TUNED)
    assert result.report is not None
    top = result.report["causes"][0]
    assert top["id"] == "carried-state"
    assert "repeat 1 asked the size, time or existence of history.txt, which an earlier repeat of this audit " \
           "wrote, at tuned.py:6" in top["evidence"][0]
    assert "python-hash-seed" not in summary_line(result)
    assert assert_summary_cause_has_evidence(tmp_path, result) == "carried-state"


@pytest.mark.process
@pytest.mark.race  # six names can come out of the set in the same order in both repeats
def test_a_hash_ordered_divergence_names_the_line_that_iterates_the_set_and_where_it_was_built(tmp_path: Path) -> None:
    """The op-level records see torch.cat receive the same columns reordered (:11); the recorder found the set of
    strings in scope there: the fix names the loop over it (:8) and where it was built (:6), not only the cat."""
    (tmp_path / "columns.py").write_text(SET_GATHERED)
    result = diverges_within(3, lambda attempt: run_cli(
        ["run", "-n", "2", "--no-explain", "--json", f"r{attempt}.json", "--out", f"run{attempt}", "columns.py"],
        cwd=tmp_path, timeout=600))
    assert result.report is not None
    finding = result.report["first_divergence"]["op_finding"]
    assert (finding["verdict"], finding["location"]) == ("input-order", "columns.py:11")
    assert finding["ordered_by"] == [{"name": "features", "of": "str", "size": 6, "built": ["columns.py:6"],
                                      "iterated": ["columns.py:8"], "used": ["columns.py:10"]}]
    hashed = next(c for c in result.report["causes"] if c["id"] == "python-hash-seed")
    assert hashed["fix"].startswith("iterate `sorted(features)` instead of the set at columns.py:8 (built at "
                                    "columns.py:6)")
