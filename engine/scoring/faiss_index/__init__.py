"""FAISS search backends (exact flat, IVF, IVF-PQ, HNSW) behind the engine's top-k and grouped-rank result types.

The only module importing faiss (faiss-cpu, or the GPU build of the ``gpu`` extra)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import faiss
import numpy as np
import torch

from hardrank.errors import DataError, UsageError
from hardrank.kernels import TIE_RULES
from hardrank.scoring import corpus_io

__all__ = ["FaissIndex", "FaissRanks", "faiss_topk", "faiss_grouped_ranks", "recall_at_k", "GPU_MAX_K"]

GPU_MAX_K = 2048        # faiss GPU search returns at most this many results per query
_PROBE_BYTES = 128      # faiss's search memory per (query, probed list), rounded up from ~90 measured (fast-scan PQ)
_IP = faiss.METRIC_INNER_PRODUCT


def _size_pool() -> None:
    """FAISS may link its own OpenMP runtime, which torch's thread setting does not reach (where both load one
    libgomp, as the PyPI wheels do, it is one setting): before FAISS builds or searches, its threads are set to
    torch's intra-op threads, i.e. the run's budget (``hardrank.cpus.apply`` at the run's start; in a Ray
    actor, the count its constructor set). OpenMP keeps the setting per calling thread, so it is set in the
    thread that searches."""
    n = torch.get_num_threads()
    if faiss.omp_get_max_threads() != n:
        faiss.omp_set_num_threads(n)


# -- small helpers --------------------------------------------------------------------------
def _as_matrix(name: str, x, d: int | None = None) -> np.ndarray:
    """Validate a 2-D float array; returns it unchanged (fp16 memmaps stay on disk, and so do lazy
    array-likes such as ``clip_retrieval.VectorRows``: shape, dtype, slicing and ``__array__``)."""
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().float().numpy()
    lazy = not isinstance(x, np.ndarray) and hasattr(x, "__array__") and hasattr(x, "shape") and hasattr(x, "dtype")
    if not (isinstance(x, np.ndarray) or lazy) or x.ndim != 2 or x.dtype.kind != "f":
        got = f"{type(x).__name__} of shape {getattr(x, 'shape', '?')} dtype {getattr(x, 'dtype', '?')}"
        raise ValueError(f"{name} must be a 2-D float array (n, d), got {got}")
    if d is not None and x.shape[1] != d:
        raise ValueError(f"{name} has dimension {x.shape[1]}, expected {d} (queries and corpus must come "
                         f"from the same model)")
    return x


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def _sort_rows(D: np.ndarray, I: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by score desc, then lower index; missing entries (I < 0) last as (-inf, -1)."""
    D = np.where(I < 0, -np.inf, D).astype(np.float32)
    I = np.where(I < 0, -1, I).astype(np.int64)
    key_i = np.where(I < 0, np.iinfo(np.int64).max, I)
    order = np.lexsort((key_i, -D.astype(np.float64)), axis=-1)
    D, I = np.take_along_axis(D, order, 1), np.take_along_axis(I, order, 1)
    if k is not None:
        D, I = _pad(D[:, :k], I[:, :k], k)
    return D, I


