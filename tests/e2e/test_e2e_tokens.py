"""`run` answers in tokens for a generation script (issue 46 item 3): sample_tokens.py continues two prompts
ten tokens each with a small GRU, sampling from the unseeded global RNG (divergent) or greedily (deterministic).
The script prints its sequences, so what detaudit says about tokens is checked against what the repeats printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import SCRIPTS, CliResult, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.process]

PROMPT = 4  # each printed sequence starts with its 4 prompt tokens


def audit(where: Path, *script_args: str) -> CliResult:
    # module granularity and no experiment: the token answer needs neither, and the e2e stays small
    return run_cli(["run", "-n", "3", "--granularity", "module", "--no-explain", "--out", "run", "--json", "r.json",
                    str(SCRIPTS / "sample_tokens.py"), "--", *script_args], cwd=where)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> tuple[CliResult, Path]:
    where = tmp_path_factory.mktemp("sampled")
    return audit(where), where / "run"


@pytest.fixture(scope="module")
def greedy(tmp_path_factory: pytest.TempPathFactory) -> CliResult:
    return audit(tmp_path_factory.mktemp("greedy"), "--greedy")


def printed(run_dir: Path) -> list[list[list[int]]]:
    """Each repeat's generated tokens, sequence by sequence, as the script printed them."""
    lines = [(run_dir / f"repeat-{i}.stdout").read_text().splitlines() for i in range(3)]
    return [[[int(t) for t in line.split()][PROMPT:] for line in repeat] for repeat in lines]


def tokens(result: CliResult) -> dict[str, Any]:
    assert result.report is not None, result.output
    found: dict[str, Any] = result.report["tokens"]
    assert found is not None, result.output
    return found


def test_sampled_repeats_count_the_distinct_outputs_they_printed(sampled: tuple[CliResult, Path]) -> None:
    result, run_dir = sampled
    outputs = printed(run_dir)
    assert tokens(result)["distinct_outputs"] == len({repr(o) for o in outputs})


def test_each_sequence_first_differs_where_the_printed_tokens_first_differ(sampled: tuple[CliResult, Path]) -> None:
    result, run_dir = sampled
    outputs = printed(run_dir)
    expected = {}
    for seq in range(2):
        at = [next((p for p, (a, b) in enumerate(zip(outputs[0][seq], o[seq])) if a != b), None) for o in outputs[1:]]
        if any(p is not None for p in at):
            expected[seq] = min(p for p in at if p is not None)
    assert {d["sequence"]: d["position"] for d in tokens(result)["first_divergent_tokens"]} == expected


def test_the_console_leads_with_the_token_answer(sampled: tuple[CliResult, Path]) -> None:
    result, _ = sampled
    assert result.stdout.splitlines()[1].startswith(f"tokens: {tokens(result)['distinct_outputs']} distinct outputs "
                                                    "among 3 repeats; sequence ")


def test_a_seeded_greedy_decoder_is_deterministic(greedy: CliResult) -> None:
    assert greedy.returncode == 0, greedy.output


def test_a_seeded_greedy_decoder_generated_one_distinct_output(greedy: CliResult) -> None:
    assert greedy.stdout.splitlines()[1] == ("tokens: 1 distinct output among 3 repeats (2 sequence(s) of up to 10 "
                                             "tokens)")
