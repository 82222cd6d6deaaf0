"""The auto backend (mining): an exact streaming pass or a FAISS IVF index, whichever costs less here.

The cost model (``plan``), in multiply-adds at the rate the exact kernel measures on this machine
(``gemm_rate``), and bytes at assumed disk rates:

- exact: every (query, corpus row) pair once, ``nq x nb x d``; a memory-mapped corpus is read once per
  block of queries: from disk (assumed 500 MB/s, overlapping the GEMM) and converted to normalised fp32 rows
  on the same cores (``read_rate``, measured), so a pass costs its conversion plus its GEMM, or its disk read
  when that is slower.
- index: the build (k-means on the training sample, ``_NITER x train x nlist x d``; every row read, assigned
  to its list and encoded, at an fp32 GEMM's measured rate: FAISS's), the recall sample's exact pass
  (``recall_sample x nb x d`` and a read of the corpus: what checks the index and tunes nprobe; the exact path
  needs none), and the search (each query's coarse assignment and the codes of ``nprobe ~ nlist / 32`` lists,
  then ``k x refine`` candidates re-scored from the corpus).

Few queries against a large corpus make the exact pass cheaper (2,000 x 28M x 512: about 5 minutes against
a 20-minute build); many make the index cheaper. An index already built (``mine --index``) costs its search.

The index is sized so it can reach the recall target: about 2 sqrt(nb) lists (fewer when the training
sample, a quarter of the budget, would give a list fewer than 39 rows), an HNSW coarse quantiser from 8,192
lists, and codes of 2 bits a dimension (4-bit fast-scan PQ with 2 dims a sub-quantiser while the lists fit
half the budget in memory; else 8-bit PQ with 4 dims a sub-quantiser, lists memory-mapped from disk), whose
candidates are re-scored exactly (4x over-fetch, raised by tuning when nprobe alone does not reach the target).
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from hardrank.kernels import topk
from hardrank.scoring import corpus_io
from hardrank.scoring.backends.base import TOPK, Backend, MinePlan
from hardrank.scoring.backends.exhaustive import kernel_searcher
from hardrank.scoring.backends.faiss import describe_factory, faiss_searcher
from hardrank.units import hms
from hardrank.vectors import unit_rows

__all__ = ["Auto", "IndexShape", "auto_factory", "size_index", "gemm_rate", "plan"]

_NITER = 10            # k-means iterations (faiss_index.ondisk)
_NPROBE_SHARE = 32     # nprobe ~ nlist / 32 reached recall@10 0.95-0.96 on clustered data (benchmarks/README.md)
_SEQ_READ = 500e6      # bytes/s assumed for reading a memory-mapped corpus in order
_PAGE_READ = 100e6     # bytes/s assumed for scattered 4 KB pages (candidates re-scored from a mapped corpus)
_SCAN = {"fs": 4, "pq": 32, "sq": 1}  # multiply-add equivalents a code costs to scan, per sub-quantiser (per
#                        dimension for SQ8): fast-scan's SIMD lookups against 8-bit PQ's table reads
_FREE_MACS = 1 << 33   # below this many multiply-adds the exact pass takes seconds: no rate measured, no index
_ADD_OVERHEAD = 2.0    # FAISS's add beside its GEMM (residuals, encoding, list appends): measured ~2x (README)


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB"


@functools.cache
def read_rate(d: int) -> float:
    """Rows per second of turning a memory-mapped fp16 corpus's rows into what the search reads: float16 to
    float32 (torch), L2-normalised in float64 (``vectors.unit_rows``, as clip-retrieval parts are read), on a
    16,384 x ``d`` tile; the best of two after a warm-up. A pass over such a corpus pays this beside its GEMM."""
    x16 = np.random.default_rng(0).standard_normal((16384, d)).astype(np.float16)
    out = np.empty(x16.shape, np.float32)
    best = math.inf
    for i in range(3):
        t0 = time.perf_counter()
        torch.from_numpy(out).copy_(torch.from_numpy(x16))
        unit_rows(out, str, out=out)
        if i:
            best = min(best, time.perf_counter() - t0)
    return len(x16) / max(best, 1e-6)


@dataclass(frozen=True)
class IndexShape:
    """An IVF index sized for a corpus: its factory and what it costs."""

    factory: str
    nlist: int
    kind: str          # "fs" (4-bit fast-scan PQ), "pq" (8-bit PQ), "sq" (SQ8)
    m: int             # sub-quantisers (PQ) or dimensions (SQ8)
    code: int          # bytes a row's code takes
    hnsw: bool         # an HNSW coarse quantiser (many lists)
    train_rows: int
    in_memory: bool    # the lists fit half the budget (else on disk, memory-mapped)

    def bytes(self, nb: int) -> int:
        return nb * (self.code + 8)

    def words(self, nb: int) -> str:
        where = "in memory" if self.in_memory else "on disk, memory-mapped"
        return f"{self.factory} ({self.code} B a row + ids: {_gb(self.bytes(nb))} {where})"


def size_index(nb: int, d: int, budget_bytes: int, scale: float = 1.0) -> IndexShape:
    """The IVF index ``auto`` builds over ``nb`` rows of ``d`` dims within ``budget_bytes`` (``scale``: its
    lists and codes x2 or /2 for the plan's larger and smaller alternatives)."""
    cap = max(1, (budget_bytes // 4) // (4 * d))  # training rows: fp32 in a quarter of the budget
    nlist = 2 ** max(4, round(math.log2(2 * math.sqrt(max(nb, 1)) * scale)))
    while nlist > 16 and (nb < 39 * nlist or cap < 39 * nlist):
        nlist //= 2
    train = int(min(nb, cap, max(64 * nlist, 10_000)))
    hnsw = nlist >= 8192
    ivf = f"IVF{nlist}" + ("_HNSW32" if hnsw else "")
    bits = 2 * scale  # bits a dimension: 2 (1 smaller, 4 larger)
    fs_m = int(d * bits / 4)   # 4-bit fast-scan sub-quantisers
    pq_m = int(d * bits / 8)   # 8-bit PQ sub-quantisers: the same bytes a row
    if fs_m and fs_m % 2 == 0 and d % fs_m == 0 and nb * (fs_m // 2 + 8) <= budget_bytes // 2:
        return IndexShape(f"{ivf},PQ{fs_m}x4fs", nlist, "fs", fs_m, fs_m // 2, hnsw, train, True)
    if pq_m and d % pq_m == 0:
        return IndexShape(f"{ivf},PQ{pq_m}", nlist, "pq", pq_m, pq_m, hnsw, train,
                          nb * (pq_m + 8) <= budget_bytes // 2)
    return IndexShape(f"{ivf},SQ8", nlist, "sq", d, d, hnsw, train, nb * (d + 8) <= budget_bytes // 2)


def auto_factory(nb: int, d: int, budget_bytes: int) -> str:
    """The factory ``auto`` builds over an (nb, d) corpus within ``budget_bytes`` (``size_index``)."""
    return size_index(nb, d, budget_bytes).factory


@functools.cache
def gemm_rate(d: int, precision: str = "auto") -> float:
    """Multiply-adds per second of the exact kernel (``kernels.topk``, top-16) on this machine: 1,024 queries
    against 16,384 rows of ``d`` dims in 16 MiB of score tiles, the best of two calls after a warm-up (the
    kernel's own precision choice included; a few hundred ms, some 30 MB)."""
    g = torch.Generator().manual_seed(0)
    xq = torch.nn.functional.normalize(torch.randn(1024, d, generator=g), dim=1)
    xb = torch.nn.functional.normalize(torch.randn(16384, d, generator=g), dim=1)
    best = math.inf
    for i in range(3):
        t0 = time.perf_counter()
        topk(xq, xb, 16, precision=precision, budget_bytes=16 << 20)
        if i:
            best = min(best, time.perf_counter() - t0)
    return 1024 * 16384 * d / max(best, 1e-6)


def _index_seconds(shape: IndexShape, nq: int, nb: int, d: int, k: int, recall_sample: int, rate: float,
                   mapped: bool, built: bool, rate32: float | None = None, read: float = 0.0) -> dict:
    """Seconds of the index's build, the recall sample's exact pass and the search. ``rate``: the exact kernel's
    multiply-adds/s; ``rate32``: an fp32 GEMM's (FAISS's k-means, assignment and scans), default ``rate``;
    ``read``: seconds a pass spends reading the corpus (each of the build's add and the sample's pass)."""
    rate32 = rate32 or rate
    coarse = (2048 if shape.hnsw else shape.nlist) * d
    encode = {"fs": 16, "pq": 256, "sq": 1}[shape.kind] * d
    train = _NITER * shape.train_rows * shape.nlist * d + _NITER * min(shape.train_rows, 16384) * encode
    add = _ADD_OVERHEAD * nb * (coarse + encode) / rate32 + read
    build = 0.0 if built else train / rate32 + add
    sample = min(nq, recall_sample) * nb * d / rate + read
    nprobe = max(1, shape.nlist // _NPROBE_SHARE)
    scan = nprobe * nb / shape.nlist * shape.m * _SCAN[shape.kind]
    kk = k + max(4, k // 2)
    rescore = nq * kk * 4 * (4096 / _PAGE_READ if mapped else d * 4 / 1e10)
    search = nq * (coarse + scan) / rate32 + rescore
    return {"build": build, "recall_sample": sample, "search": search, "total": build + sample + search}


def plan(nq: int, shape: tuple[int, int], opts, *, mapped: bool = False, built: str | None = None,
         rate: float | None = None, read_rows: float | None = None) -> MinePlan:
    """Exact streaming pass or IVF index for ``nq`` queries over an (nb, d) corpus (``mapped``: read from disk
    on demand), from the cost model above at the exact kernel's measured rate and the measured rate of reading
    a mapped corpus (``rate``, ``read_rows``: given instead).
    ``built``: the factory of an index already built for this corpus (``mine --index``): its cost is its
    search alone, and it is used."""
    nb, d = shape
    budget = opts.budget_mb << 20
    block = max(1, opts.block_size)
    exact_how = "exact search (kernels.topk, the corpus streamed in tiles)"
    if built is None and nq * nb * d <= _FREE_MACS:
        return MinePlan(exact_how, f"auto: {nq:,} x {nb:,} x {d} multiply-adds take seconds")
    rate32 = rate or gemm_rate(d, "fp32")
    rate = rate or gemm_rate(d, opts.rank_precision)
    passes = math.ceil(nq / block)
    # a pass over a mapped corpus reads it from disk (overlapping the GEMM) and converts it (on the same cores)
    disk = nb * d * 2 / _SEQ_READ if mapped else 0.0
    read = max(disk, nb / (read_rows or read_rate(d))) if mapped else 0.0
    exact = sum(max(disk, read + min(block, nq - b * block) * nb * d / rate) for b in range(passes))
    sh = size_index(nb, d, budget)
    idx = _index_seconds(sh, nq, nb, d, opts.k, opts.recall_sample, rate, mapped, built is not None, rate32, read)
    at = f"at {rate:.2g} multiply-adds/s measured (fp32 GEMM {rate32:.2g})" + (
        f", reading {nb / read:,.0f} rows/s" if read else "")
    alts = []
    for scale, what in ((0.5, "smaller"), (2.0, "larger")):
        other = size_index(nb, d, budget, scale)
        if other.factory != sh.factory:
            o = _index_seconds(other, nq, nb, d, opts.k, opts.recall_sample, rate, mapped, False, rate32, read)
            alts.append(f"{what}: {other.words(nb)}, build ~{hms(o['build'])}, search ~{hms(o['search'])}")
    parts = (f"build ~{hms(idx['build'])}, " if not built else "") + (
        f"recall sample's exact pass ~{hms(idx['recall_sample'])}, search ~{hms(idx['search'])}")
    if built is not None:
        return MinePlan(describe_factory(built), f"auto: the index built before ({parts}; an exact pass "
                        f"~{hms(exact)}, {at})", built, exact, idx, ())
    if exact <= idx["total"]:
        return MinePlan(exact_how, f"auto: an exact pass ~{hms(exact)} costs less than an index ~{hms(idx['total'])} "
                                   f"({sh.words(nb)}: {parts}), {at}", None, exact, idx, tuple(alts))
    return MinePlan(describe_factory(sh.factory), f"auto: an index ~{hms(idx['total'])} ({sh.words(nb)}: {parts}) "
                                                  f"costs less than an exact pass ~{hms(exact)}, {at}",
                    sh.factory, exact, idx, tuple(alts))


class Auto(Backend):
    """Mining's default: the exact streaming pass or a FAISS IVF index, by the cost model (``plan``)."""

    name = "auto"
    ops = {TOPK: "an exact streaming pass or a FAISS IVF index, whichever the cost model says is cheaper for "
                 "these queries and this corpus (nprobe tuned to --recall-target)"}

    def mining_plan(self, spec, nq, shape, opts, *, mapped=False, built=None):
        return plan(nq, tuple(shape), opts, mapped=mapped, built=built)

    def searcher(self, spec, xb, opts, nq=None):
        # the plan the run printed (``mining_plan``: its queries, the corpus mapped or not), made again alike
        p = plan(nq if nq is not None else opts.block_size, tuple(xb.shape), opts, mapped=corpus_io.mapped(xb))
        return kernel_searcher(xb, opts, nq) if p.index is None else faiss_searcher(xb, p.index, opts)

    def describe(self, spec, shape, opts):
        return "exact search (kernels.topk) or a FAISS IVF index, by cost"
