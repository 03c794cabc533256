"""detaudit's exceptions and the exit code each one maps to (the CLI is the only place that exits)."""

from __future__ import annotations

EXIT_DETERMINISTIC = 0
EXIT_DIVERGENT = 1
EXIT_USAGE = 2
EXIT_SCRIPT_FAILED = 3
EXIT_BAD_TRACE = 4
EXIT_TIMEOUT = 5
EXIT_INCONCLUSIVE = 6  # nothing comparable was recorded (lost, cut short, or no tensor at all)
EXIT_OUTPUT = 7  # an output (run directory, --json, --junit) cannot be written: read-only, full, no permission
EXIT_INTERNAL = 70
EXIT_SIGHUP = 129  # 128 + the signal, as shells report a process ended by it
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT)
EXIT_SIGTERM = 143


class DetauditError(Exception):
    """A failure we can explain in one paragraph; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_USAGE


class UsageError(DetauditError):
    exit_code = EXIT_USAGE


class TraceError(DetauditError):
    """A trace or run directory that is unreadable, corrupt, foreign or from an unknown version."""

    exit_code = EXIT_BAD_TRACE


class OutputError(DetauditError):
    """Something detaudit must write cannot be written (EROFS, ENOSPC, EACCES...): one line, its own code."""

    exit_code = EXIT_OUTPUT


def output_error(path: object, exc: OSError) -> OutputError:
    """The one-line message for an OSError met while writing `path`."""
    import errno

    name = errno.errorcode.get(exc.errno or 0, "")
    why = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
    return OutputError(f"cannot write {path}: {why}")
