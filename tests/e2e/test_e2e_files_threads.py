"""End to end, through the real CLI (issue 45 items 3 and 8): a file the script appends to and reads back, a
prefetch thread drawing from the global RNG beside the main thread, and the latent CUDA notes of a mean
EmbeddingBag beside a Conv2d. Each script is audited once per session (tests/audits.py), its tests share it."""

from __future__ import annotations

import pytest
from audits import DETERMINISTIC, Audit, Cache, Done
from conftest import SCRIPTS

SESSIONS = Audit("train_distill_sessions.py")
PREFETCH = Audit("train_prefetch.py", ("-n", "2", "--no-explain"))
RANKER = Audit("train_bag_ranker.py", DETERMINISTIC)  # the cause matrix's row: one run for both


def at(script: str, line: int) -> str:
    """A line of a scenario script as the report shows it (the audits run in a folder of their own)."""
    return f"{SCRIPTS / script}:{line}"


def top_cause(done: Done) -> dict:
    assert done.result.returncode == 1, done.result.output
    return done.report["causes"][0]


@pytest.mark.process
def test_an_appended_session_file_is_carried_state(shared: Cache) -> None:
    top = top_cause(shared.run(SESSIONS))
    assert (top["id"], top["basis"], top["confidence"]) == ("carried-state", "direct", "likely")


@pytest.mark.process
def test_an_appended_session_file_is_named_at_its_read_with_the_append_that_changed_it(shared: Cache) -> None:
    top = top_cause(shared.run(SESSIONS))
    assert top["evidence"][0].startswith(
        f"repeat 1 read sessions.jsonl at {at('train_distill_sessions.py', 10)} holding other bytes than repeat 0 read "
        f"there (2 lines, 38 bytes against 1 line, 19 bytes): the script appends to it at "
        f"{at('train_distill_sessions.py', 8)}")


@pytest.mark.process
def test_an_appended_session_file_spends_no_experiment_on_a_guess(shared: Cache) -> None:
    assert shared.run(SESSIONS).report["experiments"] == []


@pytest.mark.process
def test_a_prefetch_thread_drawing_beside_a_lazy_layer_is_a_latent_race_with_both_lines(shared: Cache) -> None:
    done = shared.run(PREFETCH)
    assert done.result.returncode in (0, 1), done.result.output  # whether the race fired in these repeats
    [race] = [x for x in done.report["latent"] if x["id"] == "concurrency"]
    assert (f"thread `prefetch` (started at {at('train_prefetch.py', 21)}) draws torch.randn at "
            f"{at('train_prefetch.py', 15)} from torch's global RNG, which the main thread draws from at "
            f"{at('train_prefetch.py', 26)} (Tensor.uniform_) while a thread it started runs") in race["evidence"]


@pytest.mark.process
def test_a_mean_embedding_bag_gets_no_max_mode_note_and_a_conv2d_its_own_entry(shared: Cache) -> None:
    done = shared.run(RANKER)
    quoted = [line for x in done.report["latent"] for line in x["evidence"]]
    assert [line.split('torch lists "')[1].split(" when")[0] for line in quoted] == ["torch.nn.Conv2d"], quoted
