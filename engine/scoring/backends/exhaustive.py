"""The exhaustive backend: exact grouped ranks (``kernels.grouped_ranks``), exact streaming top-k (``kernels.topk``)."""
from __future__ import annotations

import numpy as np
import torch

from hardrank.kernels import grouped_ranks, precision_choice, topk
from hardrank.scoring import corpus_io
from hardrank.scoring.backends.base import RANKS, TOPK, Backend, MinePlan

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
    """Exact streaming top-k with ``kernels.topk``: the corpus read in tiles of rows (``corpus_io.read_tile``:
    a memory-mapped fp16 corpus stays fp16 on disk, each tile converted to fp32 as the kernel needs it; a
    corpus held as fp32 in memory is searched in place), every query's running top-kk merged tile by tile.

    Scores are the kernel's exact dot products rounded once to fp32, which depend on the two vectors alone
    (``kernels._exact``), and each tile's list holds its best items in the global order (score descending,
    then row ascending), so the merge equals one ``topk`` call over the whole corpus, bit for bit, whatever
    the tiling, and a shard of the corpus (``executors.ray_search``) scores every pair the same.

    Memory: one tile (a quarter of ``budget_bytes``) and the kernel's score tiles (another quarter), whatever
    the corpus's size. ``progress``: called with the rows of each tile searched (progress lines)."""

    exact = True

    def __init__(self, xb, budget_bytes: int, precision: str = "auto", block: int = 8192):
        self.xb = xb
        nb, d = xb.shape
        self.budget = budget_bytes
        self.precision = precision
        in_place = isinstance(xb, np.ndarray) and xb.dtype == np.float32 and not corpus_io.mapped(xb)
        self.tile_rows = nb if in_place else max(1, min(nb, (budget_bytes // 4) // max(1, 4 * d)))
        self.q_block = max(1, min(2048, budget_bytes // 4 // (16 * 1024)))  # a 1024-wide tile and its temporaries
        self.progress = None
        # the kernel's first GEMM on a block of queries (results do not depend on it)
        first, why = precision_choice(precision, "cpu", work=block * min(nb, self.tile_rows) * d)
        self.info = {"method": "exact", "backend": "kernels.topk", "precision": first, "precision_reason": why,
                     "tile_rows": int(self.tile_rows)}

    def __call__(self, xq, kk, excl):
        m, nb = len(xq), len(self.xb)
        D = np.full((m, kk), -np.inf, np.float32)
        I = np.full((m, kk), -1, np.int64)
        if m == 0 or nb == 0 or kk == 0:
            return D, I
        q = torch.from_numpy(np.ascontiguousarray(xq, dtype=np.float32))
        for lo in range(0, nb, self.tile_rows):
            hi = min(nb, lo + self.tile_rows)
            tile = corpus_io.read_tile(self.xb, lo, hi)  # (w, d) float32
            kw = {}
            if excl is not None:
                ptr, idx = _local(excl, lo, hi)
                kw = {"exclude_ptr": torch.from_numpy(ptr), "exclude_idx": torch.from_numpy(idx)}
            Dt, It = topk(q, torch.from_numpy(tile), min(kk, hi - lo), precision=self.precision,
                          budget_bytes=self.budget // 4, q_block=self.q_block, **kw)
            del tile
            corpus_io.release(self.xb)
            It = It.numpy().astype(np.int64)
            D, I = _merge_after(D, I, Dt.float().numpy(), np.where(It >= 0, It + lo, -1), kk)
            if self.progress is not None:
                self.progress(hi - lo)
        return D, I


def _local(excl, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The exclusions (CSR over queries of corpus rows) inside rows [lo, hi), as rows of that tile."""
    ptr, idx = excl
    keep = (idx >= lo) & (idx < hi)
    row = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    new_ptr = np.zeros(len(ptr), np.int64)
    np.cumsum(np.bincount(row[keep], minlength=len(ptr) - 1), out=new_ptr[1:])
    return new_ptr, (idx[keep] - lo).astype(np.int64)


def _merge_after(D, I, Dt, It, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """The top-kk of a running list (D, I) and the list of a later tile (Dt, It), every row of it after
    every row already seen: a stable sort by score, the running list first, keeps the order (score
    descending, then row ascending); -0.0 and 0.0 tie, as in the kernels."""
    Dc, Ic = np.concatenate([D, Dt], 1), np.concatenate([I, It], 1)
    order = np.argsort(-Dc, axis=1, kind="stable")[:, :kk]
    Dc, Ic = np.take_along_axis(Dc, order, 1), np.take_along_axis(Ic, order, 1)
    if Dc.shape[1] < kk:
        pad = kk - Dc.shape[1]
        Dc = np.concatenate([Dc, np.full((len(Dc), pad), -np.inf, np.float32)], 1)
        Ic = np.concatenate([Ic, np.full((len(Ic), pad), -1, np.int64)], 1)
    return Dc, np.where(Dc == -np.inf, -1, Ic)


def kernel_searcher(xb, opts, nq: int | None = None) -> KernelSearch:
    """Exact streaming top-k over ``xb`` within ``opts.budget_mb`` (a tile of the corpus and the kernel's score
    tiles). ``nq``: the queries it will see (when known), for the precision record of the first GEMM."""
    block = opts.block_size if nq is None else max(1, min(opts.block_size, nq))
    return KernelSearch(xb, opts.budget_mb << 20, opts.rank_precision, block)


class Exhaustive(Backend):
    """Every (query, item) pair scored by the kernels: exact ranks and exact top-k."""

    name = "exhaustive"
    aliases = ("exact",)
    ops = {RANKS: "the exact kernels, one pass over the union of the gallery groups",
           TOPK: "exact streaming top-k (kernels.topk) over the corpus in tiles within --budget-mb"}
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
        return "exact search (kernels.topk, the corpus streamed in tiles)"

    def mining_plan(self, spec, nq, shape, opts, *, mapped=False, built=None):
        return MinePlan(self.describe(spec, shape, opts), f"--search {spec}")
