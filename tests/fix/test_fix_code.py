"""Knobs as code (detaudit/fix/code.py): the prelude and where it goes, line edits, the copy that runs them,
and the patch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from detaudit.errors import OutputError, UsageError
from detaudit.fix import code
from detaudit.pin import Pin


def test_every_knob_is_a_pin_and_address_layout_is_not_a_knob() -> None:
    assert set(code.KNOBS) == set(Pin) - {Pin.ADDRESS_LAYOUT}
    assert code.catalogue(["cpu"], False) == [Pin.TORCH_RNG, Pin.NUMPY_RNG, Pin.PYTHON_RNG, Pin.HASH_SEED,
                                              Pin.DETERMINISTIC, Pin.ZERO_EMPTY, Pin.ONE_THREAD]
    assert {Pin.CUDNN, Pin.CUBLAS, Pin.TF32_OFF, Pin.NCCL} <= set(code.catalogue(["cuda"], True))


def test_the_kernels_and_the_fill_are_two_knobs_and_together_one_call() -> None:
    kernels = code.prelude([Pin.DETERMINISTIC])
    fill = code.prelude([Pin.ZERO_EMPTY])
    both = code.prelude([Pin.DETERMINISTIC, Pin.ZERO_EMPTY])
    assert "torch.utils.deterministic.fill_uninitialized_memory = False" in kernels
    assert "torch.utils.deterministic.fill_uninitialized_memory = True" in fill
    assert both.count(code.DETERMINISTIC_ON) == 1
    assert [line for line in both if "fill_uninitialized_memory" in line] == [
        "torch.utils.deterministic.fill_uninitialized_memory = True"]


def test_the_prelude_imports_once_and_environment_knobs_add_no_line() -> None:
    lines = code.prelude([Pin.TORCH_RNG, Pin.ONE_THREAD, Pin.HASH_SEED])
    assert lines[0] == "# detaudit fix: torch-rng, one-thread"
    assert lines.count("import torch") == 1
    assert "torch.set_num_threads(1)" in lines
    assert code.prelude([Pin.HASH_SEED]) == []
    assert code.environment([Pin.HASH_SEED, Pin.ONE_THREAD]) == {
        "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert code.prelude([Pin.NUMPY_RNG], edits_only={Pin.NUMPY_RNG}) == []


@pytest.mark.parametrize(("source", "after"), [
    ("import torch\n", 0),
    ('"""Doc."""\nimport torch\n', 1),
    ('"""Doc\non two lines."""\nfrom __future__ import annotations\n\nimport torch\n', 3),
    ("#!/usr/bin/env python\n# -*- coding: utf-8 -*-\nimport torch\n", 2),
    ("#!/usr/bin/env python\n# a comment\nimport torch\n", 1),
])
def test_the_prelude_goes_below_the_docstring_and_future_imports(source: str, after: int) -> None:
    assert code.insertion_line(source) == after
    changed = code.rewrite(source, code.prelude([Pin.TORCH_RNG]), [])
    compile(changed, "x.py", "exec")  # `from __future__` still first: python accepts it
    assert changed.splitlines()[after] == "# detaudit fix: torch-rng"


def test_a_script_that_does_not_parse_is_refused() -> None:
    with pytest.raises(UsageError, match="does not parse"):
        code.insertion_line("def broken(:\n")


def test_an_unseeded_rng_object_gets_a_seed_at_its_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import numpy as np\nrng = np.random.default_rng()  # shuffles\n"
                      "other = np.random.default_rng(1)\n")
    edit = code.seed_edit(Pin.NUMPY_RNG, "np.random.default_rng", "train.py:2", "seed it", script, tmp_path)
    assert edit.applies
    assert edit.after == "rng = np.random.default_rng(0)  # shuffles"
    changed = code.rewrite(script.read_text(), [], [edit])
    assert changed.splitlines()[1] == edit.after
    assert changed.splitlines()[2].endswith("default_rng(1)")
    elsewhere = code.seed_edit(Pin.NUMPY_RNG, "np.random.default_rng", "lib/data.py:2", "seed it", script, tmp_path)
    assert not elsewhere.applies  # another file: advice only, never applied to the copy
    unknown = code.seed_edit(Pin.PYTHON_RNG, "random.SystemRandom", "train.py:2", "use Random(0)", script, tmp_path)
    assert unknown.after is None
    assert not unknown.applies


def test_the_patch_applies_to_the_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    source = '"""Train."""\nimport numpy as np\nrng = np.random.default_rng()\n'
    script.write_text(source)
    edit = code.seed_edit(Pin.NUMPY_RNG, "np.random.default_rng", "train.py:3", "", script, tmp_path)
    changed = code.rewrite(source, code.prelude([Pin.TORCH_RNG]), [edit])
    patch = code.unified_diff("train.py", source, changed)
    assert patch.startswith("--- a/train.py\n+++ b/train.py\n")
    (tmp_path / "fix.patch").write_text(patch)
    if subprocess.run(["git", "--version"], capture_output=True).returncode == 0:
        subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True)
        assert script.read_text() == changed


def _applied_by_the_tools(folder: Path, script: Path, patch: str) -> list[bytes]:
    """The script as `git apply` and `patch -p1` leave it after taking `patch` (each tool that is installed)."""
    (folder / "fix.patch").write_bytes(patch.encode())
    original = script.read_bytes()
    results = []
    for command in (["git", "apply", "fix.patch"], ["patch", "-p1", "-s", "-i", "fix.patch"]):
        if subprocess.run([command[0], "--version"], capture_output=True).returncode != 0:
            continue
        subprocess.run(command, cwd=folder, check=True, capture_output=True)
        results.append(script.read_bytes())
        script.write_bytes(original)
    return results


@pytest.mark.parametrize("newline", ["\r\n", "\n"])
@pytest.mark.parametrize("last", ["\n", ""])
def test_a_patch_applies_as_the_tools_apply_it_whatever_the_line_endings(tmp_path: Path, newline: str,
                                                                         last: str) -> None:
    """CRLF lines keep their CR in the patch (the file's own bytes are its context), added lines take the file's
    ending, and a last line without one is marked: the patch our applier checks is the one the tools take."""
    script = tmp_path / "train.py"
    source = newline.join(['"""Train."""', "import numpy as np", "rng = np.random.default_rng()"]) + (
        newline if last else "")
    script.write_bytes(source.encode())
    assert code.read_source(script) == source
    edit = code.seed_edit(Pin.NUMPY_RNG, "np.random.default_rng", "train.py:3", "", script, tmp_path)
    changed = code.rewrite(source, code.prelude([Pin.TORCH_RNG]), [edit])
    assert changed.count(newline) == changed.count("\n")  # one line ending throughout
    patch = code.unified_diff("train.py", source, changed)
    assert code.patched("train.py", source, changed) == changed
    assert _applied_by_the_tools(tmp_path, script, patch) in ([changed.encode()] * 2, [changed.encode()], [])


def test_a_patch_whose_context_is_not_the_files_is_refused() -> None:
    source = "a = 1\r\nb = 2\r\n"
    patch = code.unified_diff("t.py", source, "import torch\r\na = 1\r\nb = 2\r\n")
    with pytest.raises(code.PatchMismatch):
        code.apply_patch(source.replace("\r\n", "\n"), patch)  # the file as read with newline translation


@pytest.mark.process
def test_the_copy_sits_beside_the_script_and_behaves_like_it(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    (tmp_path / "data.txt").write_text("rows\n")
    script = tmp_path / "train.py"
    source = ("import sys\nfrom pathlib import Path\nimport helper\n"
              "print(helper.VALUE, Path(__file__).parent == Path(sys.path[0]), "
              "(Path(__file__).parent / 'data.txt').read_text().strip())\n")
    script.write_text(source)
    with code.temporary_copy(script, source) as copy:
        assert copy.parent == tmp_path
        assert copy.name.startswith(".train.detaudit-fix-")
        out = subprocess.run([sys.executable, str(copy)], cwd=tmp_path, capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["7", "True", "rows"]
    assert not copy.exists()
    assert script.read_text() == source


def test_the_copy_never_writes_through_a_planted_link_and_a_readonly_folder_is_one_error(tmp_path: Path,
                                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                                        ) -> None:
    script = tmp_path / "train.py"
    script.write_text("x = 1\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    monkeypatch.setattr(code.secrets, "token_hex", lambda n: "fixed")
    os.symlink(victim, tmp_path / ".train.detaudit-fix-fixed.py")
    with pytest.raises(OutputError, match="beside it"), code.temporary_copy(script, "x = 2\n"):
        pass
    assert victim.read_text() == "keep"


def test_under_perturb_a_knob_that_is_only_a_perturbed_variable_is_held_away() -> None:
    from detaudit.pin import Perturb, perturbations
    from detaudit.run.perturb_plan import Perturbation

    specs = perturbations(4)

    def held(*knobs: Perturb) -> frozenset[str]:
        return Perturbation(tuple(specs[k] for k in knobs), {}).variables

    every = code.catalogue(["cuda"], distributed=False)
    assert held(Perturb.THREADS) == {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}
    # one-thread's environment is held by the perturbation, but its prelude (set_num_threads) is still the knob
    assert code.held_away(every, held(Perturb.THREADS)) == []
    assert code.held_away(every, held(Perturb.HASH_SEED)) == [Pin.HASH_SEED]
    assert code.held_away(every, held(*Perturb)) == [Pin.HASH_SEED, Pin.CUBLAS]
    assert code.held_away(every, frozenset()) == []


def test_a_patch_for_a_name_with_a_space_applies_with_both_tools(tmp_path: Path) -> None:
    """`patch -p1` reads a name on the `---` line up to its first space unless a tab ends it (git writes one)."""
    script = tmp_path / "my train.py"
    source = "import torch\nx = 1\n"
    script.write_text(source)
    changed = code.rewrite(source, code.prelude([Pin.TORCH_RNG]), [])
    patch = code.unified_diff("my train.py", source, changed)
    assert patch.startswith("--- a/my train.py\t\n+++ b/my train.py\t\n")
    assert code.patched("my train.py", source, changed) == changed
    assert _applied_by_the_tools(tmp_path, script, patch) in ([changed.encode()] * 2, [changed.encode()], [])
