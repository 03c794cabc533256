"""Whose option is it: detaudit's options, the script's argv, and refusals that say how to spell it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from detaudit.errors import UsageError
from detaudit.run.scriptargs import OptionSpec, script_options, split_run_args

SPECS = [OptionSpec(frozenset({"-n", "--repeats"}), True), OptionSpec(frozenset({"--device"}), True, multiple=True),
         OptionSpec(frozenset({"-q", "--quiet"}), False), OptionSpec(frozenset({"--json"}), True),
         OptionSpec(frozenset({"--explain"}), False)]


def split(args: list[str], defines: set[str] | None = None) -> tuple[list[str], str | None, list[str]]:
    result = split_run_args(args, SPECS, lambda script: defines or set())
    return result.ours, result.script, result.script_args


def test_options_before_the_script_are_detaudits() -> None:
    assert split(["-n", "5", "--device=cpu", "-q", "train.py"]) == (["-n", "5", "--device=cpu", "-q"], "train.py", [])


def test_an_unknown_option_after_the_script_goes_to_it_with_everything_after() -> None:
    assert split(["train.py", "data.txt", "--compile", "-n", "5", "--quiet"]) == (
        [], "train.py", ["data.txt", "--compile", "-n", "5", "--quiet"])


def test_known_options_after_the_script_that_it_does_not_define_stay_detaudits() -> None:
    assert split(["train.py", "data.txt", "--repeats", "5", "--device=cpu", "-q"]) == (
        ["--repeats", "5", "--device=cpu", "-q"], "train.py", ["data.txt"])
    assert split(["train.py", "-n5", "--", "--repeats", "2"]) == (["-n5"], "train.py", ["--repeats", "2"])


def test_negative_numbers_and_a_lone_dash_are_the_scripts_arguments() -> None:
    assert split(["train.py", "-1", "-", "-.5", "-q"]) == (["-q"], "train.py", ["-1", "-", "-.5"])


def test_an_option_the_script_also_defines_is_refused_with_both_spellings() -> None:
    with pytest.raises(UsageError) as refused:
        split_run_args(["-n", "3", "train.py", "data.txt", "--device=cpu", "--lr", "0.1"], SPECS,
                       lambda script: {"--device", "--lr"})
    message = str(refused.value)
    assert "--device=cpu is an option of both detaudit and train.py" in message
    assert "`detaudit run -n 3 train.py -- data.txt --device=cpu --lr 0.1`" in message
    assert "`detaudit run -n 3 --device=cpu train.py data.txt --lr 0.1`" in message


def test_a_short_option_the_script_defines_is_refused_too() -> None:
    with pytest.raises(UsageError, match=r"-n 5 is an option of both"):
        split(["train.py", "-n", "5"], defines={"-n", "--num-samples"})


def test_only_the_spelling_the_script_defines_collides() -> None:
    # makemore defines -n/--num-workers: detaudit's --repeats is no option of the script's
    assert split(["makemore.py", "--repeats", "3", "--", "-i", "names.txt"], defines={"-n", "--num-workers"}) == (
        ["--repeats", "3"], "makemore.py", ["-i", "names.txt"])


def test_the_scripts_spelling_suggested_hands_the_script_no_double_dash() -> None:
    with pytest.raises(UsageError) as refused:
        split(["makemore.py", "-n", "3", "--", "-i", "names.txt"], defines={"-n", "--num-workers"})
    assert "`detaudit run makemore.py -- -n 3 -i names.txt`" in str(refused.value)


def test_an_option_given_before_and_after_the_script_is_refused() -> None:
    with pytest.raises(UsageError) as refused:
        split(["--repeats", "3", "train.py", "--repeats", "5"])
    message = str(refused.value)
    assert "given twice (--repeats 3, then --repeats 5 after train.py)" in message
    assert "`detaudit run --repeats 3 train.py -- --repeats 5`" in message
    with pytest.raises(UsageError, match="given twice"):
        split(["--device", "cpu", "train.py", "--device", "cuda"])  # repeatable, but not across SCRIPT


def test_a_repeatable_option_may_repeat_on_one_side() -> None:
    assert split(["train.py", "--device", "cpu", "--device", "cuda"])[0] == ["--device", "cpu", "--device", "cuda"]
    with pytest.raises(UsageError, match="given twice"):
        split(["-n", "3", "-n", "4", "train.py"])


def test_unknown_options_before_the_script_are_left_for_the_parser_to_reject() -> None:
    assert split(["--bogus", "train.py"]) == (["--bogus"], "train.py", [])


def test_the_parser_sees_the_script_arguments_after_a_double_dash() -> None:
    result = split_run_args(["train.py", "a", "-q", "--compile"], SPECS, lambda s: set())
    assert result.for_parser() == ["-q", "train.py", "--", "a", "--compile"]


def test_script_options_are_found_statically(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import argparse, click
        parser = argparse.ArgumentParser()
        parser.add_argument("data")
        parser.add_argument("-d", "--device", default="cpu")
        group = parser.add_argument_group("opt")
        group.add_argument("--lr", type=float)
        @click.option("--compile/--no-compile")
        def f(): pass
        print("--not-an-option")
    """))
    assert script_options(script) == {"-d", "--device", "--lr", "--compile"}
    (tmp_path / "broken.py").write_text("def (:\n")
    assert script_options(tmp_path / "broken.py") == set()
    assert script_options(tmp_path / "missing.py") == set()


