"""hardrank's errors and the one map from an error to the command line's exit code."""
from __future__ import annotations

import errno

__all__ = ["HardrankError", "UsageError", "DataError", "TooManyFailures", "NoSpace", "MissingExtra", "Terminated",
           "exit_code", "INPUT_FILE_ERRORS", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_DATA", "EXIT_FAILURES",
           "EXIT_NO_SPACE", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "EXIT_CODES_HELP"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DATA, EXIT_FAILURES, EXIT_NO_SPACE = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as shells report it
EXIT_TERMINATED = 143   # SIGTERM (128 + 15, as shells report it): Slurm, Kubernetes and systemd stopping a job
EXIT_CODES_HELP = ("exit codes: 0 ok, 2 usage (bad flags, options or job file), 3 bad data (missing or malformed "
                   "files), 4 too many unreadable images (--max-failures), 5 no space left (disk full or quota; "
                   "finished work is kept), 1 anything else (a bug, a missing extra), 130 interrupted (Ctrl-C), "
                   "143 terminated (SIGTERM); after 5, 130 and 143 the same command resumes")


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


class NoSpace(HardrankError, OSError):
    """A write found no space left (ENOSPC) or the quota spent (EDQUOT); names the file and the space it
    needed. What was committed before stays whole (writes are atomic), so a rerun resumes."""

    exit_code = EXIT_NO_SPACE
    __str__ = Exception.__str__  # the message; OSError's would print "[Errno 28] ..." once errno is set


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt (a subclass: every cleanup that
    runs on Ctrl-C, such as flushing encoded embeddings to the store, runs on SIGTERM too)."""


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
    (1), not bad data; a full disk is 5: where the user can act, hardrank raises UsageError or DataError."""
    if isinstance(exc, HardrankError):
        return exc.exit_code
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # a write not named by NoSpace
        return EXIT_NO_SPACE
    if isinstance(exc, INPUT_FILE_ERRORS):
        return EXIT_DATA
    return EXIT_ERROR
