"""Grouped rank extraction: per query and gallery group, how many items beat the best positive."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ._common import (
    CHUNK,
    check_csr,
    check_embeddings,
    check_int_tensor,
    chunked,
    count_gt,
    csr_block,
    entries_above,
    gallery_tiles,
    plan_tiles,
    row_maxima,
    tile_group_segments,
    tile_segments,
)
from ._exact import exact_dot
from ._levels import (
    CAND_LIMIT,
    PRECISIONS,
    BlockScorer,
    Escalation,
    Levels,
    crowd_limit,
    first_level,
    lowp_tile,
)

__all__ = ["TIE_RULES", "GroupedRanks", "grouped_ranks", "best_positives"]

# How an item with exactly the best positive's score is counted (docs/retrieval.md, "Ties"):
TIE_RULES = (
    "index",        # it beats the positive iff it comes first in gallery order (default)
    "optimistic",   # it never beats the positive (only strictly greater scores do)
    "pessimistic",  # it always beats the positive
)


@dataclass(frozen=True, eq=False)  # eq on tensors would be ambiguous
class GroupedRanks:
    """Per query i and gallery group g; the rank of i over a union U of groups is
    ``counts[i, U].sum()`` (0 = the best positive is top-1)."""

    counts: torch.Tensor     # (nq, G) int64: non-positive items of group g that beat the best positive
    pos_score: torch.Tensor  # (nq,) float32: score of the best positive
    pos_index: torch.Tensor  # (nq,) int64: gallery index of the best positive (score desc, then lowest index)
    neg_score: torch.Tensor  # (nq, G) float32: best non-positive score in group g (-inf if the group has none)
    neg_index: torch.Tensor  # (nq, G) int64: its gallery index, lowest among ties (-1 if none)
    info: dict = field(default_factory=dict)  # how it was computed: precision, rows scored per level, ...

    def rank(self, groups=None) -> torch.Tensor:
        """(nq,) int64 rank over the union of ``groups`` (indices into G; all groups by default)."""
        c = self.counts if groups is None else self.counts[:, list(groups)]
        return c.sum(1)


# --- the per-piece reduction: counts against two thresholds and chunk maxima -----------------------
# Row maxima are kept per 128-column chunk: as cheap as the plain row max, and they let the sparse
# searches for undecided items skip chunks without reading them again.

def _count2_cmax(s: torch.Tensor, t_up: torch.Tensor, t_sure: torch.Tensor):
    """s (m, w) float32 (w a multiple of CHUNK) -> counts of s > t_up and s > t_sure (m,) int32, chunk
    maxima (m, w / CHUNK)."""
    m, w = s.shape
    v = s.view(m, w // CHUNK, CHUNK)
    # per-chunk float counts (exact: integers <= 128), then per row: the form inductor vectorises best
    up = (v > t_up[:, None, None]).to(torch.float32).sum(2).sum(1)
    sure = (v > t_sure[:, None, None]).to(torch.float32).sum(2).sum(1)
    return up.to(torch.int32), sure.to(torch.int32), v.amax(2)


# torch.compile can fuse both compares, the counts and the chunk maxima into one pass over the tile.
# Compiling costs seconds (tens on a cold cache), so it is opt-in: HARDRANK_COMPILE=1. CPU only.
_compiled = None   # the compiled function once built; False when compiling failed


def _compiled_count2_cmax():
    global _compiled
    if _compiled is None:
        try:
            _compiled = torch.compile(_count2_cmax, dynamic=True)
        except Exception:  # no compiler toolchain, unsupported platform, ...
            _compiled = False
    return _compiled


def _use_compiled(device: torch.device) -> bool:
    return device.type == "cpu" and os.environ.get("HARDRANK_COMPILE", "0") == "1" and _compiled is not False


def _piece_stats(v, sure_below, up, fused: bool, buf):
    """For a piece v (k, w) of a tile: counts of v > sure_below (proved above the threshold) and of
    v > up (possibly above), the row max and chunk maxima (None unless v is chunked). CPU: rows whose
    max does not pass ``up`` count 0; with a good model that is nearly every row of nearly every tile."""
    global _compiled
    k = v.shape[0]
    ch = chunked(v)
    if fused and ch and k >= 2:  # size 1 would force an extra specialised compile
        fn = _compiled_count2_cmax()
        if fn:
            try:
                n_up, n_sure, cm = fn(v, up, sure_below)
                cm = cm.float()
                return n_sure, n_up, cm.amax(1), cm
            except Exception:  # compile failed at first call: stay eager from now on
                _compiled = False
    mx, cm = row_maxima(v)
    if v.device.type != "cpu":
        return count_gt(v, sure_below), count_gt(v, up), mx, cm
    active = mx > up
    n_active = int(active.sum())
    # mostly active fp32 rows: count in place; a 2-byte tile widens its active rows once instead (comparing
    # bf16 against fp32 thresholds widens every value, per threshold)
    if 2 * n_active >= k and v.dtype == torch.float32:
        return count_gt(v, sure_below, buf), count_gt(v, up, buf), mx, cm
    n_sure = torch.zeros(k, dtype=torch.int32, device=v.device)
    n_up = torch.zeros(k, dtype=torch.int32, device=v.device)
    if n_active:
        rows = torch.nonzero(active).squeeze(1)
        sub = v[rows].float()
        n_sure[rows] = count_gt(sub, sure_below[rows])
        n_up[rows] = count_gt(sub, up[rows])
    return n_sure, n_up, mx, cm


def _check_bounds(group_bounds, nb: int) -> list[int]:
    b = check_int_tensor("group_bounds", group_bounds, 1).cpu()
    if b.numel() < 1:
        raise ValueError("group_bounds must have G + 1 >= 1 entries [0, ..., nb], got an empty tensor")
    if int(b[0]) != 0 or int(b[-1]) != nb:
        raise ValueError(f"group_bounds must start at 0 and end at nb={nb} (the gallery size), "
                         f"got first={int(b[0])}, last={int(b[-1])}")
    d = b[1:] - b[:-1]
    if d.numel() and bool((d < 0).any()):
        g = int(torch.nonzero(d < 0)[0])
        raise ValueError(f"group_bounds must be non-decreasing, but group_bounds[{g}] = {int(b[g])} > "
                         f"group_bounds[{g + 1}] = {int(b[g + 1])}")
    return b.tolist()


def check_rank_inputs(group_bounds, pos_ptr, pos_idx, nq: int, nb: int, every_query: bool = True
                      ) -> tuple[list[int], list[int], torch.Tensor]:
    """``grouped_ranks``'s checks of its groups and positives for nq queries against nb items: (bounds,
    pos_ptr as a list, pos_idx int64). ``every_query``: each query needs a positive (not for one gallery
    shard given its threshold). Callers that split the work (sharded galleries) run them up front."""
    bounds = _check_bounds(group_bounds, nb)
    ptr, pidx = check_csr("pos_ptr", "pos_idx", pos_ptr, pos_idx, nq, nb, "a gallery")
    for i in range(nq if every_query else 0):
        if ptr[i + 1] == ptr[i]:
            raise ValueError(f"query {i} has no positive (pos_ptr[{i}] == pos_ptr[{i + 1}] == {ptr[i]}); "
                             "every query needs at least one positive in the gallery")
    return bounds, ptr, pidx


def check_precision(precision) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def grouped_ranks(xq: torch.Tensor, xb: torch.Tensor, group_bounds, pos_ptr, pos_idx, *,
                  tie_rule: str = "index", precision: str = "auto", budget_bytes: int = 64 << 20,
                  q_block: int | None = None, g_block: int | None = None, threshold=None) -> GroupedRanks:
    """Exact ranks of every query's best positive, counted per gallery group, in one streamed pass.

    xq (nq, d) queries and xb (nb, d) gallery (L2-normalised by the caller). The score of query i and
    item j is their exact dot product rounded once to fp32 (both rows taken as fp32; ties to even):
    a property of the two vectors alone, so an exact duplicate of an item scores exactly like it, and
    the result does not depend on the precision, tiling, device or BLAS (``reference.py`` computes
    the same bits). Group g is the gallery slice ``[group_bounds[g], group_bounds[g + 1])``. Query
    i's positives are ``pos_idx[pos_ptr[i]:pos_ptr[i + 1]]`` (gallery indices, any order, duplicates
    allowed); each query needs one. The best positive p* has the highest score, then the lowest
    index. A non-positive item j beats it per ``tie_rule``: ``index``: s_j > s* or (s_j == s* and
    j < p*); ``optimistic``: s_j > s*; ``pessimistic``: s_j >= s*.

    ``precision`` is the GEMM that scores the tiles first: ``fp32``, ``bf16``/``fp16`` (several times
    faster where the hardware has low-precision matrix units), or ``auto`` (``resolve_precision``).
    Each tile score comes with a rigorous error bound (``_levels``); items the bound cannot place
    against the threshold are re-scored exactly, and rows with too many of them are scored again in
    fp32 (then fp64). ``info`` says what ran. Runs on xq's device.

    ``threshold=(s_star, p_star)`` (one gallery shard of a larger one, ``best_positives``): each
    query's best positive is given instead of found: s_star (nq,) float32 its exact score, p_star
    (nq,) int64 its index in this gallery's frame, which may lie outside [0, nb) when it is held by
    another shard (under ``index`` an item scoring exactly s_star then beats it iff its index <
    p_star: every such item when p_star >= nb, none when p_star < 0). The positives are not scored,
    queries may have none here, the positives present are still excluded from the counts and best
    negatives, and pos_score / pos_index echo the threshold. Per-shard counts then add up to the
    whole gallery's.
    Memory: never (nq, nb); queries go in blocks of ``q_block`` rows against gallery tiles of at most
    ``g_block`` columns (all the same width; a tile straddling groups is counted per piece), sized
    from ``budget_bytes`` unless given.
    """
    if tie_rule not in TIE_RULES:
        raise ValueError(f"tie_rule must be one of {TIE_RULES}, got {tie_rule!r}")
    check_precision(precision)
    check_embeddings("xq", xq)
    check_embeddings("xb", xb, d=xq.shape[1])
    nq, nb = xq.shape[0], xb.shape[0]
    bounds, ptr, pidx = check_rank_inputs(group_bounds, pos_ptr, pos_idx, nq, nb, every_query=threshold is None)
    given = None if threshold is None else _check_threshold(threshold, nq, xq.device)
    device = xq.device
    first, why = first_level(precision, device, xq, xb)
    plan = plan_tiles(nq, budget_bytes, q_block, g_block, nb, low_precision_tile=lowp_tile(first, device))
    G = len(bounds) - 1
    out = GroupedRanks(
        counts=torch.zeros(nq, G, dtype=torch.long, device=device),
        pos_score=torch.empty(nq, dtype=torch.float32, device=device),
        pos_index=torch.empty(nq, dtype=torch.long, device=device),
        neg_score=torch.full((nq, G), float("-inf"), dtype=torch.float32, device=device),
        neg_index=torch.full((nq, G), -1, dtype=torch.long, device=device),
    )
    out.info.update(precision=first, precision_reason=why, q_block=plan.q_block, g_block=plan.g_block)
    if given is not None:
        out.pos_score.copy_(given[0])
        out.pos_index.copy_(given[1])
    if nq == 0 or nb == 0:
        return out
    rp = _RankPass(xq, Levels(xb, device, first), bounds, ptr, pidx.to(device), plan.g_block, tie_rule, out, given)
    for r0 in range(0, nq, plan.q_block):
        rp.block(r0, min(r0 + plan.q_block, nq))
    out.info.update(rp.stats)
    return out


def _check_threshold(threshold, nq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``threshold=(s_star, p_star)``: (nq,) float32 scores (not NaN) and (nq,) integer indices."""
    try:
        s_star, p_star = threshold
    except (TypeError, ValueError) as e:
        raise ValueError("threshold must be a pair (s_star, p_star) of (nq,) tensors: the best positive's "
                         "exact score (float32) and gallery index (int64) per query") from e
    if not isinstance(s_star, torch.Tensor) or s_star.dtype != torch.float32 or tuple(s_star.shape) != (nq,):
        what = f"{s_star.dtype} {tuple(s_star.shape)}" if isinstance(s_star, torch.Tensor) else type(s_star).__name__
        raise ValueError(f"threshold s_star must be a float32 tensor of shape ({nq},) (exact scores, as "
                         f"best_positives returns them), got {what}")
    if bool(torch.isnan(s_star).any()):
        i = int(torch.nonzero(torch.isnan(s_star))[0])
        raise ValueError(f"threshold s_star[{i}] is NaN; every query needs its best positive's score")
    p_star = check_int_tensor("threshold p_star", p_star, 1)
    if p_star.numel() != nq:
        raise ValueError(f"threshold p_star must have shape ({nq},), got {tuple(p_star.shape)}")
    return s_star.to(device), p_star.to(device)


