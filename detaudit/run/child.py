"""Inside one repeat: become `python SCRIPT ARGS...` and record it.

Started by the launcher as `python -m detaudit.run.child CONFIG SCRIPT [ARGS...]` in a fresh
interpreter; when the config names a module, it becomes `python -m MODULE ARGS...` instead (the
pytest plugin). It restores argv, sys.path[0] and `__main__` as plain python would set them,
installs the recorder when the script imports torch (not before: a script may set
environment variables that torch reads at import), runs the script, and writes the footer
with its exit status and, when it raised, its structured traceback (`exception`,
detaudit/run/failure.py). The script's own traceback is printed as python would print it.
Recording goes on after the script's body returns: its threads and its `atexit` handlers (a
last torch.save) are recorded, and the footer is written by an exit handler that runs after
all of the script's. Only object finalizers at interpreter shutdown come later, unrecorded.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import runpy
import signal
import sys
import threading
import time
import tokenize
import traceback
from collections.abc import Callable
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any, NoReturn

from detaudit.recorder import evidence, location
from detaudit.recorder.patch import wrap
from detaudit.recorder.pinning import reexec_without_aslr
from detaudit.run import failure
from detaudit.run.distributed import enter_rank
from detaudit.run.ownimports import OwnImports


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a module finishes importing (before the importer sees it).

    The spec comes from the finders after this one, as python would find it (a vendored or zipped
    torch included). A callback is dropped only once its module imported; its failure is reported
    (`on_error`), never raised into the user's `import`.
    """

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]],
                 on_error: Callable[[str, BaseException], None]) -> None:
        self.callbacks = callbacks
        self.on_error = on_error

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.callbacks:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        def make(original: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
            def exec_module(module: ModuleType) -> None:
                original(module)
                callback = self.callbacks.pop(fullname, None)
                if callback is not None:
                    try:
                        callback(module)
                    except Exception as exc:
                        self.on_error(fullname, exc)

            return exec_module

        wrap(spec.loader, "exec_module", make)
        return spec

    def catch_up(self) -> None:
        """Instrument the watched modules imported before the script started (sitecustomize, .pth)."""
        for name in [n for n in self.callbacks if n in sys.modules]:
            try:
                self.callbacks.pop(name)(sys.modules[name])
            except Exception as exc:
                self.on_error(name, exc)


class WindowRecorded(BaseException):
    """Raised inside the script to end an op-window re-run early (see Session._stop_after_op_window)."""


class WatchStopped(BaseException):
    """Raised inside the script when `detaudit watch` stops it before a save or an update (recorder/replay.py)."""


class BoundReached(BaseException):
    """Raised inside the script when --max-steps or --max-time is reached, or a stop was requested
    (recorder/bounds.py)."""


class Session:
    """One audited repeat: the trace writer, the hooks, and the script's outcome."""

    def __init__(self, config: dict[str, Any], script: Path) -> None:
        self.config = config
        self.script = script
        self.recorder: Any = None
        self.hooks: Any = None
        self.started = time.time()
        self.pid = os.getpid()
        self.recording_failed: str | None = None
        self.outcome: dict[str, Any] | None = None  # the footer to write at `close`, once the script ended
        self.finished = False

    def on_import_error(self, module: str, exc: BaseException) -> None:
        """Instrumenting an imported module failed: the script runs on, the report must say so."""
        why = f"{type(exc).__name__}: {exc}"
        print(f"detaudit: could not instrument `{module}`, recording is incomplete: {why}", file=sys.stderr)
        if self.recording_failed is None:
            self.recording_failed = f"instrumenting {module}: {why}"

    def on_torch_import(self, torch_module: ModuleType) -> None:
        import detaudit.recorder
        from detaudit.recorder import checkpoints, ops
        from detaudit.recorder.full_values import recorder_for
        from detaudit.recorder.hooks import Hooks
        from detaudit.trace import TraceWriter

        # detaudit's own frames are library code; its demo script is user code.
        location.skip_paths(location.package_dir(torch_module), *location.own_code())
        header = {
            "repeat": self.config.get("repeat", 0),
            "script": str(self.script),
            "argv": self.stored_argv(),
            "pid": os.getpid(),
            "device_request": self.config.get("device", "auto"),
            "granularity": self.config.get("granularity", "module"),
            "op_window": self.config.get("op_window"),
            "pins": self.config.get("pins", []),
            "torch": getattr(torch_module, "__version__", "?"),
            **({"distributed": self.config["distributed"]} if self.config.get("distributed") else {}),
        }
        writer = TraceWriter(Path(self.config["trace"]), header)
        self.recorder = recorder_for(writer, self.config, Path(self.config["trace"]))  # drift's re-recording
        self.recorder.perturb_at = self.config.get("perturb_record")  # --self-check only
        evidence.attach(self.recorder, torch_module)  # before the hooks: its first-forward event precedes records
        self.hooks = Hooks(self.recorder)
        self.hooks.install()
        if self.config.get("batch") is not None:  # `detaudit batch`: before the bounds, so the N-th call is probed
            from detaudit.recorder import batchprobe

            batchprobe.install(self.recorder, self.hooks.module_name, self.config["batch"])
        checkpoints.install(self.recorder, self.hooks, self.config)
        # an op-windowed repeat of `auto` (audit/pipeline.py) runs on after its window, as the repeat it also is
        ops.install(self.recorder, self.config,
                    None if self.config.get("op_window_runs_on") else self._stop_after_op_window)
        if self.config.get("distributed"):
            from detaudit.recorder import rank_evidence as collectives
            collectives.install(self.recorder)
        max_steps, max_time = self.config.get("max_steps"), self.config.get("max_time")
        stop_file = self.config.get("stop_file")  # the audit may ask this repeat to stop (compare/live.py)
        if max_steps is not None or max_time is not None or stop_file is not None:
            from detaudit.recorder.agree import RankStop
            from detaudit.recorder.bounds import Bounds

            ranks = RankStop() if self.config.get("distributed") and stop_file is not None else None
            Bounds(self.recorder, self.hooks.is_root_call, max_steps, max_time, self.started,
                   self._stop_at_bound, stop_file, ranks).install()
        if self.config.get("watch"):  # `detaudit watch` (after the hooks: its check runs before their save records)
            from detaudit.recorder import replay

            replay.install(self.recorder, self.config["watch"], self._stop_for_watch)
        detaudit._set_active_recorder(self.recorder)

    def stored_argv(self) -> list[str]:
        """argv as the trace keeps it: the arguments replaced under --redact-args (they may hold secrets)."""
        if self.config.get("redact_args"):
            return [sys.argv[0], *["<redacted>"] * (len(sys.argv) - 1)]
        return sys.argv

    def _stop_at_bound(self, stop: Any) -> None:
        """--max-steps / --max-time reached, or the audit asked for a stop: end the repeat here, as if the
        script had ended."""
        self.finish(0, None, **stop.footer())
        raise BoundReached

    def _stop_for_watch(self, before: str) -> None:
        """`detaudit watch` found a mismatch: end the job before `before` (torch.save, optimizer.step) runs,
        with exit status 1, unwinding as a bound does (the script's `finally` blocks run)."""
        self.finish(1, f"detaudit watch: stopped before {before} after a replay mismatch")
        raise WatchStopped

    def _stop_after_op_window(self) -> None:
        """The op-level re-run of --granularity auto has recorded its window: the rest is not needed.

        Unwinds with an exception the script's `except Exception` cannot swallow, so its `finally`
        blocks, context managers and atexit handlers still run (DataLoader workers are shut down).
        """
        self.finish(0, None, stopped_after_step=self.recorder.step - 1)
        raise WindowRecorded

    def finish(self, exit_code: int, error: str | None, exception: BaseException | None = None,
               **extra: Any) -> None:
        """Write the footer now: the process ends here (os._exit), or recording stops (a bound)."""
        self.ended(exit_code, error, exception, **extra)
        self.close()

    def ended(self, exit_code: int, error: str | None, exception: BaseException | None = None,
              **extra: Any) -> None:
        """The script ended so: its exit status, python's one-line summary of the error (`error`) and
        the exception's frames, kept for the footer `close` writes. A later outcome replaces it until
        then (os._exit from an atexit handler sets the process's real exit status)."""
        if self.finished:
            return
        footer = {"exit_code": exit_code, "error": error, "duration_s": None, **extra}
        captured = None if exception is None else _captured(exception)
        if captured is not None:
            footer["exception"] = captured
        self.outcome = footer

    def close(self) -> None:
        """Write the footer, once, in the repeat's own process (a forked child runs its parent's exit
        handlers too); records made after it are not kept."""
        if self.finished or self.outcome is None or os.getpid() != self.pid:
            return
        self.finished = True
        footer = {**self.outcome, "duration_s": round(time.time() - self.started, 4)}
        if self.recorder is None and self.recording_failed is None and "torch" in sys.modules:
            self.recording_failed = "torch was imported but the recorder was never installed"
        if self.recording_failed is not None:
            footer["recording_failed"] = self.recording_failed
        if self.hooks is not None and self.hooks.stopped is not None:
            footer["recording_stopped"] = self.hooks.stopped
        try:
            sink = self._empty_trace() if self.recorder is None else self.recorder
            evidence.finish(sink)
            sink.close(footer)
            lost = getattr(getattr(sink, "writer", sink), "lost", None)
            if lost:  # no footer: said where the report reads a repeat's end (a full disk reads inconclusive)
                print(f"detaudit: this repeat's recording is incomplete: {lost}", file=sys.stderr)
        except Exception as exc:  # the script's outcome matters more than a last flush
            print(f"detaudit: could not finish the trace: {exc}", file=sys.stderr)

    def _empty_trace(self) -> Any:
        """A script that never imported torch still gets a (record-less) trace.

        Written without the Recorder: importing it imports torch, which would fire the import
        hook mid-import (a circular import) and cost seconds for a script that never used torch.
        """
        from detaudit.trace import TraceWriter

        header = {"repeat": self.config.get("repeat", 0), "script": str(self.script), "argv": self.stored_argv(),
                  "pid": os.getpid(), "torch": None}
        return TraceWriter(Path(self.config["trace"]), header)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def _captured(exc: BaseException) -> dict[str, Any] | None:
    """The exception's frames for the footer; None if capturing them fails (the footer is written anyway)."""
    try:
        return failure.capture(exc, __file__, location.display_path).to_json()
    except Exception as problem:
        print(f"detaudit: could not record the script's traceback: {problem}", file=sys.stderr)
        return None


def _print_user_traceback(exc: BaseException) -> None:
    """Print the script's traceback without detaudit's own frames, as python would."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _read_compiled(script: str, data: bytes) -> CodeType:
    """A compiled script (`python script.pyc` runs it): its code object, refused with python's own messages."""
    if data[:4] != importlib.util.MAGIC_NUMBER:
        raise RuntimeError("Bad magic number in .pyc file")
    try:  # the import system's reader of .pyc files (no unmarshalling of our own)
        code = importlib.machinery.SourcelessFileLoader("__main__", script).get_code("__main__")
    except (ImportError, EOFError, ValueError, TypeError):
        code = None
    if code is None:
        raise RuntimeError("Bad code object in .pyc file")
    return code


def _read_source(script: str, data: bytes) -> str:
    """The script's text, decoded as python decodes it; a file that is not Python text raises python's
    own one-line SyntaxError (never tokenize's internals)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # a bad cookie, or bytes that are no text at all (reported below)
        encoding = "utf-8"
        if _decodes(data, encoding):
            raise SyntaxError(exc.msg) from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise SyntaxError(f"Non-UTF-8 code starting with '\\x{data[exc.start]:02x}' in file {script} on line "
                          f"{line}, but no encoding declared; see https://peps.python.org/pep-0263/ for details"
                          if encoding == "utf-8" else f"{exc}") from None


def _decodes(data: bytes, encoding: str) -> bool:
    try:
        data.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def _run_as_main(script: str) -> None:
    """Execute the script as `__main__`, with the module attributes plain python gives it.

    `script` is the path exactly as python would spell `__file__` (absolute, neither normalised
    nor symlink-resolved), so tracebacks and `__file__` read the same as under plain python.
    """
    with open(script, "rb") as fh:
        data = fh.read()
    compiled = script.endswith(".pyc") or data[:2] == importlib.util.MAGIC_NUMBER[:2]  # as python tells them
    code = _read_compiled(script, data) if compiled else compile(_read_source(script, data), script, "exec",
                                                         dont_inherit=True)
    main_module = ModuleType("__main__")
    main_module.__file__ = script
    main_module.__cached__ = None  # type: ignore[attr-defined]
    loader = importlib.machinery.SourcelessFileLoader if compiled else importlib.machinery.SourceFileLoader
    main_module.__loader__ = loader("__main__", script)
    main_module.__spec__ = None
    main_module.__annotations__ = {}
    main_module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main_module
    exec(code, main_module.__dict__)


def _end_with_a_stopped_thread(original: Callable[[Any], None], pid: int) -> Callable[[Any], None]:
    """threading.excepthook: `detaudit watch` stopped the job on a thread of its own (the training's). The thread
    has unwound (its `finally` blocks ran) and the footer is written: the process ends with it, as a stop on the
    main thread ends it, rather than letting the main thread go on unwatched."""
    def excepthook(args: Any) -> None:
        if args.exc_type is not WatchStopped or os.getpid() != pid:
            original(args)
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)

    return excepthook


def _keep_records_at_exit(session: Session) -> None:
    """Records reach the trace however the process ends.

    `os._exit` (no atexit, no finally) is wrapped: the trace is finished with its exit status
    first; `os.execv`/`execve` (and the `exec*` functions built on them) flush first. `os.abort`
    from an exit handler (native state released by hand) finishes the trace with the script's own
    exit status, so the launcher sees a teardown crash after a whole recording; called while the
    script runs, it flushes only, as a fatal signal does. SIGTERM and
    SIGHUP (a timeout, a stop, a closed terminal) flush what was recorded but write no footer, so
    the trace reads as incomplete, then end the process by that signal as python would. Forked
    children (DataLoader workers) exit untouched.
    """
    real_exit = os._exit
    pid = os.getpid()

    def _exit(code: int) -> NoReturn:
        if os.getpid() == pid:
            session.finish(code if isinstance(code, int) else 1, None, ended_by="os._exit")
        real_exit(code)

    def abort_wrapper(real_abort: Callable[[], NoReturn]) -> Callable[[], NoReturn]:
        def _abort() -> NoReturn:
            if os.getpid() == pid:
                if session.outcome is not None:  # the script ended: this is its exit handlers' work
                    session.outcome["ended_by"] = "os.abort"
                    session.close()
                elif session.recorder is not None:
                    session.recorder.flush_safely()
            real_abort()

        return _abort

    def on_signal(signum: int, frame: Any) -> None:
        if os.getpid() == pid and session.recorder is not None:
            session.recorder.flush_safely()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def before_exec(exec_fn: Callable[..., NoReturn]) -> Callable[..., NoReturn]:
        """`os.execv`/`execve` replace the process: flush first (no footer: the new program is not recorded)."""
        def exec_wrapper(*args: Any) -> NoReturn:
            if os.getpid() == pid and session.recorder is not None:
                session.recorder.flush_safely()
            exec_fn(*args)

        return exec_wrapper

    wrap(threading, "excepthook", lambda original: _end_with_a_stopped_thread(original, pid))
    wrap(os, "_exit", lambda real: _exit)
    wrap(os, "abort", abort_wrapper)
    wrap(os, "execv", before_exec)
    wrap(os, "execve", before_exec)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
def _run_module(name: str) -> None:
    """Execute module `name` as `python -m name` would (the pytest plugin runs `python -m pytest`)."""
    runpy.run_module(name, run_name="__main__", alter_sys=True)


def main(argv: list[str]) -> None:
    config_path, script_arg, *script_args = argv
    config = json.loads(Path(config_path).read_text())
    reexec_without_aslr(config.get("pins", []))  # the address-layout pin of --explain
    config["distributed"] = enter_rank(config)  # a torchrun rank: its own trace, stdout and pid file
    script = Path(script_arg).resolve()
    session = Session(config, script)

    module = config.get("module")  # `python -m MODULE`: SCRIPT is the module's file, sys.path[0] the cwd
    sys.argv = [script_arg, *script_args]
    # the launcher's bootstrap left sys.path as the interpreter's own (no working directory): detaudit's
    # imports keep to it, the script gets its directory first, as under plain python
    user_dir = os.getcwd() if module else str(script.parent)
    sys.meta_path.insert(0, OwnImports(sys.path, location.own_code(),
                                       (user_dir, os.path.dirname(os.path.abspath(script_arg))),
                                       (_run_as_main.__code__, _run_module.__code__)))
    if not getattr(sys.flags, "safe_path", False):  # -P / PYTHONSAFEPATH, python 3.11+
        sys.path.insert(0, user_dir)
    found = evidence.install(config)
    after_import = _AfterImport({"torch": session.on_torch_import, **found.import_callbacks()},
                                session.on_import_error)
    after_import.catch_up()
    sys.meta_path.insert(0, after_import)

    _keep_records_at_exit(session)
    # The footer is written by the first exit handler registered, so the last to run (atexit is last in,
    # first out): the script's own handlers, and the threads python joins before them, are recorded.
    atexit.register(session.close)

    try:
        if module:
            _run_module(module)
        else:
            _run_as_main(os.path.join(os.getcwd(), script_arg))
    except (WindowRecorded, BoundReached):
        sys.exit(0)
    except WatchStopped:
        sys.exit(1)
    except SystemExit as exc:
        code = _exit_code(exc)
        session.ended(code, None, exc if code else None)
        raise
    except KeyboardInterrupt as exc:  # as python reports it: the script's frames, exit status 130
        session.ended(130, "KeyboardInterrupt", exc)
        _print_user_traceback(exc)
        sys.exit(130)
    except BaseException as exc:
        summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        session.ended(1, summary, exc)
        _print_user_traceback(exc)
        sys.exit(1)  # a normal exit, as python's: atexit handlers run and buffered stdout is kept
    session.ended(0, None)


if __name__ == "__main__":
    main(sys.argv[1:])
