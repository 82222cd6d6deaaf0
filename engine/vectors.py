"""Embeddings from users' files to unit rows: the one L2 normaliser for every file of vectors hardrank reads."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hardrank.errors import DataError

__all__ = ["unit_rows", "UnitRows", "f32"]

_BLOCK = 1 << 22  # values per float64 block: the temporary stays at 32 MB whatever the file's size
# sums of squares float64 holds with full precision; outside (or NaN) a row is rescaled first. Any float32,
# float16 or integer vector lands inside (float32's largest square x 1e4 dims is ~1e81, its smallest
# nonzero square ~2e-90): only float64 values beyond ~1e145 or below ~1e-145 take the rescaling branch.
_LOW, _HIGH = 1e-290, 1e290


def unit_rows(x: np.ndarray, name_row: Callable[[int], str], out: np.ndarray | None = None) -> np.ndarray:
    """(n, d) float32 L2-normalised rows of ``x`` (n, d), any real dtype (float16/32/64, integers).

    Every finite nonzero vector becomes its direction, whatever its magnitude: the norm is taken in
    float64, where a float32 vector x 1e20 (whose float32 norm is inf) or x 1e-25 (whose float32 squares
    are 0) is an ordinary number, and a float64 row whose squares would leave float64's range is first
    divided by its largest |value|; the quotient is rounded to float32 once. A row holding NaN or inf,
    or only zeros (no direction), raises a DataError starting with ``name_row(j)`` (the file and the
    row's id). ``out``: a float32 array of x's shape to write into (``x`` itself: in place, each block
    is copied before it is written)."""
    n, d = x.shape
    out = np.empty((n, d), np.float32) if out is None else out
    step = max(1, _BLOCK // max(d, 1))
    buf = np.empty((min(step, n), d), np.float64)  # one float64 block, reused: no fresh pages for each block
    for lo in range(0, n, step):
        block = buf[:min(step, n - lo)]
        np.copyto(block, x[lo:lo + step], casting="unsafe")  # (b, d) a copy (integers, floats: exact in float64)
        ss = _sums(block, lo, name_row)
        # the quotient in float64, then rounded to float32 once (a ufunc writing float32 from float64 operands
        # took the buffered casting path: 10x slower)
        np.divide(block, np.sqrt(ss)[:, None], out=block)
        out[lo:lo + len(block)] = block
    return out


def _sums(block: np.ndarray, lo: int, name_row) -> np.ndarray:
    """(b,) float64 sums of squares of ``block`` (b, d) float64 rows ``lo..``; rows outside float64's
    comfortable range are rescaled in place first (``_rescale``), a row without a direction raises."""
    ss = np.einsum("ij,ij->i", block, block)
    odd = ~((ss > _LOW) & (ss < _HIGH))
    if odd.any():
        _rescale(block, ss, np.flatnonzero(odd), lo, name_row)
    return ss


class UnitRows:
    """(n, d) float32 L2-normalised rows of a float16 array, normalised on read: a float16 file's vectors
    kept as the file stores them (half the memory of float32 rows), every row read equal, bit for bit, to
    ``unit_rows`` of the same values (each row's norm taken once, in float64, when the view is made).
    Normalising into float16 instead would round each value a second time and move scores by ~1e-4.

    An array-like (as ``clip_retrieval.VectorRows``): ``len``, ``shape``, ``dtype`` (float32), slices
    (another view, no copy), integer and integer-array indexing (float32 rows read), ``np.asarray`` (the
    whole view, read a block at a time: no float64 copy of it), ``select`` (rows copied as another view),
    ``nbytes`` (what it holds). Picklable: a shard actor handed a slice holds that slice."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, raw: np.ndarray, root: np.ndarray):
        self.raw, self.root = raw, root  # (n, d) float16 as stored; (n,) float64 their L2 norms

    @classmethod
    def of(cls, raw: np.ndarray, name_row: Callable[[int], str]) -> UnitRows:
        """The view over ``raw`` (n, d) float16 (held, not copied); a row of zeros raises as in ``unit_rows``."""
        if raw.dtype != np.float16 or raw.ndim != 2:
            raise ValueError(f"UnitRows holds a 2-D float16 array, got {raw.dtype} of shape {raw.shape}")
        n, d = raw.shape
        root = np.empty(n, np.float64)
        step = max(1, _BLOCK // max(d, 1))
        for lo in range(0, n, step):  # float16's squares never leave float64's range: only zero rows are odd
            root[lo:lo + step] = np.sqrt(_sums(np.array(raw[lo:lo + step], dtype=np.float64), lo, name_row))
        return cls(raw, root)

    @property
    def shape(self) -> tuple[int, int]:
        return self.raw.shape

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes + self.root.nbytes)

    def __len__(self) -> int:
        return len(self.raw)

    def select(self, idx) -> UnitRows:
        """Rows ``idx`` (integers, repeats allowed) as a new view holding copies of their float16 values."""
        idx = np.asarray(idx, np.int64).reshape(-1)
        return UnitRows(self.raw[idx], self.root[idx])

    def _read(self, idx) -> np.ndarray:
        """(len(idx), d) float32 rows ``idx`` (a slice or integers): the division ``unit_rows`` does."""
        raw, root = self.raw[idx], self.root[idx]
        out = np.empty(raw.shape, np.float32)
        step = max(1, _BLOCK // max(raw.shape[1], 1))
        for lo in range(0, len(raw), step):
            np.divide(np.array(raw[lo:lo + step], dtype=np.float64), root[lo:lo + step, None],
                      out=out[lo:lo + step], casting="same_kind")
        return out

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return UnitRows(self.raw[idx], self.root[idx])
        if isinstance(idx, (int, np.integer)):
            return self._read(np.array([idx], np.int64))[0]
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        return self._read(idx.reshape(-1).astype(np.int64)).reshape(*idx.shape, self.raw.shape[1])

    def __array__(self, dtype=None, copy=None):
        out = self._read(slice(None))
        return out if dtype is None else out.astype(dtype, copy=False)


def _rescale(block: np.ndarray, ss: np.ndarray, rows: np.ndarray, lo: int, name_row) -> None:
    """Rows ``rows`` of ``block`` divided by their largest |value| (in place, with their new sums of
    squares in ``ss``), so the squares stay in range; the first row with NaN/inf or only zeros raises."""
    sub = block[rows]
    scale = np.abs(sub).max(1, initial=0.0)  # NaN for a row holding NaN, inf for one holding inf
    bad = ~np.isfinite(scale) | (scale == 0)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        if np.isfinite(scale[k]):
            raise DataError(f"{name_row(lo + int(rows[k]))} has an all-zero embedding (every value is 0: it has no "
                            f"direction to score); drop the row or re-embed the item")
        raise DataError(f"{name_row(lo + int(rows[k]))} has a NaN or infinite value in its embedding; every "
                        f"embedding must be a finite vector (drop the row or re-embed the item)")
    sub /= scale[:, None]
    block[rows] = sub
    ss[rows] = np.einsum("ij,ij->i", sub, sub)


def f32(x) -> np.ndarray:
    """``x`` as a C-contiguous float32 array (no copy when it is one)."""
    return np.ascontiguousarray(x, dtype=np.float32)
