"""One block of queries mined: search with headroom, drop positives' near duplicates and out-of-band
candidates, search deeper for the queries left short."""
from __future__ import annotations

from collections import Counter

import numpy as np

from hardrank.config import MineOptions
from hardrank.mining.problem import MineProblem, csr_take, gather
from hardrank.vectors import f32

__all__ = ["mine_block"]


def _filter(D, I, rows_of, d: int, pos, opts: MineOptions, budget_bytes: int):
    """Reason codes per candidate: 0 keep, 1 near-duplicate of a positive, 2 above max_sim,
    3 below min_sim, -1 missing."""
    reason = np.where(I >= 0, 0, -1).astype(np.int8)
    if opts.min_sim is not None:
        reason[(reason == 0) & (D < opts.min_sim)] = 3
    if opts.max_sim is not None:
        reason[(reason == 0) & (D > opts.max_sim)] = 2
    if opts.dup_threshold is not None and pos is not None and len(pos[1]):
        ptr, emb = pos
        m, kk = I.shape
        step = max(1, budget_bytes // max(1, kk * d * 8))
        for s in range(0, m, step):
            r = np.arange(s, min(m, s + step))
            lens = ptr[r + 1] - ptr[r]
            if not lens.any():
                continue
            P = np.zeros((len(r), int(lens.max()), d), np.float32)  # (m, maxp, d) padded positives
            sub_ptr, sub_emb = csr_take(ptr, emb, r)
            slot = np.arange(sub_ptr[-1]) - np.repeat(sub_ptr[:-1], lens)
            P[np.repeat(np.arange(len(r)), lens), slot] = f32(sub_emb)
            sims = np.einsum("mkd,mpd->mkp", rows_of(I[r]), P)
            sims = np.where(np.arange(P.shape[1])[None, None, :] < lens[:, None, None], sims, -np.inf)
            near = sims.max(2) > opts.dup_threshold
            sub = reason[r]
            sub[(sub == 0) & near] = 1
            reason[r] = sub
    return reason


def mine_block(search, problem: MineProblem, rows: np.ndarray, opts: MineOptions, stats: Counter):
    """(S (n, k) float32, I (n, k) int64) negatives of queries ``rows``, padded with -inf / -1.
    ``search(xq, kk, exclude)`` gives exact-scored candidates; a ``search.gather(I)`` (m, kk, d), when
    present, gives their embeddings (else they are read from ``problem.xb``)."""
    n, k, nb = len(rows), opts.k, len(problem.xb)
    # candidates' embeddings for the near-duplicate filter: a sharded searcher fetches them from its shards
    rows_of = getattr(search, "gather", None) or (lambda I: gather(problem.xb, I))
    budget = opts.budget_mb << 20
    xq = f32(problem.xq[rows])
    excl = csr_take(problem.exclude_ptr, problem.exclude_idx, rows)
    pos = csr_take(problem.pos_ptr, problem.pos_emb, rows)
    out_S = np.full((n, k), -np.inf, np.float32)
    out_I = np.full((n, k), -1, np.int64)
    todo = np.arange(n)
    kk = min(nb, k + max(4, k // 2))  # headroom for filtered candidates; grows x4 for queries left short
    cap = min(nb, max(1024, 100 * k))  # past this many candidates a query stays short (counted)
    while len(todo) and nb:
        D, I = search(xq[todo], kk, csr_take(*excl, todo) if excl else None)
        reason = _filter(D, I, rows_of, problem.xb.shape[1], csr_take(*pos, todo) if pos else None, opts,
                         budget // 4)
        keep = reason == 0
        kept = np.cumsum(keep, 1)
        exhausted = (I[:, -1] < 0) | (kk >= cap)
        if opts.min_sim is not None:
            exhausted |= D[:, -1] < opts.min_sim  # sorted: nothing further can pass
        done = (kept[:, -1] >= k) | exhausted
        for j in np.nonzero(done)[0]:
            sel = np.nonzero(keep[j])[0][:k]
            q = todo[j]
            out_S[q, :len(sel)], out_I[q, :len(sel)] = D[j, sel], I[j, sel]
            cut = sel[-1] + 1 if len(sel) == k else kk  # reasons counted among candidates above the cut
            for code, name in ((1, "near_duplicate"), (2, "above_max_sim"), (3, "below_min_sim")):
                stats[name] += int((reason[j, :cut] == code).sum())
            stats["short"] += int(len(sel) < k)
        todo = todo[~done]
        kk = min(cap, kk * 4)
    return out_S, out_I
