"""Shared plumbing for the streaming kernels: input checks, tiling plans, fp32-accumulating GEMM tiles."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Bytes per score-tile element the planner reserves: the fp32 tile, a low-precision GEMM output (2) and
# same-size temporaries (compare buffers, row gathers).
_WORK_BYTES_PER_SCORE = 12
_DEFAULT_G_BLOCK = 1024  # gallery columns per tile: ~1k keeps a 2k x 1k fp32 tile near the L2/L3 sweet spot
_DEFAULT_Q_BLOCK = 2048  # queries per block
# A CPU low-precision first pass keeps its tile in the GEMM's 2-byte output (``_levels.BlockScorer.tile``):
# 2 bytes a score plus row gathers. Its GEMM runs ~2x faster than fp32, so the fixed cost of visiting a
# tile (some 30 small ops) weighs twice as much: larger tiles (with the 2-byte tiles, the bf16 path went
# from 1.48x to 1.83-1.86x the fp32 GEMM at RoCOCO shape: `hardrank bench kernels`, benchmarks/README.md).
_WORK_BYTES_PER_SCORE_LP = 6
# The fixed cost of visiting one tile, in columns of its GEMM (~1 ms against ~10 us per fp32 column of a
# 1,667-row block on 2 AVX-512 cores; a bf16 column costs half), so the width is not cut to save a few
# wasted columns at the price of many more tiles (125,010 columns: 2,048-wide bf16 tiles, not 1,408).
_TILE_VISIT_COLS = 128
_TILE_VISIT_COLS_LP = 256
_DEFAULT_G_BLOCK_LP = 2048
_DEFAULT_Q_BLOCK_LP = 6144


def check_embeddings(name: str, x, d: int | None = None) -> torch.Tensor:
    """``x`` must be a 2-D floating tensor (n, d); ``d`` (when given) is the expected width."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (n, d), got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D (n, d), got shape {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if d is not None and x.shape[1] != d:
        raise ValueError(f"{name} has width d={x.shape[1]} but the queries have d={d}; "
                         "both tables must come from the same embedding space")
    # min and max propagate NaN and expose Inf in one cheap pass (isfinite().all() would be four)
    if x.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):
        raise ValueError(f"{name} contains NaN or Inf; scores would be meaningless (check the encoder output)")
    return x


def check_int_tensor(name: str, x, dim: int) -> torch.Tensor:
    """Integer tensor of the given rank (array-likes are converted); returned as int64."""
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{name} must be an integer tensor, got {type(x).__name__}") from e
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    return t.long()


def check_csr(ptr_name: str, idx_name: str, ptr, idx, n_rows: int, n_cols: int,
              col_what: str) -> tuple[list[int], torch.Tensor]:
    """Validate a CSR list (row i owns ``idx[ptr[i]:ptr[i+1]]``, values in [0, n_cols)).

    Returns the pointer as a Python list (block offsets are host-side) and the indices as int64.
    """
    ptr = check_int_tensor(ptr_name, ptr, 1)
    idx = check_int_tensor(idx_name, idx, 1)
    if ptr.numel() != n_rows + 1:
        raise ValueError(f"{ptr_name} must have n + 1 = {n_rows + 1} entries (one more than the {n_rows} "
                         f"queries), got {ptr.numel()}")
    p = ptr.cpu()
    if int(p[0]) != 0:
        raise ValueError(f"{ptr_name}[0] must be 0, got {int(p[0])}")
    steps = p[1:] - p[:-1]
    if steps.numel() and bool((steps < 0).any()):
        i = int(torch.nonzero(steps < 0)[0])
        raise ValueError(f"{ptr_name} must be non-decreasing, but {ptr_name}[{i}] = {int(p[i])} > "
                         f"{ptr_name}[{i + 1}] = {int(p[i + 1])}")
    if int(p[-1]) != idx.numel():
        raise ValueError(f"{ptr_name}[-1] = {int(p[-1])} must equal len({idx_name}) = {idx.numel()}")
    if idx.numel():
        bad = (idx < 0) | (idx >= n_cols)
        if bool(bad.any()):
            j = int(torch.nonzero(bad)[0])
            raise ValueError(f"{idx_name}[{j}] = {int(idx[j])} is out of range for {col_what} of "
                             f"{n_cols} items (valid: 0..{n_cols - 1})")
    return p.tolist(), idx


@dataclass(frozen=True)
class Plan:
    q_block: int  # query rows per block
    g_block: int  # gallery columns per tile


def _check_pos_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    return v


