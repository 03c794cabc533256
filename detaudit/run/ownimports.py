"""Inside a repeat, detaudit's own imports never resolve through the script's directory.

Plain python puts the script's directory first on sys.path, and so does the child, for the script.
A module detaudit imports after that (the recorder once the script imports torch, numpy for a
trace, json for an event...) would be found there first: a script named `xxhash.py`, or a
`json.py` beside it, would be imported as that module and run a second time inside the repeat.
The launcher's bootstrap keeps the working directory out of the child's own imports
(launcher.child_command); this finder keeps the script's directory out of the later ones.

An import made from detaudit's code, or from a module such an import is loading, is resolved on
the interpreter's own path (sys.path before the script's directory was added) first; one found
nowhere there is left to python. An import made from the script's code (its directory's files, or
anything the script runs that detaudit did not call) is left to python, as plain python would do it.
Who imports is read off the stack: the innermost frame that is either detaudit's or the script's
decides; the import machinery's frames and child.py's import hooks are neither, and the child's
frames that run the script (`stop_at`) end the search: below them everything is the script's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import CodeType, FrameType
from typing import Any

_HOOK_FRAMES = frozenset({"find_spec", "exec_module"})  # child.py's _AfterImport: machinery, not an importer


class OwnImports(importlib.abc.MetaPathFinder):
    """A meta path finder for top-level imports made from detaudit's code (see the module docstring).

    `path`: the interpreter's own sys.path; `own`: detaudit's files and packages (not its demo, a
    script); `script_dirs`: the directory whose files are the script's, as typed and resolved;
    `stop_at`: the code of the child's functions that run the script.
    """

    def __init__(self, path: Sequence[str], own: Sequence[str], script_dirs: Sequence[str],
                 stop_at: Sequence[CodeType]) -> None:
        self.path = list(path)
        self.own = tuple(own)
        self.script_dirs = tuple(os.path.join(d, "") for d in script_dirs)
        self.stop_at = frozenset(stop_at)
        self._whose: dict[str, bool | None] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if path is not None or not self._from_detaudit(sys._getframe(1)):
            return None  # a submodule follows its package; the script's imports are python's
        return importlib.machinery.PathFinder.find_spec(fullname, self.path)

    def _from_detaudit(self, frame: FrameType | None) -> bool:
        while frame is not None:
            code = frame.f_code
            if code in self.stop_at:
                return False
            whose = self._whose.get(code.co_filename, ...)
            if whose is ...:
                whose = self._whose[code.co_filename] = self._classify(code.co_filename)
            if whose is not None and not (whose and code.co_name in _HOOK_FRAMES):
                return whose
            frame = frame.f_back
        return False

    def _classify(self, filename: str) -> bool | None:
        """True: detaudit's code; False: the script's; None: neither (python, torch, the import machinery)."""
        if filename.startswith("<"):
            return None
        absolute = os.path.abspath(filename)
        if absolute.startswith(self.own):
            return True
        return False if absolute.startswith(self.script_dirs) or \
            os.path.realpath(absolute).startswith(self.script_dirs) else None