def test_an_option_missing_its_value_is_named() -> None:
    with pytest.raises(UsageError, match="--json needs a value"):
        split(["train.py", "--json"])


script_words = st.text(min_size=1, max_size=12).filter(lambda a: not a.startswith("-"))
any_args = st.lists(st.text(max_size=12), max_size=8)


@given(st.lists(script_words, max_size=4), any_args)
def test_everything_after_a_double_dash_reaches_the_script_unchanged(positional: list[str], rest: list[str]) -> None:
    result = split_run_args(["-q", "train.py", *positional, "--", *rest], SPECS, lambda s: {"--device", "-n"})
    assert (result.ours, result.script, result.script_args) == (["-q"], "train.py", [*positional, *rest])


@given(st.lists(script_words, max_size=4), st.from_regex(r"--[a-z][a-z-]{0,10}", fullmatch=True), any_args)
def test_an_unknown_option_takes_everything_after_it_to_the_script(positional: list[str], unknown: str,
                                                                  rest: list[str]) -> None:
    assume(unknown not in {n for spec in SPECS for n in spec.names})
    result = split_run_args(["train.py", *positional, unknown, *rest], SPECS, lambda s: set())
    assert result.ours == []
    assert result.script_args == [*positional, unknown, *rest]


def test_script_options_reads_only_a_bounded_regular_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`/dev/zero` would be read forever and a FIFO would block before any repeat (or its --timeout) began."""
    import os

    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)  # no writer: a blocking open or read would hang this test
    assert script_options(fifo) == set()
    assert script_options(Path("/dev/zero")) == set()
    assert script_options(tmp_path) == set()
    big = tmp_path / "big.py"
    big.write_text('import argparse\nargparse.ArgumentParser().add_argument("--big")\n')
    assert script_options(big) == {"--big"}
    monkeypatch.setattr("detaudit.run.scriptargs.MAX_SCAN_BYTES", 16)
    assert script_options(big) == set()  # larger than the cap: not scanned (read no further than the cap)


def test_the_scripts_spelling_suggested_moves_only_that_option_after_the_double_dash() -> None:
    """detaudit's options after the clash stay detaudit's (they all went to the script: issue 44's trial, a
    script defining -n/--hidden)."""
    with pytest.raises(UsageError) as refused:
        split(["lstm.py", "-n", "2", "--device", "cpu", "--json", "r.json", "--", "--epochs", "1"],
              defines={"-n", "--hidden"})
    assert "`detaudit run lstm.py --device cpu --json r.json -- -n 2 --epochs 1`" in str(refused.value)
