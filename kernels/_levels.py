"""Score levels: a GEMM in one precision with a rigorous bound on each score's distance to the exact
score, up to the exact level; the choice of the first level (``precision``) and the hardware probe.

A kernel scores a tile at its first level, decides what the bound allows (an item far above or below a
threshold), collects the few undecided items for exact re-scoring (``_exact``), and sends rows whose
undecided items are too many to re-score one by one up a level, where the tile row is computed again:
low precision (bf16 / fp16) -> fp32 -> exact (fp64 GEMM, each entry certified). Every level ends in the
same exact scores, so the precision changes the speed, never a result.

The bound (x a query, y a gallery row, both fp32: the contract's operands; S = x . y exactly)
-------------------------------------------------------------------------------------------------
Low-precision level (format p: bf16 u = 2^-8, fp16 u = 2^-11). The GEMM's operands are x^ = p(x)
(fp16: entries below its smallest normal flushed to 0 by us, so no hardware flushing can change them)
and the residual dx = x - x^ is exact in fp32. From x y = x^ y^ + x^ dy + dx y and Cauchy-Schwarz:

    |x^ . y^ - S| <= |x^| |dy| + |dx| |y|

x^_k y^_k is exact in fp32 (8 + 8 or 11 + 11 significant bits), so summing the d products in fp32 in
any order, blocking or FMA use, with accumulation unit roundoff nu, adds at most
gamma_d(nu) |x^| |y^| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., sec. 3.1;
sum |x^_k y^_k| <= |x^| |y^|), where gamma_n(u) = n u / (1 - n u). Hardware that flushes subnormal
inputs, products or partial sums to zero (AVX512-BF16 and AMX do) moves each by < 2^-126, which
tau = 2^-125 (d + 1 + sqrt(d) (|x| + |y|)) covers. A CPU GEMM returns its fp32 sum rounded to p:
|r - sum| <= u |sum|, i.e. <= rho |r| with rho = u / (1 - u). Per query i, with gallery-wide maxima:

    |r_ij - S_ij| <= E_i + rho |r_ij|,
    E_i = |x^_i| max|dy| + |dx_i| max|y| + gamma_d(nu) |x^_i| max|y^| + tau_i

nu = 2^-23 on CPUs (fp32 FMA rounds to nearest, 2^-24: a factor 2 of margin covers a truncating unit)
and 2^-22 on CUDA tensor cores (fp32 accumulation with truncation; Fasi, Higham, Mikaitis, Pranesh,
"Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021). For unit vectors at d = 512 in bf16:
|dy| <= ~0.0020, so E ~ 0.0041 and rho = 1/255; in fp16 E ~ 0.0005.

fp32 level: operands exact, E_i = gamma_d(2^-24) |x_i| max|y| + tau_i (~3.1e-5 at d = 512). When
torch is allowed a faster fp32 matmul (``torch.set_float32_matmul_precision("high"/"medium")``, TF32
on CUDA: the library may round operands to tf32 or bf16), the a-priori form is used instead:
E_i = ((1 + 2^-8)^2 - 1 + gamma_d(nu) (1 + 2^-8)^2) |x_i| max|y| + tau_i.

Exact level: fp64 GEMM, products exact, |s64 - S| <= gamma_d(2^-53) |x| |y|; entries whose fp32
rounding that could change are summed exactly (``_exact.round_certified``, ``exact_fp32``).

Deciding with the bound: the exact score e = fl32(S) satisfies e >= t (t fp32) when S >= t, and
S >= r - E - rho |r|, so ``r >= ge(t)`` (solved for r, rounded up) proves e >= t; ``r <= le(t)``
proves e <= t; e > s* is e >= nextafter(s*, +inf). All thresholds are computed in fp64 with a
relative slack far above fp64's rounding, then rounded outward to fp32, and kept out of the fp32
subnormal range, so a comparison that flushes subnormals to zero cannot flip a decision.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import torch

from ._exact import U64, exact_dot, exact_fp32, gamma, grid_exponent, round_certified, sums_exact

__all__ = ["PRECISIONS", "resolve_precision", "precision_choice", "Levels", "BlockScorer"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_UNIT = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_FP16_MAX = 2.0 ** 14  # fp16 operands only while every entry and every score stays far inside its range
_FP16_TINY = 2.0 ** -14  # fp16's smallest normal: smaller operands are flushed to 0 (kept exact in dx)
_NORMAL = 2.0 ** -125  # thresholds are kept at least this far from 0 (fp32 subnormals end at 2^-126)
_SLACK = 2.0 ** -20  # relative slack of the fp32 threshold arithmetic (its few roundings are < 2^-22)
_INFLATE = 1 + 2.0 ** -30  # on E: the fp64 rounding of norms, maxima and products
_NORM32 = 1 + 2.0 ** -12  # on a norm computed in fp32 (its relative error is below d 2^-24)
_SPEEDUP = 1.5  # "auto" takes a low precision when its GEMM is at least this much faster than fp32's


# --- choosing the first level ------------------------------------------------------------------
_SMALL = 1 << 28  # multiply-adds under which ``auto`` stays in fp32: the low-precision pass's set-up
# (a pass over the gallery, operand copies, small GEMMs that run no faster) outweighs what it saves
_NARROW_CPU = 128  # embedding widths under which ``auto`` stays in fp32 on a CPU: each score costs d
# multiply-adds but also the passes over its tile (maxima, compares, counts, the band's re-scores), which bf16 does
# not speed up; at d = 64 (the toy model) the bf16 path ran 1.3-1.9x slower than fp32 (1,000 x 5,010, both ways)


def resolve_precision(precision: str = "auto", device: torch.device | str = "cpu", work: int | None = None) -> str:
    """The first level a kernel call will use: ``fp32``, ``bf16`` or ``fp16``.

    ``auto`` picks the low precision this device multiplies fastest: on CUDA, fp16 on tensor cores
    (compute capability 7.0+); on CPU, bf16 when the CPU has bf16 matrix units (flags ``amx_bf16`` or
    ``avx512_bf16`` in /proc/cpuinfo, where it exists), oneDNN has a bf16 GEMM, and a small timed
    probe (cached per process) finds it at least 1.5x faster than fp32; fp32 otherwise, and for calls
    of fewer than 2^28 multiply-adds (``work`` = nq * nb * d, when given). The kernels fall back from
    fp16 to bf16 (or fp32) when the data leave fp16's range. ``precision_choice`` also says why.
    """
    return precision_choice(precision, device, work)[0]


def precision_choice(precision: str = "auto", device: torch.device | str = "cpu",
                     work: int | None = None) -> tuple[str, str]:
    """(``resolve_precision``'s answer, why: the hardware found and the probe's figure), for provenance."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision, "requested"
    if work is not None and work < _SMALL:
        return "fp32", "auto: a small call (< 2^28 multiply-adds), where a low-precision pass does not pay"
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 7:
            return "fp16", f"auto: CUDA tensor cores (sm_{major}{minor})"
        return "fp32", f"auto: no tensor cores (sm_{major}{minor})"
    if device.type != "cpu":
        return "fp32", f"auto: no low-precision path on {device.type}"
    flags = _cpu_bf16_flags()
    if flags is not None and not flags:
        return "fp32", "auto: no bf16 matrix unit (the CPU flags have neither amx_bf16 nor avx512_bf16)"
    units = "+".join(flags) if flags else "CPU flags unknown"
    speedup = _cpu_bf16_speedup()
    if speedup == 0:
        return "fp32", f"auto: {units}, but this torch's oneDNN has no bf16 GEMM"
    if speedup >= _SPEEDUP:
        return "bf16", f"auto: {units}; a bf16 GEMM probe ran {speedup:.1f}x faster than fp32"
    return "fp32", f"auto: {units}, but a bf16 GEMM probe ran only {speedup:.1f}x faster than fp32 (< {_SPEEDUP})"


