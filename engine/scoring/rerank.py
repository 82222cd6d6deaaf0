"""Two-stage retrieval (``--rerank itm:K``): each query's top K by the dual encoder, re-scored by a cross-encoder.

The protocol of BLIP's retrieval evaluation as RoCOCO runs it (pseulki/rococo ``eval_blip_i2t.py`` /
``eval_blip_t2i.py``, ``retrieval_coco.yaml``: ``k_test: 256``): per query, the K gallery items with the
highest ITC similarity s (the stored, L2-normalised embeddings' dot product) get the score
``itm_logit[:, 1] + s`` from the cross-encoder; every other item keeps ``FILL`` (-100); ranks and metrics
come from that matrix. Here the gallery is a task's union of groups (every variant view at once): its top
K is re-scored once, and every view's ranks are read from the re-scored union as the exhaustive pass's
are (``GroupedRanks``: counts per group, summed over a view's groups).

Ties, which the reference leaves to ``torch.topk`` and ``np.argsort`` (neither specifies an order):
- which items enter: the K highest similarities, ties at the K-th score broken by the lower gallery
  index (``kernels.topk``: scores are exact dot products rounded once to fp32); K larger than the
  gallery re-scores all of it (the reference would fail in ``topk``);
- ranks: the suite's tie rule on the re-scored matrix (``index``: an item with exactly the best
  positive's score beats it iff it comes first in gallery order), the -100 items included.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hardrank.errors import UsageError
from hardrank.kernels import TIE_RULES, GroupedRanks, topk
from hardrank.tasks import RankingTask

__all__ = ["RerankSpec", "parse", "FILL", "PROTOCOL", "CANDIDATE_RULE", "candidates", "rescored_ranks",
           "rerank_ranks"]

FILL = -100.0  # the score of every item outside a query's top K (the reference's torch.full(..., -100.0))
PROTOCOL = ("per query, the top K of the union gallery by the dual encoder's similarity s are re-scored as "
            "itm_logit[:, 1] + s; every other item scores -100 (RoCOCO eval_blip_i2t.py / eval_blip_t2i.py)")
CANDIDATE_RULE = "score desc, then lower gallery index (ties at the K-th score: the lower indices enter)"
_SYNTAX = re.compile(r"^(?P<method>[a-z]+):(?P<k>[+-]?\d+)$")
_METHODS = ("itm",)  # the cross-encoders a model may bring (BLIP's image-text matching head)


@dataclass(frozen=True)
class RerankSpec:
    """A parsed ``--rerank`` value."""

    method: str  # "itm": the model's image-text matching head
    k: int       # candidates per query re-scored (>= 1)

    def __str__(self) -> str:
        return f"{self.method}:{self.k}"


def parse(value: str | None) -> RerankSpec | None:
    """``itm:K`` -> RerankSpec; None -> None; anything else a UsageError saying how to write it."""
    if value is None:
        return None
    m = _SYNTAX.match(str(value).strip())
    if not m or m.group("method") not in _METHODS:
        raise UsageError(f"--rerank {value!r}: expected itm:K, the cross-encoder (itm: the model's image-text "
                         f"matching head, e.g. BLIP's) and how many dual-encoder candidates per query it "
                         f"re-scores, e.g. --rerank itm:256 (RoCOCO's and BLIP's k_test for COCO)")
    k = int(m.group("k"))
    if k < 1:
        raise UsageError(f"--rerank {value}: K must be at least 1 (candidates re-scored per query), got {k}; "
                         f"e.g. --rerank itm:256")
    return RerankSpec(m.group("method"), k)


def candidates(xq: torch.Tensor, xb: torch.Tensor, k: int, *, budget_bytes: int = 64 << 20):
    """Each query's ``min(k, nb)`` candidates: ITC similarities ``D (nq, k')`` float32 and gallery
    positions ``I (nq, k')`` int64, score desc then lower index (``CANDIDATE_RULE``)."""
    return topk(xq, xb, min(k, xb.shape[0]), budget_bytes=budget_bytes)


def rescored_ranks(I: torch.Tensor, S: torch.Tensor, nb: int, group_bounds, pos_ptr, pos_idx, *,
                   tie_rule: str = "index", budget_bytes: int = 64 << 20) -> GroupedRanks:
    """``GroupedRanks`` of the matrix that is ``S[i, j]`` at ``(i, I[i, j])`` and ``FILL`` elsewhere
    (``I (nq, k)`` distinct gallery positions per row, ``S (nq, k)`` float32), as ``kernels.grouped_ranks``
    defines them for a score matrix: the best positive is the highest-scoring one, then the lowest index;
    a non-positive item beats it per ``tie_rule``. Rows are materialised a block at a time (never (nq, nb))."""
    if tie_rule not in TIE_RULES:
        raise ValueError(f"tie_rule must be one of {TIE_RULES}, got {tie_rule!r}")
    I, S = torch.as_tensor(I, dtype=torch.long).cpu(), torch.as_tensor(S, dtype=torch.float32).cpu()
    bounds = [int(b) for b in group_bounds]
    ptr, pidx = np.asarray(pos_ptr, dtype=np.int64), torch.as_tensor(np.asarray(pos_idx, dtype=np.int64))
    nq, G = I.shape[0], len(bounds) - 1
    counts = torch.zeros(nq, G, dtype=torch.long)
    pos_score = torch.empty(nq, dtype=torch.float32)
    pos_index = torch.empty(nq, dtype=torch.long)
    neg_score = torch.full((nq, G), float("-inf"), dtype=torch.float32)
    neg_index = torch.full((nq, G), -1, dtype=torch.long)
    gid = torch.repeat_interleave(torch.arange(G), torch.as_tensor(np.diff(bounds)))  # (nb,) group of each item
    col = torch.arange(nb)
    qb = max(1, budget_bytes // max(1, nb * 16))  # (qb, nb) float32 scores + bool masks per block
    for q0 in range(0, nq, qb):
        q1 = min(nq, q0 + qb)
        b = q1 - q0
        M = torch.full((b, nb), FILL, dtype=torch.float32)  # (b, nb) the re-scored rows
        M.scatter_(1, I[q0:q1], S[q0:q1])
        P = torch.zeros(b, nb, dtype=torch.bool)  # (b, nb) positives
        lens = torch.as_tensor(np.diff(ptr[q0:q1 + 1]))
        if (lens == 0).any():
            raise ValueError(f"query {q0 + int(torch.nonzero(lens == 0)[0])} has no positive")
        P[torch.repeat_interleave(torch.arange(b), lens), pidx[ptr[q0]:ptr[q1]]] = True
        s_star = torch.where(P, M, torch.tensor(float("-inf"))).max(1).values  # (b,)
        p_star = torch.where(P & (M == s_star[:, None]), col, nb).min(1).values  # (b,) lowest best positive
        if tie_rule == "index":
            beats = (M > s_star[:, None]) | ((M == s_star[:, None]) & (col < p_star[:, None]))
        elif tie_rule == "optimistic":
            beats = M > s_star[:, None]
        else:
            beats = M >= s_star[:, None]
        beats &= ~P
        counts[q0:q1] = torch.zeros(b, G, dtype=torch.long).index_add_(1, gid, beats.long())
        pos_score[q0:q1], pos_index[q0:q1] = s_star, p_star
        neg = torch.where(P, torch.tensor(float("-inf")), M)  # (b, nb)
        for g in range(G):
            lo, hi = bounds[g], bounds[g + 1]
            if hi == lo:
                continue
            part, free = neg[:, lo:hi], ~P[:, lo:hi]
            best = part.max(1).values
            first = torch.where(free & (part == best[:, None]), col[lo:hi], nb).min(1).values
            has = free.any(1)
            neg_score[q0:q1, g] = torch.where(has, best, torch.tensor(float("-inf")))
            neg_index[q0:q1, g] = torch.where(has, first, torch.tensor(-1))
    return GroupedRanks(counts, pos_score, pos_index, neg_score, neg_index)


def rerank_ranks(task: RankingTask, query_emb: np.ndarray, gallery_emb: np.ndarray,
                 scorer: Callable[[np.ndarray, np.ndarray], np.ndarray], spec: RerankSpec, *,
                 tie_rule: str = "index", device: str = "cpu", budget_bytes: int = 256 << 20,
                 pair_batch: int = 256) -> GroupedRanks:
    """The task's ranks after re-ranking (module docstring). ``*_emb``: whole-table embeddings of the
    query / gallery modality (rows gathered by the task's items); ``scorer(image_rows, text_rows)`` gives
    the cross-encoder's ``itm_logit[:, 1]`` of each (image, text) pair of table rows, ``pair_batch`` pairs
    per call (query-major order: one query's candidates are consecutive). ``info`` says what ran."""
    t0 = time.perf_counter()
    xq = torch.from_numpy(np.ascontiguousarray(query_emb[task.query_items])).float().to(device)
    xb = torch.from_numpy(np.ascontiguousarray(gallery_emb[task.gallery_items])).float().to(device)
    nb = xb.shape[0]
    D, I = candidates(xq, xb, spec.k, budget_bytes=budget_bytes)  # (nq, k') each
    D, I = D.cpu(), I.cpu()
    t_first = time.perf_counter() - t0
    nq, k = I.shape
    q_rows = np.repeat(task.query_items, k)                      # (nq * k,) table rows, query-major
    g_rows = task.gallery_items[I.reshape(-1).numpy()]           # (nq * k,)
    image_rows, text_rows = (q_rows, g_rows) if task.query_modality == "image" else (g_rows, q_rows)
    itm = np.empty(nq * k, dtype=np.float32)
    t1 = time.perf_counter()
    for s in range(0, nq * k, pair_batch):
        itm[s:s + pair_batch] = scorer(image_rows[s:s + pair_batch], text_rows[s:s + pair_batch])
    t_itm = time.perf_counter() - t1
    S = torch.from_numpy(itm).view(nq, k) + D  # itm_logit[:, 1] + s, float32
    t2 = time.perf_counter()
    ranks = rescored_ranks(I, S, nb, task.group_bounds, task.pos_ptr, task.pos_idx, tie_rule=tie_rule,
                           budget_bytes=budget_bytes)
    info = {"rerank": str(spec), "k": spec.k, "k_used": k, "gallery": nb, "pairs": nq * k, "pair_batch": pair_batch,
            "fill": FILL, "candidates": CANDIDATE_RULE,
            "seconds": {"first_stage": round(t_first, 4), "cross_encoder": round(t_itm, 4),
                        "ranks": round(time.perf_counter() - t2, 4)}}
    return GroupedRanks(ranks.counts, ranks.pos_score, ranks.pos_index, ranks.neg_score, ranks.neg_index, info)