def plan_tiles(nq: int, budget_bytes: int, q_block: int | None, g_block: int | None,
               nb: int = 0, low_precision_tile: bool = False) -> Plan:
    """Pick block sizes: one score tile + same-size temporaries fit ``budget_bytes``, half of it by
    default (re-scored rows and candidate lists take the rest). Planned blocks never go below 1 x 1;
    blocks the caller gives must fit the budget. A planned tile width is a multiple of 128 chosen to
    waste the fewest columns on the last (shifted) window. ``low_precision_tile``: the tiles are
    2-byte GEMM outputs (a CPU bf16 / fp16 first pass): fewer bytes a score, larger default blocks."""
    budget = _check_pos_int("budget_bytes", budget_bytes)
    if q_block is not None:
        _check_pos_int("q_block", q_block)
    if g_block is not None:
        _check_pos_int("g_block", g_block)
    per, g_def, q_def = ((_WORK_BYTES_PER_SCORE_LP, _DEFAULT_G_BLOCK_LP, _DEFAULT_Q_BLOCK_LP) if low_precision_tile
                         else (_WORK_BYTES_PER_SCORE, _DEFAULT_G_BLOCK, _DEFAULT_Q_BLOCK))
    elems = max(1, budget // per)  # score elements the working set may hold
    g = g_block if g_block is not None else max(1, min(g_def, elems))
    q = q_block if q_block is not None else max(1, min(q_def, elems // (2 * g)))
    if (q_block is not None or g_block is not None) and q * g * per > budget:
        raise ValueError(f"q_block * g_block = {q} * {g} scores need {q * g * per} bytes "
                         f"(score tiles + same-size temporaries), more than budget_bytes={budget}; "
                         "lower q_block/g_block or raise budget_bytes")
    if nq > 0:
        q = min(q, nq)
        q = math.ceil(nq / math.ceil(nq / q))  # balanced blocks: no tiny remainder block
    if g_block is None and nb > g >= 256:
        # every window has the same width and the last one is shifted left to fit, so ceil(nb / w) * w
        # columns get computed, and each tile also costs a fixed visit (~30 small ops) worth about
        # _TILE_VISIT_COLS columns of GEMM: pick w (multiple of 128, in [g/2, g]) that costs least
        visit = _TILE_VISIT_COLS_LP if low_precision_tile else _TILE_VISIT_COLS
        cands = range(g // 128 * 128, (g + 1) // 2 - 1, -128)
        g = min(cands, key=lambda w: (math.ceil(nb / w) * (w + visit), -w))
    return Plan(q_block=q, g_block=g)


def gallery_tiles(nb: int, g_block: int) -> list[tuple[int, int, int]]:
    """(c0, n0, c1) tiles: GEMM window [c0, c1) of exactly min(g_block, nb) columns, owning columns
    [n0, c1). The last window is shifted left to keep its width (n0 > c0 then: its first columns
    belong to the previous tile and are ignored).

    One width: every GEMM has the same shape (buffers are reused, BLAS stays on one code path).
    """
    if nb == 0:
        return []
    w = min(g_block, nb)
    tiles = []
    for n0 in range(0, nb, w):
        c1 = min(n0 + w, nb)
        tiles.append((c1 - w, n0, c1))
    return tiles


def tile_group_segments(tiles: list[tuple[int, int, int]], bounds: list[int]) -> list[list[tuple[int, int, int]]]:
    """For each tile, the (a, b, g) pieces of its owned columns [n0, c1) cut at group boundaries."""
    out = []
    len(bounds) - 1
    g = 0
    for _, n0, c1 in tiles:
        segs = []
        a = n0
        while a < c1:
            while bounds[g + 1] <= a:  # skip groups ending before a (and empty groups)
                g += 1
            b = min(c1, bounds[g + 1])
            segs.append((a, b, g))
            a = b
        out.append(segs)
    return out


def csr_block(ptr: list[int], idx: torch.Tensor, r0: int, r1: int, device: torch.device
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of the CSR entries of rows r0:r1, rows block-local, sorted by column (stable)."""
    p0, p1 = ptr[r0], ptr[r1]
    cols = idx[p0:p1].to(device)  # (m,) int64
    lens = torch.tensor([ptr[i + 1] - ptr[i] for i in range(r0, r1)], dtype=torch.long, device=device)
    rows = torch.repeat_interleave(torch.arange(r1 - r0, device=device), lens)  # (m,) int64
    order = torch.argsort(cols, stable=True)
    return rows[order], cols[order]


def tile_segments(cols_sorted: torch.Tensor, tile_starts: torch.Tensor) -> dict[int, tuple[int, int]]:
    """Map tile id -> [a, b) slice of ``cols_sorted`` whose columns fall in that tile."""
    if cols_sorted.numel() == 0:
        return {}
    tid = torch.searchsorted(tile_starts, cols_sorted, right=True) - 1
    utid, cnt = torch.unique_consecutive(tid, return_counts=True)
    segs, a = {}, 0
    for t, c in zip(utid.tolist(), cnt.tolist()):
        segs[t] = (a, a + c)
        a += c
    return segs


def order_keys(vals: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """int64 keys ordering (score desc, index asc) as one descending integer.

    ``vals`` float32, ``idx`` int64 in [0, 2**32). -0.0 is folded into +0.0 so equal scores tie.
    The float's bits are mapped to an order-preserving int32 (negative floats have their magnitude
    bits flipped), shifted left 32 and combined with the complemented index.
    """
    v = (vals + 0.0).contiguous().view(torch.int32).long()
    v = torch.where(v < 0, v ^ 0x7FFFFFFF, v)
    return v * (1 << 32) + ((1 << 32) - 1 - idx)


CHUNK = 128  # columns per chunk of the chunk maxima that let sparse searches skip most of a tile


def row_maxima(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(row maxima (k,), chunk maxima (k, w / CHUNK) or None unless v is ``chunked``) of a tile v (k, w),
    as fp32 whatever v's dtype (a bf16 tile's maxima are exact in fp32; arithmetic on them must not
    round to bf16).

    A 2-byte float tile (bf16 / fp16, sign and magnitude) is reduced as int16 bit patterns: torch's bf16
    max widens every element and runs ~5x slower than this. Non-negative floats order like their bit
    patterns read as int16, and every negative float reads as a negative int16, so a chunk holding a
    value >= +0 has its max's pattern as the int16 max; a chunk without one (int16 max < 0: every
    value <= -0, as in masked or anti-correlated rows) is reduced again in fp32."""
    if not chunked(v):
        return v.amax(1).float(), None
    k = v.shape[0]
    v3 = v.view(k, -1, CHUNK)
    if v.element_size() == 2 and v.dtype.is_floating_point:
        bits = v3.view(torch.int16).amax(2)  # (k, w / CHUNK)
        cm = bits.view(v.dtype).float()
        rr, cc = torch.nonzero(bits < 0, as_tuple=True)
        if rr.numel():
            cm[rr, cc] = v3[rr, cc].float().amax(1)
    else:
        cm = v3.amax(2).float()
    return cm.amax(1), cm


def chunked(s: torch.Tensor) -> bool:
    """Whether s (k, w) can be viewed as (k, w / CHUNK, CHUNK) chunks."""
    return s.is_contiguous() and s.shape[1] % CHUNK == 0 and s.shape[1] > CHUNK


def entries_above(v: torch.Tensor, thr: torch.Tensor, rows: torch.Tensor | None = None,
                  cm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pos, cols, vals) of the entries v[rows[pos], cols] > thr[pos], row-major (vals as fp32); ``rows``
    (n,) rows of v (all when None), thr (n,). With ``cm`` (v's chunk maxima, v chunked) whole chunks whose max does
    not pass are skipped, so only the passing chunks are read again."""
    k = v.shape[0]
    if cm is not None:
        v3 = v.view(k, -1, CHUNK)
        cmr = cm if rows is None else cm[rows]
        rr, cc = torch.nonzero(cmr > thr[:, None], as_tuple=True)  # passing chunks, row-major
        sub = v3[rr if rows is None else rows[rr], cc]  # (n_chunks, CHUNK)
        r2, j2 = torch.nonzero(sub > thr[rr, None], as_tuple=True)
        return rr[r2], cc[r2] * CHUNK + j2, sub[r2, j2].float()
    sub = v if rows is None else v[rows]
    r, c = torch.nonzero(sub > thr[:, None], as_tuple=True)
    return r, c, sub[r, c].float()


def count_gt(s: torch.Tensor, thr: torch.Tensor, buf: torch.Tensor | None = None) -> torch.Tensor:
    """(m,) int32 count of s[i] > thr[i]. On CPU, summing a bool mask makes torch first cast it to
    the sum's dtype (an extra pass); comparing straight into a float32 buffer and summing that is
    ~2x faster, and exact (counts are integers far below 2**24)."""
    if s.device.type != "cpu" or s.shape[1] >= 1 << 24:
        return (s > thr[:, None]).sum(1, dtype=torch.int32)
    if buf is None or buf.shape != s.shape:
        buf = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    torch.gt(s, thr[:, None], out=buf)
    return buf.sum(1).to(torch.int32)
