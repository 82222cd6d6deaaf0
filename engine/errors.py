"""hardrank's errors and the one map from an error to the command line's exit code."""
from __future__ import annotations

__all__ = ["HardrankError", "UsageError", "DataError", "TooManyFailures", "MissingExtra", "exit_code",
           "INPUT_FILE_ERRORS", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_DATA", "EXIT_FAILURES",
           "EXIT_INTERRUPTED", "EXIT_CODES_HELP"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DATA, EXIT_FAILURES = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it
EXIT_CODES_HELP = ("exit codes: 0 ok, 2 usage (bad flags, options or job file), 3 bad data (missing or malformed "
                   "files), 4 too many unreadable images (--max-failures), 1 anything else (a bug, a missing extra), "
                   "130 interrupted (Ctrl-C; finished work is kept)")


class HardrankError(Exception):
    """Base of hardrank's own errors; ``exit_code`` is what the command line returns for it."""

    exit_code = EXIT_ERROR


class UsageError(HardrankError, ValueError):
    """An option, flag or job-file value is invalid (names the option, what it got, what it takes)."""

    exit_code = EXIT_USAGE


class DataError(HardrankError, ValueError):
    """An input file is missing or malformed (names the file, the item and the fix)."""

    exit_code = EXIT_DATA


class TooManyFailures(HardrankError, RuntimeError):
    """More images could not be read than ``max_failures`` allows; finished work stays in the store."""

    exit_code = EXIT_FAILURES


class MissingExtra(HardrankError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    exit_code = EXIT_ERROR

    def __init__(self, what: str, extra: str, module: str):
        super().__init__(f"{what} needs the optional package {module!r}, which is not installed; "
                         f"install it with: pip install 'hardrank[{extra}]'")
        self.extra, self.module = extra, module


# Python's own errors about an input path (missing, a file where a folder is expected or the reverse, not
# readable) are bad data. Outputs never get here: --out and --store are checked up front (UsageError).
INPUT_FILE_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def exit_code(exc: BaseException) -> int:
    """The exit code for an error that reached the command line: a HardrankError's own, 3 for Python's
    errors about an input path (``INPUT_FILE_ERRORS``), else 1. A plain ValueError or KeyError is a bug
    (1), not bad data: where the user can act, hardrank raises UsageError or DataError."""
    if isinstance(exc, HardrankError):
        return exc.exit_code
    if isinstance(exc, INPUT_FILE_ERRORS):
        return EXIT_DATA
    return EXIT_ERROR
