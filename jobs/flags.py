"""argparse flags made from the config dataclasses, so every option is defined once (hardrank.config)."""
from __future__ import annotations

import argparse
import dataclasses
import glob
import typing

from hardrank.config import build, flat_fields, option_kind

__all__ = ["add_options", "options_from_args", "expand_globs", "Formatter"]


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's example lines as written."""


_GROUPS = {"SuiteOptions": "suite inputs", "EmbedOptions": "embedding (model runs, store, executor)",
           "MineOptions": "mining"}


def add_options(parser: argparse.ArgumentParser, cls, *, skip=(), required=()) -> None:
    """One flag per option of ``cls`` (nested options flattened, each nested dataclass under its
    own heading): ``--batch-size`` for ``batch_size``, its type, choices and help from the field;
    lists take several values."""
    groups: dict[str, argparse._ActionsContainer] = {}
    for owner, name, f, tp in _owned_fields(cls):
        if name in skip or not f.metadata.get("cli", True):
            continue
        title = _GROUPS.get(owner.__name__)
        target = parser if title is None else groups.setdefault(title, parser.add_argument_group(title))
        scalar, is_list, _ = option_kind(tp)
        flag = f.metadata.get("flag") or "--" + name.replace("_", "-")
        default = f.default
        help_text = f.metadata.get("help", "")
        if default not in (None, (), "", (None,)) and name not in required:
            shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
            help_text += f" (default: {shown})"
        kw = {"dest": name, "help": help_text,
              "metavar": f.metadata.get("metavar") or flag.lstrip("-").replace("-", "_").upper(),
              "default": None if default in ((None,), ()) else (list(default) if is_list and default else default)}
        if scalar is bool:
            kw["action"] = argparse.BooleanOptionalAction
            kw.pop("metavar")
        else:
            kw["type"] = scalar if scalar in (int, float) else str
            if f.metadata.get("choices"):
                kw["choices"] = list(f.metadata["choices"])
                kw.pop("metavar")
            if is_list:
                kw["nargs"] = "+" if name in required or default not in ((), None) else "*"
        if name in required:
            kw["required"] = True
        flags = [flag] if not flag.startswith("-") or flag.startswith("--") else [flag, "--" + name.replace("_", "-")]
        target.add_argument(*flags, **kw)


def _owned_fields(cls):
    """(owning dataclass, name, field, type) of every option, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _owned_fields(hints[f.name])
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
