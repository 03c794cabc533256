"""Inside a repeat, the script must behave as under plain `python SCRIPT`: argv, cwd, `__name__`,
`__file__`, sys.path[0], output, traceback and exit status. Each case runs the script both ways."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import detaudit
from detaudit.run.failure import excerpt, from_footer, read_error
from detaudit.run.launcher import child_command
from detaudit.trace import read_trace

pytestmark = pytest.mark.process  # each case runs the script under plain python and under detaudit.run.child

SCRIPTS = Path(__file__).parents[1] / "scripts"
PARITY_SCRIPT = SCRIPTS / "show_env.py"


@dataclass
class Ran:
    code: int
    out: str
    err: str


def run_plain(script: str | Path, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> Ran:
    proc = subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def run_child(script: str | Path, args: list[str], cwd: Path, trace: Path,
              env: dict[str, str] | None = None) -> Ran:
    """What the launcher starts for one repeat (launcher.child_command: the child, CONFIG SCRIPT ARGS...)."""
    config = trace.with_suffix(".config.json")
    config.write_text(json.dumps({"repeat": 0, "device": "cpu", "granularity": "module", "trace": str(trace)}))
    proc = subprocess.run(child_command(config, str(script), args), cwd=cwd,
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120)
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def both(tmp_path: Path, script: str | Path, args: list[str], cwd: Path | None = None,
         env: dict[str, str] | None = None) -> tuple[Ran, Ran, Path]:
    trace = tmp_path / "repeat-0.trace"
    cwd = cwd or tmp_path
    return run_plain(script, args, cwd, env), run_child(script, args, cwd, trace, env), trace


def write_script(tmp_path: Path, body: str, name: str = "user_script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


ARGS = ["--lr", "0.1", "a b", "-n", "5", "--", "--repeats", "--json", "x.json", "ünïcode"]


@pytest.mark.parametrize("how", ["absolute", "relative-from-elsewhere", "bare-name-in-script-dir"])
def test_parity_script_sees_what_plain_python_gives_it(tmp_path: Path, how: str) -> None:
    elsewhere = tmp_path / "work dir"
    elsewhere.mkdir()
    if how == "absolute":
        script, cwd = str(PARITY_SCRIPT), elsewhere
    elif how == "relative-from-elsewhere":
        script, cwd = os.path.relpath(PARITY_SCRIPT, elsewhere), elsewhere
    else:
        script, cwd = PARITY_SCRIPT.name, PARITY_SCRIPT.parent
    plain, child, trace = both(tmp_path, script, [*ARGS, "--env"], cwd=cwd, env={"SOMEVAR": "v a l"})
    assert plain.code == 7  # guards the comparison: the parity script really reports and exits 7
    assert "argv:" in plain.out
    assert "SOMEVAR: v a l" in plain.out
    assert (child.code, child.out, child.err) == (plain.code, plain.out, plain.err)
    tr = read_trace(trace)
    assert tr.footer is not None
    assert tr.footer["exit_code"] == 7


def test_symlinked_script_parity(tmp_path: Path) -> None:
    link = tmp_path / "linked.py"
    link.symlink_to(PARITY_SCRIPT)
    plain, child, _ = both(tmp_path, link.name, ["x"])
    assert (child.code, child.out) == (plain.code, plain.out)


def test_a_script_named_with_a_leading_dash_gets_its_argv0_as_typed(tmp_path: Path) -> None:
    """`./-y.py` reached the script as `-y.py` (a Path drops the `./`): re-running sys.argv[0] then fails."""
    write_script(tmp_path, "import sys\nprint(sys.argv, __file__)\n", name="-y.py")
    plain, child, _ = both(tmp_path, "./-y.py", ["--x"])
    assert plain.code == 0
    assert "['./-y.py', '--x']" in plain.out
    assert (child.code, child.out, child.err) == (plain.code, plain.out, plain.err)


def test_a_compiled_script_runs_as_python_runs_it(tmp_path: Path) -> None:
    """A .pyc script (python runs it) was compiled as source and failed in every repeat."""
    import py_compile
    import shutil

    source = write_script(tmp_path, """
        import sys
        print(sys.argv[0], __file__.endswith(("s.pyc", "compiled")), __loader__.__class__.__name__, 6 * 7)
        sys.exit(3)
    """)
    py_compile.compile(str(source), cfile=str(tmp_path / "s.pyc"), doraise=True)
    shutil.copy(tmp_path / "s.pyc", tmp_path / "compiled")  # no suffix: python knows it by its magic number
    (tmp_path / "bad.pyc").write_bytes(b"not compiled at all")
    (tmp_path / "badcode.pyc").write_bytes((tmp_path / "s.pyc").read_bytes()[:16] + b"\xffgarbage")
    source.unlink()
    outs = []
    for name in ("s.pyc", "compiled", "badcode.pyc", "bad.pyc"):
        plain, child, trace = both(tmp_path, name, [])
        trace.unlink()
        assert (child.code, child.out, child.err) == (plain.code, plain.out, plain.err), name
        outs.append(child.out)
    assert plain.code == 1
    assert "Bad magic number in .pyc file" in plain.err
    assert outs[:2] == ["s.pyc True SourcelessFileLoader 42\n", "compiled True SourcelessFileLoader 42\n"]


SHADOW = "import os\nos.write(2, b'SHADOWED {name}\\n')\n"
MODULES_AT_EXIT = """\
import atexit, os, sys
def _modules_at_exit():
    os.write(2, ("MODULES " + " ".join(sorted(sys.modules)) + "\\n").encode())
