"""recorder/location.py: which frames are the user's."""

from __future__ import annotations

import os

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
    assert os.path.isfile(demo) and not demo.startswith(own)
    assert not os.path.abspath(__file__).startswith(own)
