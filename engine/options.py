"""Options declared once: ``opt`` (a config field with its help and checks) and the checks every options class runs.

Here, below every room that declares options, so a room's own frozen dataclass of ``opt(...)`` fields (a suite's,
a scorer's) imports nothing above it; ``hardrank.config`` re-exports both.
"""
from __future__ import annotations

import dataclasses
from dataclasses import field

from hardrank.errors import UsageError

__all__ = ["opt", "check_options", "option_label"]


def opt(default, help: str, *, choices=None, minimum=None, check=None, path: bool = False, flag: str | None = None,
        metavar: str | None = None, cli: bool = True, positional: bool = False, listing: str | None = None,
        repeat: bool = False, per_suite: bool = False, fetch: bool = False):
    """A config field: its default and its one help text; ``choices``/``minimum`` are checked on construction, then
    ``check(value, what)`` (a set value only; ``what`` names the option), which raises UsageError for a value out of
    range (thread counts: ``hardrank.cpus.check_threads``); ``path`` values in job files are relative to the file;
    ``flag`` overrides the ``--name`` on the command line; ``positional`` makes it a positional argument there
    (shown as ``metavar``); ``cli=False`` keeps it off the command line; ``listing`` names a registry whose names
    the command line's help lists after the help text (``suites``: the suite registry); ``repeat``: a list option
    whose flag may be given several times, each adding its values; ``per_suite`` (a suite option) also takes a value
    per suite, ``SUITE=VALUE`` or ``{suite: value}``; ``fetch``: a URL given is read from a local copy
    (``urls.fetch_input``), not in place."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum, "check": check,
                                            "path": path, "flag": flag, "metavar": metavar, "cli": cli,
                                            "positional": positional, "listing": listing, "repeat": repeat,
                                            "per_suite": per_suite, "fetch": fetch})


# -- validation shared by every options dataclass --------------------------------------------------
def option_label(f: dataclasses.Field) -> str:
    """How messages name an option: its key and its command-line flag (or positional argument)."""
    if f.metadata.get("positional"):
        return f"{f.name} ({f.metadata.get('metavar') or f.name.upper()})"
    return f"{f.name} ({f.metadata.get('flag') or '--' + f.name.replace('_', '-')})"


def check_options(obj) -> None:
    """Check each field against its ``choices``, ``minimum`` and ``check`` (UsageError naming the option)."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        choices, minimum = f.metadata.get("choices"), f.metadata.get("minimum")
        if choices is not None and isinstance(v, tuple):  # a list option: each of its values
            bad = [x for x in v if x not in choices]
            if bad:
                raise UsageError(f"option {option_label(f)} takes values of {list(choices)}, got {bad[0]!r}")
        elif choices is not None and v is not None and v not in choices:
            raise UsageError(f"option {option_label(f)} must be one of {list(choices)}, got {v!r}")
        if minimum is not None and isinstance(v, tuple):  # a list option: each of its values
            bad = [x for x in v if isinstance(x, bool) or not isinstance(x, (int, float)) or x < minimum]
            if bad:
                raise UsageError(f"option {option_label(f)} takes numbers >= {minimum}, got {bad[0]!r}")
        elif minimum is not None and v is not None and not (isinstance(v, (int, float)) and v >= minimum):
            raise UsageError(f"option {option_label(f)} must be a number >= {minimum}, got {v!r}")
        if f.metadata.get("check") is not None and v is not None:
            f.metadata["check"](v, f"option {option_label(f)}")
