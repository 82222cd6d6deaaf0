"""Corpus search for mining: exact streaming top-k (kernels) or a FAISS index with exact re-scoring.

Searchers map (xq (m, d) float32, kk, exclude CSR) to exact-scored (D, I) sorted descending, padded."""
from __future__ import annotations

import math
import re
import time

import numpy as np
import torch

from ..config import MineOptions
from ..kernels import precision_choice, topk
from .problem import MineProblem, f32

__all__ = ["build_searcher", "searcher_for", "merge_topk", "measure_recall", "describe_search"]

_TARGET_RECALL = 0.95  # nprobe auto-tuning stops once recall@10 on the sample reaches this


class _KernelSearch:
    """Exact streaming top-k with ``kernels.topk`` over the corpus held in memory as fp32.

    The query blocking depends on the budget only, never on the corpus size, so a shard of the
    corpus scores every (query, item) pair with the same GEMM row blocks, hence the same bits, as
    the whole corpus does (column tiling does not change a score: ``kernels._common.score_tile``)."""

    exact = True

    def __init__(self, xb, budget_bytes: int, precision: str = "auto", block: int = 8192):
        self.xb = torch.from_numpy(f32(xb))
        self.budget = budget_bytes
        self.precision = precision
        self.q_block = max(1, min(2048, budget_bytes // (16 * 1024)))  # a 1024-wide tile and its temporaries
        # the kernel's first GEMM on a block of queries (results do not depend on it)
        first, why = precision_choice(precision, "cpu", work=block * self.xb.numel())
        self.info = {"method": "exact", "backend": "kernels.topk", "precision": first, "precision_reason": why}

    def __call__(self, xq, kk, excl):
        kw = {}
        if excl is not None:
            kw = {"exclude_ptr": torch.from_numpy(excl[0]), "exclude_idx": torch.from_numpy(excl[1])}
        D, I = topk(torch.from_numpy(xq), self.xb, kk, precision=self.precision, budget_bytes=self.budget,
                    q_block=self.q_block, **kw)
        return D.float().numpy(), I.numpy().astype(np.int64)


def merge_topk(parts: list[tuple[np.ndarray, np.ndarray]], kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-shard top-kk lists (D (m, kk_s) desc, I (m, kk_s) global indices, -1 = none) merged into
    the top-kk of their union under the global order: score descending, then index ascending. Each
    shard's list holds its best items in that order, so the merge equals a search of the whole corpus."""
    D = np.concatenate([d for d, _ in parts], axis=1)
    I = np.concatenate([i for _, i in parts], axis=1)
    key_i = np.where(I >= 0, I, np.iinfo(np.int64).max)  # missing entries sort last
    order = np.lexsort((key_i, -D.astype(np.float64)), axis=1)[:, :kk]
    D, I = np.take_along_axis(D, order, 1), np.take_along_axis(I, order, 1)
    if D.shape[1] < kk:
        pad = kk - D.shape[1]
        D = np.concatenate([D, np.full((len(D), pad), -np.inf, D.dtype)], 1)
        I = np.concatenate([I, np.full((len(I), pad), -1, I.dtype)], 1)
    return D, I


class _FaissSearch:
    """A FAISS index; approximate ones over-fetch candidates (``_refine``) and re-score them exactly from ``xb``."""

    def __init__(self, xb, factory: str, opts: MineOptions, budget_bytes: int):
        from ..faiss_search import FaissIndex  # faiss: imported by that module alone

        refine = _refine(factory, xb.shape[1])
        self.index = FaissIndex(xb, factory, nprobe=opts.nprobe, budget_bytes=budget_bytes // 4, seed=opts.seed,
                                refine=refine)
        self.exact = self.index.exact
        self.info = {"method": "faiss", "factory": factory, "gpu": self.index.gpu, "refine": refine}

    def __call__(self, xq, kk, excl):
        return self.index.search(xq, kk, exclude=excl)


def _auto_factory(nb: int, d: int, budget_bytes: int) -> str:
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


def _refine(factory: str, d: int) -> int:
    """Candidates fetched per result before exact re-scoring: 2 for SQ/flat codes, 4 for PQ with
    <= 2 dims per sub-quantiser, 8 for coarser PQ."""
    m = re.search(r"PQ(\d+)", factory)
    if m is None:
        return 2
    return 4 if 2 * int(m.group(1)) >= d else 8


def _choose(problem: MineProblem, opts: MineOptions) -> tuple[str, str | None]:
    return _method(problem.xb.shape, opts)


def _method(shape: tuple[int, int], opts: MineOptions) -> tuple[str, str | None]:
    nb, d = shape
    budget = opts.budget_mb << 20
    spec = opts.search_spec
    if spec.method == "exact":
        return "exact", None
    if spec.method == "faiss":
        return "faiss", spec.factory
    if nb * d * 4 <= budget:
        return "exact", None
    return "faiss", _auto_factory(nb, d, budget)


def describe_search(shape: tuple[int, int], opts: MineOptions) -> str:
    """How ``searcher_for`` will search a corpus of ``shape`` (n, d), in words, for plans printed before the work."""
    method, factory = _method(shape, opts)
    if method == "exact":
        return "exact search (kernels.topk)"
    return f"FAISS {factory}" + ("" if factory == "Flat" else ", candidates re-scored exactly")


def build_searcher(problem: MineProblem, opts: MineOptions):
    return searcher_for(problem.xb, opts, len(problem.xq))


def searcher_for(xb, opts: MineOptions, nq: int | None = None):
    """The searcher ``opts.search`` asks for over the corpus rows ``xb`` (n, d): exact while the fp32
    rows fit ``opts.budget_mb``, else a FAISS index (also one shard of a sharded corpus). ``nq``: the
    queries it will see (when known), for the exact kernel's precision record."""
    method, factory = _method(xb.shape, opts)
    budget = opts.budget_mb << 20
    if method == "exact":
        block = opts.block_size if nq is None else max(1, min(opts.block_size, nq))
        return _KernelSearch(xb, budget // 4, opts.rank_precision, block)  # corpus (<= budget) + score tiles
    return _FaissSearch(xb, factory, opts, budget)


def measure_recall(search, problem: MineProblem, opts: MineOptions) -> dict:
    """recall@10 of the approximate path (no exclusions) against exact FAISS search on a sample;
    with ``nprobe`` unset, nprobe is doubled from nlist/512 until the recall reaches _TARGET_RECALL."""
    from ..faiss_search import FaissIndex, recall_at_k

    nq = len(problem.xq)
    n = min(nq, opts.recall_sample)
    if n == 0 or search.exact:
        return {"recall@10": 1.0 if search.exact else None, "recall_sample": n}
    rows = np.sort(np.random.default_rng(opts.seed).choice(nq, n, replace=False))
    xs = f32(problem.xq[rows])
    t0 = time.perf_counter()
    if hasattr(search, "exact_topk"):  # a sharded corpus: its shards search exactly and the lists merge
        _, Ie = search.exact_topk(xs, 10)
    else:
        _, Ie = FaissIndex(problem.xb, "Flat", budget_bytes=(opts.budget_mb << 20) // 4).search(xs, 10)
    out = {"recall_sample": n, "exact_seconds": round(time.perf_counter() - t0, 3)}
    index = search.index
    tune = opts.nprobe is None and index.nlist is not None
    top = index.nlist or 0
    if tune:
        index.set_nprobe(max(1, top // 512))
    tried = []
    while True:
        _, Ia = search(xs, 10, None)
        r = recall_at_k(Ia, Ie, 10)
        tried.append({"nprobe": index.nprobe, "recall@10": round(r, 4)})
        if not tune or r >= _TARGET_RECALL or index.nprobe >= top:
            break
        index.set_nprobe(min(top, index.nprobe * 2))
    out.update({"recall@10": r, "nprobe": index.nprobe, "tuning": tried})
    return out
