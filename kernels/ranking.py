"""Grouped rank extraction: per query and gallery group, how many items beat the best positive."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ._common import (
    check_csr,
    check_embeddings,
    check_int_tensor,
    csr_block,
    gallery_tiles,
    gemm_width,
    operand_dtype,
    plan_tiles,
    query_block,
    score_tile,
    tile_group_segments,
    tile_segments,
)

__all__ = ["TIE_RULES", "GroupedRanks", "grouped_ranks"]

# How an item with exactly the best positive's score is counted (BENCHMARKS.md, "Tie rules"):
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

    def rank(self, groups=None) -> torch.Tensor:
        """(nq,) int64 rank over the union of ``groups`` (indices into G; all groups by default)."""
        c = self.counts if groups is None else self.counts[:, list(groups)]
        return c.sum(1)


# --- the per-tile reduction: count of scores above a per-row threshold, and chunk maxima ---------
# Row maxima are kept per 128-column chunk: as cheap as the plain row max, and they locate the
# first maximal column later without a row-wide argmax (slow on CPU, ~1.4 ns/score).
_CHUNK = 128


def _chunked(s: torch.Tensor) -> bool:
    return s.is_contiguous() and s.shape[1] % _CHUNK == 0 and s.shape[1] > _CHUNK


def _count_cmax(s: torch.Tensor, thr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s (m, w) float32 (w a multiple of _CHUNK), thr (m,) -> count of s[i] > thr[i] (m,) int32,
    chunk maxima (m, w / _CHUNK) float32."""
    m, w = s.shape
    v = s.view(m, w // _CHUNK, _CHUNK)
    # per-chunk float counts (exact: integers <= 128), then per row: the form inductor vectorises best
    cnt = (v > thr[:, None, None]).to(torch.float32).sum(2).sum(1)
    return cnt.to(torch.int32), v.amax(2)


# torch.compile can fuse the compare, the count and the chunk maxima into one pass over the tile
# (CPU: ~0.4 ns/score against ~0.7 ns eager, next to a GEMM of ~5 ns/score/core at d=512). End to
# end that measured only 0-5% faster on a 2-core AVX-512 box, while compiling costs seconds (tens
# on a cold cache), so it is opt-in: HARDRANK_COMPILE=1. CPU only; GPU runs stay eager.
_compiled = None   # the compiled function once built; False when compiling failed


def _compiled_count_cmax():
    global _compiled
    if _compiled is None:
        try:
            _compiled = torch.compile(_count_cmax, dynamic=True)
        except Exception:  # no compiler toolchain, unsupported platform, ...
            _compiled = False
    return _compiled


def _use_compiled(device: torch.device) -> bool:
    return device.type == "cpu" and os.environ.get("HARDRANK_COMPILE", "0") == "1" and _compiled is not False


def _count_gt(s: torch.Tensor, thr: torch.Tensor, buf: torch.Tensor | None = None) -> torch.Tensor:
    """(m,) int32 count of s[i] > thr[i]. On CPU, summing a bool mask makes torch first cast it to
    the sum's dtype (an extra pass); comparing straight into a float32 buffer and summing that is
    ~2x faster, and exact (counts are integers far below 2**24)."""
    if s.device.type != "cpu" or s.shape[1] >= 1 << 24:
        return (s > thr[:, None]).sum(1, dtype=torch.int32)
    if buf is None or buf.shape != s.shape:
        buf = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    torch.gt(s, thr[:, None], out=buf)
    return buf.sum(1).to(torch.int32)


def _tile_count_amax(s: torch.Tensor, thr: torch.Tensor, fused: bool, buf: torch.Tensor | None = None):
    """(count (m,) int32, row max (m,) float32, chunk maxima (m, w / _CHUNK) or None) of s (m, w);
    ``buf`` is optional float32 scratch of s's shape."""
    global _compiled
    m = s.shape[0]
    chunked = _chunked(s)
    if fused and chunked and m >= 2:  # size 1 would force an extra specialised compile
        fn = _compiled_count_cmax()
        if fn:
            try:
                cnt, cm = fn(s, thr)
                return cnt, cm.amax(1), cm
            except Exception:  # compile failed at first call: stay eager from now on
                _compiled = False
    if chunked:
        cm = s.view(m, -1, _CHUNK).amax(2)  # (m, w / _CHUNK)
        mx = cm.amax(1)
    else:
        cm, mx = None, s.amax(1)
    if s.device.type != "cpu":
        return _count_gt(s, thr), mx, cm
    # CPU: rows whose max does not pass the threshold count 0; with a good model that is nearly
    # every row of nearly every tile, so count only the rows that can score.
    active = mx > thr
    n_active = int(active.sum())
    if 2 * n_active >= m:
        return _count_gt(s, thr, buf), mx, cm
    cnt = torch.zeros(m, dtype=torch.int32, device=s.device)
    if n_active:
        rows = torch.nonzero(active).squeeze(1)
        cnt[rows] = _count_gt(s[rows], thr[rows])
    return cnt, mx, cm


def _first_max_index(v: torch.Tensor, cm, rows=None) -> torch.Tensor:
    """First column of each row of v (or of v[rows]) holding the row max: the first chunk whose
    max is the row max, then the first max inside it (``max(dim)`` returns the first maximal index)."""
    if cm is None:
        return (v if rows is None else v[rows]).max(1).indices
    m = v.shape[0]
    v3 = v.view(m, -1, _CHUNK)
    if rows is None:
        rows = torch.arange(m, device=v.device)
    else:
        cm = cm[rows]
    j = cm.max(1).indices  # (r,) first chunk holding the row max
    return j * _CHUNK + v3[rows, j].max(1).indices


def _flushes_denormals(device: torch.device) -> bool:
    """True when comparisons on ``device`` treat denormals as zero (e.g. torch.set_flush_denormal)."""
    tiny = torch.tensor([torch.finfo(torch.float32).smallest_normal / 4], device=device)
    return not bool((tiny > 0).item())


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


def grouped_ranks(xq: torch.Tensor, xb: torch.Tensor, group_bounds, pos_ptr, pos_idx, *,
                  tie_rule: str = "index", budget_bytes: int = 64 << 20,
                  q_block: int | None = None, g_block: int | None = None) -> GroupedRanks:
    """Exact ranks of every query's best positive, counted per gallery group, in one streamed pass.

    xq (nq, d) queries and xb (nb, d) gallery (L2-normalised by the caller; scores are ``xq @ xb.T``).
    Group g is the gallery slice ``[group_bounds[g], group_bounds[g + 1])``. Query i's positives are
    ``pos_idx[pos_ptr[i]:pos_ptr[i + 1]]`` (gallery indices, any order, duplicates allowed); each query
    needs one. The best positive p* has the highest score, then the lowest index. A non-positive item
    j beats it per ``tie_rule``: ``index``: s_j > s* or (s_j == s* and j < p*); ``optimistic``:
    s_j > s*; ``pessimistic``: s_j >= s*.

    Runs on xq's device; scores are fp32 (fp16/bf16 upcast on CPU, fp32 accumulation on CUDA).
    Memory: never (nq, nb); queries go in blocks of ``q_block`` rows against gallery tiles of
    at most ``g_block`` columns (all the same width; a tile straddling groups is counted per
    piece), sized from ``budget_bytes`` unless given. The positives' scores are read from the very tiles the
    counting pass uses (cached within the budget, otherwise recomputed bitwise identically), and
    every tile has the same GEMM shape, so an exact duplicate of a positive ties with it.
    """
    if tie_rule not in TIE_RULES:
        raise ValueError(f"tie_rule must be one of {TIE_RULES}, got {tie_rule!r}")
    check_embeddings("xq", xq)
    check_embeddings("xb", xb, d=xq.shape[1])
    nq, nb = xq.shape[0], xb.shape[0]
    bounds = _check_bounds(group_bounds, nb)
    ptr, pidx = check_csr("pos_ptr", "pos_idx", pos_ptr, pos_idx, nq, nb, "a gallery")
    for i in range(nq):
        if ptr[i + 1] == ptr[i]:
            raise ValueError(f"query {i} has no positive (pos_ptr[{i}] == pos_ptr[{i + 1}] == {ptr[i]}); "
                             "every query needs at least one positive in the gallery")
    plan = plan_tiles(nq, budget_bytes, q_block, g_block, nb)
    device = xq.device
    G = len(bounds) - 1
    out = GroupedRanks(
        counts=torch.zeros(nq, G, dtype=torch.long, device=device),
        pos_score=torch.empty(nq, dtype=torch.float32, device=device),
        pos_index=torch.empty(nq, dtype=torch.long, device=device),
        neg_score=torch.full((nq, G), float("-inf"), dtype=torch.float32, device=device),
        neg_index=torch.full((nq, G), -1, dtype=torch.long, device=device),
    )
    if nq == 0:
        return out
    rp = _RankPass(xq, xb, bounds, ptr, pidx.to(device), plan.g_block, tie_rule, out)
    pos_tile = torch.searchsorted(rp.tile_starts.cpu(), pidx, right=True) - 1  # owner tile per positive
    for r0, r1, cache_tiles in _query_blocks(nq, ptr, pos_tile, plan.q_block, budget_bytes, rp.width,
                                             adaptive=q_block is None):
        rp.block(r0, r1, cache_tiles)
    return out


_Q_MIN = 256  # adaptive blocks stop shrinking here: smaller GEMMs lose more than recomputing


def _query_blocks(nq, ptr, pos_tile, q_block, budget, width, adaptive):
    """[(r0, r1, cache_tiles)] query blocks. A block's tiles holding positives are computed before
    its counting pass and kept for it when the budget allows; past that they are computed twice.
    When the caller left q_block to us, a block whose positive tiles would not fit is shrunk by
    1/8 steps (down to _Q_MIN rows): smaller tiles and fewer positive tiles per block (COCO-like
    data has each block's positives in one contiguous run of the gallery, so the cache a block
    needs grows with q_block squared). Big blocks run the GEMM faster, so shrink no further."""
    out, r0 = [], 0
    while r0 < nq:
        q = q_block
        while True:
            r1 = min(r0 + q, nq)
            tile_bytes = (r1 - r0) * width * 4
            cap = max(0, (budget - 2 * tile_bytes) // tile_bytes)  # beyond the tile + its temporaries
            if not adaptive or q <= _Q_MIN:
                break
            if torch.unique(pos_tile[ptr[r0]:ptr[r1]]).numel() <= cap:
                break
            q = max(_Q_MIN, q * 7 // 8)
        out.append((r0, r1, cap))
        r0 = r1
    return out


class _RankPass:
    """State shared by the query blocks of one grouped_ranks call; ``block`` fills rows r0:r1."""

    def __init__(self, xq, xb, bounds, ptr, pidx, g_block, tie_rule, out: GroupedRanks):
        self.xq, self.xb, self.ptr, self.pidx, self.tie_rule, self.out = xq, xb, ptr, pidx, tie_rule, out
        self.device = device = xq.device
        self.tiles = gallery_tiles(xb.shape[0], g_block)  # (c0, n0, c1), all c1 - c0 == width
        self.width = self.tiles[0][2] - self.tiles[0][0]
        self.tile_starts = torch.tensor([t[1] for t in self.tiles], dtype=torch.long, device=device)
        self.pieces = tile_group_segments(self.tiles, bounds)  # per tile: (lo, hi, group)
        self.piece_starts = torch.tensor([p[0] for ps in self.pieces for p in ps], dtype=torch.long,
                                         device=device)
        self.op_dtype = operand_dtype(xq, xb, device)
        self.fused = _use_compiled(device)
        self.flush_denormals = tie_rule != "optimistic" and _flushes_denormals(device)
        self.neg_inf = torch.tensor(float("-inf"), device=device)
        self.pool: list[torch.Tensor] = []  # tile buffers reused by every block of the call

    def _buffers(self, n: int, rows: int) -> list[torch.Tensor]:
        """n (rows, gemm_width(width)) float32 tile buffers. Reused across blocks: fresh multi-MB allocations
        are page-faulted in again every time (on CPU that costs ~10% of the GEMM). None where the
        GEMM cannot write into a given buffer (fp16/bf16 operands)."""
        if self.op_dtype != torch.float32:
            return [None] * n
        while len(self.pool) < n:
            self.pool.append(torch.empty(self.pool[0].shape if self.pool else (rows, gemm_width(self.width)),
                                         dtype=torch.float32, device=self.device))
        if self.pool[0].shape[0] < rows:
            self.pool = [torch.empty(rows, gemm_width(self.width), dtype=torch.float32, device=self.device)
                         for _ in range(n)]
        return [b[:rows] for b in self.pool[:n]]

    def block(self, r0: int, r1: int, cache_tiles: int) -> None:
        device, xb, tiles, nb = self.device, self.xb, self.tiles, self.xb.shape[0]
        nqb = r1 - r0
        a = query_block(self.xq, r0, r1, self.op_dtype, device)  # (nqb, d), 2 rows if nqb == 1
        prow, pcol = csr_block(self.ptr, self.pidx, r0, r1, device)  # (m,) positives, sorted by column
        psegs = tile_segments(pcol, self.tile_starts)  # tile id -> slice of the positives it owns

        # Pass 1: the tiles holding positives give the positives' scores, as the very floats the
        # counting pass will compare against. Keep them (within the budget) for pass 2.
        n_keep = min(cache_tiles, len(psegs))
        work, *spare = self._buffers(1 + n_keep, a.shape[0])  # (rows, width) float32 each
        pval = torch.empty(pcol.numel(), dtype=torch.float32, device=device)  # (m,) float32
        cache: dict[int, torch.Tensor] = {}
        for t, (pa, pb) in psegs.items():
            c0, _, c1 = tiles[t]
            keep = len(cache) < n_keep
            s = score_tile(a, xb, c0, c1, nqb, spare[len(cache)] if keep else work)  # (nqb, w) float32
            pval[pa:pb] = s[prow[pa:pb], pcol[pa:pb] - c0]
            if keep:
                cache[t] = s
        s_star = torch.full((nqb,), float("-inf"), device=device).scatter_reduce_(0, prow, pval, "amax")
        best = torch.where(pval == s_star[prow], pcol, nb)
        p_star = torch.full((nqb,), nb, dtype=torch.long, device=device).scatter_reduce_(0, prow, best, "amin")
        self.out.pos_score[r0:r1] = s_star
        self.out.pos_index[r0:r1] = p_star

        # "s >= s*" is evaluated as "s > nextafter(s*, -inf)" so one compare serves every row of a
        # tile; only when denormals are flushed and some s* is exactly 0 does that identity fail.
        th = _Thresholds(self.tie_rule, s_star, torch.nextafter(s_star, self.neg_inf.expand_as(s_star)),
                         p_star, self.flush_denormals and bool((s_star == 0).any()))
        holds_p: dict[int, torch.Tensor] = {}
        if self.tie_rule == "index":
            # rows whose p* falls in a piece have that piece's ties after p* taken off its count
            piece_of = torch.searchsorted(self.piece_starts, p_star, right=True) - 1
            order = torch.argsort(piece_of, stable=True)
            up, uc = torch.unique_consecutive(piece_of[order], return_counts=True)
            o = 0
            for k, c in zip(up.tolist(), uc.tolist()):
                holds_p[k] = order[o:o + c]
                o += c

        # float32 scratch for the eager CPU count, reused by every tile (fresh ones cost page faults)
        scratch = None
        if device.type == "cpu" and not self.fused:
            scratch = torch.empty(nqb, self.width, dtype=torch.float32, device=device)
        cnt_blk = self.out.counts[r0:r1]  # (nqb, G) views into the outputs
        nsc_blk = self.out.neg_score[r0:r1]
        nix_blk = self.out.neg_index[r0:r1]
        k = -1  # running piece id
        for t, (c0, _, c1) in enumerate(tiles):
            s = cache.pop(t, None)
            if s is None:
                s = score_tile(a, xb, c0, c1, nqb, work)  # (nqb, w) float32
            if t in psegs:
                pa, pb = psegs[t]
                s.index_put_((prow[pa:pb], pcol[pa:pb] - c0), self.neg_inf)  # positives never count
            for lo, hi, g in self.pieces[t]:
                k += 1
                whole = lo == c0 and hi == c1
                v = s if whole else s[:, lo - c0:hi - c0]  # (nqb, hi - lo) piece of group g
                cnt, mx, cm = th.count(v, lo, self.fused and whole, scratch if whole else None)
                rows = holds_p.get(k)
                if rows is not None:
                    # these rows were counted with >= (p* >= lo); ties after p* do not beat it
                    after = torch.arange(lo, hi, device=device)[None, :] > p_star[rows, None]
                    cnt[rows] -= ((v[rows] == s_star[rows, None]) & after).sum(1, dtype=torch.int32)
                cnt_blk[:, g] += cnt
                _update_best(v, lo, mx, cm, nsc_blk, nix_blk, g)


@dataclass
class _Thresholds:
    """Per-row comparison against s* for one query block under a tie rule."""

    tie_rule: str
    s_star: torch.Tensor        # (nqb,) float32 best positive score
    s_below: torch.Tensor       # (nqb,) float32 nextafter(s*, -inf): "> s_below" is ">= s*"
    p_star: torch.Tensor        # (nqb,) int64 best positive index
    two_compares: bool          # evaluate ">=" literally (flushed denormals and some s* == 0)

    def count(self, v, lo, fused, scratch):
        """Per row: items of the piece v (columns from gallery index lo) that beat s* (ties before
        p* included), plus the piece's row max and chunk maxima. Under ``index`` the rows whose p*
        lies in the piece are counted with >= here; the caller takes off the ties after p*."""
        if self.tie_rule == "optimistic":
            ge = None
        elif self.tie_rule == "pessimistic":
            ge = True
        else:
            ge = self.p_star >= lo  # piece before (or holding) p*: ties come first in gallery order
        if self.two_compares and ge is not None:
            ge_rows = ge if isinstance(ge, torch.Tensor) else torch.ones_like(self.p_star, dtype=torch.bool)
            s_star = self.s_star[:, None]
            cnt = torch.where(ge_rows, (v >= s_star).sum(1, dtype=torch.int32), (v > s_star).sum(1, dtype=torch.int32))
            return cnt, v.amax(1), None
        if ge is None:
            thr = self.s_star
        elif ge is True:
            thr = self.s_below
        else:
            thr = torch.where(ge, self.s_below, self.s_star)
        return _tile_count_amax(v, thr, fused, scratch)


def _update_best(v, lo, mx, cm, nsc_blk, nix_blk, g) -> None:
    """Fold the piece's max into the group's running best non-positive. Later pieces hold higher
    indices, so only a strictly greater max replaces the running one; the index (first maximal
    column) is looked up for those rows only."""
    run = nsc_blk[:, g]
    better = mx > run  # (nqb,) bool
    nqb = v.shape[0]
    if v.device.type != "cpu":  # no host syncs on GPUs: index every row
        nsc_blk[:, g] = torch.where(better, mx, run)
        nix_blk[:, g] = torch.where(better, v.argmax(1) + lo, nix_blk[:, g])
        return
    n_better = int(better.sum())
    if n_better == 0:
        return
    if 2 * n_better >= nqb:
        nsc_blk[:, g] = torch.where(better, mx, run)
        nix_blk[:, g] = torch.where(better, _first_max_index(v, cm) + lo, nix_blk[:, g])
    else:
        rows = torch.nonzero(better).squeeze(1)
        nsc_blk[rows, g] = mx[rows]
        nix_blk[rows, g] = _first_max_index(v, cm, rows) + lo
