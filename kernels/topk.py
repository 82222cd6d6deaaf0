"""Streaming exact top-k by inner product, with optional per-query exclusions."""
from __future__ import annotations

import torch

from ._common import (check_csr, check_embeddings, csr_block, gallery_tiles, operand_dtype, order_keys,
                      plan_tiles, query_block, score_tile, tile_segments)

__all__ = ["topk"]


def topk(xq: torch.Tensor, xb: torch.Tensor, k: int, *, exclude_ptr=None, exclude_idx=None,
         budget_bytes: int = 64 << 20, q_block: int | None = None,
         g_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k highest-scoring gallery items of every query: D (nq, k) float32, I (nq, k) int64.

    Scores are ``xq @ xb.T`` (fp32, as in ``grouped_ranks``). Rows are sorted by score descending,
    then by index ascending; selection is exact under that order, ties at the k-th place included
    (the lowest indices win). Query i never gets ``exclude_idx[exclude_ptr[i]:exclude_ptr[i + 1]]``
    (CSR; both or neither given). With fewer than k candidates the row is padded with -inf / -1.
    Memory as ``grouped_ranks``: query blocks against streamed gallery tiles, never (nq, nb).
    """
    check_embeddings("xq", xq)
    check_embeddings("xb", xb, d=xq.shape[1])
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative int, got {k!r}")
    nq, nb = xq.shape[0], xb.shape[0]
    if nb >= 1 << 32:
        raise ValueError(f"gallery of nb={nb} items exceeds the 2**32 supported by the tie-break keys")
    if (exclude_ptr is None) != (exclude_idx is None):
        raise ValueError("exclude_ptr and exclude_idx come together (CSR): pass both or neither")
    if exclude_ptr is not None:
        ptr, eidx = check_csr("exclude_ptr", "exclude_idx", exclude_ptr, exclude_idx, nq, nb, "a gallery")
    else:
        ptr, eidx = [0] * (nq + 1), torch.zeros(0, dtype=torch.long)
    plan = plan_tiles(nq, budget_bytes, q_block, g_block, nb)
    device = xq.device
    D = torch.full((nq, k), float("-inf"), dtype=torch.float32, device=device)  # (nq, k) float32
    I = torch.full((nq, k), -1, dtype=torch.long, device=device)                # (nq, k) int64
    if nq == 0 or nb == 0 or k == 0:
        return D, I

    tiles = gallery_tiles(nb, plan.g_block)  # same-width GEMM windows, see grouped_ranks
    tile_starts = torch.tensor([t[1] for t in tiles], dtype=torch.long, device=device)  # owned starts
    op_dtype = operand_dtype(xq, xb, device)
    eidx = eidx.to(device)
    neg_inf = torch.tensor(float("-inf"), device=device)
    for r0 in range(0, nq, plan.q_block):
        r1 = min(r0 + plan.q_block, nq)
        nqb = r1 - r0
        a = query_block(xq, r0, r1, op_dtype, device)  # (nqb, d)
        erow, ecol = csr_block(ptr, eidx, r0, r1, device)
        esegs = tile_segments(ecol, tile_starts)
        run_v = torch.full((nqb, k), float("-inf"), device=device)  # (nqb, k) float32 running top-k
        run_i = torch.full((nqb, k), nb, dtype=torch.long, device=device)  # nb: sentinel, sorts last
        work = torch.empty(a.shape[0], tiles[0][2] - tiles[0][0], dtype=torch.float32, device=device)
        for t, (c0, n0, c1) in enumerate(tiles):
            s = score_tile(a, xb, c0, c1, nqb, work)  # (nqb, w) float32
            if t in esegs:
                ea, eb = esegs[t]
                s.index_put_((erow[ea:eb], ecol[ea:eb] - c0), neg_inf)  # -inf = not a candidate
            if n0 > c0:
                s = s[:, n0 - c0:]  # the shifted last window: earlier columns were done already
            rows = None
            if device.type == "cpu":
                # Only rows whose tile max beats their running k-th score can change (ties lose: the
                # running items have lower indices). Late tiles rarely touch many rows.
                live = s.amax(1) > run_v[:, -1]
                n_live = int(live.sum())
                if n_live == 0:
                    continue
                if 2 * n_live < nqb:
                    rows = torch.nonzero(live).squeeze(1)
                    s = s[rows]
            v, i = _tile_topk(s, k)  # (r, kt) candidates, i local to the tile
            i = i + n0
            rv = run_v if rows is None else run_v[rows]
            ri = run_i if rows is None else run_i[rows]
            cv = torch.cat([rv, v], 1)  # (r, k + kt)
            ci = torch.cat([ri, i], 1)
            sel = order_keys(cv, ci).topk(k, dim=1).indices  # exact (score desc, index asc)
            nv, ni = cv.gather(1, sel), ci.gather(1, sel)
            if rows is None:
                run_v, run_i = nv, ni
            else:
                run_v[rows], run_i[rows] = nv, ni
        run_i = torch.where(run_v == float("-inf"), -1, run_i)  # excluded / padding -> -1
        D[r0:r1], I[r0:r1] = run_v, run_i
    return D, I


def _tile_topk(s: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-min(k, w) of each row of s (r, w) under (score desc, index asc).

    torch.topk may pick any of several equal scores at the k-th place; asking for k + 1 shows where
    that can happen (k-th == (k+1)-th score) and only those rows are redone with tie-break keys.
    """
    r, w = s.shape
    if w <= k:
        return s, torch.arange(w, device=s.device).expand(r, w)
    v, i = s.topk(k + 1, dim=1)  # sorted descending
    amb = (v[:, k - 1] == v[:, k]) & (v[:, k] > float("-inf"))
    v, i = v[:, :k], i[:, :k]
    if bool(amb.any()):
        rows = torch.nonzero(amb).squeeze(1)
        sub = s[rows]  # (ra, w)
        cols = torch.arange(w, device=s.device).expand_as(sub)
        ii = order_keys(sub, cols).topk(k, dim=1).indices
        v, i = v.clone(), i.clone()
        v[rows], i[rows] = sub.gather(1, ii), ii
    return v, i
