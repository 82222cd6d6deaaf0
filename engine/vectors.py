"""Embeddings from users' files to unit rows: the one L2 normaliser for every file of vectors hardrank reads."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .errors import DataError

__all__ = ["unit_rows"]

_BLOCK = 1 << 22  # values per float64 block: the temporary stays at 32 MB whatever the file's size


def unit_rows(x: np.ndarray, name_row: Callable[[int], str], out: np.ndarray | None = None) -> np.ndarray:
    """(n, d) float32 L2-normalised rows of ``x`` (n, d), any real dtype (float16/32/64, integers).

    Every finite nonzero vector becomes its direction, whatever its magnitude: each row is divided by
    its largest |value| first (in float64), so the sum of squares lies in [1, d] and can neither
    overflow (a float32 vector x 1e20 has a float32 norm of inf) nor underflow to 0 (x 1e-25), then by
    its norm, then rounded to float32. A row holding NaN or inf, or only zeros (no direction),
    raises a DataError starting with ``name_row(j)`` (the file and the row's id). ``out``: a float32
    array of x's shape to write into (``x`` itself: in place, each block is copied before it is written)."""
    n, d = x.shape
    out = np.empty((n, d), np.float32) if out is None else out
    step = max(1, _BLOCK // max(d, 1))
    for lo in range(0, n, step):
        block = np.array(x[lo:lo + step], dtype=np.float64)  # (b, d) a copy, divided in place
        finite = np.isfinite(block).all(1)
        if not finite.all():
            j = lo + int(np.flatnonzero(~finite)[0])
            raise DataError(f"{name_row(j)} has a NaN or infinite value in its embedding; every embedding must be "
                            f"a finite vector (drop the row or re-embed the item)")
        scale = np.abs(block).max(1, initial=0.0)  # (b,)
        if not scale.all():
            j = lo + int(np.flatnonzero(scale == 0)[0])
            raise DataError(f"{name_row(j)} has an all-zero embedding (every value is 0: it has no direction to "
                            f"score); drop the row or re-embed the item")
        block /= scale[:, None]
        block /= np.sqrt(np.einsum("ij,ij->i", block, block))[:, None]
        out[lo:lo + len(block)] = block
    return out
