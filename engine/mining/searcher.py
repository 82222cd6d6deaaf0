"""Corpus search for mining: the searcher of the chosen backend (``hardrank.scoring.backends``), list merging, recall.

Searchers map (xq (m, d) float32, kk, exclude CSR) to exact-scored (D, I) sorted descending, padded."""
from __future__ import annotations

import time
from collections import Counter

import numpy as np
import torch

from hardrank.config import MineOptions
from hardrank.mining.block import mine_block
from hardrank.mining.problem import MineProblem
from hardrank.scoring import backends
from hardrank.scoring.backends import Backend
from hardrank.scoring.backends.sharded import merge_topk
from hardrank.vectors import f32

__all__ = ["build_searcher", "searcher_for", "measure_recall", "written_recall", "ExactReference"]


def build_searcher(problem: MineProblem, opts: MineOptions, backend: Backend | None = None):
    return searcher_for(problem.xb, opts, len(problem.xq), backend=backend)


def searcher_for(xb, opts: MineOptions, nq: int | None = None, *, backend: Backend | None = None):
    """The searcher of the backend ``opts.search`` names (``hardrank.scoring.backends``) over the corpus rows
    ``xb`` (n, d) (also one shard of a sharded corpus); ``backend``: that backend as placed for this run
    (``backends.sharded.for_mining``). ``nq``: the queries it will see (when known), for the exact
    kernel's precision record."""
    return backends.searcher(opts.search_spec, xb, opts, nq, backend=backend)


def _sample(nq: int, n: int, seed: int) -> np.ndarray:
    """The recall sample: ``n`` of ``nq`` query rows, sorted, drawn by ``numpy.random.default_rng(seed)``."""
    return np.sort(np.random.default_rng(seed).choice(nq, n, replace=False))


