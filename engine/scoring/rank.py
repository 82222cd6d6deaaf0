"""Scoring tasks with the kernels: grouped rank extraction for ranking tasks, grid scores for choice."""
from __future__ import annotations

import numpy as np
import torch

from hardrank.config import SearchSpec
from hardrank.kernels import choice_scores, grouped_ranks
from hardrank.tasks import ChoiceTask, RankingTask

__all__ = ["score_ranking", "score_choice", "RankArrays"]


class RankArrays:
    """GroupedRanks as numpy arrays (what metrics consume); ``info``: how the kernel scored them."""

    def __init__(self, r):
        self.info = {"search": "exhaustive", "precision": r.info["precision"]}
        if "precision_reason" in r.info:  # why that first GEMM: requested, or what auto found on this hardware
            self.info["precision_reason"] = r.info["precision_reason"]
        self.counts = r.counts.cpu().numpy()
        self.pos_score = r.pos_score.float().cpu().numpy()
        self.pos_index = r.pos_index.cpu().numpy()
        self.neg_score = r.neg_score.float().cpu().numpy()
        self.neg_index = r.neg_index.cpu().numpy()


def _as_tensor(x: np.ndarray, device: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    if device == "cpu" and t.dtype != torch.float32:
        t = t.float()  # CPU GEMMs in fp32
    return t.to(device)


def score_ranking(task: RankingTask, query_emb: np.ndarray, gallery_emb: np.ndarray, *, tie_rule: str = "index",
                  device: str = "cpu", budget_bytes: int = 256 << 20, search: SearchSpec | str = "exhaustive",
                  precision: str = "auto", ranker=None):
    """One kernel pass over the union of all groups. ``*_emb`` are whole-table embeddings of the
    query / gallery modality; rows are gathered by the task's item indices. ``precision``: the
    kernel's first GEMM (``kernels.resolve_precision``; results do not depend on it).
    ``search="faiss:<factory>"`` uses per-group FAISS top-k instead (``faiss_search.FaissRanks``:
    censored counts, ``info``). ``ranker``: a sharded pass (``hardrank.executors.ray_rank.ShardedRanker``)
    used for the galleries it ``wants``; its ranks equal the kernel's."""
    search = SearchSpec.parse(search)
    if search.method == "faiss":
        from hardrank.scoring.faiss_index import faiss_grouped_ranks  # faiss: imported by that module alone

        return faiss_grouped_ranks(query_emb[task.query_items], gallery_emb[task.gallery_items], task.group_bounds,
                                   task.pos_ptr, task.pos_idx, tie_rule=tie_rule, factory=search.factory,
                                   gpu="auto" if device.startswith("cuda") else False, budget_bytes=budget_bytes)
    if ranker is not None and ranker.wants(len(task.gallery_items), gallery_emb.shape[1]):
        r = ranker(query_emb[task.query_items], gallery_emb[task.gallery_items], task.group_bounds, task.pos_ptr,
                   task.pos_idx, tie_rule=tie_rule, precision=precision, budget_bytes=budget_bytes)
        out = RankArrays(r)
        out.info["sharded"] = r.info["sharded"]  # recorded in the result's provenance
        return out
    xq = _as_tensor(query_emb[task.query_items], device)      # (nq, d)
    xb = _as_tensor(gallery_emb[task.gallery_items], device)  # (nb, d)
    r = grouped_ranks(xq, xb, torch.from_numpy(task.group_bounds).to(device),
                      torch.from_numpy(task.pos_ptr).to(device), torch.from_numpy(task.pos_idx).to(device),
                      tie_rule=tie_rule, precision=precision, budget_bytes=budget_bytes)
    return RankArrays(r)


def score_choice(task: ChoiceTask, left_emb: np.ndarray, right_emb: np.ndarray, *, device: str = "cpu") -> np.ndarray:
    """(n, A, B) float32 scores of every row's grid."""
    s = choice_scores(_as_tensor(left_emb, device), _as_tensor(right_emb, device),
                      torch.from_numpy(task.left).to(device), torch.from_numpy(task.right).to(device))
    return s.float().cpu().numpy()
