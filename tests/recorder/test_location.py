"""recorder/location.py: which frames are the user's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import detaudit
from detaudit.recorder import fingerprint, location


def test_all_of_detaudit_but_its_demo_is_library_code() -> None:
    """An editable install is not under site-packages: without this, `fingerprint.py`'s own
    `torch.empty(0)` was recorded as the script's uninitialised allocation."""
    own = location.own_code()
    root = os.path.dirname(os.path.abspath(detaudit.__file__))
    for path in (fingerprint.__file__, location.__file__, detaudit.__file__, os.path.join(root, "trace", "reader.py")):
        assert os.path.abspath(path).startswith(own), path
    demo = os.path.join(root, "demo", "train_demo.py")
    assert os.path.isfile(demo)
    assert not demo.startswith(own)
    assert not os.path.abspath(__file__).startswith(own)


def test_a_library_line_is_shown_after_the_users_line_that_led_to_it() -> None:
    """An op run by an installed package (timm initialising its classifier) is placed at the user's line that
    called into the package first, then at the package's own line, as its import path shows it."""
    lib = location._INSTALLED[0]  # a file placed where an installed package's would be
    library = compile("def build(f):\n    return f()\n", os.path.join(lib, "fakepkg", "layers.py"), "exec")
    scope: dict[str, object] = {}
    exec(library, scope)
    seen: list[str] = []

    def op() -> None:
        frame = sys._getframe(1)
        seen.append(location.describe_frames(frame, location.user_caller(frame)))

    scope["build"](op); line = sys._getframe().f_lineno  # noqa: E702
    assert seen == [f"{location.display_path(__file__)}:{line} via fakepkg/layers.py:2"]
    here = sys._getframe()
    assert location.user_caller(here) is None
    text, line = location.describe_frames(here, None), here.f_lineno
    assert text == f"{location.display_path(__file__)}:{line}"


def test_a_site_directory_on_sys_path_outside_this_interpreters_own_is_installed_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A venv that sees another venv's packages (a .pth naming its site-packages) has them outside its own
    sysconfig paths: their frames are still library code, never the user's line."""
    other = tmp_path / "outer" / "lib" / "python3.11" / "site-packages"
    monkeypatch.setattr(sys, "path", [*sys.path, str(other), str(tmp_path / "mine")])
    dirs = location.installed_dirs()
    assert f"{other}{os.sep}" in dirs
    assert f"{tmp_path / 'mine'}{os.sep}" not in dirs
