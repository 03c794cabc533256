"""failure.py: capturing a script's exception as frames, reading it back from a footer, and the excerpt
the report shows (frames in, text out; the end of stderr only when a trace has no frames)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

import detaudit
from detaudit import schema
from detaudit.errors import TraceError
from detaudit.results import MAX_FRAMES, MAX_MESSAGE, Frame, ScriptError
from detaudit.run import failure
from detaudit.run.failure import capture, excerpt
from detaudit.trace import MAGIC, RecordStream, TraceWriter, read_footer

USER = Frame("train.py", 22, "main", "preds = model(val_x)", True)
OUTER = Frame("train.py", 40, "<module>", "main()", True)
LIBRARY = Frame("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward",
                "return F.linear(input, self.weight, self.bias)", False)


def test_the_excerpt_names_the_users_innermost_line_where_a_library_raised_and_the_error() -> None:
    error = ScriptError("RuntimeError", "mat1 and mat2 shapes cannot be multiplied", (OUTER, USER, LIBRARY), 4)
    assert excerpt(error, "stderr is not read when there are frames") == (
        "train.py:22, in main\n"
        "    preds = model(val_x)\n"
        "  (raised in torch/nn/modules/linear.py:125, in forward)\n"
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied")


def test_an_error_raised_in_the_users_own_frame_needs_no_raise_site() -> None:
    error = ScriptError("KeyError", "'missing'", (OUTER, USER))
    assert excerpt(error, "") == "train.py:22, in main\n    preds = model(val_x)\nKeyError: 'missing'"


def test_without_user_frames_or_source_the_excerpt_keeps_what_it_has() -> None:
    no_source = Frame("train.py", 3, "<module>", None, True)
    assert excerpt(ScriptError("KeyboardInterrupt", "", (no_source,)), "") == \
        "train.py:3, in <module>\nKeyboardInterrupt"
    assert excerpt(ScriptError("mypkg.Error", "bad", (LIBRARY,)), "") == (
        "  (raised in torch/nn/modules/linear.py:125, in forward)\nmypkg.Error: bad")
    assert excerpt(ScriptError("SyntaxError", "invalid syntax (t.py, line 1)", ()), "") == \
        "SyntaxError: invalid syntax (t.py, line 1)"


def test_a_bare_sys_exit_shows_what_the_script_printed_first() -> None:
    argparse_exit = ScriptError("SystemExit", "2", (USER, Frame("/usr/lib/python3.11/argparse.py", 2617, "exit",
                                                               "_sys.exit(status)", False)))
    stderr = "usage: train.py [-h] [--n N]\ntrain.py: error: unrecognized arguments: --bogus\n"
    assert excerpt(argparse_exit, stderr) == (
        "usage: train.py [-h] [--n N]\ntrain.py: error: unrecognized arguments: --bogus\n"
        "train.py:22, in main\n    preds = model(val_x)\n  (raised in argparse.py:2617, in exit)\nSystemExit: 2")
    said = ScriptError("SystemExit", "fatal: bad config", (USER,))  # python printed the message: shown once
    assert excerpt(said, "fatal: bad config\n").count("fatal: bad config") == 1


def test_without_frames_the_end_of_stderr_is_shown_safe_to_print() -> None:
    stderr = "\n".join(f"line {i}" for i in range(30)) + "\n\x1b[31mSegmentation fault\x1b[0m \x07\n"
    shown = excerpt(None, stderr, lines=5)
    assert shown.splitlines()[0] == "line 26"
    assert shown.endswith("Segmentation fault \\x07")
    assert excerpt(ScriptError("ValueError", "bad \x1b]52;c;AAAA\x07", (USER,)), "").endswith(
        "ValueError: bad \\x1b]52;c;AAAA\\x07")


# -- capture ---------------------------------------------------------------------------------------------
def _caught(fn: object, *args: object) -> BaseException:
    try:
        fn(*args)  # type: ignore[operator]
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


def test_capture_keeps_user_frames_and_the_innermost_frame_and_drops_the_callers_own(tmp_path: Path) -> None:
    lib = tmp_path / "lib.py"
    lib.write_text("def call(f):\n    return f()\n\ndef fail():\n    raise ValueError('deep')\n")
    script = tmp_path / "script.py"
    script.write_text("def step():\n    fail()\n\ndef main():\n    call(step)\n")
    space: dict[str, object] = {}
    for path in (lib, script):
        exec(compile(path.read_text(), str(path), "exec"), space)
    exc = _caught(space["main"])
    # this file's frames play the child's (skipped while they lead); lib.py plays an installed package
    error = capture(exc, __file__, show_path=os.path.basename, library=lambda path: path == str(lib))
    assert error == ScriptError("ValueError", "deep", (
        Frame("script.py", 5, "main", "call(step)", True),
        Frame("script.py", 2, "step", "fail()", True),
        Frame("lib.py", 5, "fail", "raise ValueError('deep')", False)), omitted=1)  # `call` in between
    everything = capture(exc, "", library=lambda path: False)
    assert [f.function for f in everything.frames] == ["_caught", "main", "call", "step", "fail"]
    assert everything.frames[1].file == os.path.relpath(script)
    assert everything.omitted == 0


def test_capture_skips_the_recorders_wrapper_frames_so_the_users_call_is_innermost(tmp_path: Path) -> None:
    """An op that raises in C leaves the recorder's wrapper (`return original(...)`) as the innermost Python
    frame: the excerpt must name the user's call, never the wrapper."""
    script = tmp_path / "script.py"
    script.write_text("def main(op):\n    op()\n")
    space: dict[str, object] = {}
    wrapper = "def op():\n    raise IndexError('index out of range in self')\n"
    exec(compile(wrapper, failure._RECORDER_DIR + "evidence" + os.sep + "kernels.py", "exec"), space)
    exec(compile(script.read_text(), str(script), "exec"), space)
    error = capture(_caught(space["main"], space["op"]), __file__, show_path=os.path.basename)
    assert error.frames == (Frame("script.py", 2, "main", "op()", True),)
    assert excerpt(error, "") == "script.py:2, in main\n    op()\nIndexError: index out of range in self"


