"""The suite registry: each suite's name, loader, own options and help line (one ``register`` line per suite).

``hardrank.suites`` fills it; ``hardrank.config`` reads it, so the options a suite declares beside its loader
(a frozen dataclass of ``opt(...)`` fields) are flags, job-file keys and keywords like every other option,
and a per-suite value (``--data sugarcrepe=DIR``) can name any registered suite. It imports no loader: it
sits below the config, which sits below the suites.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hardrank.errors import UsageError

__all__ = ["SUITES", "ALIASES", "SuiteSpec", "register", "unregister", "alias", "get", "names", "aliases", "expand",
           "is_suite", "own_fields", "takers", "listing", "describe"]


def _always(own) -> bool:
    return True


@dataclass(frozen=True)
class SuiteSpec:
    """One suite. ``load(tables, opts, name=...)`` (``load(tables, opts, own, name=...)`` when the suite
    declares ``options``) returns a ``Suite`` or a list of them (xm3600: one per language); ``opts`` is the
    ``SuiteOptions`` as this suite sees them (its per-suite values in place of the common ones), ``own`` an
    instance of ``options``. ``options``: the suite's own options, a frozen dataclass of ``opt(...)`` fields
    (several suites may share one class, or derive from one; an option name belongs to the one class declaring
    it). ``help``: one line for
    listings. ``needs_model(own)``: whether the suite, with these options, scores embeddings (a mask suite
    scoring ``--predictions`` does not)."""

    name: str
    load: Callable
    options: type | None = None
    help: str = ""
    needs_model: Callable[[object], bool] = _always

    def __call__(self, tables, opts):
        """Load this suite into ``tables`` with ``opts`` (a ``SuiteOptions``)."""
        mine = opts.for_suite(self.name)
        if self.options is None:
            return self.load(tables, mine, name=self.name)
        return self.load(tables, mine, opts.own_options(self.name), name=self.name)


# read these; change them with register / unregister / alias
SUITES: dict[str, SuiteSpec] = {}          # name -> spec, in registration order (the order of listings)
ALIASES: dict[str, tuple[str, ...]] = {}   # alias -> the suites it stands for (toy -> toy-rococo ...)


def _declarer(cls: type, name: str) -> type:
    """The class in ``cls``'s MRO that declares option ``name`` (options classes may derive from shared ones)."""
    return next(k for k in cls.__mro__ if name in k.__dict__.get("__annotations__", {}))


def register(name: str, load: Callable, options: type | None = None, help: str = "", *,
             needs_model: Callable[[object], bool] = _always) -> SuiteSpec:
    """Add suite ``name`` (see ``SuiteSpec``); returns its spec. A taken name, an options class that is
    no frozen dataclass, or an option name another class already declares is a ValueError."""
    if not name or any(c in name for c in "=, ") or name in SUITES or name in ALIASES:
        raise ValueError(f"suite name {name!r} is empty, holds '=', ',' or a space, or is taken")
    if options is not None:
        if not (dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
            raise ValueError(f"suite {name!r}: options must be a frozen dataclass of opt(...) fields, got {options!r}")
        for f in dataclasses.fields(options):  # one declaration per name: a class it derives from may share it
            other = next((s for s in SUITES.values() if s.options is not None
                          and f.name in {g.name for g in dataclasses.fields(s.options)}
                          and _declarer(s.options, f.name) is not _declarer(options, f.name)), None)
            if other is not None:
                raise ValueError(f"suite {name!r}: option {f.name!r} is declared already by suite {other.name!r} "
                                 f"({other.options.__name__}); share that class or pick another name")
    spec = SuiteSpec(name, load, options, help, needs_model)
    SUITES[name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove suite ``name`` (and it from every alias)."""
    del SUITES[name]
    for a, members in list(ALIASES.items()):
        ALIASES[a] = tuple(m for m in members if m != name)


def alias(name: str, members: Iterable[str]) -> None:
    """``name`` stands for the registered suites ``members`` (``--suite toy``)."""
    members = tuple(members)
    unknown = [m for m in members if m not in SUITES]
    if name in SUITES or name in ALIASES or unknown:
        raise ValueError(f"alias {name!r} is taken, or names unregistered suites {unknown}")
    ALIASES[name] = members


def names() -> list[str]:
    """The registered suites, in registration order."""
    return list(SUITES)


def aliases() -> dict[str, tuple[str, ...]]:
    return dict(ALIASES)


def is_suite(name: str) -> bool:
    """Whether ``name`` is a registered suite or alias (what a per-suite key may name)."""
    return name in SUITES or name in ALIASES


def get(name: str) -> SuiteSpec:
    if name not in SUITES:
        raise UsageError(_unknown(name))
    return SUITES[name]


def _unknown(name: str) -> str:
    known = [*SUITES, *ALIASES]
    hint = difflib.get_close_matches(name, known, n=1)
    return (f"unknown suite {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; choose from {', '.join(sorted(known))}")


def expand(names_: Iterable[str]) -> list[str]:
    """Suite names with aliases replaced by their members, each once, in order; an unknown name is a
    UsageError listing the suites."""
    out = []
    for n in names_:
        if n not in SUITES and n not in ALIASES:
            raise UsageError(_unknown(n))
        for m in ALIASES.get(n, (n,)):
            if m not in out:
                out.append(m)
    return out


def own_fields() -> dict[str, tuple[dataclasses.Field, type, tuple[str, ...]]]:
    """Every option a suite declares: name -> (its field, the options class, the suites taking it)."""
    out: dict[str, tuple[dataclasses.Field, type, tuple[str, ...]]] = {}
    for spec in SUITES.values():
        if spec.options is None:
            continue
        for f in dataclasses.fields(spec.options):
            field_, cls, takers_ = out.get(f.name, (f, spec.options, ()))
            out[f.name] = (field_, cls, (*takers_, spec.name))
    return out


def takers(option: str) -> tuple[str, ...]:
    """The suites that take the suite option ``option`` (empty: none declares it)."""
    return own_fields().get(option, (None, None, ()))[2]


def listing() -> str:
    """The registry's names for help texts: aliases first with what they stand for, then every suite."""
    return ", ".join([*(f"{a} (= {' + '.join(m)})" for a, m in ALIASES.items()), *SUITES])


def describe() -> str:
    """One line per suite for help texts: its name and help line, its own options' flags."""
    width = max((len(n) for n in SUITES), default=0)
    lines = []
    for spec in SUITES.values():
        flags = [f.metadata.get("flag") or "--" + f.name.replace("_", "-")
                 for f in (dataclasses.fields(spec.options) if spec.options is not None else ())]
        lines.append(f"  {spec.name:<{width}}  {spec.help}")
        if flags:
            lines.append(f"  {'':<{width}}    its own options: {' '.join(flags)}")
    lines += [f"  {a:<{width}}  = {' + '.join(m)}" for a, m in ALIASES.items()]
    return "\n".join(lines)
