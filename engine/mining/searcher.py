"""Corpus search for mining: the searcher of the chosen backend (``hardrank.scoring.backends``), list merging, recall.

Searchers map (xq (m, d) float32, kk, exclude CSR) to exact-scored (D, I) sorted descending, padded."""
from __future__ import annotations

import time

import numpy as np

from hardrank.config import MineOptions
from hardrank.mining.problem import MineProblem, f32
from hardrank.scoring import backends
from hardrank.scoring.backends import Backend

__all__ = ["build_searcher", "searcher_for", "merge_topk", "measure_recall"]

_TARGET_RECALL = 0.95  # nprobe auto-tuning stops once recall@10 on the sample reaches this


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


def build_searcher(problem: MineProblem, opts: MineOptions, backend: Backend | None = None):
    return searcher_for(problem.xb, opts, len(problem.xq), backend=backend)


def searcher_for(xb, opts: MineOptions, nq: int | None = None, *, backend: Backend | None = None):
    """The searcher of the backend ``opts.search`` names (``hardrank.scoring.backends``) over the corpus rows
    ``xb`` (n, d) (also one shard of a sharded corpus); ``backend``: that backend as placed for this run
    (``backends.sharded.for_mining``). ``nq``: the queries it will see (when known), for the exact
    kernel's precision record."""
    return backends.searcher(opts.search_spec, xb, opts, nq, backend=backend)


def measure_recall(search, problem: MineProblem, opts: MineOptions) -> dict:
    """recall@10 of the approximate path (no exclusions) against exact FAISS search on a sample;
    with ``nprobe`` unset, nprobe is doubled from nlist/512 until the recall reaches _TARGET_RECALL
    (a searcher without an IVF-like ``index``: measured once, nothing tuned)."""
    from hardrank.scoring.faiss_index import FaissIndex, recall_at_k

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
    index = getattr(search, "index", None)
    tune = opts.nprobe is None and index is not None and index.nlist is not None
    top = index.nlist or 0 if index is not None else 0
    if tune:
        index.set_nprobe(max(1, top // 512))
    tried = []
    while True:
        _, Ia = search(xs, 10, None)
        r = recall_at_k(Ia, Ie, 10)
        tried.append({"nprobe": getattr(index, "nprobe", None), "recall@10": round(r, 4)})
        if not tune or r >= _TARGET_RECALL or index.nprobe >= top:
            break
        index.set_nprobe(min(top, index.nprobe * 2))
    out.update({"recall@10": r, "nprobe": getattr(index, "nprobe", None), "tuning": tried})
    return out
