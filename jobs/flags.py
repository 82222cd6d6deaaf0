"""argparse flags made from the config dataclasses, so every option is defined once (hardrank.config)."""
from __future__ import annotations

import argparse
import dataclasses
import glob
import typing

import hardrank.suites  # noqa: F401  (registers the suites: their own options are flags too)
from hardrank import suite_registry
from hardrank.config import build, flat_fields, option_kind
from hardrank.jobs.commands import CLI_FLAGS, Formatter, add_cli_flags  # the front page's, shared
from hardrank.models.spec import forms_help

__all__ = ["add_options", "add_cli_flags", "options_from_args", "expand_globs", "Formatter", "CLI_FLAGS",
           "CONFIG_CLASS"]

# the parser default naming a command's config dataclass (tests walk the parsers with it)
CONFIG_CLASS = "config_class"


_GROUPS = {"SuiteOptions": "suite inputs", "EmbedOptions": "embedding (model runs, store, executor)",
           "MineOptions": "mining", "ProbeOptions": "linear probe (suite linear_probe)"}


_LISTINGS = {"suites": suite_registry.listing, "models": forms_help}  # opt(listing=...) -> what the help lists


def add_options(parser: argparse.ArgumentParser, cls, *, skip=(), only=None, required=(), help=None,
                positional=()) -> None:
    """One flag per option of ``cls``, the command's config dataclass (nested options flattened, each
    nested dataclass under its own heading): ``--batch-size`` for ``batch_size``, its type, choices
    and help from the field; lists take several values. A command that takes some of a shared
    config's options names them in ``only`` (an allow-list: options added to the config later stay
    off it) or the few it lacks in ``skip``; ``help`` rewords an option's help for this command (one
    that mentions flags the command lacks), ``positional`` shows options as positional arguments.
    Records ``cls`` as the parser's ``config_class`` default."""
    if parser.get_default(CONFIG_CLASS) is not None:
        raise ValueError(f"parser {parser.prog!r} already takes {parser.get_default(CONFIG_CLASS).__name__}")
    parser.set_defaults(**{CONFIG_CLASS: cls})
    known = {name for name, _, _ in flat_fields(cls)}
    unknown = (set(skip) | set(only or ()) | set(required) | set(help or ()) | set(positional)) - known
    if unknown:
        raise ValueError(f"{cls.__name__} has no options {sorted(unknown)}")
    groups: dict[str, argparse._ActionsContainer] = {}
    own = suite_registry.own_fields()
    for owner, name, f, tp in _owned_fields(cls):
        if name in skip or (only is not None and name not in only) or not f.metadata.get("cli", True):
            continue
        title = _GROUPS.get(owner.__name__)
        if name in own and own[name][1] is owner:  # a suite's own option: under that suite's heading
            title = f"suite {', '.join(own[name][2])}" if len(own[name][2]) == 1 else \
                f"suites {', '.join(own[name][2])}"
        target = parser if title is None else groups.setdefault(title, parser.add_argument_group(title))
        scalar, is_list, _ = option_kind(tp)
        flag = f.metadata.get("flag") or "--" + name.replace("_", "-")
        default = None if f.default is dataclasses.MISSING else f.default
        help_text = (help or {}).get(name, f.metadata.get("help", ""))
        if f.metadata.get("listing") and name not in (help or {}):  # a command's own wording replaces it all
            help_text += ": " + _LISTINGS[f.metadata["listing"]]()
        if default not in (None, (), "", (None,)) and name not in required:
            shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
            help_text += f" (default: {shown})"
        kw = {"dest": name, "help": help_text,
              "metavar": f.metadata.get("metavar") or flag.lstrip("-").replace("-", "_").upper(),
              "default": None if default in ((None,), ()) else (list(default) if is_list and default else default)}
        if name in own:  # given or not, never a default: a suite's option given with other suites is refused
            kw["default"] = None
        if scalar is bool:
            kw["action"] = argparse.BooleanOptionalAction
            kw.pop("metavar")
        elif f.metadata.get("per_suite"):  # DIR, SUITE=DIR ..., repeatable
            kw.update(type=str, nargs="+", action="extend")
        else:
            kw["type"] = scalar if scalar in (int, float) else str
            if f.metadata.get("choices"):
                kw["choices"] = list(f.metadata["choices"])
                kw.pop("metavar")
            if is_list:
                kw["nargs"] = "+" if name in required or default not in ((), None) else "*"
                if f.metadata.get("repeat"):  # --log-to a --log-to b: both (the default must be empty)
                    kw["action"], kw["nargs"] = "extend", "+"
        if f.metadata.get("positional") or name in positional:
            kw.pop("dest")  # argparse names a positional's destination by its first argument
            kw.setdefault("metavar", f.metadata.get("metavar") or name.upper())
            if name not in required and not is_list:
                kw["nargs"] = "?"
            target.add_argument(name, **kw)
            continue
        if name in required:
            kw["required"] = True
        flags = [flag] if flag.startswith("--") else [flag, "--" + name.replace("_", "-")]
        target.add_argument(*flags, **kw)


def _owned_fields(cls):
    """(owning dataclass, name, field, type) of every option, nested dataclasses flattened (a suite's own
    options owned by the class it declared them in)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _owned_fields(hints[f.name])
        elif f.metadata.get("declared_by") == "suites":
            for name, (fld, owner, _) in suite_registry.own_fields().items():
                yield owner, name, fld, typing.get_type_hints(owner)[name]
        else:
            yield cls, f.name, f, hints[f.name]


def options_from_args(cls, args: argparse.Namespace, **values):
    """``cls`` from the flags the user gave (a flag left out keeps the field's default), plus
    ``values`` (which win)."""
    given = {name: getattr(args, name) for name, _, _ in flat_fields(cls)
             if getattr(args, name, None) is not None}
    return build(cls, {**given, **values})


def expand_globs(patterns) -> tuple:
    """Checkpoint patterns expanded (sorted); a pattern matching nothing stays as given, so the
    error names the missing file. No patterns: ``(None,)`` (the model's random init)."""
    if not patterns:
        return (None,)
    out = []
    for it in patterns:
        out.extend(sorted(glob.glob(it)) or [it])
    return tuple(out)
