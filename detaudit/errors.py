"""detaudit's exceptions and the exit code each one maps to (the CLI is the only place that exits)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Every status the CLI exits with, and what it means: the one source of `--help`'s table (cli/commands.py)
    and of the tables in README and docs (tests/test_errors.py checks they agree)."""

    meaning: str

    def __new__(cls, value: int, meaning: str) -> ExitCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    DETERMINISTIC = 0, "deterministic: every repeat agrees"
    DIVERGENT = 1, "divergent (including repeats that end differently), or different from --baseline"
    USAGE = 2, "usage error (bad option, missing script, --out not empty)"
    SCRIPT_FAILED = 3, "the script failed in every repeat"
    BAD_TRACE = 4, "unreadable, corrupt or foreign trace / run directory / baseline"
    TIMEOUT = 5, "a repeat timed out"
    INCONCLUSIVE = 6, "inconclusive: nothing comparable was recorded (lost, cut short, no tensor)"
    OUTPUT = 7, "an output cannot be written (read-only, disk full, no permission)"
    NO_CHECKPOINT = 8, "resume: no checkpoint saved by --stop-at, or none loaded by the resumed run"
    UNCONTROLLED = 9, "fix: no knob controls the divergence (the clock, the pid, the environment, the script's code)"
    INTERNAL = 70, "internal error: a bug in detaudit (DETAUDIT_DEBUG=1 shows its traceback)"
    SIGHUP = 129, "interrupted by SIGHUP (128 + the signal, as shells report it)"
    INTERRUPTED = 130, "interrupted by Ctrl-C (SIGINT)"
    SIGTERM = 143, "interrupted by SIGTERM"


class DetauditError(Exception):
    """A failure we can explain in one paragraph; `exit_code` is what the CLI exits with."""

    exit_code = ExitCode.USAGE


class UsageError(DetauditError):
    exit_code = ExitCode.USAGE


class TraceError(DetauditError):
    """A trace or run directory that is unreadable, corrupt, foreign or from an unknown version."""

    exit_code = ExitCode.BAD_TRACE


class Inconclusive(DetauditError):
    """Nothing comparable was recorded where the user pointed: the data is intact, but lies elsewhere."""

    exit_code = ExitCode.INCONCLUSIVE


class ScriptFailed(DetauditError):
    """A run that a command needs whole failed (`detaudit resume`'s interrupted or resumed run)."""

    exit_code = ExitCode.SCRIPT_FAILED


class NoCheckpoint(DetauditError):
    """`detaudit resume`: the interrupted run saved nothing by --stop-at, or the resumed run loaded nothing."""

    exit_code = ExitCode.NO_CHECKPOINT


class OutputError(DetauditError):
    """Something detaudit must write cannot be written (EROFS, ENOSPC, EACCES...): one line, its own code."""

    exit_code = ExitCode.OUTPUT


def output_error(path: object, exc: OSError) -> OutputError:
    """The one-line message for an OSError met while writing `path`."""
    import errno

    name = errno.errorcode.get(exc.errno or 0, "")
    why = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    return OutputError(f"cannot write {path}: {why}")
