"""Exact scores: the fp32 value nearest the exact dot product of two fp32 vectors (ties to even).

This is what every kernel score means. It depends on the two vectors alone, not on a GEMM's shape,
blocking, thread count or hardware, so an exact duplicate of an item scores exactly like it wherever
it sits, and a fast pass in any precision can be made to return the very same bits by re-scoring
what its error bound leaves undecided.

How: fp32 x fp32 products are exact in fp64 (48 significant bits <= 53), so the fp64 sum of the d
products differs from the exact dot product S by at most ``gamma(d, 2**-53) * |x| |y|`` whatever the
summation order. When every real within that distance of the fp64 sum rounds to the same fp32 value,
that value is fl32(S) (rounding is monotone). Otherwise (an fp32 rounding boundary lies within
~1e-13 relative: exact zeros reached by cancellation, values a hair from a midpoint) the products are
summed exactly in Python.
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["gamma", "U64", "exact_dot", "round_certified", "exact_fp32", "grid_exponent", "sums_exact"]

U64 = 2.0 ** -53     # unit roundoff of fp64
_INFLATE = 1 + 2.0 ** -30  # covers the fp64 rounding of the norms and of the bound's own arithmetic


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of a sum of n terms (any order)."""
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def round_certified(s64: torch.Tensor, err: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, certain) for fp64 approximations ``s64`` within ``err`` of exact reals S: ``value`` is
    fl32(S) wherever ``certain`` (both ends of [s64 - err, s64 + err] round to the same fp32 value);
    -0.0 is returned as +0.0. nextafter widens each end by one fp64 step for the rounding of the +/-."""
    inf = torch.tensor(math.inf, dtype=torch.float64, device=s64.device)
    lo = torch.nextafter(s64 - err, -inf).float()
    hi = torch.nextafter(s64 + err, inf).float()
    return lo + 0.0, lo == hi


_NO_GRID = 1 << 20  # grid exponent of an all-zero row: no constraint


def grid_exponent(x: torch.Tensor) -> torch.Tensor:
    """(n,) int64: per row of x (n, d) fp32, the largest g with every entry a multiple of 2^g.

    When two rows' products and partial sums all lie on the grid 2^(gx + gy) below 2^p of it, a
    p-bit floating-point sum of their products is exact in any order (``sums_exact``): quantised or
    low-entropy embeddings (and most tie-heavy test data) are scored exactly by an fp32 GEMM."""
    bits = x.float().contiguous().view(torch.int32)
    field = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    sig = torch.where(field > 0, man | 0x800000, man)  # x = sig * 2^(field - 150) (subnormals: 2^-149)
    e0 = torch.where(field > 0, field - 150, -149)
    low = sig & (-sig)  # lowest set bit of the significand: a power of two (0 for x == 0)
    tz = torch.frexp(low.float()).exponent - 1
    return torch.where(sig == 0, _NO_GRID, e0 + tz).amin(1).long()


def sums_exact(norm_x: torch.Tensor, grid_x: torch.Tensor, norm_y: torch.Tensor, grid_y: torch.Tensor,
               bits: int) -> torch.Tensor:
    """Whether a ``bits``-bit floating-point dot product of rows with these L2 norms (upper bounds) and
    grid exponents is exact whatever the order: sum |x_k y_k| <= |x| |y| < 2^(bits + gx + gy), and the
    grid 2^(gx + gy) >= 2^-126 (no product or sum is subnormal, so none can be flushed)."""
    g = grid_x + grid_y
    room = torch.ldexp(torch.ones_like(norm_x, dtype=torch.float64), (bits + g).clamp(max=1000))
    return (g >= -126) & (norm_x.double() * norm_y.double() < room)


def exact_fp32(x: list[float], y: list[float]) -> float:
    """fl32(sum x_k y_k) of two fp32 vectors given as Python floats, exactly (slow; for the rare
    pairs ``round_certified`` leaves open). ``math.fsum`` of the exact fp64 products is the correctly
    rounded fp64 value f of S; rounding f to fp32 equals rounding S unless f is exactly halfway
    between two fp32 values, where the sign of S - f (exact: another fsum) decides."""
    p = [a * b for a, b in zip(x, y)]  # exact: 24 + 24 significant bits, exponents far inside fp64
    f = math.fsum(p)
    with np.errstate(over="ignore"):
        c = np.float32(f)  # round to nearest even
    if float(c) == f or not math.isfinite(float(c)):
        return float(c) + 0.0
    other = np.nextafter(c, np.float32(-np.inf if float(c) > f else np.inf))
    if (float(c) + float(other)) / 2 != f:
        return float(c)  # f is not a midpoint: rounding f and rounding S agree
    side = math.fsum(p + [-f])  # exact sign of S - f (zero only if S == f)
    if side == 0:
        return float(c)  # a true tie: numpy rounded it to even
    up = side > 0
    return float(max(c, other) if up else min(c, other))


def exact_dot(a: torch.Tensor, b: torch.Tensor, a_norm: torch.Tensor | None = None,
              b_norm: torch.Tensor | None = None) -> torch.Tensor:
    """Exact scores (n,) float32 of the row pairs a (n, d), b (n, d) (any float dtype, taken as fp32).
    ``a_norm``/``b_norm``: (n,) upper bounds of the rows' L2 norms, when the caller has them."""
    n, d = a.shape
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=a.device)
    a64 = a if a.dtype == torch.float64 and a_norm is not None else a.float().double()  # (n, d) float64
    b64 = b.float().double()
    s = torch.linalg.vecdot(a64, b64)  # products exact, sum within gamma_d |a| |b|
    na = torch.linalg.vector_norm(a64, dim=1) if a_norm is None else a_norm
    nb = torch.linalg.vector_norm(b64, dim=1) if b_norm is None else b_norm.double()
    v, ok = round_certified(s, gamma(d, U64) * _INFLATE * na * nb)
    if not bool(ok.all()):
        bad = torch.nonzero(~ok).squeeze(1)
        ea, eb = a64[bad].float(), b64[bad].float()
        grid = sums_exact(na.expand(n)[bad], grid_exponent(ea), nb.expand(n)[bad], grid_exponent(eb), 53)
        v[bad[grid]] = s[bad[grid]].float() + 0.0  # the fp64 sum is the exact sum: round it once
        for i in bad[~grid].tolist():
            v[i] = exact_fp32(a64[i].tolist(), b64[i].tolist())
    return v
