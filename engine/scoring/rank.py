"""Scoring tasks: grouped ranks for ranking tasks through the search backends, grid scores for choice tasks."""
from __future__ import annotations

import numpy as np
import torch

from hardrank.kernels import choice_scores
from hardrank.scoring import backends
from hardrank.scoring.backends import Backend, SearchSpec
from hardrank.tasks import ChoiceTask, RankingTask

__all__ = ["score_ranking", "score_choice"]


def _as_tensor(x: np.ndarray, device: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    if device == "cpu" and t.dtype != torch.float32:
        t = t.float()  # CPU GEMMs in fp32
    return t.to(device)


def score_ranking(task: RankingTask, query_emb: np.ndarray, gallery_emb: np.ndarray, *, tie_rule: str = "index",
                  device: str = "cpu", budget_bytes: int = 256 << 20, search: SearchSpec | str = "exhaustive",
                  precision: str = "auto", backend: Backend | None = None):
    """The task's ranks from the search backend ``search`` names (``hardrank.scoring.backends``): exhaustive =
    one kernel pass over the union of all groups; ``faiss:<factory>`` = per-group FAISS top-k
    (``faiss_index.FaissRanks``: censored counts). ``*_emb`` are whole-table embeddings of the query /
    gallery modality; rows are gathered by the task's item indices. ``precision``: the kernel's first GEMM
    (``kernels.resolve_precision``; results do not depend on it). ``backend``: that backend as placed for
    this run (``backends.sharded.for_ranking``: galleries split over actors; the ranks are the same).
    ``info`` names the backend for the result's provenance."""
    return backends.grouped_ranks(search, query_emb[task.query_items], gallery_emb[task.gallery_items],
                                  task.group_bounds, task.pos_ptr, task.pos_idx, backend=backend, tie_rule=tie_rule,
                                  device=device, budget_bytes=budget_bytes, precision=precision)


def score_choice(task: ChoiceTask, left_emb: np.ndarray, right_emb: np.ndarray, *, device: str = "cpu") -> np.ndarray:
    """(n, A, B) float32 scores of every row's grid."""
    s = choice_scores(_as_tensor(left_emb, device), _as_tensor(right_emb, device),
                      torch.from_numpy(task.left).to(device), torch.from_numpy(task.right).to(device))
    return s.float().cpu().numpy()
