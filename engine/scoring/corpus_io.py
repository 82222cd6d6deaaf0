"""Corpus rows read for search: tiles in file order, scattered candidates in sorted batches, mapped pages let go.

A corpus may be a memory-mapped file (an fp16 ``.npy``, clip-retrieval's parts through ``VectorRows``): its
pages, once read through the map, count in the process's resident set (file-backed) until the kernel needs
the memory. A search that streams a 30 GB corpus would then show 30 GB resident although it holds one tile.
Here every read ends by dropping this process's mappings of the pages it touched (``madvise(MADV_DONTNEED)``:
the page cache keeps them, a later read is a minor fault), so the resident set follows what is held.

Scattered reads (exact re-scoring of approximate candidates, the near-duplicate filter) go in sorted order of
row, in budget-sized batches, with read-ahead off (``MADV_RANDOM``): a 1 KB row read through a map with the
default read-ahead pulled 128 KB from disk, 17x the corpus in all for one mining run (issue 43).
"""
from __future__ import annotations

import contextlib
import mmap

import numpy as np

__all__ = ["read_tile", "gather", "rescore", "release", "mapped"]

_HAS_MADVISE = hasattr(mmap.mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED")
# a page fault maps up to 64 KB of neighbouring pages already cached ("fault-around"), read-ahead or not: a
# batch of scattered rows may map this much each until the batch releases them
_FAULT_AROUND = 64 << 10


def _maps_of(x, open_them: bool = False) -> list:
    """The mmap objects behind ``x``: an np.memmap (or a view of one), or a lazy reader holding memmaps
    (``VectorRows``; ``open_them``: its parts' maps opened first, so advice reaches maps a read would open)."""
    if open_them and callable(getattr(x, "maps", None)):
        x.maps()
    out, seen = [], set()
    stack = [x]
    while stack:
        a = stack.pop()
        if a is None or id(a) in seen:
            continue
        seen.add(id(a))
        mm = getattr(a, "_mmap", None)
        if isinstance(mm, mmap.mmap):
            out.append(mm)
        maps = getattr(a, "_maps", None)
        if isinstance(maps, dict):
            stack.extend(maps.values())
        if isinstance(a, np.ndarray):
            stack.append(a.base)
    return out


def mapped(x) -> bool:
    """Whether ``x`` reads its rows from files on demand (a memory map or a lazy reader): not held in memory."""
    return (isinstance(x, np.memmap) or (not isinstance(x, np.ndarray) and hasattr(x, "__array__"))
            or (isinstance(x, np.ndarray) and bool(_maps_of(x))))



def release(x) -> None:
    """Drop this process's mappings of the file pages ``x`` has read (they stay in the page cache)."""
    if not _HAS_MADVISE:
        return
    for mm in _maps_of(x):
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(mmap.MADV_DONTNEED)


@contextlib.contextmanager
def _advice(x, advice_name: str):
    """``x``'s maps advised ``advice_name`` (MADV_RANDOM, MADV_SEQUENTIAL) inside the block, then normal;
    the pages read are released at the end (callers reading in batches release after each)."""
    maps = _maps_of(x, open_them=True) if _HAS_MADVISE and hasattr(mmap, advice_name) else []
    for mm in maps:
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(getattr(mmap, advice_name))
    try:
        yield
    finally:
        for mm in _maps_of(x) if _HAS_MADVISE else []:
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(mmap.MADV_NORMAL)
                mm.madvise(mmap.MADV_DONTNEED)


def read_tile(xb, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of ``xb`` (n, d) as a C-contiguous float32 array (a view when ``xb`` holds them so in
    memory; fp16 converted here, one tile at a time). The caller releases the pages (``release``) once done
    with the tile: a view of a memory map stays valid after that (the pages are read again if touched)."""
    part = xb[lo:hi]  # (a lazy reader's slice opens maps of its own, let go with it)
    with _advice(part, "MADV_SEQUENTIAL") if _maps_of(part, open_them=True) else contextlib.nullcontext():
        return np.ascontiguousarray(part, dtype=np.float32)


def _sorted_rows(xb, rows: np.ndarray) -> np.ndarray:
    """(len(rows), d) float32 rows of ``xb`` for sorted ``rows`` (unique or not)."""
    if not len(rows):
        return np.zeros((0, xb.shape[1]), np.float32)
    return np.asarray(xb[rows], dtype=np.float32)


def gather(xb, I: np.ndarray, budget_bytes: int = 64 << 20) -> np.ndarray:
    """(*I.shape, d) float32 rows of ``xb`` for indices ``I`` (-1 -> row 0, masked by callers), read in
    sorted order of row, each row once, with read-ahead off."""
    flat = np.where(I >= 0, I, 0).reshape(-1)
    u, inv = np.unique(flat, return_inverse=True)
    d = xb.shape[1]
    out = np.empty((len(u), d), np.float32)
    step = max(256, min(budget_bytes // max(1, 4 * d), budget_bytes // _FAULT_AROUND))
    with _advice(xb, "MADV_RANDOM"):
        for s in range(0, len(u), step):
            out[s:s + step] = _sorted_rows(xb, u[s:s + step])
            release(xb)
    if len(u) == len(flat) and np.array_equal(u, flat):
        return out.reshape(*I.shape, d)  # sorted distinct rows (a training sample): no second copy
    return out[inv].reshape(*I.shape, d)


def rescore(xq: np.ndarray, xb, I: np.ndarray, budget_bytes: int = 64 << 20) -> np.ndarray:
    """Exact scores (m, kk) float32 of candidates ``I`` (m, kk) (-1 -> -inf) for queries ``xq`` (m, d):
    products summed in float64 and rounded once to float32. Candidates are read in sorted order of row,
    each distinct row once per batch, in batches of about ``budget_bytes``."""
    m, kk = I.shape
    out = np.full(m * kk, -np.inf, np.float32)
    flat = I.reshape(-1)
    pos = np.flatnonzero(flat >= 0)
    if not len(pos):
        return out.reshape(m, kk)
    rows = flat[pos]
    order = np.argsort(rows, kind="stable")
    pos, rows = pos[order], rows[order]
    d = xb.shape[1]
    # pairs a batch: fp32 rows read, two fp64 operands, and the pages mapped around each row read
    step = max(256, min(budget_bytes // max(1, 24 * d), budget_bytes // _FAULT_AROUND))
    with _advice(xb, "MADV_RANDOM"):
        for s in range(0, len(rows), step):
            r, p = rows[s:s + step], pos[s:s + step]
            u, inv = np.unique(r, return_inverse=True)
            R = _sorted_rows(xb, u)  # (u, d) float32
            q = np.asarray(xq[p // kk], dtype=np.float64)
            out[p] = np.einsum("nd,nd->n", q, R[inv].astype(np.float64)).astype(np.float32)
            release(xb)
    return out.reshape(m, kk)
