"""Slow, obviously correct twins of the kernels (full score matrix, per-query loops): test oracles, bench baselines."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from .ranking import TIE_RULES, GroupedRanks

__all__ = ["grouped_ranks_reference", "best_positives_reference", "topk_reference", "choice_scores_reference",
           "naive_rank"]


def _nearest_fp32(q: Fraction) -> float:
    """The fp32 value nearest the rational q, ties to the even significand."""
    c = np.float32(float(q))  # within one fp32 step of the answer
    cands = [c, np.nextafter(c, np.float32(-np.inf)), np.nextafter(c, np.float32(np.inf))]
    cands = [x for x in cands if np.isfinite(x)]
    return float(min(cands, key=lambda x: (abs(Fraction(float(x)) - q), int(np.array(x).view(np.int32)) & 1))) + 0.0


def _scores(xq: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
    """Full (nq, nb) float32 scores: each the exact dot product of the two rows (taken as fp32) rounded
    once to the nearest fp32 value. The fp64 matrix product is within d * 2^-52 * sum|x_k y_k| of the
    exact value; where that interval holds an fp32 rounding boundary, the products are summed exactly."""
    x, y = xq.float().double().cpu(), xb.float().double().cpu()
    s = x @ y.T  # (nq, nb) float64
    err = 2 * x.shape[1] * 2.0 ** -52 * (x.abs() @ y.abs().T) + 2.0 ** -1000
    lo, hi = (s - err).float(), (s + err).float()
    out = lo + 0.0  # -0.0 -> +0.0
    xn, yn = x.numpy(), y.numpy()
    for i, j in torch.nonzero(lo != hi).tolist():
        out[i, j] = _exact_fp32_dot(xn[i], yn[j])
    return out


def _exact_fp32_dot(a: np.ndarray, b: np.ndarray) -> float:
    """The exact dot product of two fp32-valued float64 rows, rounded once to the nearest fp32 (ties to even).
    Each product is exact in float64 (24 + 24 significand bits); ``math.fsum`` rounds their exact sum once to
    float64, and rounding that to fp32 is the single rounding unless it sits exactly on an fp32 midpoint (then
    the sum is taken in fractions)."""
    f = math.fsum((a * b).tolist())
    c = np.float32(f)
    if float(c) != f and np.isfinite(c):
        other = np.nextafter(c, np.float32(np.inf) if f > float(c) else np.float32(-np.inf))
        if f == (float(c) + float(other)) / 2:  # a midpoint: double rounding could differ from one rounding
            return _nearest_fp32(sum((Fraction(p) * Fraction(q) for p, q in zip(a.tolist(), b.tolist())),
                                     Fraction(0)))
    return float(c) + 0.0


def best_positives_reference(xq, xb, pos_ptr, pos_idx) -> tuple[torch.Tensor, torch.Tensor]:
    """``best_positives`` by its definition: the full score matrix, one query at a time."""
    S = _scores(xq, xb)  # (nq, nb) float32
    ptr = [int(p) for p in torch.as_tensor(pos_ptr)]
    pidx = [int(j) for j in torch.as_tensor(pos_idx)]
    score = torch.full((len(xq),), float("-inf"), dtype=torch.float32)
    index = torch.full((len(xq),), -1, dtype=torch.long)
    for i in range(len(xq)):
        pos = sorted(set(pidx[ptr[i]:ptr[i + 1]]))
        if pos:
            s = max(float(S[i, j]) for j in pos)
            score[i], index[i] = s, min(j for j in pos if float(S[i, j]) == s)
    return score.to(xq.device), index.to(xq.device)


def grouped_ranks_reference(xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule="index",
                            threshold=None) -> GroupedRanks:
    """``grouped_ranks`` by its definition, one query and one group at a time (``threshold``: the
    given (s_star, p_star) replace each query's best positive, as in ``grouped_ranks``)."""
    if tie_rule not in TIE_RULES:
        raise ValueError(f"tie_rule must be one of {TIE_RULES}, got {tie_rule!r}")
    S = _scores(xq, xb)  # (nq, nb) float32
    nq = S.shape[0]
    bounds = [int(b) for b in torch.as_tensor(group_bounds)]
    ptr = [int(p) for p in torch.as_tensor(pos_ptr)]
    pidx = [int(j) for j in torch.as_tensor(pos_idx)]
    G = len(bounds) - 1
    counts = torch.zeros(nq, G, dtype=torch.long)
    pos_score = torch.empty(nq, dtype=torch.float32)
    pos_index = torch.empty(nq, dtype=torch.long)
    neg_score = torch.full((nq, G), float("-inf"), dtype=torch.float32)
    neg_index = torch.full((nq, G), -1, dtype=torch.long)
    for i in range(nq):
        pos = sorted(set(pidx[ptr[i]:ptr[i + 1]]))
        row = S[i].tolist()
        if threshold is not None:
            s_star, p_star = float(threshold[0][i]), int(threshold[1][i])
        elif not pos:
            raise ValueError(f"query {i} has no positive")
        else:
            s_star = max(row[j] for j in pos)
            p_star = min(j for j in pos if row[j] == s_star)
        pos_score[i], pos_index[i] = s_star, p_star
        pos_set = set(pos)
        for g in range(G):
            items = [j for j in range(bounds[g], bounds[g + 1]) if j not in pos_set]
            if tie_rule == "index":
                beats = [j for j in items if row[j] > s_star or (row[j] == s_star and j < p_star)]
            elif tie_rule == "optimistic":
                beats = [j for j in items if row[j] > s_star]
            else:
                beats = [j for j in items if row[j] >= s_star]
            counts[i, g] = len(beats)
            if items:
                best = max(row[j] for j in items)
                neg_score[i, g] = best
                neg_index[i, g] = min(j for j in items if row[j] == best)
    dev = xq.device
    return GroupedRanks(counts.to(dev), pos_score.to(dev), pos_index.to(dev), neg_score.to(dev), neg_index.to(dev))


def topk_reference(xq, xb, k, *, exclude_ptr=None, exclude_idx=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk`` by sorting every full score row by (score desc, index asc)."""
    S = _scores(xq, xb)  # (nq, nb) float32
    nq, nb = S.shape
    D = torch.full((nq, k), float("-inf"), dtype=torch.float32)
    I = torch.full((nq, k), -1, dtype=torch.long)
    for i in range(nq):
        excluded = set()
        if exclude_ptr is not None:
            e0, e1 = int(exclude_ptr[i]), int(exclude_ptr[i + 1])
            excluded = {int(j) for j in exclude_idx[e0:e1]}
        row = S[i].tolist()
        order = sorted((j for j in range(nb) if j not in excluded), key=lambda j: (-row[j], j))[:k]
        for r, j in enumerate(order):
            D[i, r], I[i, r] = row[j], j
    return D.to(xq.device), I.to(xq.device)


def choice_scores_reference(left, right, left_idx, right_idx) -> torch.Tensor:
    """``choice_scores`` read off the full left x right score matrix."""
    full = (left.double().cpu() @ right.double().cpu().T).float()  # (nl, nr) float32
    li, ri = torch.as_tensor(left_idx).cpu().long(), torch.as_tensor(right_idx).cpu().long()
    out = full[li[:, :, None], ri[:, None, :]]  # (n, A, B)
    return out.to(left.device)


def naive_rank(xq, xb, pos_ptr, pos_idx):
    """Full ``(nq, nb)`` score matrix + stable descending argsort (lower index wins ties, the index
    rule). Returns ``rank (nq,)`` of each query's best positive (0 = top-1) and ``top1 (nq,)``.
    The slow, obviously correct twin of the engine's ranking (and the baseline it is timed against)."""
    s = xq @ xb.T                                                        # (nq, nb)
    order = torch.argsort(s, dim=1, descending=True, stable=True)        # (nq, nb)
    inv = torch.empty_like(order)
    inv.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    pos_ptr = torch.as_tensor(pos_ptr, device=order.device)
    pos_idx = torch.as_tensor(pos_idx, device=order.device)
    q_of = torch.repeat_interleave(torch.arange(len(xq), device=order.device), pos_ptr[1:] - pos_ptr[:-1])
    big = torch.full((len(xq),), order.shape[1], dtype=torch.int64, device=order.device)
    rank = big.scatter_reduce(0, q_of, inv[q_of, pos_idx], reduce="amin")
    return rank, order[:, 0]
