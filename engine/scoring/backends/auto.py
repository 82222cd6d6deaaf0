"""The auto backend (mining): exact top-k while the fp32 corpus fits the budget, else a FAISS IVF index."""
from __future__ import annotations

import math

from hardrank.scoring.backends.base import TOPK, Backend
from hardrank.scoring.backends.exhaustive import kernel_searcher
from hardrank.scoring.backends.faiss import describe_factory, faiss_searcher

__all__ = ["Auto", "auto_factory", "choose"]


def auto_factory(nb: int, d: int, budget_bytes: int) -> str:
    """IVF with about 2*sqrt(nb) lists (a power of two, >= 39 training rows each) and 4-bit fast-scan
    PQ codes of 2 dims per sub-quantiser (d/4 bytes a row; 4 or 8 dims when that exceeds the budget).
    Candidates are re-scored exactly, so recall is set by nprobe, not by the codes, and fast-scan
    scans lists several times faster than SQ8 on AVX2 (benchmarks/README.md)."""
    nlist = 2 ** max(4, round(math.log2(2 * math.sqrt(max(nb, 1)))))
    while nlist > 16 and nb < 39 * nlist:
        nlist //= 2
    if d % 2:
        return f"IVF{nlist},SQ8"
    for dims in (2, 4, 8):
        if d % dims == 0 and nb * (d // dims) // 2 <= budget_bytes:
            break
    return f"IVF{nlist},PQ{d // dims}x4fs"


def choose(shape: tuple[int, int], budget_bytes: int) -> tuple[str, str | None]:
    """("exact", None) while an (nb, d) fp32 corpus fits ``budget_bytes``, else ("faiss", its IVF factory)."""
    nb, d = shape
    if nb * d * 4 <= budget_bytes:
        return "exact", None
    return "faiss", auto_factory(nb, d, budget_bytes)


class Auto(Backend):
    """Mining's default: the exhaustive searcher while the corpus fits ``--budget-mb``, else faiss IVF-PQ."""

    name = "auto"
    ops = {TOPK: "exact while the fp32 corpus fits --budget-mb, else a FAISS IVF index with fast-scan PQ codes "
                 "(nprobe tuned to recall@10 >= 0.95)"}

    def searcher(self, spec, xb, opts, nq=None):
        method, factory = choose(xb.shape, opts.budget_mb << 20)
        return kernel_searcher(xb, opts, nq) if method == "exact" else faiss_searcher(xb, factory, opts)

    def describe(self, spec, shape, opts):
        method, factory = choose(tuple(shape), opts.budget_mb << 20)
        return "exact search (kernels.topk)" if method == "exact" else describe_factory(factory)
