"""Where `detaudit batch`'s probes run, so that re-running a forward cannot touch the script's state or files.

A probe re-runs the model's forward several times. A copy of the module keeps its own state apart, but a
forward can reach past its module: a global counter, a module-level tensor updated in place, a log file,
a print. Run in the script's process, those happen once per probe, and the script then prints other results
than under `python SCRIPT` (docs/batch.md promises the same bits).

- On CPU the probes run in a **forked copy** of the process (`in_fork`): whatever they change there dies
  with the copy. Every descriptor the copy could write through (stdout, stderr, a log file the script keeps
  open, the trace) points at /dev/null, a file opened for writing opens /dev/null instead, and what leaves
  the process otherwise (removing or renaming a file, a subprocess, a socket) is refused: the call is then
  reported `side-effects`, not probed. The copy evaluates in a thread of its own, because OpenMP's thread
  pool does not survive a fork on the thread that used it (a matmul in the forked main thread hangs), while
  a new thread gets a fresh pool with the same thread count, hence the same kernels and bits.
- CUDA cannot be used in a forked copy. There (`forkable` is false) the script's own call is watched
  (`Watch`): a global of the script's modules that changed, or a file written, a process started... during
  that call, and the call is not probed (`side-effects`, saying what). Otherwise the probes run in the
  process with stdout, stderr and logging silenced and the same effects refused (`quiet`).
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import io
import json
import logging
import os
import signal
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# audit events that reach outside the process (beyond opening a file for writing, handled apart)
_LEAVING = frozenset({
    "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.truncate", "os.chmod", "os.chown", "os.link",
    "os.symlink", "os.utime", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "os.kill", "os.killpg", "subprocess.Popen", "socket.connect", "socket.sendto",
    "socket.bind", "shutil.copyfile", "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.make_archive",
    "sqlite3.connect", "mmap.__new__", "webbrowser.open", "urllib.Request", "http.client.connect",
})


class ProbeFailed(Exception):
    """The forked copy raised, or ended without a result."""


@dataclass(frozen=True)
class Isolated:
    """What the forked copy sent back: the work's result (None when it raised), the error in words, and the
    effects that were refused (each a short description)."""

    value: Any
    error: str | None
    refused: tuple[str, ...]


def forkable(module: torch.nn.Module, values: Any) -> bool:
    """Whether the probes of this call can run in a forked copy: a POSIX fork, CUDA never initialised in this
    process (a forked copy cannot use it), and the module's parameters and the call's tensors on the CPU."""
    if not hasattr(os, "fork") or torch.cuda.is_initialized():
        return False
    tensors = [*module.parameters(), *module.buffers(), *_tensors(values)]
    return all(t.device.type == "cpu" for t in tensors)


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 8:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, depth + 1)]
    return []


# -- the audit hook: one per process, doing what the calling thread asks ---------------------------------
_local = threading.local()  # .refused: list[str] while effects are refused; .seen: list[str] while watched
_hooked = False


def _hook() -> None:
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True


def _leaves(event: str, args: tuple[Any, ...]) -> str | None:
    """The effect in words when an audit event reaches outside the process; None otherwise."""
    if event == "open" and len(args) >= 3 and not isinstance(args[0], int):
        mode, flags = args[1], args[2]
        writes = (isinstance(flags, int) and flags & _WRITING) or (isinstance(mode, str) and set(mode) & set("wax+"))
        path = args[0] if isinstance(args[0], str) else str(args[0])
        # importlib's bytecode cache (written atomically, the same bytes the script's process would write)
        harmless = path == os.devnull or f"{os.sep}__pycache__{os.sep}" in path
        return f"opens {path} for writing" if writes and not harmless else None
    if event in _LEAVING:
        shown = ", ".join(str(a) for a in args[:2] if isinstance(a, (str, bytes, int, os.PathLike)))
        return f"{event}({shown})"
    return None


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # detaudit's own files
_STDLIB = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib")})
_WRAPPERS = __file__  # the copy's diverting wrappers (`_forgetting`) call on the caller's behalf


def _not_the_forwards() -> bool:
    """Whether the effect being audited is not the forward's own: made while a module is imported (torch making
    its cache directory when a forward first imports torch._dynamo: once per process, as under python), or
    by detaudit itself (the innermost caller outside the standard library is detaudit's)."""
    frame = sys._getframe(2)  # the frame that caused the audit event (0: this function, 1: the hook)
    innermost: str | None = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith("<frozen importlib"):
            return True
        if innermost is None and not path.startswith((*_STDLIB, "<frozen")) and path != _WRAPPERS:
            innermost = path
        frame = frame.f_back  # type: ignore[assignment]
    return innermost is not None and innermost.startswith(_PACKAGE)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    refused: list[str] | None = getattr(_local, "refused", None)
    seen: list[str] | None = getattr(_local, "seen", None)
    if refused is None and seen is None:
        return
    effect = _leaves(event, args)
    if effect is None or _not_the_forwards():
        return
    if seen is not None:
        seen.append(effect)
        return
    assert refused is not None
    refused.append(effect)
    raise PermissionError(f"detaudit batch: a probe may not have effects outside the process ({effect})")


# -- CPU: a forked copy ------------------------------------------------------------------------------------
def in_fork(work: Callable[[], Any], prepare: Callable[[], None] = lambda: None) -> Isolated:
    """Run `work` in a forked copy of this process, on a new thread carrying the calling thread's autocast
    and inference mode, and return what it returned (JSON through a pipe: the probe's events are plain
    values, and nothing read from a pipe is unpickled). Raises ProbeFailed when the copy ends without a
    result (killed, or exited). `prepare` runs first in the copy (a lock another thread held at the fork
    stays held there: the caller replaces those it may take)."""
    modes = _ThreadModes.capture()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: never returns
        _child(work, prepare, modes, read_end, write_end)
    os.close(write_end)
    finished = False
    try:
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        _, status = os.waitpid(pid, 0)
        finished = True
    finally:
        if not finished:  # interrupted while the copy ran: it must not outlive the call
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    if not data:
        raise ProbeFailed(f"the probes' forked process ended without a result ({_ended(status)})")
    sent = json.loads(data)
    return Isolated(sent["value"], sent["error"], tuple(sent["refused"]))


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _child(work: Callable[[], Any], prepare: Callable[[], None], modes: _ThreadModes, read_end: int,
           write_end: int) -> None:
    """The forked copy: seal it, run `work` on a fresh thread, send the result, and end without running any
    of the script's exit handlers or flushing its buffers."""
    try:
        os.close(read_end)
        _seal(keep=write_end)
        prepare()
        box: list[Isolated] = []

        def run() -> None:
            refused: list[str] = []
            _local.refused = refused
            try:
                with modes.entered():
                    value = work()
                box.append(Isolated(value, None, tuple(refused)))
            except BaseException as exc:  # noqa: BLE001 - the copy reports every ending to its parent
                box.append(Isolated(None, f"{type(exc).__name__}: {exc}", tuple(refused)))
            finally:
                _local.refused = None

        thread = threading.Thread(target=run, name="detaudit-batch-probe")
        thread.start()
        thread.join()
        result = box[0] if box else Isolated(None, "the probe's thread ended without a result", ())
        try:
            text = json.dumps({"value": result.value, "error": result.error, "refused": list(result.refused)})
        except (TypeError, ValueError) as exc:
            text = json.dumps({"value": None, "error": f"its result cannot be sent back ({exc})",
                               "refused": list(result.refused)})
        view = memoryview(text.encode())
        while view:
            view = view[os.write(write_end, view):]
    finally:
        os._exit(0)


def _seal(keep: int) -> None:
    """Point every descriptor the copy could write through at /dev/null, divert opens for writing there, and
    refuse the other effects that leave the process."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in _open_descriptors():
        if fd in (keep, null):
            continue
        with contextlib.suppress(OSError):
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY:
                os.dup2(null, fd)
    diverted: set[str] = set()
    builtins.open = io.open = _diverted(io.open, diverted)
    os.open = _diverted_os_open(os.open, diverted)
    os.remove = os.unlink = _forgetting(os.unlink, diverted)
    torch.save = _diverted_save(torch.save)
    _hook()


def _open_descriptors() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def _diverted(real: Callable[..., Any], diverted: set[str]) -> Callable[..., Any]:
    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, int) or not set(mode) & set("wax+"):
            return real(file, mode, *args, **kwargs)
        diverted.add(_key(file))
        return real(os.devnull, mode.replace("x", "w"), *args, **kwargs)

    return open_


def _diverted_os_open(real: Callable[..., int], diverted: set[str]) -> Callable[..., int]:
    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if not flags & _WRITING:
            return real(path, flags, *args, **kwargs)
        kwargs.pop("dir_fd", None)
        diverted.add(_key(path))
        return real(os.devnull, flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC))

    return open_


def _forgetting(real: Callable[..., None], diverted: set[str]) -> Callable[..., None]:
    """Removing a file the copy itself opened for writing (diverted to /dev/null, so never made) succeeds and
    touches nothing: `tempfile.gettempdir()` writes a test file and removes it, and without this finds no usable
    directory (torch's first `import torch._dynamo`, from inside a forward, calls it)."""
    def remove(path: Any, *args: Any, **kwargs: Any) -> None:
        if not args and not kwargs and _key(path) in diverted:
            diverted.discard(_key(path))
            return
        real(path, *args, **kwargs)

    return remove


def _key(path: Any) -> str:
    """A path as the copy's opens and removes name it (absolute, so a relative and an absolute name agree)."""
    try:
        return os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return ""


def _diverted_save(real: Callable[..., None]) -> Callable[..., None]:
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:  # its C++ writer opens a path itself
        real(obj, io.BytesIO() if isinstance(f, (str, bytes, os.PathLike)) else f, *args, **kwargs)

    return save


@dataclass(frozen=True)
class _ThreadModes:
    """The calling thread's autocast (CPU) and inference mode, which a new thread does not inherit."""

    autocast: bool
    autocast_dtype: torch.dtype
    inference: bool

    @classmethod
    def capture(cls) -> _ThreadModes:
        return cls(torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                   torch.is_inference_mode_enabled())

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.inference:
                stack.enter_context(torch.inference_mode())
            if self.autocast:
                stack.enter_context(torch.autocast("cpu", dtype=self.autocast_dtype))
            yield


# -- CUDA: the script's own call watched, the probes in the process ---------------------------------------
@dataclass
class Watch:
    """The script's own call, watched for effects outside its module: the globals of the script's modules
    (values, containers' lengths, tensors' versions) before and after, and what the audit hook saw."""

    before: dict[tuple[str, str], Any] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)

    @classmethod
    def start(cls) -> Watch:
        _hook()
        watch = cls(before=_globals_token())
        _local.seen = watch.seen
        return watch

    def effects(self) -> list[str]:
        """What the call did outside its module, in words (empty: nothing this watch can see)."""
        _local.seen = None
        after = _globals_token()
        changed = [f"changed `{name}` in {module}" for (module, name), token in after.items()
                   if self.before.get((module, name), token) != token]
        return [*changed, *dict.fromkeys(self.seen)]


def _user_modules() -> list[ModuleType]:
    """The script and the modules it imported from outside the standard library and installed packages."""
    roots = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name == "__main__" or (isinstance(path, str) and not path.startswith(roots)
                                  and not path.startswith(_PACKAGE)):
            found.append(module)
    return found


_SMALL = 64  # a container up to this length is watched item by item (a counter kept in a list or dict)


def _token(value: Any, depth: int = 0) -> Any:
    if isinstance(value, (int, float, str, bytes, bool)) or value is None:
        return value
    if isinstance(value, torch.Tensor):
        return id(value), value._version
    if isinstance(value, (list, tuple, dict)) and depth == 0 and len(value) <= _SMALL:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return id(value), tuple((k, _token(v, 1)) for k, v in items)
    if isinstance(value, (list, tuple, dict, set, bytearray)):
        return id(value), len(value)
    return id(value)


def _globals_token() -> dict[tuple[str, str], Any]:
    """Each global of the script's modules (and each plain attribute of a class defined there) as a token
    that changes when it is rebound, or grows, or (a tensor) is written in place."""
    out: dict[tuple[str, str], Any] = {}
    for module in _user_modules():
        where = module.__name__
        for name, value in list(vars(module).items()):
            if name.startswith("__") or isinstance(value, ModuleType) or (callable(value)
                                                                           and not isinstance(value, type)):
                continue
            if isinstance(value, type):
                if value.__module__ == where:
                    out.update({(where, f"{name}.{k}"): _token(v) for k, v in list(vars(value).items())
                                if not k.startswith("__") and not callable(v)})
                continue
            out[(where, name)] = _token(value)
    return out


class _Muted:
    """sys.stdout or sys.stderr while a thread probes in the process: that thread's writes are dropped,
    every other thread's reach the real stream."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def write(self, text: str) -> int:
        return len(text) if getattr(_local, "refused", None) is not None else int(self._real.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def quiet() -> Iterator[list[str]]:
    """In-process probes: this thread's prints and log records dropped, its effects outside the process
    refused (the list yielded collects them); other threads of the script go on as they were."""
    _hook()
    refused: list[str] = []
    _local.refused = refused
    streams = sys.stdout, sys.stderr
    call_handlers = logging.Logger.callHandlers

    def handlers_unless_probing(logger: logging.Logger, record: logging.LogRecord) -> None:
        if getattr(_local, "refused", None) is None:
            call_handlers(logger, record)

    sys.stdout, sys.stderr = _Muted(streams[0]), _Muted(streams[1])
    logging.Logger.callHandlers = handlers_unless_probing  # type: ignore[method-assign,assignment]
    try:
        yield refused
    finally:
        logging.Logger.callHandlers = call_handlers  # type: ignore[method-assign]
        sys.stdout, sys.stderr = streams
        _local.refused = None