atexit.register(_modules_at_exit)
"""


def _top_level_modules(err: str) -> set[str]:
    [line] = [line for line in err.splitlines() if line.startswith("MODULES ")]
    return {name.split(".")[0] for name in line.split()[1:]}


@pytest.mark.parametrize(("name", "body"), [
    ("xxhash.py", "print('no torch here')\n"),
    pytest.param("train.py", "import torch, detaudit\nm = torch.nn.Linear(3, 2)\nopt = torch.optim.SGD("
                 "m.parameters(), lr=0.1)\nm(torch.ones(1, 3)).sum().backward()\nopt.step()\n"
                 "torch.save(m.state_dict(), 'm.pt')\ndetaudit.checkpoint('w', m.weight)\n",
                 marks=pytest.mark.slow),
])
def test_detaudits_own_imports_never_come_from_the_scripts_directory(tmp_path: Path, name: str, body: str) -> None:
    """A script named after a module detaudit imports (xxhash.py), or one beside such a file, was imported by
    detaudit as that module (and ran twice per repeat). Every module the child imports that plain python does
    not, for this script, is planted in the script's directory (also the working directory): none may load."""
    write_script(tmp_path, MODULES_AT_EXIT + body, name=name)
    plain, child, trace = both(tmp_path, name, [])
    assert plain.code == child.code == 0, child.err
    extra = _top_level_modules(child.err) - _top_level_modules(plain.err) - set(sys.builtin_module_names)
    extra -= {"detaudit", "__main__", "__mp_main__"}
    needs = {"xxhash", "numpy"} if "import torch" in body else {"xxhash"}  # numpy waits for the recorder
    assert needs <= extra | _top_level_modules(plain.err)  # the check has teeth: what detaudit needs
    for module in extra - {Path(name).stem}:  # the script itself is the one named xxhash
        (tmp_path / f"{module}.py").write_text(SHADOW.format(name=module))
    trace.unlink()
    plain, child, trace = both(tmp_path, name, [])
    assert "SHADOWED" not in plain.err  # the planted files are only what detaudit imports
    assert "SHADOWED" not in child.err, child.err
    assert child.code == plain.code == 0
    assert child.out == plain.out
    tr = read_trace(trace)
    assert tr.footer is not None
    assert tr.footer["exit_code"] == 0
    assert "recording_failed" not in tr.footer
    assert len(tr.records) > 0 or "import torch" not in body