def _block_top(S: np.ndarray, pos: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """(D, I) of one block's scores ``S`` (m, b) (-inf: excluded) over corpus rows ``pos`` (b,): per query,
    every item scoring at least its kk-th best (ties kept, so the merge can break them by index)."""
    m, b = S.shape
    keep = S >= np.partition(S, b - kk, axis=1)[:, b - kk, None] if b > kk else np.ones(S.shape, bool)
    keep &= S > -np.inf
    cnt = keep.sum(1)
    r, c = np.nonzero(keep)  # row-major: each query's items in column order
    slot = np.arange(len(r)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    w = max(1, int(cnt.max(initial=0)))
    D, I = np.full((m, w), -np.inf, np.float32), np.full((m, w), -1, np.int64)
    D[r, slot], I[r, slot] = S[r, c], pos[c]
    return D, I


class _StreamedExact:
    """Exact top-kk over corpus rows read again from the input's file a block at a time (``FileRows``): float32
    scores, excluded pairs dropped, blocks merged as shards are (``merge_topk``: score desc, then lower index).
    Holds nothing of the corpus between calls; each call reads the file once."""

    exact = True

    def __init__(self, xb):
        self.xb = xb

    def gather(self, I: np.ndarray) -> np.ndarray:
        return self.xb[np.where(I >= 0, I, 0)]

    def __call__(self, xq, kk, excl):
        xq = f32(xq)
        m, nb = len(xq), len(self.xb)
        kk = min(kk, nb)
        best = (np.full((m, kk), -np.inf, np.float32), np.full((m, kk), -1, np.int64))
        if excl is not None:
            q_ex, i_ex = np.repeat(np.arange(m), np.diff(excl[0])), np.asarray(excl[1], np.int64)
        parts = [best]
        for pos, rows in self.xb.blocks():
            S = (torch.from_numpy(xq) @ torch.from_numpy(rows).T).numpy()  # (m, b) float32 (torch: the thread budget's)
            if excl is not None and len(i_ex):  # excluded pairs whose corpus row is in this block
                sorter = np.argsort(pos)
                at = np.minimum(np.searchsorted(pos, i_ex, sorter=sorter), len(pos) - 1)
                hit = pos[sorter[at]] == i_ex
                S[q_ex[hit], sorter[at[hit]]] = -np.inf
            parts.append(_block_top(S, pos, kk))
            if sum(p[0].shape[1] for p in parts) > 4 * kk:
                parts = [merge_topk(parts, kk)]
        return merge_topk(parts, kk)


class ExactReference:
    """Exact search of the corpus rows, the reference of the recall checks: FAISS ``Flat`` streamed over the
    corpus within a quarter of the budget, or (a sharded corpus) the shards' own exact search, merged; a corpus
    read again from its file on each access (``MineProblem.reference``), streamed from the file."""

    exact = True

    def __init__(self, problem: MineProblem, opts: MineOptions, search=None):
        if hasattr(problem.xb, "blocks"):
            streamed = _StreamedExact(problem.xb)
            self._search, self.gather = streamed, streamed.gather
        elif search is not None and hasattr(search, "exact_topk"):
            self._search = search.exact_topk
            self.gather = search.gather  # candidates' rows for the near-duplicate filter
        else:
            from hardrank.scoring.faiss_index import FaissIndex  # faiss: imported by that module alone

            index = FaissIndex(problem.xb, "Flat", budget_bytes=(opts.budget_mb << 20) // 4)
            self._search = lambda xq, kk, excl: index.search(xq, kk, exclude=excl)

    def __call__(self, xq, kk, excl):
        return self._search(xq, kk, excl)


def measure_recall(search, problem: MineProblem, opts: MineOptions) -> dict:
    """The tuning recall: recall@10 of the search itself (no exclusions, no filters) against exact search
    on a sample; with ``nprobe`` unset, nprobe is doubled from nlist/512 until it reaches
    ``opts.recall_target`` or every list (a searcher without an IVF-like ``index``: measured once). What the
    run reports is the recall of what it wrote (``written_recall``); this one only picks nprobe."""
    from hardrank.scoring.faiss_index import recall_at_k  # faiss: imported by that module alone

    nq = len(problem.xq)
    n = min(nq, opts.recall_sample)
    if n == 0 or search.exact:
        return {"tuning_recall@10": 1.0 if search.exact else None, "tuning_sample": n}
    xs = f32(problem.xq[_sample(nq, n, opts.seed)])
    t0 = time.perf_counter()
    _, Ie = ExactReference(problem, opts, search)(xs, 10, None)
    out = {"tuning_sample": n, "exact_seconds": round(time.perf_counter() - t0, 3)}
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
        if not tune or r >= opts.recall_target or index.nprobe >= top:
            break
        index.set_nprobe(min(top, index.nprobe * 2))
    out.update({"tuning_recall@10": r, "nprobe": getattr(index, "nprobe", None), "nlist": top or None,
                "tuning": tried})
    return out


def written_recall(problem: MineProblem, opts: MineOptions, written, search=None) -> dict:
    """recall@k of the negatives a run wrote, on the recall sample (``_sample``: ``opts.recall_sample``
    queries drawn with ``opts.seed``).

    For each sampled query, the reference is what mining with an exact search writes (``mine_block`` with
    ``ExactReference``: the same exclusions, near-duplicate and similarity filters, the same k), over the
    vectors as the inputs store them: ``problem.reference`` where an input's files are read again (an
    embeddings file), so a fault in loading them shows here instead of passing as recall 1.0. The query's
    recall is |written ∩ reference| / |reference| (negatives compared by corpus id), and the figure is its
    mean over the sampled queries whose reference is not empty. ``written(rows)`` gives the written negative
    ids of query rows ``rows``, each list in rank order. ``search``: the run's searcher (a sharded one serves
    its own exact search, unless the reference reads the files again)."""
    nq = len(problem.xq)
    n = min(nq, opts.recall_sample)
    if n == 0:
        return {}
    t0 = time.perf_counter()
    rows = _sample(nq, n, opts.seed)
    ref = problem.reference or problem
    _, I = mine_block(ExactReference(ref, opts, search), ref, rows, opts, Counter())
    got = written(rows)
    per = []
    for j, negs in enumerate(got):
        ref = {problem.corpus_ids[i] for i in I[j] if i >= 0}
        if ref:
            per.append(len(ref & set(negs)) / len(ref))
    r = float(np.mean(per)) if per else None
    return {f"recall@{opts.k}": r, "k": opts.k, "sample": n, "compared": len(per), "seed": opts.seed,
            "target": opts.recall_target, "met": r is not None and r >= opts.recall_target,
            "reference": "mining with exact search (FAISS Flat, or the shards' exact search) of the vectors as the "
                         "inputs store them (an embeddings file's read again from the file): same exclusions, "
                         "filters and k",
            "definition": "mean over the sampled queries (numpy default_rng(seed).choice(queries, sample, "
                          "replace=False)) of |written negatives ∩ reference negatives| / |reference negatives|",
            "seconds": round(time.perf_counter() - t0, 3)}