def best_positives(xq: torch.Tensor, xb: torch.Tensor, pos_ptr, pos_idx) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's best positive in this gallery: (score (nq,) float32, index (nq,) int64).

    The score is the exact one ``grouped_ranks`` uses (the dot product of the fp32 rows rounded once
    to fp32), the highest over the query's positives ``pos_idx[pos_ptr[i]:pos_ptr[i + 1]]``, ties to
    the lowest index: ``grouped_ranks``'s pos_score / pos_index. A query without a positive here gets
    (-inf, -1). For a gallery split into shards, the best over shards (highest score, then lowest
    global index) is the whole gallery's, and goes back to each shard as ``grouped_ranks``'s
    ``threshold``. Runs on xq's device; only the positive pairs are scored."""
    check_embeddings("xq", xq)
    check_embeddings("xb", xb, d=xq.shape[1])
    nq, nb = xq.shape[0], xb.shape[0]
    ptr, pidx = check_csr("pos_ptr", "pos_idx", pos_ptr, pos_idx, nq, nb, "a gallery")
    device = xq.device
    rows, cols = csr_block(ptr, pidx, 0, nq, device)
    score = torch.full((nq,), float("-inf"), dtype=torch.float32, device=device)
    index = torch.full((nq,), -1, dtype=torch.long, device=device)
    if rows.numel() == 0:
        return score, index
    a = xq.to(dtype=torch.float32)
    vals = torch.empty(rows.numel(), dtype=torch.float32, device=device)
    step = max(64, (1 << 19) // max(1, xq.shape[1]))  # ~4 MiB of fp64 per step: gathers stay in cache
    for s0 in range(0, rows.numel(), step):
        r, c = rows[s0:s0 + step], cols[s0:s0 + step]
        vals[s0:s0 + step] = exact_dot(a[r], xb[c.to(xb.device)].to(device=device, dtype=torch.float32))
    score.scatter_reduce_(0, rows, vals, "amax")
    best = torch.where(vals == score[rows], cols, nb)
    first = torch.full((nq,), nb, dtype=torch.long, device=device).scatter_reduce_(0, rows, best, "amin")
    has = first < nb
    index[has] = first[has]
    return score, index


class _RankPass:
    """State shared by the query blocks of one grouped_ranks call; ``block`` fills rows r0:r1."""

    def __init__(self, xq, levels: Levels, bounds, ptr, pidx, g_block, tie_rule, out: GroupedRanks, given=None):
        self.xq, self.levels, self.ptr, self.pidx, self.tie_rule, self.out = xq, levels, ptr, pidx, tie_rule, out
        self.given = given  # (s_star, p_star) of every query, or None: found from the positives
        self.device = device = xq.device
        self.nb = levels.xb.shape[0]
        self.G = len(bounds) - 1
        self.tiles = gallery_tiles(self.nb, g_block)  # (c0, n0, c1), all c1 - c0 == width
        self.tile_starts = torch.tensor([t[1] for t in self.tiles], dtype=torch.long, device=device)
        self.pieces = tile_group_segments(self.tiles, bounds)  # per tile: (lo, hi, group)
        self.fused = _use_compiled(device)
        self.stats = {"row_tiles": {}, "rescored_pairs": 0}

    def block(self, r0: int, r1: int) -> None:
        sc = self.levels.block(self.xq, r0, r1)
        blk = _RankBlock(self, sc, r0, r1)
        esc = Escalation(sc)
        for t, (c0, _, c1) in enumerate(self.tiles):
            esc.run(c0, c1, lambda i, rows, r: blk.visit(t, i, rows, r))
        blk.finish()
        for name, n in esc.stats().items():
            self.stats["row_tiles"][name] = self.stats["row_tiles"].get(name, 0) + n
        self.stats["rescored_pairs"] += blk.rescored


class _RankBlock:
    """One query block: the exact best positives, then each tile's counts (proved ones at once,
    undecided ones kept for one exact re-scoring at the end) and best-negative candidates."""

    def __init__(self, rp: _RankPass, sc: BlockScorer, r0: int, r1: int):
        self.rp, self.sc = rp, sc
        device, nb, out = rp.device, rp.nb, rp.out
        m = self.m = r1 - r0
        self.prow, self.pcol = csr_block(rp.ptr, rp.pidx, r0, r1, device)  # (p,) positives, sorted by column
        self.psegs = tile_segments(self.pcol, rp.tile_starts)  # tile id -> slice of the positives it owns
        if rp.given is not None:  # the threshold of a gallery shard (it may hold none of the positives)
            self.s_star, self.p_star = rp.given[0][r0:r1], rp.given[1][r0:r1]
            s_star = self.s_star
            self.rescored = 0
        else:
            pval = sc.exact(self.prow, self.pcol)  # (p,) float32 exact scores
            self.s_star = s_star = torch.full((m,), float("-inf"), device=device).scatter_reduce_(
                0, self.prow, pval, "amax")
            best = torch.where(pval == s_star[self.prow], self.pcol, nb)
            self.p_star = torch.full((m,), nb, dtype=torch.long, device=device).scatter_reduce_(
                0, self.prow, best, "amin")
            out.pos_score[r0:r1] = s_star
            out.pos_index[r0:r1] = self.p_star
            self.rescored = int(self.prow.numel())
        inf = torch.full_like(s_star, float("inf"))
        above, below = torch.nextafter(s_star, inf), torch.nextafter(s_star, -inf)
        self.sure, self.up = [], []  # per non-exact level: r > sure proves e > s*; r <= up proves e < s*
        for i in range(sc.n_levels - 1):
            g = sc.ge(i, above)  # r >= g proves e >= next(s*) > s*
            self.sure.append(torch.nextafter(g, -inf))
            self.up.append(sc.le(i, below))
        # best negative per (row, group): tau is a lower bound of the exact best so far (-inf: none yet);
        # cand_floor[i] the level-i tile value below which an item surely scores under tau
        self.tau = torch.full((m, rp.G), float("-inf"), device=device)
        self.cand_floor = [torch.full((m, rp.G), float("-inf"), device=device) for _ in range(sc.n_levels - 1)]
        self.band: list[tuple] = []  # (rows, group, cols): undecided against s*
        self.cand: list[tuple] = []  # (rows, group, cols, upper bound, exact?): best-negative candidates
        self.cnt = out.counts[r0:r1]  # (m, G) views into the outputs
        self.nsc = out.neg_score[r0:r1]
        self.nix = out.neg_index[r0:r1]
        # compare buffer of the dense counts (CPU fp32 tiles; a low-precision tile widens its rows instead)
        self.scratch = torch.empty(m, rp.tiles[0][2] - rp.tiles[0][0], device=device) \
            if device.type == "cpu" and sc.level(0).dtype == torch.float32 else None
        self.inf = inf

    def _mask_positives(self, t: int, rows, r: torch.Tensor) -> None:
        seg = self.psegs.get(t)
        if seg is None:
            return
        pa, pb = seg
        prow, pcol = self.prow[pa:pb], self.pcol[pa:pb] - self.rp.tiles[t][0]
        if rows is not None:
            pos = torch.full((self.m,), -1, dtype=torch.long, device=r.device)
            pos[rows] = torch.arange(rows.numel(), device=r.device)
            prow = pos[prow]
            keep = prow >= 0
            prow, pcol = prow[keep], pcol[keep]
        r.index_put_((prow, pcol), self.inf[:1].neg().to(r.dtype))  # positives never count

    def _set_tau(self, rows: torch.Tensor, g: int, tau: torch.Tensor) -> None:
        self.tau[rows, g] = tau
        below = torch.nextafter(tau, -self.inf[:tau.numel()])
        for i, floor in enumerate(self.cand_floor):
            floor[rows, g] = self.sc.le(i, below, rows)

    def visit(self, t: int, i: int, rows, r: torch.Tensor):
        """Level-i tile values r (k, w) of block rows ``rows`` (None: all): count and collect; return
        the positions of rows left to the next level (too many undecided items to re-score each)."""
        self._mask_positives(t, rows, r)
        sc, rp = self.sc, self.rp
        c0, _, c1 = rp.tiles[t]
        if i == sc.n_levels - 1:
            self._visit_exact(t, rows, r)
            return None, None
        k = r.shape[0]
        sel = (lambda x: x) if rows is None else (lambda x: x[rows])
        brow = torch.arange(k, device=r.device) if rows is None else rows  # block row of each tile row
        sure, up = sel(self.sure[i]), sel(self.up[i])
        limit = crowd_limit(i, sc, c1 - c0)
        dense = torch.zeros(k, dtype=torch.bool, device=r.device)  # too many undecided counts
        flood = torch.zeros(k, dtype=torch.bool, device=r.device)  # too many best-negative candidates
        found = []
        for lo, hi, g in rp.pieces[t]:
            whole = lo == c0 and hi == c1
            v = r if whole else r[:, lo - c0:hi - c0]  # (k, hi - lo) piece of group g
            buf = self.scratch[:k] if whole and self.scratch is not None else None
            n_sure, n_up, mx, cm = _piece_stats(v, sure, up, rp.fused and whole, buf)
            n_band = n_up - n_sure
            dense |= n_band > limit
            band = None
            band_rows = torch.nonzero(n_band > 0).squeeze(1)
            if band_rows.numel():  # the undecided items: above up, not above sure
                pos, cols, vals = entries_above(v, up[band_rows], band_rows, cm)
                und = vals <= sure[band_rows][pos]
                band = (band_rows[pos[und]], cols[und] + lo)
            # rows whose piece may hold a new best negative, and the items that may be it
            cand = None
            imp = torch.nonzero(mx > sel(self.cand_floor[i][:, g])).squeeze(1)
            if imp.numel():
                nb_rows = brow[imp]
                nb_tau = torch.maximum(self.tau[nb_rows, g], sc.lo(i, mx[imp], nb_rows))
                nb_thr = sc.le(i, torch.nextafter(nb_tau, -self.inf[:imp.numel()]), nb_rows)
                pos, cols, vals = entries_above(v, nb_thr, imp, cm)
                flood[imp] |= torch.bincount(pos, minlength=imp.numel()) > CAND_LIMIT
                cand = (imp, nb_tau, imp[pos], cols + lo, vals)
            found.append((g, n_sure, band, cand))
        crowd = dense | flood
        esc = torch.nonzero(crowd).squeeze(1) if bool(crowd.any()) else None
        for g, n_sure, band, cand in found:
            if esc is None:
                if rows is None:
                    self.cnt[:, g] += n_sure
                else:
                    self.cnt[rows, g] += n_sure
            else:
                kr = torch.nonzero(~crowd).squeeze(1)
                self.cnt[brow[kr], g] += n_sure[kr]
            if band is not None:
                brows, bcols = band
                if esc is not None:
                    ok = ~crowd[brows]
                    brows, bcols = brows[ok], bcols[ok]
                self.band.append((brow[brows], g, bcols))
            if cand is not None:
                imp, nb_tau, cpos, ccols, cvals = cand
                if esc is not None:
                    ok, cok = ~crowd[imp], ~crowd[cpos]
                    imp, nb_tau, cpos, ccols, cvals = imp[ok], nb_tau[ok], cpos[cok], ccols[cok], cvals[cok]
                if imp.numel():
                    self._set_tau(brow[imp], g, nb_tau)
                    crow = brow[cpos]
                    self.cand.append((crow, g, ccols, sc.hi(i, cvals, crow), False))
        if esc is not None:  # rows whose fp32 scores here are exact (coarse-grid data) need no next level
            ex = sc.exact_rows(i, brow[esc], c0, c1)
            if bool(ex.any()):
                self._visit_exact(t, brow[esc[ex]], r[esc[ex]])
                esc = esc[~ex]
        return esc, (None if esc is None else torch.nonzero(dense).squeeze(1))

    def _visit_exact(self, t: int, rows, e: torch.Tensor) -> None:
        """Exact scores e (k, w): count by the tie rule, take each piece's best and its first index."""
        rp = self.rp
        c0 = rp.tiles[t][0]
        brow = torch.arange(e.shape[0], device=e.device) if rows is None else rows
        s_star, p_star = self.s_star[brow][:, None], self.p_star[brow][:, None]
        for lo, hi, g in rp.pieces[t]:
            v = e[:, lo - c0:hi - c0]
            beats = v > s_star
            if self.rp.tie_rule == "pessimistic":
                beats |= v == s_star
            elif self.rp.tie_rule == "index":
                cols = torch.arange(lo, hi, device=e.device)[None, :]
                beats |= (v == s_star) & (cols < p_star)
            self.cnt.index_put_((brow, torch.full_like(brow, g)), beats.sum(1), accumulate=True)
            mx, arg = v.max(1)  # first maximal column
            fin = torch.nonzero(mx > float("-inf")).squeeze(1)
            if fin.numel():
                fr = brow[fin]
                better = mx[fin] >= self.tau[fr, g]
                fr, fin = fr[better], fin[better]
                if fin.numel():
                    self._set_tau(fr, g, mx[fin])
                    self.cand.append((fr, g, arg[fin] + lo, mx[fin], True))

    def finish(self) -> None:
        """Exact re-scoring of the undecided items: the band's counts, each group's best negative."""
        sc, rp, device = self.sc, self.rp, self.rp.device
        G = rp.G
        if self.band:
            rows = torch.cat([b[0] for b in self.band])
            gs = torch.cat([torch.full_like(b[0], b[1]) for b in self.band])
            cols = torch.cat([b[2] for b in self.band])
            e = sc.exact(rows, cols)
            self.rescored += int(rows.numel())
            s = self.s_star[rows]
            beats = e > s
            if rp.tie_rule == "pessimistic":
                beats |= e == s
            elif rp.tie_rule == "index":
                beats |= (e == s) & (cols < self.p_star[rows])
            self.cnt.index_put_((rows, gs), beats.long(), accumulate=True)
        if not self.cand:
            return
        rows = torch.cat([c[0] for c in self.cand])
        gs = torch.cat([torch.full_like(c[0], c[1]) for c in self.cand])
        cols = torch.cat([c[2] for c in self.cand])
        ub = torch.cat([c[3] for c in self.cand])
        known = torch.cat([torch.full_like(c[0], c[4], dtype=torch.bool) for c in self.cand])
        live = ub >= self.tau[rows, gs]  # below tau: surely under the best
        rows, gs, cols, ub, known = rows[live], gs[live], cols[live], ub[live], known[live]
        e = ub.clone()
        todo = torch.nonzero(~known).squeeze(1)
        if todo.numel():
            e[todo] = sc.exact(rows[todo], cols[todo])
            self.rescored += int(todo.numel())
        key = rows * G + gs
        best = torch.full((self.m * G,), float("-inf"), device=device).scatter_reduce_(0, key, e, "amax")
        top = e == best[key]
        first = torch.full((self.m * G,), rp.nb, dtype=torch.long, device=device).scatter_reduce_(
            0, key[top], cols[top], "amin")
        has = first < rp.nb
        self.nsc.view(-1)[has] = best[has]
        self.nix.view(-1)[has] = first[has]
