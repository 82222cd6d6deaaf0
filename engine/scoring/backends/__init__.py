"""Search backends behind one registry: ``--search`` parsing, its help, the dispatch of ranks and top-k, provenance.

A backend is one module of this package (a ``base.Backend`` subclass: its name, how its spec parses, the
operations it serves) plus one entry in ``_BUILTIN`` below; ``register`` adds one at run time. Everything
that knows the backends asks here: ``hardrank.config`` (parsing and validating ``--search``, its help),
``scoring.rank.score_ranking`` (evaluation) and ``mining.searcher`` (mining). The sharded placement
(``backends.sharded``) wraps the named backend when the executor splits the work over actors.
"""
from __future__ import annotations

from hardrank.errors import UsageError
from hardrank.scoring.backends import auto, exhaustive, faiss
from hardrank.scoring.backends.base import OPS, RANKS, TOPK, Backend, SearchSpec

__all__ = ["Backend", "SearchSpec", "OPS", "RANKS", "TOPK", "register", "unregister", "get", "registered", "parse",
           "search_help", "grouped_ranks", "searcher", "describe"]

_BUILTIN = (exhaustive.Exhaustive(), faiss.Faiss(), auto.Auto())  # the order of --help and error listings

_BACKENDS: dict[str, Backend] = {}  # name -> backend, in registration order
_WORDS: dict[str, Backend] = {}     # every name and alias -> its backend


def register(backend: Backend) -> Backend:
    """Add ``backend`` under its name and aliases; returns it. A word already taken is a UsageError."""
    if not isinstance(backend, Backend) or not backend.name:
        raise TypeError(f"a search backend is a hardrank.scoring.backends.Backend with a name, got {backend!r}")
    bad = [op for op in backend.ops if op not in OPS]
    if bad:
        raise ValueError(f"search backend {backend.name!r} declares unknown operations {bad}; known: {list(OPS)}")
    for word in backend.words:
        if not word or ":" in word or word in _WORDS:
            raise UsageError(f"search backend {backend.name!r}: the word {word!r} is empty, holds a colon or is "
                             f"taken (registered: {', '.join(_WORDS)}); pick another name")
    _BACKENDS[backend.name] = backend
    _WORDS.update(dict.fromkeys(backend.words, backend))
    return backend


def unregister(name: str) -> None:
    """Remove the backend registered as ``name`` (its aliases too)."""
    backend = _BACKENDS.pop(name)
    for word in backend.words:
        del _WORDS[word]


def registered(op: str | None = None) -> list[Backend]:
    """The registered backends, those serving ``op`` (``RANKS`` or ``TOPK``) when given."""
    return [b for b in _BACKENDS.values() if op is None or op in b.ops]


def get(spec: SearchSpec | str) -> Backend:
    """The backend a spec (or a bare name) names."""
    word = spec.method if isinstance(spec, SearchSpec) else spec.partition(":")[0]
    if word not in _WORDS:
        raise UsageError(f"search {str(spec)!r} names no search backend; {_choices(None)}")
    return _WORDS[word]


def _choices(op: str | None) -> str:
    """'search must be ...' listing the backends serving ``op``, with how to write their arguments."""
    words = [w for b in registered(op) for w in ((b.syntax,) if b.syntax else b.words)]
    listed = ", ".join(repr(w) for w in words[:-1]) + f" or {words[-1]!r}" if len(words) > 1 else repr(words[0])
    hints = "; ".join(b.hint for b in registered(op) if b.hint)
    what = f" for {OPS[op]}" if op else ""
    return f"search{what} must be {listed}" + (f" ({hints})" if hints else "")


def parse(text: SearchSpec | str, op: str | None = None) -> SearchSpec:
    """``name`` or ``name:arg`` checked against the registry (and, with ``op``, against the backends serving
    that operation); the backend parses ``arg``. UsageError listing the registered choices otherwise."""
    if isinstance(text, SearchSpec):
        text = str(text)  # a spec built by hand passes the same checks
    if not isinstance(text, str):
        raise UsageError(f"{_choices(op)}, got {text!r}")
    word, colon, arg = text.partition(":")
    backend = _WORDS.get(word)
    if backend is None:
        raise UsageError(f"{_choices(op)}, got {text!r}")
    if op is not None and op not in backend.ops:
        serves = " and ".join(OPS[o] for o in backend.ops)
        raise UsageError(f"search {word!r} serves {serves}, not {OPS[op]}; {_choices(op)}")
    return SearchSpec(word, backend.parse(arg if colon else None))


def search_help(op: str) -> str:
    """The ``--search`` help of the command doing ``op``: every backend serving it, as written, and what it does."""
    parts = [f"{b.written()}: {b.ops[op]}" for b in registered(op)]
    return f"search backend for {OPS[op]}: " + "; ".join(parts)


def _label(backend: Backend, spec: SearchSpec) -> str:
    """The provenance's name for a spec: the backend's own name (not an alias), then its argument."""
    return str(SearchSpec(backend.name, spec.arg))


def grouped_ranks(spec: SearchSpec | str, xq, xb, group_bounds, pos_ptr, pos_idx, *, backend: Backend | None = None,
                  tie_rule: str = "index", device: str = "cpu", budget_bytes: int = 256 << 20,
                  precision: str = "auto"):
    """Ranks of ``xq (nq, d)`` over ``xb (nb, d)`` by the backend ``spec`` names (``backend``: that backend as
    placed for this run, e.g. sharded); ``info["search"]`` names it for the result's provenance."""
    spec = parse(spec, RANKS)
    backend = backend or get(spec)
    r = backend.grouped_ranks(spec, xq, xb, group_bounds, pos_ptr, pos_idx, tie_rule=tie_rule, device=device,
                              budget_bytes=budget_bytes, precision=precision)
    r.info = {"search": _label(backend, spec), **{k: v for k, v in r.info.items() if k != "search"}}
    return r


def searcher(spec: SearchSpec | str, xb, opts, nq: int | None = None, *, backend: Backend | None = None):
    """The top-k searcher over corpus rows ``xb (nb, d)`` of the backend ``spec`` names (``backend``: as placed
    for this run); its ``info`` (mining's ``summary.json`` ``search``) names the method when it does not."""
    spec = parse(spec, TOPK)
    backend = backend or get(spec)
    search = backend.searcher(spec, xb, opts, nq)
    if "method" not in search.info:
        search.info = {"method": backend.name, **search.info}
    return search


for _b in _BUILTIN:
    register(_b)


def describe(spec: SearchSpec | str, shape: tuple[int, int], opts, *, backend: Backend | None = None) -> str:
    """How the top-k search of ``spec`` (``backend``: as placed for this run) will run over a corpus of
    ``shape`` (nb, d), in words: the plan line printed before a long search."""
    spec = parse(spec, TOPK)
    return (backend or get(spec)).describe(spec, shape, opts)