def test_capture_bounds_frames_and_message() -> None:
    def recurse(n: int) -> None:
        if n == 0:
            raise RuntimeError("x" * (MAX_MESSAGE + 50))
        recurse(n - 1)

    error = capture(_caught(recurse, 60), "", library=lambda path: False)
    assert len(error.frames) == MAX_FRAMES
    assert error.omitted == 62 - MAX_FRAMES
    assert error.frames[-1].text == 'raise RuntimeError("x" * (MAX_MESSAGE + 50))'
    assert error.message.endswith("... (50 more characters)")
    assert len(error.message) < MAX_MESSAGE + 30


def test_system_exit_and_a_failing_str_are_captured_as_python_prints_them() -> None:
    assert capture(SystemExit(3), "").message == "3"
    assert capture(SystemExit("fatal: bad config"), "").message == "fatal: bad config"

    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError

    assert capture(Broken(), "").message == "<exception str() failed>"
    assert capture(Broken(), "").type.endswith("Broken")


def test_library_files_are_the_standard_library_installed_packages_and_detaudit(tmp_path: Path) -> None:
    assert failure.is_library(os.__file__)
    assert failure.is_library(detaudit.__file__)
    assert failure.is_library("/opt/env/lib/python3.11/site-packages/torch/nn/functional.py")
    assert failure.is_library("<frozen runpy>")
    assert not failure.is_library("<string>")
    assert not failure.is_library(str(tmp_path / "train.py"))
    assert not failure.is_library(str(Path(detaudit.__file__).parent / "demo" / "train.py"))


# -- the footer ------------------------------------------------------------------------------------------
def _trace(path: Path, footer: dict[str, object]) -> Path:
    TraceWriter(path, {"repeat": 0}).close(footer)
    return path


