"""detaudit's exceptions and the exit code each one maps to (the CLI is the only place that exits)."""

from __future__ import annotations

EXIT_DETERMINISTIC = 0
EXIT_DIVERGENT = 1
EXIT_USAGE = 2
EXIT_SCRIPT_FAILED = 3
EXIT_BAD_TRACE = 4
EXIT_TIMEOUT = 5
EXIT_INTERRUPTED = 130


class DetauditError(Exception):
    """A failure we can explain in one paragraph; `exit_code` is what the CLI exits with."""

    exit_code = EXIT_USAGE


class UsageError(DetauditError):
    exit_code = EXIT_USAGE


class TraceError(DetauditError):
    """A trace or run directory that is unreadable, corrupt, foreign or from an unknown version."""

    exit_code = EXIT_BAD_TRACE
