"""The suite registry: each suite's name, loader, own options and help line (one ``register`` line per suite).

``hardrank.suites`` fills it; ``hardrank.config`` reads it, so the options a suite declares beside its loader
(a frozen dataclass of ``opt(...)`` fields) are flags, job-file keys and keywords like every other option,
and a per-suite value (``--data sugarcrepe=DIR``) can name any registered suite. It imports no loader: it
sits below the config, which sits below the suites.

A **family** is one ``register`` line (``match=``) standing for every name its pattern accepts (``wds/<name>``:
CLIP_benchmark's dataset names); each name becomes a suite of its own the first time it is named (``get``), with
the family's loader and options. An **alias** stands for several suites (``toy``); a collection's members may
depend on the run's options (``datacomp``: the task list ``--tasklist`` names), given as a function of them.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hardrank.errors import UsageError

__all__ = ["SUITES", "ALIASES", "FAMILIES", "SuiteSpec", "register", "unregister", "alias", "get", "names", "aliases",
           "expand", "is_suite", "takes", "own_fields", "takers", "listing", "describe", "result_stem"]


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
    match: Callable[[str], bool] | None = None  # a family: the names it stands for (``name`` is its listing)
    examples: tuple[str, ...] = ()  # a family's names to suggest for a mistyped one

    def __call__(self, tables, opts):
        """Load this suite into ``tables`` with ``opts`` (a ``SuiteOptions``)."""
        mine = opts.for_suite(self.name)
        if self.options is None:
            return self.load(tables, mine, name=self.name)
        return self.load(tables, mine, opts.own_options(self.name), name=self.name)


# read these; change them with register / unregister / alias
SUITES: dict[str, SuiteSpec] = {}          # name -> spec, in registration order (the order of listings)
ALIASES: dict[str, tuple[str, ...] | Callable] = {}  # alias -> the suites it stands for (toy -> toy-rococo ...),
#                                            or a function of the run's suite options giving them (aliases())
FAMILIES: dict[str, SuiteSpec] = {}        # family listing name (wds/<name>) -> its spec (with ``match``)
_MADE: dict[str, SuiteSpec] = {}           # names a family stood for, made on first use


def _declarer(cls: type, name: str) -> type:
    """The class in ``cls``'s MRO that declares option ``name`` (options classes may derive from shared ones)."""
    return next(k for k in cls.__mro__ if name in k.__dict__.get("__annotations__", {}))