def test_an_error_round_trips_through_the_footer_and_the_schema(tmp_path: Path) -> None:
    error = ScriptError("RuntimeError", "boom", (OUTER, USER, LIBRARY), 2)
    assert ScriptError.from_json(schema.check(error.to_json(), schema.SCRIPT_ERROR, "t")) == error
    path = _trace(tmp_path / "t.trace", {"exit_code": 1, "exception": error.to_json()})
    assert failure.read_error(path) == error
    assert failure.first_error([tmp_path / "missing.trace", path]) == error


def test_a_footer_without_an_exception_is_read_as_before(tmp_path: Path) -> None:
    """Traces written before the field existed, and scripts that ended without one (os._exit, exit 0)."""
    path = _trace(tmp_path / "old.trace", {"exit_code": 3, "error": None, "duration_s": 1.0})
    assert failure.read_error(path) is None
    assert read_footer(path) == {"records": 0, "exit_code": 3, "error": None,
                                                                      "duration_s": 1.0}
    assert failure.read_error(tmp_path / "never-written.trace") is None


@pytest.mark.parametrize("bad", [
    {"type": 1, "message": "", "frames": []},
    {"type": "E", "message": "", "frames": [{"file": "a.py", "line": "7", "function": "f", "user": True}]},
    {"type": "E", "message": "", "frames": [{"file": "a.py", "line": 7, "function": "f"}]},
    {"type": "E", "frames": []},
    ["not", "an", "object"],
])
def test_a_malformed_exception_is_refused_at_the_read_boundary(tmp_path: Path, bad: object) -> None:
    path = _trace(tmp_path / "bad.trace", {"exit_code": 1, "exception": bad})
    with pytest.raises(TraceError, match="footer: field `exception"):
        RecordStream(path).drain()
    assert read_footer(path) is None
    assert failure.read_error(path) is None


def test_a_hand_made_footer_with_too_much_is_bounded_when_read(tmp_path: Path) -> None:
    frames = [{"file": "a.py", "line": i, "function": "f" * 1000, "text": None, "user": True} for i in range(500)]
    path = _trace(tmp_path / "big.trace", {"exception": {"type": "E", "message": "m" * 10**5, "frames": frames}})
    error = failure.read_error(path)
    assert error is not None
    assert len(error.frames) == MAX_FRAMES
    assert error.omitted == 500 - MAX_FRAMES
    assert error.frames[-1].line == 499
    assert len(error.message) < MAX_MESSAGE + 40
    assert all(len(f.function) < 300 for f in error.frames)


def test_a_footer_cut_short_or_nested_too_deeply_reads_as_no_footer(tmp_path: Path) -> None:
    deep = b"[" * 100000
    path = tmp_path / "deep.trace"
    path.write_bytes(MAGIC + b"F" + struct.pack("<I", len(deep)) + deep)
    assert read_footer(path) is None
    (tmp_path / "cut.trace").write_bytes(MAGIC + b"F" + struct.pack("<I", 100) + b"{}")
    assert read_footer(tmp_path / "cut.trace") is None


def test_a_footer_claiming_more_bytes_than_the_file_holds_is_no_footer(tmp_path: Path) -> None:
    path = tmp_path / "huge.trace"
    path.write_bytes(MAGIC + b"F" + struct.pack("<I", 0xFFFFFFF0) + b"{}")
    assert read_footer(path) is None


def test_a_full_disk_is_read_from_the_excerpt_a_failed_repeat_shows() -> None:
    shown = excerpt(ScriptError("OSError", "[Errno 28] No space left on device", (USER,), 0), "")
    assert failure.disk_full(shown) == "OSError: [Errno 28] No space left on device"
    lost = "detaudit: this repeat's recording is incomplete: writing the trace failed: No space left on device"
    assert failure.disk_full(excerpt(None, f"some output\n{lost}\n")) == lost
    assert failure.disk_full(excerpt(ScriptError("OSError", "[Errno 122] Disk quota exceeded", (USER,), 0), ""))
    assert failure.disk_full(excerpt(ScriptError("ValueError", "no space for this model", (USER,), 0), "")) is None
