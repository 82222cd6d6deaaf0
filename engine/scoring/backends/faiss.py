"""The faiss backend: per-group FAISS top-k for ranks, a FAISS index with exact re-scoring for mining.

faiss itself is imported by ``hardrank.scoring.faiss_index`` alone, when a search first needs it."""
from __future__ import annotations

import re

from hardrank.errors import UsageError
from hardrank.scoring.backends.base import RANKS, TOPK, Backend, MinePlan

__all__ = ["Faiss", "FaissSearch", "faiss_searcher"]

_EXAMPLES = ("faiss:Flat", "faiss:IVF1024,Flat", "faiss:IVF1024,PQ64", "faiss:HNSW32")
_HINT = "a faiss index_factory string: " + ", ".join(_EXAMPLES)


MAX_REFINE = 32  # the most candidates per result tuning fetches (re-scored exactly) before it stops


def refine(factory: str, d: int) -> int:
    """Candidates fetched per result before exact re-scoring: 2 for SQ/flat codes, 4 for PQ codes of at least
    2 bits a dimension (PQ{d/2}x4fs, PQ{d/4}), 8 for coarser PQ. Tuning raises it when nprobe alone does not
    reach the recall target (``mining.searcher.measure_recall``)."""
    m = re.search(r"PQ(\d+)(x(\d+))?", factory)
    if m is None:
        return 2
    bits = int(m.group(1)) * int(m.group(3) or 8)
    return 4 if bits >= 2 * d else 8


class FaissSearch:
    """A FAISS index; approximate ones over-fetch candidates (``refine``) and re-score them exactly from ``xb``.
    ``index``: a ``FaissIndex`` built before (``faiss_index.ondisk``); else one is built in memory."""

    def __init__(self, xb, factory: str, opts, budget_bytes: int, index=None, where: str = "in memory"):
        from hardrank.scoring.faiss_index import FaissIndex  # faiss: imported by that module alone

        n_refine = refine(factory, xb.shape[1])
        if index is None:
            index = FaissIndex(xb, factory, nprobe=opts.nprobe, budget_bytes=budget_bytes // 4, seed=opts.seed,
                               refine=n_refine)
        else:
            index = FaissIndex.loaded(xb, index, factory, nprobe=opts.nprobe, budget_bytes=budget_bytes // 4,
                                      refine=n_refine)
        self.index = index
        self.exact = self.index.exact
        self.info = {"method": "faiss", "factory": factory, "gpu": self.index.gpu, "refine": n_refine,
                     "index": where}

    def __call__(self, xq, kk, excl):
        return self.index.search(xq, kk, exclude=excl)


def faiss_searcher(xb, factory: str, opts, index=None, where: str = "in memory") -> FaissSearch:
    """A FAISS ``factory`` index over ``xb`` within ``opts.budget_mb`` (``index``: one built before, from
    ``where``)."""
    return FaissSearch(xb, factory, opts, opts.budget_mb << 20, index, where)


class Faiss(Backend):
    """Any faiss ``index_factory`` string: exact (``Flat``) or approximate (IVF, PQ, HNSW)."""

    name = "faiss"
    syntax = "faiss:<factory>"
    examples = _EXAMPLES
    hint = _HINT
    ops = {RANKS: "per-group FAISS top-k (" + _HINT + "); mean/median rank become lower bounds (docs/search.md)",
           TOPK: "a FAISS index (e.g. faiss:IVF4096,SQ8, faiss:HNSW32, faiss:Flat); approximate candidates are "
                 "re-scored exactly"}

    def parse(self, arg):
        if not arg or not arg.strip():
            raise UsageError(f"search 'faiss' needs an index factory after its colon ({_HINT}), "
                             f"got {'faiss' if arg is None else 'faiss:' + arg!r}")
        return arg

    def grouped_ranks(self, spec, xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule, device, budget_bytes,
                      precision):
        from hardrank.scoring.faiss_index import faiss_grouped_ranks  # faiss: imported by that module alone

        return faiss_grouped_ranks(xq, xb, group_bounds, pos_ptr, pos_idx, tie_rule=tie_rule, factory=spec.arg,
                                   gpu="auto" if device.startswith("cuda") else False, budget_bytes=budget_bytes)

    def searcher(self, spec, xb, opts, nq=None):
        return faiss_searcher(xb, spec.arg, opts)

    def describe(self, spec, shape, opts):
        return describe_factory(spec.arg)

    def mining_plan(self, spec, nq, shape, opts, *, mapped=False, built=None):
        ivf = re.match(r"IVF\d+", spec.arg.strip()) is not None  # an IVF index can live in a folder
        return MinePlan(self.describe(spec, shape, opts), f"--search {spec}", spec.arg.strip() if ivf else None)


def describe_factory(factory: str) -> str:
    """A FAISS index in words: approximate ones have their candidates re-scored exactly (``FaissSearch``)."""
    return f"FAISS {factory}" + ("" if factory == "Flat" else ", candidates re-scored exactly")