def test_script_sees_main_module_attributes_like_plain_python(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        import sys
        import __main__
        print(__name__, __main__.__file__ == __file__, sys.modules["__main__"] is __main__)
        print(__spec__, __package__, __doc__, type(__builtins__).__name__)
        print(sorted(k for k in globals() if k.startswith("__")))
        import pickle
        class Thing:
            pass
        print(pickle.loads(pickle.dumps(Thing())).__class__.__module__)  # classes defined in __main__ pickle
        """)
    plain, child, _ = both(tmp_path, script.name, [])
    assert plain.code == 0, plain.err
    assert (child.code, child.out, child.err) == (plain.code, plain.out, plain.err)


def test_raising_script_prints_its_own_traceback_and_exits_1(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        def inner(x):
            return {"a": 1}[x]

        def main():
            print("started", flush=True)
            inner("missing")

        main()
        """)
    plain, child, trace = both(tmp_path, script.name, [])
    assert plain.code == 1
    assert "KeyError: 'missing'" in plain.err
    assert child.code == 1
    assert child.err == plain.err  # same traceback, line for line
    assert "detaudit" not in child.err
    assert child.out == plain.out
    tr = read_trace(trace)
    assert tr.footer is not None
    assert tr.footer["exit_code"] == 1
    assert "KeyError" in tr.footer["error"]


@pytest.mark.slow
def test_the_footer_holds_the_exceptions_frames_user_and_library_told_apart(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        import torch

        def evaluate(model):
            return model(torch.ones(2, 5))

        evaluate(torch.nn.Linear(4, 3))
        """)
    trace = tmp_path / "repeat-0.trace"
    child = run_child(script.name, [], tmp_path, trace)
    assert child.code == 1
    error = read_error(trace)
    assert error is not None
    assert error.type == "RuntimeError"
    assert "cannot be multiplied" in error.message
    user = [(f.file, f.line, f.function, f.text) for f in error.frames if f.user]
    assert user == [("user_script.py", 7, "<module>", "evaluate(torch.nn.Linear(4, 3))"),
                    ("user_script.py", 5, "evaluate", "return model(torch.ones(2, 5))")]
    raised = error.frames[-1]  # torch's innermost frame; the ones between are counted, not kept
    assert not raised.user
    assert raised.file.endswith("linear.py")
    assert error.omitted >= 1
    # none of detaudit's frames (paths are shown relative to the script's folder), wherever the checkout lives
    package = Path(detaudit.__file__).resolve().parent
    assert not any((tmp_path / f.file).resolve().is_relative_to(package) for f in error.frames), error.frames
    assert excerpt(error, child.err).startswith("user_script.py:5, in evaluate\n    return model(torch.ones(2, 5))")


def test_output_written_before_a_crash_is_kept(tmp_path: Path) -> None:
    """stdout is a file under detaudit (block-buffered): a crash must not lose what was printed."""
    script = write_script(tmp_path, """
        import atexit
        atexit.register(lambda: print("atexit ran"))
        print("line before the crash")
        raise RuntimeError("boom")
        """)
    plain, child, _ = both(tmp_path, script.name, [])
    assert plain.out == "line before the crash\natexit ran\n"
    assert (child.code, child.out) == (plain.code, plain.out)


def test_chained_exception_traceback_matches(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        try:
            1 / 0
        except ZeroDivisionError as exc:
            raise ValueError("wrapped") from exc
        """)
    plain, child, _ = both(tmp_path, script.name, [])
    assert child.code == plain.code == 1
    assert child.err == plain.err


def test_syntax_error_reported_like_python(tmp_path: Path) -> None:
    script = write_script(tmp_path, "x = (1,\nprint('never')\n")
    plain, child, _ = both(tmp_path, script.name, [])
    assert plain.code == 1
    assert "SyntaxError" in plain.err
    assert child.code == 1
    assert "SyntaxError" in child.err
    assert "detaudit" not in child.err


@pytest.mark.parametrize("exit_stmt,code", [
    ("sys.exit(0)", 0), ("sys.exit(3)", 3), ("raise SystemExit(42)", 42), ("sys.exit()", 0),
    ("sys.exit(None)", 0), ("sys.exit('fatal: bad config')", 1), ("sys.exit(256 + 4)", 4),
])
def test_system_exit_status_matches(tmp_path: Path, exit_stmt: str, code: int) -> None:
    script = write_script(tmp_path, f"import sys\nprint('out')\n{exit_stmt}\n")
    plain, child, trace = both(tmp_path, script.name, [])
    assert plain.code == code
    assert (child.code, child.out, child.err) == (plain.code, plain.out, plain.err)
    tr = read_trace(trace)
    assert tr.footer is not None
    error = from_footer(tr.footer)  # a non-zero status leaves the exception and the line that raised it
    assert error is None if code == 0 else (error.type == "SystemExit" and error.frames[-1].line == 3)