@functools.cache
def _cpu_bf16_flags() -> tuple[str, ...] | None:
    """The CPU's bf16 matrix-unit flags (``amx_bf16``, ``avx512_bf16``) from /proc/cpuinfo; None where
    that file does not exist or lists no flags (not Linux, not x86): the oneDNN check and probe decide."""
    try:
        text = open("/proc/cpuinfo", encoding="ascii", errors="replace").read()
    except OSError:
        return None
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), None)
    if line is None:
        return None
    have = set(line.split(":", 1)[-1].split())
    return tuple(f for f in ("amx_bf16", "avx512_bf16") if f in have)


@functools.cache
def _cpu_bf16_speedup() -> float:
    """fp32 / bf16 time of a (1024, 512) x (512, 1024) product on this CPU, best of 5 each (0 when
    oneDNN has no bf16 GEMM: a generic fallback would be slower than fp32)."""
    try:
        if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
            return 0.0
    except (AttributeError, RuntimeError):
        return 0.0
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 512, generator=g), torch.randn(1024, 512, generator=g)
    ab, bb = a.bfloat16(), b.bfloat16()
    best = {torch.float32: math.inf, torch.bfloat16: math.inf}
    for _ in range(6):  # the first round warms both up
        for x, y in ((a, b), (ab, bb)):
            t = time.perf_counter()
            torch.mm(x, y.T)
            best[x.dtype] = min(best[x.dtype], time.perf_counter() - t)
    return best[torch.float32] / best[torch.bfloat16]