def _pad(D: np.ndarray, I: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if D.shape[1] >= k:
        return D, I
    n, extra = D.shape[0], k - D.shape[1]
    return (np.concatenate([D, np.full((n, extra), -np.inf, np.float32)], 1),
            np.concatenate([I, np.full((n, extra), -1, np.int64)], 1))


def _merge(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard top lists (global indices) into one top-k per row."""
    D = np.concatenate([p[0] for p in parts], 1)
    I = np.concatenate([p[1] for p in parts], 1)
    return _sort_rows(D, I, k)


def _csr(exclude, nq: int) -> tuple[np.ndarray, np.ndarray] | None:
    if exclude is None:
        return None
    try:
        ptr, idx = (np.asarray(a, dtype=np.int64) for a in exclude)
    except (TypeError, ValueError) as exc:
        raise ValueError("exclude must be a (ptr, idx) CSR pair of integer arrays") from exc
    if ptr.shape != (nq + 1,) or ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] != len(idx):
        raise ValueError(f"exclude ptr must have {nq + 1} non-decreasing entries from 0 to len(idx)={len(idx)}, "
                         f"got shape {ptr.shape}")
    return ptr, idx


def _drop_excluded(D, I, excl, nb: int, k: int):
    """Remove excluded (query, item) pairs from over-fetched lists and keep the first k per row."""
    if excl is None:
        return _pad(D[:, :k], I[:, :k], k)
    ptr, idx = excl
    rows = np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))
    codes = rows * nb + idx
    bad = np.isin(np.arange(len(I), dtype=np.int64)[:, None] * nb + I, codes) & (I >= 0)
    order = np.argsort(bad, axis=1, kind="stable")  # kept entries first, order preserved
    D = np.where(bad, -np.inf, D)
    I = np.where(bad, -1, I)
    D, I = np.take_along_axis(D, order, 1), np.take_along_axis(I, order, 1)
    return _pad(D[:, :k], I[:, :k], k)


def _rescore(xq: np.ndarray, xb: np.ndarray, I: np.ndarray, budget_bytes: int) -> np.ndarray:
    """Exact scores (nq, kk) of candidates ``I`` (-1 -> -inf): read in sorted order of row, in budget-sized
    batches (``corpus_io.rescore``)."""
    return corpus_io.rescore(xq, xb, I, budget_bytes)


def _gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _resolve_gpu(gpu) -> bool:
    if gpu == "auto":
        return _gpu_available()
    if gpu not in (True, False):
        raise UsageError(f"gpu must be 'auto', True or False, got {gpu!r}")
    if gpu and not _gpu_available():
        raise UsageError("gpu=True but this faiss build sees no GPU; install faiss-gpu (docs/search.md) or pass "
                         "gpu='auto'")
    return gpu


def _split_topk(search, xq: np.ndarray, lo: int, hi: int, k: int, max_k: int):
    """Exact top-k over rows [lo, hi) with a backend that returns at most ``max_k`` per call.

    ``search(xq, lo, hi, kk)`` returns the exact top-kk (D, I) of rows [lo, hi), I local to lo.
    How: cut the range into shards, take each shard's top-max_k, merge. A shard is *saturated* for a
    query when it returned max_k items whose last score is >= the merged k-th score: it may hold more
    of the top-k than it returned, so it is split again and searched for those queries only. A shard
    of <= max_k rows returns all its rows, so the recursion ends. Exact, as any top-k backend is, up
    to which of several items tied at the k-th score is returned."""
    n = hi - lo
    kk = min(k, n)
    if kk <= max_k:
        D, I = search(xq, lo, hi, kk)
        return _sort_rows(D, np.where(I >= 0, I + lo, -1), k)
    n_shards = min(math.ceil(n / max_k), 2 * math.ceil(k / max_k))
    bounds = np.linspace(lo, hi, n_shards + 1).astype(np.int64)
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        m = min(max_k, int(b - a))
        D, I = search(xq, int(a), int(b), m)
        parts.append(_sort_rows(D, np.where(I >= 0, I + a, -1)))
    D, I = _merge(parts, k)
    kth = D[:, k - 1]
    redo = False
    for si, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if b - a <= max_k:
            continue
        sat = np.nonzero(parts[si][0][:, -1] >= kth)[0]
        if len(sat) == 0:
            continue
        Dp, Ip = _pad(*parts[si], k)  # widen to k, then put the shard's exact top-k for those queries
        Dp[sat], Ip[sat] = _split_topk(search, xq[sat], int(a), int(b), k, max_k)
        parts[si] = (Dp, Ip)
        redo = True
    return _merge(parts, k) if redo else (D, I)


def _factory_nlist(factory: str) -> int | None:
    m = re.search(r"IVF(\d+)", factory)
    return int(m.group(1)) if m else None


# -- the index --------------------------------------------------------------------------------
class FaissIndex:
    """A FAISS inner-product index over a corpus ``xb (nb, d)``, built once and searched block by block.

    ``factory`` is a faiss index_factory string: ``Flat`` (exact; no copy of ``xb`` is kept beyond one
    streamed chunk, and ``faiss.knn_gpu`` is used when a GPU build sees a GPU), or an approximate
    index such as ``IVF1024,Flat``, ``IVF1024,SQ8``, ``IVF1024,PQ64``, ``HNSW32`` (built on the CPU).
    ``nprobe``: IVF lists visited per query (HNSW: efSearch); None = a default (nlist // 16, >= 1).
    ``train_sample``: rows used to train IVF/PQ (default max(50 x nlist, 10,000), at most nb), drawn with ``seed``.
    ``refine``: approximate indexes fetch refine x k candidates and re-score them exactly from ``xb``
    (so returned scores are exact and PQ/SQ code errors only affect which candidates are seen).
    ``xb`` may be an fp16 memmap: it is converted to float32 one chunk (``budget_bytes``) at a time.
    """

    def __init__(self, xb, factory: str = "Flat", *, nprobe: int | None = None, train_sample: int | None = None,
                 gpu="auto", budget_bytes: int = 256 << 20, seed: int = 0, refine: int = 1, _built=None):
        self.xb = _as_matrix("xb", xb)
        _size_pool()
        if refine < 1:
            raise UsageError(f"refine must be >= 1, got {refine}")
        self.refine = int(refine)
        self.nb, self.d = self.xb.shape
        self.factory = factory
        self.budget_bytes = int(budget_bytes)
        self.exact = factory.strip() == "Flat"
        self.gpu = _resolve_gpu(gpu) if self.exact else False
        self._res = faiss.StandardGpuResources() if self.gpu else None
        self.index = None
        self.nprobe = nprobe
        if nprobe is not None and nprobe < 1:
            raise UsageError(f"nprobe must be >= 1, got {nprobe}")
        if _built is not None:
            self._use(_built)
        elif not self.exact:
            self._build(train_sample, seed)

    @classmethod
    def loaded(cls, xb, index, factory: str, *, nprobe: int | None = None, budget_bytes: int = 256 << 20,
               refine: int = 1) -> FaissIndex:
        """A ``FaissIndex`` over ``xb`` searching ``index``, an index built before (``ondisk.open_index``)."""
        if index.ntotal != len(xb) or index.d != xb.shape[1]:
            raise DataError(f"the index holds {index.ntotal:,} rows of {index.d}-d, the corpus {len(xb):,} of "
                            f"{xb.shape[1]}-d: build an index of this corpus")
        return cls(xb, factory, nprobe=nprobe, gpu=False, budget_bytes=budget_bytes, refine=refine, _built=index)

    def set_refine(self, refine: int) -> None:
        """Candidates fetched per result before exact re-scoring (approximate indexes)."""
        self.refine = max(1, int(refine))
    @property
    def nlist(self) -> int | None:
        """IVF lists (None for non-IVF indexes)."""
        ivf = faiss.try_extract_index_ivf(self.index) if self.index is not None else None
        return None if ivf is None else int(ivf.nlist)

    @property
    def chunk_rows(self) -> int:
        return max(1024, self.budget_bytes // (4 * self.d))

    def _build(self, train_sample, seed) -> None:
        try:
            index = faiss.index_factory(self.d, self.factory, _IP)
        except RuntimeError as exc:
            raise UsageError(f"faiss cannot build index {self.factory!r}: {str(exc).splitlines()[0]}. "
                             f"Use a faiss index_factory string such as 'Flat', 'IVF1024,Flat', "
                             f"'IVF1024,PQ64', 'HNSW32'") from exc
        nlist = _factory_nlist(self.factory)
        if nlist is not None and nlist > self.nb:
            raise UsageError(f"index {self.factory!r} has {nlist} lists for a corpus of {self.nb} rows; "
                             f"use fewer lists (about 4*sqrt(nb)) or 'Flat'")
        if not index.is_trained:
            n = train_sample or max(50 * (nlist or 1), 10_000)  # PQ codebooks want >= 39 x 256 rows
            # the fp32 sample within a quarter of the budget (and FAISS's copies of it within another)
            n = min(int(n), self.nb, max(39 * (nlist or 1), (self.budget_bytes // 4) // (4 * self.d)))
            rows = np.sort(np.random.default_rng(seed).choice(self.nb, n, replace=False))
            ivf = faiss.try_extract_index_ivf(index)
            if ivf is not None:
                ivf.cp.niter = 10  # enough for search quality; 25 (faiss default) costs 2.5x
                ivf.cp.seed = seed
            sub = faiss.downcast_index(ivf) if ivf is not None else None
            if isinstance(sub, faiss.IndexIVFPQ):  # no polysemous ordering (unused), lighter codebooks
                sub.do_polysemous_training = False
                sub.pq.cp.niter, sub.pq.cp.max_points_per_centroid = 10, 64
            index.train(corpus_io.gather(self.xb, rows, self.budget_bytes // 4))
            corpus_io.release(self.xb)
        for s in range(0, self.nb, self.chunk_rows):
            index.add(corpus_io.read_tile(self.xb, s, min(self.nb, s + self.chunk_rows)))
            corpus_io.release(self.xb)
        self._use(index)

    def _use(self, index) -> None:
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            self.nprobe = min(self.nprobe or max(1, ivf.nlist // 16), ivf.nlist)
            ivf.nprobe = self.nprobe
        self.index = index

    def set_nprobe(self, nprobe: int) -> None:
        ivf = faiss.try_extract_index_ivf(self.index) if self.index is not None else None
        if ivf is not None:
            ivf.nprobe = self.nprobe = min(int(nprobe), ivf.nlist)
        else:
            self.nprobe = int(nprobe)

    def _exact(self, xq: np.ndarray, k: int):
        parts = []
        for s in range(0, self.nb, self.chunk_rows):
            chunk = corpus_io.read_tile(self.xb, s, min(self.nb, s + self.chunk_rows))
            corpus_io.release(self.xb)
            if self.gpu:
                search = lambda q, a, b, kk, c=chunk: faiss.knn_gpu(self._res, q, c[a:b], kk, metric=_IP)
                D, I = _split_topk(search, xq, 0, len(chunk), min(k, len(chunk)), GPU_MAX_K)
            else:
                D, I = faiss.knn(xq, chunk, min(k, len(chunk)), metric=_IP)
            parts.append(_sort_rows(D, np.where(I >= 0, I + s, -1)))
        return _merge(parts, k)

    def search(self, xq, k: int, *, exclude=None) -> tuple[np.ndarray, np.ndarray]:
        """(D (nq, k) float32, I (nq, k) int64): top-k by inner product, score desc then lower index,
        padded with -inf / -1. ``exclude``: CSR ``(ptr (nq+1,), idx)`` of corpus rows never returned
        for each query; handled by over-fetching k + (most exclusions of any query) and filtering."""
        xq = _f32(_as_matrix("xq", xq, self.d))
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise UsageError(f"k must be a positive integer, got {k!r}")
        _size_pool()
        excl = _csr(exclude, len(xq))
        kk = min(self.nb, k + (int(np.diff(excl[0]).max()) if excl is not None and len(xq) else 0))
        if len(xq) == 0 or self.nb == 0:
            return np.full((len(xq), k), -np.inf, np.float32), np.full((len(xq), k), -1, np.int64)
        if self.exact:
            D, I = self._exact(xq, kk)
        else:
            kr = min(self.nb, kk * self.refine)
            if hasattr(self.index, "hnsw"):
                self.index.hnsw.efSearch = max(self.nprobe or 64, kr)
            # faiss's working memory grows with queries x lists probed (fast-scan tables, heaps: ~90 bytes
            # each, measured): queries go in budget-sized groups (a block of 8,192 queries probing all 1,024
            # lists in one call added ~300 MB)
            step = max(1, self.budget_bytes // (_PROBE_BYTES * max(1, self.nprobe or 1) + 12 * kr))
            parts = [self.index.search(xq[s:s + step], kr) for s in range(0, len(xq), step)]
            D, I = (np.concatenate(p) for p in zip(*parts))
            if self.refine > 1:
                D = _rescore(xq, self.xb, I, self.budget_bytes)
            D, I = _sort_rows(D, I)
        return _drop_excluded(D, I, excl, self.nb, k)


def faiss_topk(xq, xb, k: int, *, factory: str = "Flat", exclude=None, gpu="auto", nprobe: int | None = None,
               train_sample: int | None = None, budget_bytes: int = 256 << 20) -> tuple[np.ndarray, np.ndarray]:
    """Top-k inner-product search of ``xq (nq, d)`` over ``xb (nb, d)`` with a FAISS index (see
    ``FaissIndex``); the contract of ``kernels.topk``: excluded rows never returned, score desc then
    lower index, padded with -inf / -1 when fewer than k rows qualify; one difference: of several rows
    tied at the k-th score, FAISS may return any (the kernels return the lowest indices)."""
    return FaissIndex(xb, factory, nprobe=nprobe, train_sample=train_sample, gpu=gpu,
                      budget_bytes=budget_bytes).search(xq, k, exclude=exclude)


def recall_at_k(approx_I, exact_I, k: int) -> float:
    """Mean over queries of |approx top-k ∩ exact top-k| / |exact top-k| (missing -1 entries ignored)."""
    a = np.asarray(approx_I)[:, :k]
    e = np.asarray(exact_I)[:, :k]
    if a.shape[0] != e.shape[0]:
        raise ValueError(f"approx_I has {a.shape[0]} rows, exact_I has {e.shape[0]}")
    if len(e) == 0:
        return float("nan")
    hit = ((a[:, :, None] == e[:, None, :]) & (e[:, None, :] >= 0)).any(1).sum(1)
    n = (e >= 0).sum(1)
    ok = n > 0
    return float(np.mean(hit[ok] / n[ok])) if ok.any() else float("nan")


# -- ranking tasks ---------------------------------------------------------------------------
@dataclass
class FaissRanks:
    """GroupedRanks-compatible numpy arrays from per-group top-k searches (what metrics consume).

    counts (nq, G): non-positives of the group that beat the best positive, capped at ``censored_at``
    (``censored`` marks capped entries: the true count is larger). pos_score / pos_index (nq,): best
    positive (exact). neg_score / neg_index (nq, G): best non-positive of each group (-inf / -1 if none).
    """

    counts: np.ndarray
    pos_score: np.ndarray
    pos_index: np.ndarray
    neg_score: np.ndarray
    neg_index: np.ndarray
    censored: np.ndarray
    censored_at: int
    info: dict = field(default_factory=dict)


def _beats(s, i, ps, pi, tie_rule):
    if tie_rule == "optimistic":
        return s > ps
    if tie_rule == "pessimistic":
        return s >= ps
    return (s > ps) | ((s == ps) & (i < pi))


def _best_positives(xq, xb, pos_ptr, pos_idx):
    nq = len(xq)
    ps = np.full(nq, -np.inf, np.float32)
    pi = np.full(nq, -1, np.int64)
    if len(pos_idx) == 0:
        return ps, pi
    rows = np.repeat(np.arange(nq), np.diff(pos_ptr))
    s = np.einsum("nd,nd->n", _f32(xq[rows]), _f32(xb[pos_idx]))
    order = np.lexsort((pos_idx, -s.astype(np.float64), rows))  # per query: best score, then lowest index
    first = np.ones(len(order), bool)
    first[1:] = rows[order][1:] != rows[order][:-1]
    sel = order[first]
    ps[rows[sel]] = s[sel]
    pi[rows[sel]] = pos_idx[sel]
    return ps, pi


def faiss_grouped_ranks(xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule: str = "index",
                        factory: str = "Flat", extra: int = 10, nprobe: int | None = None,
                        recall_sample: int = 1000, gpu="auto", budget_bytes: int = 256 << 20,
                        seed: int = 0) -> FaissRanks:
    """Per-query, per-group rank counts from one top-k search per group (one index per group).

    k = ``extra`` + the most positives of any query. Per group, the top-k candidates are re-scored
    exactly; the count of non-positives beating the best positive (``tie_rule``) is exact when the
    list reaches below the positive's score, and capped at k (``censored``) when all k beat it. With
    ``extra`` = 10 a capped view rank is > 10, so R@1/5/10 and false_rate are exact for ``Flat``;
    mean/median rank are lower bounds whenever anything is censored (``info["lower_bounds"]``).
    Approximate factories make every figure approximate; ``info`` carries their recall@10 against
    an exact search on ``recall_sample`` queries. Groups too small to train an IVF index are
    searched exactly."""
    if tie_rule not in TIE_RULES:
        raise UsageError(f"tie_rule must be one of {TIE_RULES}, got {tie_rule!r}")
    xq = _f32(_as_matrix("xq", xq))
    xb = _as_matrix("xb", xb, xq.shape[1])
    gb = np.asarray(group_bounds, np.int64)
    pos_ptr, pos_idx = np.asarray(pos_ptr, np.int64), np.asarray(pos_idx, np.int64)
    nq, nb, G = len(xq), len(xb), len(gb) - 1
    if G < 1 or gb[0] != 0 or gb[-1] != nb or np.any(np.diff(gb) < 0):
        raise ValueError(f"group_bounds {gb.tolist()[:8]} must rise from 0 to nb={nb}")
    if pos_ptr.shape != (nq + 1,):
        raise ValueError(f"pos_ptr must have nq+1={nq + 1} entries, got {pos_ptr.shape}")
    k = int(extra) + (int(np.diff(pos_ptr).max()) if nq else 0)
    ps, pi = _best_positives(xq, xb, pos_ptr, pos_idx)
    pos_rows = np.repeat(np.arange(nq, dtype=np.int64), np.diff(pos_ptr))
    pos_codes = np.unique(pos_rows * nb + pos_idx)
    counts = np.zeros((nq, G), np.int64)
    censored = np.zeros((nq, G), bool)
    neg_s = np.full((nq, G), -np.inf, np.float32)
    neg_i = np.full((nq, G), -1, np.int64)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(nq, min(nq, recall_sample), replace=False)) if nq else np.zeros(0, np.int64)
    info = {"search": f"faiss:{factory}", "k": k, "censored_at": k, "tie_rule": tie_rule,
            "lower_bounds": ["mean_rank", "median_rank"], "groups": {}}
    rows_per_step = max(1, budget_bytes // max(1, 4 * k * xq.shape[1]))
    for g in range(G):
        lo, hi = int(gb[g]), int(gb[g + 1])
        n_g = hi - lo
        if n_g == 0 or nq == 0:
            info["groups"][g] = {"rows": n_g, "index": "empty"}
            continue
        fac = factory
        nlist = _factory_nlist(factory)
        if fac != "Flat" and nlist is not None and n_g < 39 * nlist:
            fac = "Flat"
        index = FaissIndex(xb[lo:hi], fac, nprobe=nprobe, gpu=gpu, budget_bytes=budget_bytes, seed=seed)
        kg = min(k, n_g)
        _, I = index.search(xq, kg)
        ginfo = {"rows": n_g, "index": fac, "nprobe": index.nprobe}
        for s in range(0, nq, rows_per_step):
            q = np.arange(s, min(nq, s + rows_per_step))
            Ib = I[q]
            valid = Ib >= 0
            gI = np.where(valid, Ib + lo, -1)
            # exact re-scoring of the candidates: consistent with the positive's score, PQ errors gone
            S = np.einsum("nd,nkd->nk", xq[q], _f32(xb[np.where(valid, gI, 0)].reshape(len(q), kg, -1)))
            S = np.where(valid, S, -np.inf).astype(np.float32)
            S, gI = _sort_rows(S, gI)
            valid = gI >= 0
            is_pos = np.isin(q[:, None] * nb + gI, pos_codes) & valid
            beat = _beats(S, gI, ps[q, None], pi[q, None], tie_rule) & valid & ~is_pos
            c = beat.sum(1)
            full = valid.all(1) & (kg < n_g)
            last = S[:, -1]
            cen = full & (last > ps[q])
            tie = full & (last == ps[q])
            c = np.where(cen, k, c)
            for j in np.nonzero(tie)[0]:  # the k-th score equals the positive's: count exactly
                qq = q[j]
                sc = _f32(xb[lo:hi]) @ xq[qq]
                gi = np.arange(lo, hi)
                ok = ~np.isin(qq * nb + gi, pos_codes)
                exact = int((_beats(sc, gi, ps[qq], pi[qq], tie_rule) & ok).sum())
                c[j] = min(exact, k)
                cen[j] = exact > k
            counts[q, g] = c
            censored[q, g] = cen
            first = np.argmax(valid & ~is_pos, 1)
            has = (valid & ~is_pos).any(1)
            neg_s[q, g] = np.where(has, S[np.arange(len(q)), first], -np.inf)
            neg_i[q, g] = np.where(has, gI[np.arange(len(q)), first], -1)
        ginfo["censored_fraction"] = float(censored[:, g].mean())
        if not index.exact and len(sample):
            _, Ia = index.search(xq[sample], 10)
            _, Ie = FaissIndex(xb[lo:hi], "Flat", gpu=gpu, budget_bytes=budget_bytes).search(xq[sample], 10)
            ginfo["recall@10"] = recall_at_k(Ia, Ie, 10)
            ginfo["recall_sample"] = int(len(sample))
        info["groups"][g] = ginfo
    return FaissRanks(counts=counts, pos_score=ps, pos_index=pi, neg_score=neg_s, neg_index=neg_i,
                      censored=censored, censored_at=k, info=info)