def test_script_without_torch_still_leaves_a_complete_trace(tmp_path: Path) -> None:
    script = write_script(tmp_path, "print('no torch here')\n")
    _, child, trace = both(tmp_path, script.name, [])
    assert child.code == 0
    tr = read_trace(trace)
    assert tr.complete
    assert len(tr.records) == 0


def test_torch_script_is_recorded_with_user_locations(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        import torch
        import detaudit
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        y = model(torch.randn(2, 4))
        detaudit.checkpoint("result", {"y": y})
        print(y.sum().item() != 0)
        """)
    plain, child, trace = both(tmp_path, script.name, [])
    assert child.code == 0, child.err
    assert child.out == plain.out, child.err
    tr = read_trace(trace)
    names = [tr.strings[i] for i in tr.records["name"]]
    assert "0" in names
    assert "1" in names
    assert "result.y" in names
    locs = {tr.strings[i] for i in tr.records["loc"]}
    assert all(loc.startswith("user_script.py:") for loc in locs), locs


def test_torchscript_compiles_functions_detaudit_wraps_as_under_plain_python(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        import torch
        import torch.nn.functional as F

        @torch.jit.script
        def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            return (x + torch.rand(3) * 0 + torch.empty(3).zero_() + F.dropout(x, 0.5, False)
                    + torch.index_add(x, 0, i, x))

        print(f(torch.ones(3), torch.tensor([0, 1, 2])).tolist())
    """)
    plain, child, trace = both(tmp_path, script, [])
    assert plain.code == 0
    assert "[" in plain.out
    assert (child.code, child.out, child.err) == (plain.code, plain.out, plain.err)


def test_a_recorder_that_cannot_start_never_breaks_the_scripts_import(tmp_path: Path) -> None:
    script = write_script(tmp_path, """\
        import torch
        print(torch.ones(2).sum().item())
    """)
    trace = tmp_path / "repeat-0.trace"
    trace.write_bytes(b"taken")  # the writer refuses to overwrite: instrumenting torch fails
    plain = run_plain(script, [], tmp_path)
    child = run_child(script, [], tmp_path, trace)
    assert (child.code, child.out) == (plain.code, plain.out) == (0, "2.0\n")
    assert "detaudit: could not instrument" in child.err
    assert "Traceback" not in child.err
    assert trace.read_bytes() == b"taken"


# -- every way a process can end keeps its records (issue 10) ------------------------------------------
@pytest.mark.slow
def test_os_exit_after_forward_passes_keeps_every_record(tmp_path: Path) -> None:
    """`os._exit` skips atexit and finally: the wrapped one finishes the trace first."""
    script = write_script(tmp_path, """
        import os
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        for _ in range(5):
            model(torch.randn(3, 4))
        print("done", flush=True)
        os._exit(3)
    """)
    plain, child, trace = both(tmp_path, script, [])
    assert (child.code, child.out) == (plain.code, plain.out) == (3, "done\n")
    tr = read_trace(trace)
    assert tr.complete
    assert tr.footer is not None
    assert tr.footer["exit_code"] == 3
    assert tr.footer["ended_by"] == "os._exit"
    assert len(tr.records) >= 5 * 4  # input and three outputs per pass, none lost in a buffer


@pytest.mark.slow
@pytest.mark.parametrize("ending, code, footer_code", [
    ("", 0, 0), ("raise SystemExit(2)", 2, 2), ("1 / 0", 1, 1), ("atexit.register(os._exit, 4)", 4, 4),
    ("atexit.register(os.abort)", -signal.SIGABRT, 0)])  # the script ended with 0, then its handler aborted
