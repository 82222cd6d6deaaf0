"""Slow stand-ins for kernels.topk / grouped_ranks / choice_scores, patched in by tests while kernels/ is empty."""
from __future__ import annotations

from collections import namedtuple

import torch

GroupedRanks = namedtuple("GroupedRanks", "counts pos_score pos_index neg_score neg_index")


def topk(xq, xb, k, *, exclude_ptr=None, exclude_idx=None, budget_bytes=64 << 20):
    """Exact top-k by inner product (full score matrix: small tests only); score desc, then lower index."""
    S = (xq.double() @ xb.double().T)  # (nq, nb)
    nq, nb = S.shape
    bad = torch.zeros((nq, nb), dtype=torch.bool)
    if exclude_ptr is not None:
        rows = torch.repeat_interleave(torch.arange(nq), exclude_ptr[1:] - exclude_ptr[:-1])
        bad[rows, exclude_idx] = True
    key = torch.where(bad, torch.inf, -S)
    key, order = torch.sort(key, dim=1, stable=True)  # stable: lower index first among equal scores
    D = torch.full((nq, k), float("-inf"), dtype=torch.float32)
    I = torch.full((nq, k), -1, dtype=torch.int64)
    m = min(k, nb)
    ok = torch.isfinite(key[:, :m])
    D[:, :m] = torch.where(ok, -key[:, :m], float("-inf")).float()
    I[:, :m] = torch.where(ok, order[:, :m], -1)
    return D, I


def grouped_ranks(xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule="index", budget_bytes=64 << 20):
    """Per query and group: non-positives beating the best positive, best positive, best non-positive."""
    S = (xq.float() @ xb.float().T)
    nq, G = S.shape[0], len(group_bounds) - 1
    counts = torch.zeros((nq, G), dtype=torch.int64)
    ps = torch.full((nq,), float("-inf"))
    pi = torch.full((nq,), -1, dtype=torch.int64)
    ns = torch.full((nq, G), float("-inf"))
    ni = torch.full((nq, G), -1, dtype=torch.int64)
    for q in range(nq):
        pos = pos_idx[pos_ptr[q]:pos_ptr[q + 1]].tolist()
        for j in pos:
            if S[q, j] > ps[q] or (S[q, j] == ps[q] and j < pi[q]):
                ps[q], pi[q] = S[q, j], j
        for g in range(G):
            for j in range(int(group_bounds[g]), int(group_bounds[g + 1])):
                if j in pos:
                    continue
                s = S[q, j]
                beats = {"index": s > ps[q] or (s == ps[q] and j < pi[q]), "optimistic": s > ps[q],
                         "pessimistic": s >= ps[q]}[tie_rule]
                counts[q, g] += int(bool(beats))
                if ni[q, g] < 0 or s > ns[q, g]:
                    ns[q, g], ni[q, g] = s, j
    return GroupedRanks(counts, ps, pi, ns, ni)


def choice_scores(left_emb, right_emb, left, right):
    """(n, A, B) scores of every row's grid."""
    return torch.einsum("nad,nbd->nab", left_emb[left].float(), right_emb[right].float())


def install(monkeypatch):
    """Patch the stand-ins into ``kernels`` where the real ones are missing."""
    import kernels

    for name, fn in (("topk", topk), ("grouped_ranks", grouped_ranks), ("choice_scores", choice_scores)):
        if not hasattr(kernels, name):
            monkeypatch.setattr(kernels, name, fn, raising=False)
