"""excerpt.py: the part of a failed repeat's stderr worth showing, when its trace has no frames."""

from __future__ import annotations

from detaudit.run.excerpt import error_excerpt


def test_the_recorders_wrapper_frames_are_left_out_so_the_users_call_is_innermost() -> None:
    """Python's traceback of an op that raised in C ends in the recorder's wrapper: not the user's story."""
    user = ['  File "/work/train.py", line 4, in <module>', "    x.index_add_(0, idx, src)"]
    wrapper = ['  File "/venv/lib/python3.12/site-packages/detaudit/recorder/evidence/kernels.py", line 304, in op',
               "    return original(*args, **kwargs)"]
    libraries = [line for i in range(12) for line in
                 (f'  File "/venv/lib/python3.12/site-packages/torch/m{i}.py", line {i}, in f', "    g()")]
    text = "\n".join(["Traceback (most recent call last):", *user, *libraries, *wrapper,
                      "IndexError: index out of range in self"])
    assert error_excerpt(text, lines=15).splitlines() == [
        "Traceback (most recent call last):", *user, "  ...", *libraries[-2:], "IndexError: index out of range in self"]