def register(name: str, load: Callable, options: type | None = None, help: str = "", *,
             needs_model: Callable[[object], bool] = _always, match: Callable[[str], bool] | None = None,
             examples: Iterable[str] = ()) -> SuiteSpec:
    """Add suite ``name`` (see ``SuiteSpec``); returns its spec. With ``match``, a family: every name
    ``match(name)`` accepts (and no registered suite or alias holds) is a suite of its own, loaded by ``load`` with
    its own name, ``name`` being the family's listing (``wds/<name>``; ``examples``: names it suggests for a
    mistyped one). A taken name, an options class that is
    no frozen dataclass, or an option name another class already declares is a ValueError."""
    if not name or any(c in name for c in "=, ") or name in SUITES or name in ALIASES or name in FAMILIES:
        raise ValueError(f"suite name {name!r} is empty, holds '=', ',' or a space, or is taken")
    if options is not None:
        if not (dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen):
            raise ValueError(f"suite {name!r}: options must be a frozen dataclass of opt(...) fields, got {options!r}")
        for f in dataclasses.fields(options):  # one declaration per name: a class it derives from may share it
            other = next((s for s in (*SUITES.values(), *FAMILIES.values()) if s.options is not None
                          and f.name in {g.name for g in dataclasses.fields(s.options)}
                          and _declarer(s.options, f.name) is not _declarer(options, f.name)), None)
            if other is not None:
                raise ValueError(f"suite {name!r}: option {f.name!r} is declared already by suite {other.name!r} "
                                 f"({other.options.__name__}); share that class or pick another name")
    spec = SuiteSpec(name, load, options, help, needs_model, match, tuple(sorted(examples)))
    (FAMILIES if match is not None else SUITES)[name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove suite (or family) ``name`` (and it from every alias; a family's members with it)."""
    if name in FAMILIES:
        family = FAMILIES.pop(name)
        for made in [m for m, s in _MADE.items() if s.load is family.load and s.options is family.options]:
            del _MADE[made]
        return
    del SUITES[name]
    for a, members in list(ALIASES.items()):
        if not callable(members):
            ALIASES[a] = tuple(m for m in members if m != name)


def alias(name: str, members: Iterable[str] | Callable) -> None:
    """``name`` stands for the suites ``members`` (``--suite toy``): registered ones or names a family stands for;
    or a function ``members(opts)`` of the run's suite options (None: the defaults) giving them, checked when
    expanded (a collection whose task list is an option)."""
    if not callable(members):
        members = tuple(members)
        unknown = [m for m in members if not (m in SUITES or _family(m) is not None)]
    else:
        unknown = []
    if name in SUITES or name in ALIASES or name in FAMILIES or unknown:
        raise ValueError(f"alias {name!r} is taken, or names unregistered suites {unknown}")
    ALIASES[name] = members


def names() -> list[str]:
    """The registered suites, in registration order."""
    return list(SUITES)


def _members(name: str, opts) -> tuple[str, ...]:
    members = ALIASES[name]
    return tuple(members(opts)) if callable(members) else members


def aliases(opts=None) -> dict[str, tuple[str, ...]]:
    """Each alias and the suites it stands for, with the run's suite options ``opts`` (None: the defaults)."""
    return {a: _members(a, opts) for a in ALIASES}


def _family(name: str) -> SuiteSpec | None:
    """The family standing for ``name`` (not a registered suite, alias or family listing), if any."""
    if not isinstance(name, str) or name in SUITES or name in ALIASES or name in FAMILIES:
        return None
    return next((f for f in FAMILIES.values() if f.match(name)), None)


def is_suite(name: str) -> bool:
    """Whether ``name`` is a registered suite or alias, or a name a family stands for (what a per-suite key may
    name)."""
    return name in SUITES or name in ALIASES or _family(name) is not None


def get(name: str) -> SuiteSpec:
    """The spec of suite ``name``; a name a family stands for gets its own (made once)."""
    if name in SUITES:
        return SUITES[name]
    if name in _MADE:
        return _MADE[name]
    family = _family(name)
    if family is None:
        raise UsageError(_unknown(name))
    _MADE[name] = dataclasses.replace(family, name=name, match=None, examples=())
    return _MADE[name]


def takes(name: str, option: str) -> bool:
    """Whether suite ``name`` declares option ``option`` as its own."""
    options = get(name).options
    return options is not None and option in {f.name for f in dataclasses.fields(options)}


def result_stem(name: str) -> str:
    """The file stem of suite ``name``'s results (``<checkpoint>/<stem>.json``): the name, '/' as '_'
    (``wds/vtab/cifar10`` -> ``wds_vtab_cifar10``, as CLIP_benchmark slugs dataset names)."""
    return name.replace("/", "_")


def _unknown(name: str) -> str:
    known = [*SUITES, *ALIASES, *FAMILIES]
    hint = difflib.get_close_matches(name, [*known, *(e for f in FAMILIES.values() for e in f.examples)], n=1)
    return (f"unknown suite {name!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; choose from {', '.join(sorted(known))}")


def expand(names_: Iterable[str], opts=None) -> list[str]:
    """Suite names with aliases replaced by their members (with the run's suite options ``opts``; None: the
    defaults), each once, in order; an unknown name is a UsageError listing the suites."""
    out = []
    for n in names_:
        if not is_suite(n):
            raise UsageError(_unknown(n))
        for m in (_members(n, opts) if n in ALIASES else (n,)):
            if not is_suite(m):
                raise UsageError(f"{n}: {_unknown(m)}")
            get(m)  # a family's member gets its spec now: its own options count as taken (own_fields)
            if m not in out:
                out.append(m)
    return out


def own_fields() -> dict[str, tuple[dataclasses.Field, type, tuple[str, ...]]]:
    """Every option a suite declares: name -> (its field, the options class, the suites taking it: the registered
    ones, the families' listings and the family members named so far)."""
    out: dict[str, tuple[dataclasses.Field, type, tuple[str, ...]]] = {}
    for spec in (*SUITES.values(), *FAMILIES.values(), *_MADE.values()):
        if spec.options is None:
            continue
        for f in dataclasses.fields(spec.options):
            field_, cls, takers_ = out.get(f.name, (f, spec.options, ()))
            out[f.name] = (field_, cls, (*takers_, spec.name))
    return out


def takers(option: str) -> tuple[str, ...]:
    """The suites that take the suite option ``option`` (empty: none declares it)."""
    return own_fields().get(option, (None, None, ()))[2]


def _stands_for(members) -> str:
    """What an alias stands for, in a listing: its members (a few), their count, or that options choose them."""
    if callable(members):
        return members.__doc__.strip().splitlines()[0] if members.__doc__ else "chosen by the options"
    return " + ".join(members) if len(members) <= 4 else f"{len(members)} suites: {', '.join(members[:3])}, ..."


def listing() -> str:
    """The registry's names for help texts: aliases first with what they stand for, then every suite and family."""
    return ", ".join([*(f"{a} (= {_stands_for(m)})" for a, m in ALIASES.items()), *SUITES, *FAMILIES])


def describe() -> str:
    """One line per suite (and family) for help texts: its name and help line, its own options' flags."""
    width = max((len(n) for n in [*SUITES, *FAMILIES]), default=0)
    lines = []
    for spec in (*SUITES.values(), *FAMILIES.values()):
        flags = [f.metadata.get("flag") or "--" + f.name.replace("_", "-")
                 for f in (dataclasses.fields(spec.options) if spec.options is not None else ())]
        lines.append(f"  {spec.name:<{width}}  {spec.help}")
        if flags:
            lines.append(f"  {'':<{width}}    its own options: {' '.join(flags)}")
    lines += [f"  {a:<{width}}  = {_stands_for(m)}" for a, m in ALIASES.items()]
    return "\n".join(lines)