def _fp32_matmul_is_ieee(device: torch.device) -> bool:
    """False when torch may compute fp32 GEMMs with tf32/bf16 operands on this device."""
    if torch.get_float32_matmul_precision() != "highest":
        return False
    if device.type == "cuda":
        if torch.backends.cuda.matmul.allow_tf32:
            return False
        return getattr(torch.backends.cuda.matmul, "fp32_precision", "none") in ("none", "ieee")
    mk = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    return getattr(mk, "fp32_precision", "none") in ("none", "ieee")


@functools.cache
def _mm_out_fp32(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` takes ``dtype`` operands on this device."""
    try:
        a = torch.ones(2, 2, dtype=dtype, device=device_type)
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


# --- the levels of one kernel call ----------------------------------------------------------------
@dataclass(frozen=True)
class _Level:
    name: str           # bf16 | fp16 | fp32 | exact
    dtype: torch.dtype  # GEMM operands
    u: float            # operand unit roundoff whose residuals the bound uses (0: exact operands)
    nu: float           # accumulation unit roundoff
    rho: float          # output rounding, relative to the returned score (0: fp32 output)
    a_priori: float     # fp32 under a reduced matmul precision: bound coefficient of |x| max|y|


def _flushes_denormals(device: torch.device) -> bool:
    """True when comparisons on ``device`` treat fp32 subnormals as zero (``torch.set_flush_denormal``)."""
    tiny = torch.tensor([2.0 ** -140], device=device)
    return not bool((tiny > 0).item())


def _maxnorm(x: torch.Tensor) -> float:
    return float(x.max()) if x.numel() else 0.0


class Levels:
    """The levels of one call and the gallery-wide quantities their bounds use.

    xb (nb, d) gallery (any float dtype; scores use its fp32 rounding), ``first`` the first level's
    name (``resolve_precision``). One pass over the gallery in cache-sized row chunks measures max|y|
    and, for a low-precision first level, max|dy| (y - p(y) is exact in fp32; the fp32 norms are inflated
    by ``_NORM32``)."""

    def __init__(self, xb: torch.Tensor, device: torch.device, first: str, chunk: int = 1024):
        self.xb, self.device = xb, device
        self.d = d = xb.shape[1]
        self.flushes = _flushes_denormals(device)
        cuda = device.type == "cuda"
        ieee = _fp32_matmul_is_ieee(device)
        u8 = _UNIT["bf16"]
        fp32 = _Level("fp32", torch.float32, 0.0, 2.0 ** -24, 0.0,
                      0.0 if ieee else (1 + u8) ** 2 - 1 + gamma(d, 2.0 ** -24) * (1 + u8) ** 2)
        exact = _Level("exact", torch.float64, 0.0, U64, 0.0, 0.0)
        self.levels = [fp32, exact]
        if first in _UNIT:
            dt, u = _DTYPE[first], _UNIT[first]
            rho = 0.0 if cuda and _mm_out_fp32(device.type, dt) else u / (1 - u)
            self.levels.insert(0, _Level(first, dt, u, 2.0 ** -22 if cuda else 2.0 ** -23, rho, 0.0))
        nb = xb.shape[0]
        ymax, dmax = 0.0, 0.0
        # max|dy| measured, not bounded by u max|y|: a row's residual is ~0.5 u |y| (its entries' rounding errors
        # spread over [-u, u] relative), so the bound and the band it leaves undecided shrink (-12% exact
        # re-scores at RoCOCO shape). fp16 must measure anyway: it flushes small entries.
        measure = first in _UNIT
        for c0 in range(0, nb, chunk):
            y = self.rows32(c0, min(c0 + chunk, nb))
            ymax = max(ymax, _maxnorm(torch.linalg.vector_norm(y, dim=1)))
            if measure:
                dmax = max(dmax, _maxnorm(torch.linalg.vector_norm(y - _lowp(y, self.levels[0]).float(), dim=1)))
        ymax *= _NORM32  # norms summed in fp32
        self.ymax = ymax
        self.dymax = dmax * _NORM32 if measure else 0.0
        self.yhmax = ymax + self.dymax  # |y^| <= |y| + |dy|

    def rows32(self, c0: int, c1: int) -> torch.Tensor:
        """Gallery rows c0:c1 as fp32 on the device (a view when xb already is)."""
        return self.xb[c0:c1].to(device=self.device, dtype=torch.float32)

    def block(self, xq: torch.Tensor, r0: int, r1: int) -> BlockScorer:
        return BlockScorer(self, xq[r0:r1].to(device=self.device, dtype=torch.float32).contiguous())


def _lowp(x: torch.Tensor, lv: _Level) -> torch.Tensor:
    """x (fp32) rounded to the level's format; fp16 entries below its smallest normal become 0."""
    h = x.to(lv.dtype)
    if lv.dtype == torch.float16:
        h = h.masked_fill(h.abs() < _FP16_TINY, 0)
    return h


class BlockScorer:
    """One query block a (m, d) fp32 against the gallery: tiles at each level, the per-row bounds and
    the thresholds derived from them, and exact scores of chosen pairs."""

    def __init__(self, lv: Levels, a: torch.Tensor):
        self.L, self.a = lv, a
        self.m = a.shape[0]
        d = lv.d
        self.a64 = a.double()  # (m, d) exact copy for exact scores
        self.norm = torch.linalg.vector_norm(self.a64, dim=1)  # (m,) float64
        self._grid: torch.Tensor | None = None  # (m,) int64 grid exponents (``grid``), when first needed
        tau = 2.0 ** -125 * (d + 1 + math.sqrt(d) * (self.norm + lv.ymax))  # flushed subnormals
        self.ops: list[torch.Tensor | None] = []  # per level: GEMM operand rows (m, d)
        self.E: list[torch.Tensor] = []  # per level: (m,) float64 absolute bound
        for lev in lv.levels:
            if lev.name == "exact":
                self.ops.append(None)
                self.E.append(torch.zeros_like(self.norm))
            elif lev.name == "fp32":
                coef = lev.a_priori if lev.a_priori else gamma(d, lev.nu)
                self.ops.append(a)
                self.E.append((coef * self.norm * lv.ymax + tau) * _INFLATE)
            else:
                h = _lowp(a, lev)
                hn = torch.linalg.vector_norm(h.double(), dim=1)
                dn = torch.linalg.vector_norm((a - h.float()).double(), dim=1)
                self.ops.append(h)
                self.E.append((hn * lv.dymax + dn * lv.ymax + gamma(d, lev.nu) * hn * lv.yhmax + tau) * _INFLATE)
        self.E1, self.c = [], []  # per level: (m,) fp32 and scalar margins of the fp32 threshold arithmetic
        for lev, E in zip(lv.levels, self.E):
            c = lev.rho / (1 - lev.rho) + _SLACK
            self.c.append(c)
            self.E1.append((E * ((1 + c) * (1 + _SLACK) * (1 + 2.0 ** -22))).float())  # rounded up
        self._bufs: dict[tuple, torch.Tensor] = {}

    @property
    def grid(self) -> torch.Tensor:
        """(m,) int64 grid exponents of the block's rows (``_exact.sums_exact``): only rows that reach
        the fp32 or exact level need them, which a low-precision pass often never sends."""
        if self._grid is None:
            self._grid = grid_exponent(self.a)
        return self._grid

    @property
    def n_levels(self) -> int:
        return len(self.L.levels)

    def level(self, i: int) -> _Level:
        return self.L.levels[i]

    def _buf(self, key, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        """(rows, cols) scratch reused across tiles: fresh multi-MB buffers are page-faulted in again
        every time (~10% of a CPU GEMM)."""
        b = self._bufs.get(key)
        if b is None or b.shape[0] < rows or b.shape[1] != cols or b.dtype != dtype:
            b = self._bufs[key] = torch.empty(max(rows, self.m if b is None else b.shape[0]), cols, dtype=dtype,
                                              device=self.a.device)
        return b[:rows]

    def tile(self, i: int, rows: torch.Tensor | None, c0: int, c1: int) -> torch.Tensor:
        """Scores (k, c1 - c0) of the block rows ``rows`` (all when None) against gallery rows c0:c1
        at level i: values within the level's bound of the exact scores (the exact scores themselves
        at the exact level), fp32, or bf16 / fp16 for a CPU low-precision level (compare them with
        fp32 thresholds; widen what is taken out with ``.float()`` before arithmetic). The result may
        be a reused buffer: valid until the next call."""
        lev = self.level(i)
        w = c1 - c0
        y = self.L.rows32(c0, c1)  # (w, d) float32
        if lev.name == "exact":
            return self._exact_tile(rows, y)
        a = self.ops[i] if rows is None else self.ops[i][rows]
        k = a.shape[0]
        out = self._buf("f32", k, w, torch.float32)
        if lev.dtype == torch.float32:
            return torch.mm(a, y.T, out=out)
        b = _lowp(y, lev)
        if lev.rho == 0:  # CUDA: fp32 output
            out.copy_(torch.mm(a, b.T, out_dtype=torch.float32))
            return out
        # CPU: the GEMM returns its fp32 sums rounded to the operand format. The tile stays in that
        # format (half the bytes for every pass that reads it; a copy to fp32 cost as much as those
        # passes): compares against fp32 thresholds promote to fp32 and are exact, and the values the
        # kernels take out of it (chunk maxima, candidates) are widened to fp32 before any arithmetic.
        return torch.mm(a, b.T, out=self._buf("lp", k, w, lev.dtype))

    def _exact_tile(self, rows, y: torch.Tensor) -> torch.Tensor:
        a64, y64 = self.a64 if rows is None else self.a64[rows], y.double()
        s = a64 @ y64.T  # (k, w) float64
        na = self.norm if rows is None else self.norm[rows]
        ny = torch.linalg.vector_norm(y64, dim=1)
        e, ok = round_certified(s, gamma(self.L.d, U64) * _INFLATE * na[:, None] * ny[None, :])
        if not bool(ok.all()):
            r_, c_ = torch.nonzero(~ok, as_tuple=True)
            gx = self.grid if rows is None else self.grid[rows]
            grid = sums_exact(na[r_], gx[r_], ny[c_], grid_exponent(y)[c_], 53)
            e[r_[grid], c_[grid]] = s[r_[grid], c_[grid]].float() + 0.0  # exact sums: round once
            for r, c in zip(r_[~grid].tolist(), c_[~grid].tolist()):
                e[r, c] = exact_fp32(a64[r].tolist(), y64[c].tolist())
        return e

    def exact_rows(self, i: int, rows: torch.Tensor, c0: int, c1: int) -> torch.Tensor:
        """(k,) bool: which block rows ``rows`` level i scores exactly against gallery rows c0:c1 (fp32
        level, products and sums on a coarse enough grid: ``sums_exact``); their tile values are then
        the exact scores themselves."""
        if self.level(i).name != "fp32" or self.level(i).a_priori:
            return torch.zeros(rows.numel(), dtype=torch.bool, device=rows.device)
        y = self.L.rows32(c0, c1)
        gy = grid_exponent(y)
        # the most room any gallery row needs (|y| 2^-gy) and the finest grid; then per query row
        need = float(torch.ldexp(torch.linalg.vector_norm(y.double(), dim=1), (-gy).clamp(min=-1000)).max())
        gx = self.grid[rows]
        room = torch.ldexp(torch.ones_like(self.norm[rows]), (24 + gx).clamp(-1000, 1000))
        return (gx + int(gy.min()) >= -126) & (self.norm[rows] * need * (1 + 2.0 ** -40) < room)

    # -- thresholds: fp32 tile values that prove a relation of the exact score -----------------------
    # With W(t) = E1 + c |t| (E1 = E (1 + c) plus slack, c = rho / (1 - rho) plus slack; ``_margins``):
    # a tile value r >= t + W(t) proves e >= t, r <= t - W(t) proves e <= t, and r - W(r) <= e <= r + W(r).
    # The margins absorb the fp32 rounding of these few operations (slack 2^-20 >> 3 * 2^-24), so the
    # fp32 results err on the safe side.
    def _w(self, i: int, t: torch.Tensor, rows) -> torch.Tensor:
        e1 = self.E1[i] if rows is None else self.E1[i][rows]
        return e1 + t.abs() * self.c[i]

    def ge(self, i: int, t: torch.Tensor, rows=None) -> torch.Tensor:
        """(k,) fp32 g with: tile value r >= g proves e >= t (t (k,) fp32 exact-score thresholds)."""
        return self._normal(t + self._w(i, t, rows), up=True)

    def le(self, i: int, t: torch.Tensor, rows=None) -> torch.Tensor:
        """(k,) fp32 g with: tile value r <= g proves e <= t."""
        return self._normal(t - self._w(i, t, rows), up=False)

    def lo(self, i: int, r: torch.Tensor, rows) -> torch.Tensor:
        """fp32 lower bounds of the exact scores of tile values r (n,) in block rows ``rows`` (n,)."""
        return r - self._w(i, r, rows)

    def hi(self, i: int, r: torch.Tensor, rows) -> torch.Tensor:
        """fp32 upper bounds of the exact scores of tile values r (n,) in block rows ``rows`` (n,)."""
        return r + self._w(i, r, rows)

    def _normal(self, g: torch.Tensor, up: bool) -> torch.Tensor:
        """Where compares flush subnormals to zero, thresholds in (-2^-125, 2^-125) move to +2^-125 (``up``,
        proofs of >=) or -2^-125 (proofs of <=): the safe direction, and never read as 0."""
        if not self.L.flushes:
            return g
        return torch.where(g.abs() < _NORMAL, torch.full_like(g, _NORMAL if up else -_NORMAL), g)

    def exact(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Exact scores (n,) fp32 of the pairs (block row, gallery index), in steps of ~1 MiB of fp64
        (much larger gathers fall out of cache: several times slower per pair)."""
        out = torch.empty(rows.numel(), dtype=torch.float32, device=self.a.device)
        step = max(64, (1 << 19) // max(1, self.L.d))
        cols = cols.to(self.L.xb.device)
        ymax = torch.tensor(self.L.ymax, dtype=torch.float64, device=self.a.device)  # bounds every |y|
        for s0 in range(0, rows.numel(), step):
            r, c = rows[s0:s0 + step], cols[s0:s0 + step]
            y = self.L.xb[c].to(device=self.a.device, dtype=torch.float32)
            out[s0:s0 + step] = exact_dot(self.a64[r], y, self.norm[r], ymax)
        return out


# --- which rows go to which level, tile by tile ------------------------------------------------------
_REPROBE = 8  # rows sent up from a low-precision first level start there again every this many tiles


class Escalation:
    """Runs one tile of a block level by level: rows start at their start level, and the rows a level
    leaves undecided (too many items to re-score one by one) are scored again one level up. A row
    sent up from a low-precision first level because its threshold sits in a dense part of the score
    distribution (which the next tiles will share) starts the following tiles at fp32, until every row
    tries the first level again at the next multiple of _REPROBE tiles."""

    def __init__(self, sc: BlockScorer):
        self.sc = sc
        self.start = torch.zeros(sc.m, dtype=torch.bool, device=sc.a.device)  # True: start at level 1
        self.sticky = sc.level(0).name in _UNIT
        self.n_tiles = 0
        self.row_tiles = [0] * sc.n_levels  # rows scored per level, summed over tiles

    def run(self, c0: int, c1: int, visit) -> None:
        """``visit(i, rows, r)`` handles tile values r (k, c1 - c0) of block rows ``rows`` (None: all
        rows, k = m) at level i and returns (esc, dense): the positions (into r's rows) it leaves
        undecided, and those of them whose threshold sits in a dense part of the score distribution
        (they start the next tiles one level up); either may be None."""
        sc = self.sc
        if self.n_tiles % _REPROBE == 0:
            self.start.zero_()
        self.n_tiles += 1
        later = torch.nonzero(self.start).squeeze(1) if self.sticky else None
        carry = None
        for i in range(sc.n_levels):
            if i == 0:
                rows = None if later is None or later.numel() == 0 else torch.nonzero(~self.start).squeeze(1)
            else:
                parts = [p for p in (carry, later if i == 1 else None) if p is not None and p.numel()]
                if not parts:
                    carry = None
                    continue
                rows = parts[0] if len(parts) == 1 else torch.sort(torch.cat(parts)).values
            if rows is not None and rows.numel() == 0:
                continue
            r = sc.tile(i, rows, c0, c1)
            self.row_tiles[i] += r.shape[0]
            esc, dense = visit(i, rows, r)
            carry = None if esc is None or esc.numel() == 0 else (esc if rows is None else rows[esc])
            if dense is not None and dense.numel() and i == 0 and self.sticky:
                self.start[dense if rows is None else rows[dense]] = True

    def stats(self) -> dict[str, int]:
        return {lev.name: n for lev, n in zip(self.sc.L.levels, self.row_tiles)}


CAND_LIMIT = 64  # candidates of one row in one tile (best negative, top-k) past which the row goes up a
# level: candidates are only kept, and pruned as tiles go, so many are cheap; a flood of near-ties is not


def crowd_limit(i: int, sc: BlockScorer, w: int) -> int:
    """Undecided items in one row of a w-wide tile at level i beyond which scoring the row again one
    level up is cheaper than re-scoring the items exactly one by one (an exact pair costs about as much
    as ~150 columns of an fp32 GEMM row, ~50 of an fp64 one)."""
    up = sc.level(i + 1).name
    return max(4, w // 150) if up == "fp32" else max(8, w // 50)


def lowp_tile(first: str, device: torch.device) -> bool:
    """Whether a first level ``first`` leaves its tiles in a 2-byte format (CPU bf16 / fp16 GEMMs return
    their sums rounded to the operand format; CUDA's return fp32): the tile planner sizes for that."""
    return first in _UNIT and torch.device(device).type == "cpu"


def first_level(precision: str, device: torch.device, xq: torch.Tensor, xb: torch.Tensor) -> tuple[str, str]:
    """``precision_choice`` for this call (first level, why), then fp16 only where the data fit it:
    entries and scores far inside its range (``auto`` takes bf16, or fp32, instead; an explicit
    ``fp16`` is refused)."""
    first, why = precision_choice(precision, device, xq.shape[0] * xb.shape[0] * xq.shape[1])
    if precision == "auto" and first == "bf16" and device.type == "cpu" and xq.shape[1] < _NARROW_CPU:
        return "fp32", f"{why}, but d = {xq.shape[1]} < {_NARROW_CPU}: the GEMM is too small a share of the work"
    if first != "fp16":
        return first, why
    big = max((float(x.detach().abs().max()) if x.numel() else 0.0) for x in (xq, xb))
    if big * big * xq.shape[1] <= _FP16_MAX:
        return first, why
    if precision == "fp16":
        raise ValueError(f"precision='fp16' needs |entries| and scores well inside fp16's range (<= {_FP16_MAX:g}); "
                         f"these inputs reach |x| = {big:g} at d = {xq.shape[1]}: use 'bf16', 'fp32' or 'auto'")
    cuda_bf16 = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
    lp = "bf16" if cuda_bf16 or device.type == "cpu" else "fp32"
    return lp, f"{why}; the data leave fp16's range (|x| = {big:g}): {lp}"
