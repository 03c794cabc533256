"""audit.py helpers that need no repeats: the error excerpt shown for failing repeats."""

from __future__ import annotations

from detaudit.audit import error_excerpt


def _traceback(user_frames: list[str], library_frames: int, error: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for frame in user_frames:
        lines += [f'  File "{frame}", line 22, in main', "    model(x)"]
    for i in range(library_frames):
        lines += [f'  File "/venv/lib/python3.11/site-packages/torch/nn/m{i}.py", line {i}, in f', "    g()"]
    return "\n".join(["some output", *lines, error])


def test_long_traceback_keeps_user_frames_and_the_error() -> None:
    text = _traceback(["/work/fit_model.py"], 12, "RuntimeError: shapes cannot be multiplied")
    excerpt = error_excerpt(text, lines=15)
    assert 'File "/work/fit_model.py", line 22' in excerpt
    assert excerpt.endswith("RuntimeError: shapes cannot be multiplied")
    assert "m0.py" not in excerpt and "m11.py" in excerpt  # the innermost frame stays
    assert "  ..." in excerpt


def test_short_stderr_is_returned_as_is() -> None:
    text = _traceback(["/work/a.py"], 1, "ValueError: bad")
    assert error_excerpt(text, lines=15) == text
    assert error_excerpt("just a line\n", lines=15) == "just a line"
