"""Streaming exact top-k by inner product, with optional per-query exclusions."""
from __future__ import annotations

import torch

from ._common import (
    check_csr,
    check_embeddings,
    csr_block,
    gallery_tiles,
    gemm_width,
    operand_dtype,
    order_keys,
    plan_tiles,
    query_block,
    score_tile,
    tile_segments,
)

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
        work = torch.empty(a.shape[0], gemm_width(tiles[0][2] - tiles[0][0]), dtype=torch.float32, device=device)
        for t, (c0, n0, c1) in enumerate(tiles):
            s = score_tile(a, xb, c0, c1, nqb, work)  # (nqb, w) float32
            if t in esegs:
                ea, eb = esegs[t]
                s.index_put_((erow[ea:eb], ecol[ea:eb] - c0), neg_inf)  # -inf = not a candidate
            if n0 > c0:
                s = s[:, n0 - c0:]  # the shifted last window: earlier columns were done already
            # Candidates beat the running k-th score strictly (ties lose: running items have lower
            # indices). After the first tiles only a few per row do, so they are gathered sparsely
            # instead of running torch.topk over the whole tile (~2.5 ns/score on CPU).
            kth = run_v[:, -1]  # (nqb,)
            found = _candidates(s, kth, nqb * k)
            if found is None:  # dense (first tiles): exact top-k of the tile, then merge every row
                v, i = _tile_topk(s, k)  # (nqb, kt), i local to the tile
                _merge(run_v, run_i, None, v, i + n0, k)
                continue
            r, c, vals = found  # sorted by row
            if r.numel() == 0:
                continue
            rows, cnt = torch.unique_consecutive(r, return_counts=True)
            seg = torch.repeat_interleave(torch.arange(rows.numel(), device=device), cnt)
            pos = torch.arange(r.numel(), device=device) - (torch.cumsum(cnt, 0) - cnt)[seg]
            width = int(cnt.max())
            v = torch.full((rows.numel(), width), float("-inf"), device=device)  # (r, width) padded
            i = torch.full((rows.numel(), width), nb, dtype=torch.long, device=device)
            v[seg, pos] = vals
            i[seg, pos] = c + n0
            _merge(run_v, run_i, rows, v, i, k)
        run_i = torch.where(run_v == float("-inf"), -1, run_i)  # excluded / padding -> -1
        D[r0:r1], I[r0:r1] = run_v, run_i
    return D, I


_CHUNK = 128


def _candidates(s: torch.Tensor, kth: torch.Tensor, limit: int):
    """(rows, cols, values) of the entries of s (r, w) with s[i, j] > kth[i], row-major; None if
    there are more than ``limit``. Whole 128-column chunks whose max does not pass are skipped, so
    the tile is read once (chunk maxima) and only the passing chunks again."""
    m, w = s.shape
    if s.is_contiguous() and w % _CHUNK == 0 and w > _CHUNK:
        s3 = s.view(m, w // _CHUNK, _CHUNK)
        rr, cc = torch.nonzero(s3.amax(2) > kth[:, None], as_tuple=True)  # passing chunks, row-major
        if 2 * rr.numel() <= m * (w // _CHUNK):  # worth it while at least half the tile is skipped
            sub = s3[rr, cc]  # (n_chunks, _CHUNK)
            r2, j2 = torch.nonzero(sub > kth[rr, None], as_tuple=True)
            if r2.numel() > limit:
                return None
            return rr[r2], cc[r2] * _CHUNK + j2, sub[r2, j2]
    r, c = torch.nonzero(s > kth[:, None], as_tuple=True)
    if r.numel() > limit:
        return None
    return r, c, s[r, c]


def _merge(run_v, run_i, rows, v, i, k) -> None:
    """Fold candidates (v, i) (r, kc) into the running top-k of ``rows`` (all rows if None), in place,
    exactly under (score desc, index asc)."""
    rv = run_v if rows is None else run_v[rows]
    ri = run_i if rows is None else run_i[rows]
    cv = torch.cat([rv, v], 1)  # (r, k + kc)
    ci = torch.cat([ri, i], 1)
    sel = order_keys(cv, ci).topk(k, dim=1).indices
    if rows is None:
        run_v.copy_(cv.gather(1, sel))
        run_i.copy_(ci.gather(1, sel))
    else:
        run_v[rows] = cv.gather(1, sel)
        run_i[rows] = ci.gather(1, sel)


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