def test_work_after_the_script_body_is_recorded_until_the_exit_handlers_ran(tmp_path: Path, ending: str,
                                                                            code: int, footer_code: int) -> None:
    """A torch.save in an atexit handler, and in a thread still running when the body returns, is
    recorded (issue 27: it was not, so a save differing per run was DETERMINISTIC); the footer keeps
    the script's exit status. os._exit from a handler registered after the save ends the process before
    it, with its status."""
    script = write_script(tmp_path, f"""
        import atexit, io, os, threading, time
        import torch
        def late_save():
            torch.save({{"late": torch.arange(3.0)}}, io.BytesIO())
        def thread_save():
            time.sleep(0.2)
            torch.save({{"thread": torch.ones(2)}}, io.BytesIO())
        def broken():
            raise ValueError("an exit handler failing does not change the exit status")
        atexit.register(broken)
        atexit.register(late_save)
        threading.Thread(target=thread_save).start()
        torch.save({{"body": torch.zeros(2)}}, io.BytesIO())
        {ending}
    """)
    plain, child, trace = both(tmp_path, script, [])
    assert child.code == plain.code == code, child.err
    tr = read_trace(trace)
    assert tr.complete
    assert tr.footer is not None
    assert tr.footer["exit_code"] == footer_code
    assert tr.footer.get("ended_by") == ("os.abort" if "abort" in ending else "os._exit" if "_exit" in ending
                                         else None)
    names = [tr.strings[n] for n in tr.records["name"]]
    # numbered in the order saved: python joins the script's threads before it runs the exit handlers
    late = [] if "os." in ending else ["torch.save[2].late"]  # os._exit/abort ran first: last in, first out
    assert sorted(names) == ["torch.save[0].body", "torch.save[1].thread", *late], names


@pytest.mark.slow
def test_closed_descriptors_never_send_trace_frames_into_the_scripts_file(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        import os
        import torch
        model = torch.nn.Linear(4, 2)
        outs = [model(torch.randn(3, 4)) for _ in range(5)]
        os.closerange(3, 4096)
        with open("mine.txt", "w") as fh:
            for _ in range(3):
                outs.append(model(torch.randn(3, 4)))
            fh.write("only my text\\n")
    """)
    _, child, trace = both(tmp_path, script, [])
    assert child.code == 0, child.err
    assert (tmp_path / "mine.txt").read_text() == "only my text\n"
    tr = read_trace(trace)
    assert tr.complete
    assert len(tr.records) >= 8 * 2


@pytest.mark.slow
def test_keyboard_interrupt_in_the_script_exits_130_with_only_its_frames(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        def train():
            raise KeyboardInterrupt
        train()
    """)
    _, child, trace = both(tmp_path, script, [])
    assert child.code == 130
    assert "KeyboardInterrupt" in child.err
    assert "in train" in child.err
    assert "detaudit" not in child.err  # none of detaudit's frames
    footer = read_trace(trace).footer
    assert footer is not None
    assert footer["exit_code"] == 130
    error = from_footer(footer)
    assert error is not None
    assert error.type == "KeyboardInterrupt"
    assert error.frames[-1].function == "train"


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", b"x = 1\n\xff\xfe oops\n"])
def test_a_file_that_is_not_python_text_gets_pythons_one_line_error(tmp_path: Path, content: bytes) -> None:
    script = tmp_path / "picture.png"
    script.write_bytes(content)
    plain, child, _ = both(tmp_path, script, [])
    assert child.code == plain.code == 1
    assert child.err.strip() == plain.err.strip()
    assert child.err.startswith("SyntaxError: Non-UTF-8 code")
    assert len(child.err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_fatal_signal_flushes_what_was_recorded_and_ends_like_python(tmp_path: Path, signum: int) -> None:
    script = write_script(tmp_path, """
        import time
        import torch
        model = torch.nn.Linear(4, 2)
        for _ in range(7):
            model(torch.randn(3, 4))
        print("ready", flush=True)
        time.sleep(60)
    """)
    trace = tmp_path / "repeat-0.trace"
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"repeat": 0, "device": "cpu", "granularity": "module", "trace": str(trace)}))
    proc = subprocess.Popen(child_command(config, str(script), []), cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == -signum  # as plain python ends on that signal
    tr = read_trace(trace)
    assert not tr.complete
    assert len(tr.records) >= 14


@pytest.mark.slow
def test_exec_replacing_the_process_keeps_what_was_recorded(tmp_path: Path) -> None:
    script = write_script(tmp_path, """
        import os, sys
        import torch
        model = torch.nn.Linear(4, 2)
        for _ in range(5):
            model(torch.randn(3, 4))
        os.execv(sys.executable, [sys.executable, "-c", "print('replaced')"])
    """)
    plain, child, trace = both(tmp_path, script, [])
    assert (child.code, child.out) == (plain.code, plain.out) == (0, "replaced\n")
    tr = read_trace(trace)
    assert not tr.complete
    assert len(tr.records) >= 10
