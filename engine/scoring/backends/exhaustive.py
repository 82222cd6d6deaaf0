"""The exhaustive backend: exact grouped ranks (``kernels.grouped_ranks``), exact streaming top-k (``kernels.topk``)."""
from __future__ import annotations

import numpy as np
import torch

from hardrank.kernels import grouped_ranks, precision_choice, topk
from hardrank.scoring.backends.base import RANKS, TOPK, Backend

__all__ = ["Exhaustive", "RankArrays", "KernelSearch", "kernel_searcher"]


class RankArrays:
    """GroupedRanks as numpy arrays (what metrics consume); ``info``: how the kernel scored them."""

    def __init__(self, r):
        self.info = {"precision": r.info["precision"]}
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


class KernelSearch:
    """Exact streaming top-k with ``kernels.topk`` over the corpus held in memory as fp32.

    The query blocking depends on the budget only, never on the corpus size, so a shard of the
    corpus scores every (query, item) pair with the same GEMM row blocks, hence the same bits, as
    the whole corpus does (column tiling does not change a score: ``kernels._common.score_tile``)."""

    exact = True

    def __init__(self, xb, budget_bytes: int, precision: str = "auto", block: int = 8192):
        self.xb = torch.from_numpy(np.ascontiguousarray(xb, dtype=np.float32))
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


def kernel_searcher(xb, opts, nq: int | None = None) -> KernelSearch:
    """Exact top-k over ``xb`` within ``opts.budget_mb`` (a quarter for the corpus's score tiles). ``nq``: the
    queries it will see (when known), for the precision record of the first GEMM."""
    block = opts.block_size if nq is None else max(1, min(opts.block_size, nq))
    return KernelSearch(xb, (opts.budget_mb << 20) // 4, opts.rank_precision, block)  # corpus (<= budget) + tiles


class Exhaustive(Backend):
    """Every (query, item) pair scored by the kernels: exact ranks and exact top-k."""

    name = "exhaustive"
    aliases = ("exact",)
    ops = {RANKS: "the exact kernels, one pass over the union of the gallery groups",
           TOPK: "exact streaming top-k (kernels.topk) over the fp32 corpus in memory"}
    gallery_shards = True

    def grouped_ranks(self, spec, xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule, device, budget_bytes,
                      precision):
        xq, xb = _as_tensor(xq, device), _as_tensor(xb, device)  # (nq, d), (nb, d)
        r = grouped_ranks(xq, xb, torch.from_numpy(group_bounds).to(device), torch.from_numpy(pos_ptr).to(device),
                          torch.from_numpy(pos_idx).to(device), tie_rule=tie_rule, precision=precision,
                          budget_bytes=budget_bytes)
        return RankArrays(r)

    def searcher(self, spec, xb, opts, nq=None):
        return kernel_searcher(xb, opts, nq)

    def describe(self, spec, shape, opts):
        return "exact search (kernels.topk)"
