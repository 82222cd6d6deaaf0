"""Streaming exact top-k by inner product, with optional per-query exclusions."""
from __future__ import annotations

import torch

from ._common import (
    check_csr,
    check_embeddings,
    csr_block,
    entries_above,
    gallery_tiles,
    order_keys,
    plan_tiles,
    row_maxima,
    tile_segments,
)
from ._levels import CAND_LIMIT, BlockScorer, Escalation, Levels, first_level, lowp_tile
from .ranking import check_precision

__all__ = ["topk"]

_EXACTIFY = 64  # a row's candidate set past k + this is re-scored exactly (it then shrinks to k)


def topk(xq: torch.Tensor, xb: torch.Tensor, k: int, *, exclude_ptr=None, exclude_idx=None,
         precision: str = "auto", budget_bytes: int = 64 << 20, q_block: int | None = None,
         g_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k highest-scoring gallery items of every query: D (nq, k) float32, I (nq, k) int64.

    Scores are exact dot products rounded once to fp32, as in ``grouped_ranks`` (whatever
    ``precision`` scores the tiles first). Rows are sorted by score descending, then by index
    ascending; selection is exact under that order, ties at the k-th place included (the lowest
    indices win). Query i never gets ``exclude_idx[exclude_ptr[i]:exclude_ptr[i + 1]]`` (CSR; both or
    neither given). With fewer than k candidates the row is padded with -inf / -1.
    Memory as ``grouped_ranks``: query blocks against streamed gallery tiles, never (nq, nb).
    """
    check_precision(precision)
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
    device = xq.device
    first = first_level(precision, device, xq, xb)[0]
    plan = plan_tiles(nq, budget_bytes, q_block, g_block, nb, low_precision_tile=lowp_tile(first, device))
    D = torch.full((nq, k), float("-inf"), dtype=torch.float32, device=device)  # (nq, k) float32
    I = torch.full((nq, k), -1, dtype=torch.long, device=device)                # (nq, k) int64
    if nq == 0 or nb == 0 or k == 0:
        return D, I
    levels = Levels(xb, device, first)
    tiles = gallery_tiles(nb, plan.g_block)  # same-width GEMM windows, see grouped_ranks
    tile_starts = torch.tensor([t[1] for t in tiles], dtype=torch.long, device=device)  # owned starts
    eidx = eidx.to(device)
    for r0 in range(0, nq, plan.q_block):
        r1 = min(r0 + plan.q_block, nq)
        sc = levels.block(xq, r0, r1)
        erow, ecol = csr_block(ptr, eidx, r0, r1, device)
        blk = _TopkBlock(sc, k, nb, tiles, erow, ecol, tile_segments(ecol, tile_starts))
        esc = Escalation(sc)
        for t, (c0, _, c1) in enumerate(tiles):
            esc.run(c0, c1, lambda i, rows, r: blk.visit(t, i, rows, r))
        D[r0:r1], I[r0:r1] = blk.finish()
    return D, I


class _TopkBlock:
    """One query block's candidate sets: per row, every item seen so far that may still be in the
    exact top-k, with an interval [lo, hi] holding its exact score (lo == hi: known exactly). An item
    leaves when k others have lo above its hi; the survivors are re-scored exactly at the end."""

    def __init__(self, sc: BlockScorer, k: int, nb: int, tiles, erow, ecol, esegs):
        self.sc, self.k, self.nb, self.tiles = sc, k, nb, tiles
        self.erow, self.ecol, self.esegs = erow, ecol, esegs
        m, dev = sc.m, sc.a.device
        self.lo = torch.full((m, 0), float("-inf"), device=dev)  # (m, c) exact-score lower bounds
        self.hi = torch.full((m, 0), float("-inf"), device=dev)  # (m, c) upper bounds
        self.idx = torch.full((m, 0), nb, dtype=torch.long, device=dev)  # (m, c) gallery index; nb: empty
        self.tau = torch.full((m,), float("-inf"), device=dev)  # k-th largest lo: items above it may enter
        self.floor = [torch.full((m,), float("-inf"), device=dev) for _ in range(sc.n_levels - 1)]
        self.neg_inf = torch.full((m,), float("-inf"), device=dev)

    def _mask_excluded(self, t: int, rows, r: torch.Tensor) -> None:
        seg = self.esegs.get(t)
        if seg is None:
            return
        ea, eb = seg
        erow, ecol = self.erow[ea:eb], self.ecol[ea:eb] - self.tiles[t][0]
        if rows is not None:
            pos = torch.full((self.sc.m,), -1, dtype=torch.long, device=r.device)
            pos[rows] = torch.arange(rows.numel(), device=r.device)
            erow = pos[erow]
            keep = erow >= 0
            erow, ecol = erow[keep], ecol[keep]
        r.index_put_((erow, ecol), self.neg_inf[:1].to(r.dtype))  # -inf = not a candidate

    def visit(self, t: int, i: int, rows, r: torch.Tensor):
        self._mask_excluded(t, rows, r)
        sc, k = self.sc, self.k
        c0, n0, c1 = self.tiles[t]
        v = r if n0 == c0 else r[:, n0 - c0:]  # the shifted last window: earlier columns were done already
        kk = v.shape[0]
        brow = torch.arange(kk, device=v.device) if rows is None else rows
        if i == sc.n_levels - 1:
            return self._visit_exact(brow, v, n0)
        floor = self.floor[i] if rows is None else self.floor[i][rows]  # r <= floor: e <= tau
        mx, cm = row_maxima(v)
        act = torch.nonzero(mx > floor).squeeze(1)
        if not act.numel():
            return None, None
        thr = floor[act]
        # rows with fewer than k known-good items: the tile's own k-th value bounds its candidates
        open_ = torch.nonzero(self.tau[brow[act]] == float("-inf")).squeeze(1)
        if open_.numel() and v.shape[1] > k:
            vk = v[act[open_]].topk(k, dim=1).values[:, -1].float()  # (o,) k-th largest tile value
            orows = brow[act[open_]]
            lo_k = sc.lo(i, vk, orows)
            own = sc.le(i, torch.nextafter(lo_k, self.neg_inf[:lo_k.numel()]), orows)
            thr[open_] = torch.maximum(thr[open_], torch.where(vk > float("-inf"), own, thr[open_]))
        pos, cols, vals = entries_above(v, thr, act, cm)
        crowd = torch.bincount(pos, minlength=act.numel()) > k + CAND_LIMIT
        esc = None
        if bool(crowd.any()):  # a flood of near-ties: one level up scores them apart (or exactly)
            esc = act[crowd]
            ok = ~crowd[pos]
            pos, cols, vals = pos[ok], cols[ok], vals[ok]
        crow = brow[act][pos]
        self._merge(crow, cols + n0, sc.lo(i, vals, crow), sc.hi(i, vals, crow))
        if esc is not None:  # rows whose fp32 scores here are exact (coarse-grid data) need no next level
            ex = sc.exact_rows(i, brow[esc], c0, c1)
            if bool(ex.any()):
                self._visit_exact(brow[esc[ex]], v[esc[ex]], n0)
                esc = esc[~ex]
        return esc, None

    def _visit_exact(self, brow, e: torch.Tensor, n0: int):
        """Exact scores e (k, w): each row's exact top-k of the tile joins its set as known items."""
        kk, w = e.shape
        cols = torch.arange(n0, n0 + w, device=e.device).expand(kk, w)
        keys = order_keys(e, cols)
        sel = keys.topk(min(self.k, w), dim=1).indices  # (kk, k) exact top-k of the tile rows
        vals, idx = e.gather(1, sel), cols.gather(1, sel)
        ok = vals > self.tau[brow][:, None]  # ties with tau lose: they come after the items holding it
        r_, c_ = torch.nonzero(ok, as_tuple=True)
        if r_.numel():
            self._merge(brow[r_], idx[r_, c_], vals[r_, c_], vals[r_, c_])
        return None, None

    def _merge(self, rows: torch.Tensor, cols: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> None:
        """Add candidates (row-major by block row) to their rows' sets and prune them."""
        if not rows.numel():
            return
        dev = rows.device
        urows, cnt = torch.unique_consecutive(rows, return_counts=True)
        seg = torch.searchsorted(urows, rows)  # (n,) which set each candidate joins
        slot = torch.arange(rows.numel(), device=dev) - (torch.cumsum(cnt, 0) - cnt)[seg]
        w = int(cnt.max())
        nlo = torch.full((urows.numel(), w), float("-inf"), device=dev)
        nhi, nidx = nlo.clone(), torch.full((urows.numel(), w), self.nb, dtype=torch.long, device=dev)
        nlo[seg, slot], nhi[seg, slot], nidx[seg, slot] = lo, hi, cols
        L = torch.cat([self.lo[urows], nlo], 1)  # (u, c + w)
        H = torch.cat([self.hi[urows], nhi], 1)
        X = torch.cat([self.idx[urows], nidx], 1)
        self._store(urows, L, H, X)

    def _store(self, urows, L, H, X) -> None:
        k = self.k
        if L.shape[1] >= k:
            tau = L.topk(k, dim=1).values[:, -1]  # k items are at least this good
        else:
            tau = torch.full((L.shape[0],), float("-inf"), device=L.device)
        live = (H >= tau[:, None]) & (X < self.nb)  # below tau: k items surely beat it
        big = torch.nonzero(live.sum(1) > k + _EXACTIFY).squeeze(1)
        if big.numel():  # crowded by near-ties: settle those rows exactly
            L, H, X, live, tau = self._exactify(urows[big], big, L, H, X, live, tau)
        # compact: live entries to the front of each row, in order (a cumulative count gives each its slot)
        slot = torch.cumsum(live, 1) - 1
        r_, j_ = torch.nonzero(live, as_tuple=True)
        s_ = slot[r_, j_]
        width = int(s_.max()) + 1 if s_.numel() else 0
        if width > self.lo.shape[1]:  # widen every row's set
            pad = width - self.lo.shape[1]
            self.lo = torch.nn.functional.pad(self.lo, (0, pad), value=float("-inf"))
            self.hi = torch.nn.functional.pad(self.hi, (0, pad), value=float("-inf"))
            self.idx = torch.nn.functional.pad(self.idx, (0, pad), value=self.nb)
        c = self.lo.shape[1]
        nL = torch.full((urows.numel(), c), float("-inf"), device=L.device)
        nH, nX = nL.clone(), torch.full((urows.numel(), c), self.nb, dtype=torch.long, device=L.device)
        nL[r_, s_], nH[r_, s_], nX[r_, s_] = L[r_, j_], H[r_, j_], X[r_, j_]
        self.lo[urows], self.hi[urows], self.idx[urows] = nL, nH, nX
        self.tau[urows] = tau
        below = tau  # r <= le(tau) proves e <= tau: such an item comes after the k holding tau
        for i, f in enumerate(self.floor):
            f[urows] = self.sc.le(i, below, urows)

    def _exactify(self, brows, big, L, H, X, live, tau):
        """Re-score the unknown members of rows ``big`` (positions into L) exactly and keep their exact
        top-k; the other rows pass through."""
        sub_L, sub_X, sub_live = L[big], X[big], live[big]
        r_, c_ = torch.nonzero(sub_live & (sub_L != H[big]), as_tuple=True)
        if r_.numel():
            e = self.sc.exact(brows[r_], sub_X[r_, c_])
            sub_L = sub_L.clone()
            sub_L[r_, c_] = e
        vals = torch.where(sub_live, sub_L, float("-inf"))
        keys = order_keys(vals, torch.where(sub_live, sub_X, self.nb))
        top = keys.topk(min(self.k, keys.shape[1]), dim=1).indices
        L, H, X, live, tau = L.clone(), H.clone(), X.clone(), live.clone(), tau.clone()
        keep = torch.zeros_like(sub_live).scatter_(1, top, True) & sub_live
        L[big] = torch.where(keep, sub_L, float("-inf"))
        H[big] = L[big]
        X[big] = torch.where(keep, sub_X, self.nb)
        live[big] = keep
        # the k-th exact value; a later item needs strictly more (ties lose to these earlier ones)
        kth = torch.where(keep, sub_L, float("inf")).amin(1)
        tau[big] = torch.where(keep.sum(1) >= self.k, kth, float("-inf"))
        return L, H, X, live, tau

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact scores of the surviving candidates, then each row's exact top-k: (D, I) (m, k)."""
        k, sc = self.k, self.sc
        L, H, X = self.lo, self.hi, self.idx
        r_, c_ = torch.nonzero((L != H) & (X < self.nb), as_tuple=True)
        if r_.numel():
            L = L.clone()
            L[r_, c_] = sc.exact(r_, X[r_, c_])
        m = L.shape[0]
        if L.shape[1] < k:
            L = torch.nn.functional.pad(L, (0, k - L.shape[1]), value=float("-inf"))
            X = torch.nn.functional.pad(X, (0, k - X.shape[1]), value=self.nb)
        sel = order_keys(L, X).topk(k, dim=1).indices
        D, I = L.gather(1, sel), X.gather(1, sel)
        I = torch.where((D == float("-inf")) | (I >= self.nb), -1, I)
        D = torch.where(I < 0, float("-inf"), D)
        assert D.shape == (m, k)
        return D, I
