"""Mining's corpus sharded over Ray actors: each holds a slice and its index; query blocks fan out, lists merge.

``hardrank mine --executor ray``: the corpus is cut into contiguous slices, one per actor. An actor
loads only its slice (from the embedding store, by content key) and builds the searcher of the backend
``--search`` names (``hardrank.scoring.backends``) within ``--budget-mb`` (exact tiles, else IVF-PQ with
exact re-scoring), as the local path does for the whole corpus. Each query block goes to every actor;
their top-kk lists merge under the global order (score descending, then corpus index ascending), and
the near-duplicate filter fetches the candidates' rows from their actors. With exact search the output
equals local mining byte for byte: a shard scores each (query, item) pair with the same bits
(``backends.exhaustive.KernelSearch``), and the merge of per-shard top-kk lists in the global order is
the top-kk of the union. Actors that die are restarted (they reload their slice) and their call is
retried; blocks are committed as Parquet shards, so a killed driver resumes.
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
import ray
import torch

from hardrank.config import MineOptions
from hardrank.executors.ray_embed import connect
from hardrank.scoring import backends
from hardrank.scoring.backends.sharded import merge_topk
from hardrank.vectors import UnitRows, f32

__all__ = ["ShardedSearch", "ShardedSearchFactory"]

log = logging.getLogger("hardrank.ray")


class _MemmapSlice:
    """Rows [lo, hi) of a memory-mapped (n, d) array on a shared disk, opened by the actor itself
    (so a slice of a corpus too large for the driver never passes through it)."""

    def __init__(self, xb: np.memmap, lo: int, hi: int):
        d = xb.shape[1]
        self.filename, self.dtype, self.shape = str(xb.filename), xb.dtype, (hi - lo, d)
        self.offset = int(xb.offset) + lo * d * xb.dtype.itemsize

    def __array__(self, dtype=None, copy=None):
        """The rows memory-mapped, not copied: the actor's resident memory then holds the pages its
        index build and re-scoring touch (reclaimable page cache), as the local path's does, not a heap
        copy of the whole slice."""
        if not self.shape[0]:
            return np.zeros(self.shape, dtype or self.dtype)
        rows = np.memmap(self.filename, self.dtype, "r", self.offset, self.shape)
        return rows if dtype is None or np.dtype(dtype) == self.dtype else np.array(rows, dtype=dtype)


def _slice(xb, lo: int, hi: int):
    """What an actor gets for its rows: a store view, a memmap reference, or (in memory) the rows."""
    if isinstance(xb, np.memmap) and xb.ndim == 2 and xb.flags.c_contiguous:
        return _MemmapSlice(xb, lo, hi)
    return xb[lo:hi]


class _Shard:
    """A Ray actor: one contiguous slice of the corpus and its searcher."""

    def __init__(self, rows, opts: MineOptions, threads: int):
        torch.set_num_threads(max(1, threads))
        # rows and queries arrive read-only (Ray's object store, memory maps); the kernels only read them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        # (n_s, d) store dtype; a float16 file's UnitRows stays float16 (normalised on read)
        self.xb = rows if isinstance(rows, UnitRows) else np.asarray(rows)
        self.search = backends.searcher(opts.search_spec, self.xb, opts) if len(self.xb) else None
        self.budget = opts.budget_mb << 20
        self._flat = None  # exact search for the recall sample of an approximate shard, built when asked

    def describe(self) -> dict:
        index = getattr(self.search, "index", None)
        return {"rows": len(self.xb), "exact": self.search is None or self.search.exact,
                "info": dict(self.search.info) if self.search is not None else {},
                "nlist": getattr(index, "nlist", None), "nprobe": getattr(index, "nprobe", None)}

    def top(self, xq: np.ndarray, kk: int, excl, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(D, I) (m, kk) of this slice, I local (-1 = none)."""
        if self.search is None:
            return np.full((len(xq), kk), -np.inf, np.float32), np.full((len(xq), kk), -1, np.int64)
        if not exact or self.search.exact:
            return self.search(xq, kk, excl)
        if self._flat is None:  # as the local path measures recall: the stored rows streamed in fp32 chunks
            from hardrank.scoring.faiss_index import FaissIndex  # (faiss: imported by that module alone)

            self._flat = FaissIndex(self.xb, "Flat", budget_bytes=self.budget // 4, gpu=False)
        return self._flat.search(xq, kk, exclude=excl)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (local) in the stored dtype: fp16 rows travel at half the bytes, and the driver's
        fp16 -> fp32 conversion is exact, so the filter sees the same values."""
        return np.ascontiguousarray(self.xb[idx])

    def set_nprobe(self, nprobe: int) -> None:
        if self.search is not None and getattr(self.search, "index", None) is not None:
            self.search.index.set_nprobe(nprobe)

    def peak_rss(self) -> int:
        """This actor's peak resident memory in bytes (Linux), to check it stays within the budget."""
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:")), 0)


class _Nprobe:
    """The shards' IVF lists as one index, for nprobe tuning (``measure_recall``)."""

    def __init__(self, owner: ShardedSearch, nlist: int | None, nprobe: int | None):
        self.owner, self.nlist, self.nprobe = owner, nlist, nprobe

    def set_nprobe(self, nprobe: int) -> None:
        ray.get([a.set_nprobe.remote(nprobe) for a in self.owner.actors])
        self.nprobe = nprobe


class ShardedSearch:
    """``mine_block``'s searcher over Ray actors holding ``len(bounds) - 1`` slices of the corpus ``xb``."""

    def __init__(self, xb, opts: MineOptions, shards: int):
        nb = len(xb)
        self.d = xb.shape[1]
        self.bounds = np.linspace(0, nb, shards + 1).astype(np.int64)  # contiguous slices (some empty if shards > nb)
        cpus = max(1.0, float(ray.cluster_resources().get("CPU", 1)))
        per = min(1.0, cpus / (len(self.bounds) - 1))  # all actors fit at once (one thread each)
        actor = ray.remote(max_restarts=-1, max_task_retries=-1)(_Shard)
        self.actors = [actor.options(num_cpus=per).remote(_slice(xb, lo, hi), opts, 1)
                       for lo, hi in zip(self.bounds[:-1], self.bounds[1:])]
        parts = ray.get([a.describe.remote() for a in self.actors])
        self.exact = all(p["exact"] for p in parts)
        lists = [p["nlist"] for p in parts if p["nlist"]]
        self.index = _Nprobe(self, max(lists) if lists else None, next((p["nprobe"] for p in parts if p["nprobe"]),
                                                                       None))
        first = next((p["info"] for p in parts if p["info"]), {})
        self.info = {**first, "sharded": {"shards": len(self.actors), "rows": [p["rows"] for p in parts]}}
        log.info("mining corpus of %d rows in %d shards %s", nb, len(self.actors), self.info["sharded"]["rows"])

    def _fan_out(self, xq: np.ndarray, kk: int, excl, exact: bool) -> tuple[np.ndarray, np.ndarray]:
        ref = ray.put(f32(xq))
        calls = []
        for s, (lo, hi) in enumerate(zip(self.bounds[:-1], self.bounds[1:])):
            calls.append(self.actors[s].top.remote(ref, kk, local_csr(excl, lo, hi), exact))
        parts = []
        for (lo, _), (D, I) in zip(zip(self.bounds[:-1], self.bounds[1:]), ray.get(calls)):
            parts.append((D, np.where(I >= 0, I + lo, -1)))
        return merge_topk(parts, kk)

    def __call__(self, xq: np.ndarray, kk: int, excl) -> tuple[np.ndarray, np.ndarray]:
        return self._fan_out(xq, kk, excl, exact=False)

    def exact_topk(self, xq: np.ndarray, k: int, excl=None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k of the whole corpus, ``excl`` (CSR) never returned: the reference of the recall checks."""
        return self._fan_out(xq, k, excl, exact=True)

    def gather(self, I: np.ndarray) -> np.ndarray:
        """(*I.shape, d) float32 rows of corpus indices ``I`` (-1 -> zeros), fetched from their shards."""
        flat = I.reshape(-1)
        out = np.zeros((len(flat), self.d), np.float32)
        owner = np.searchsorted(self.bounds, flat, side="right") - 1
        calls = {}
        for s in np.unique(owner[flat >= 0]):
            sel = np.nonzero((owner == s) & (flat >= 0))[0]
            calls[int(s)] = (sel, self.actors[s].rows.remote(flat[sel] - self.bounds[s]))
        for sel, ref in calls.values():
            out[sel] = ray.get(ref)  # (store dtype -> float32: exact)
        return out.reshape(*I.shape, self.d)

    def peak_rss(self) -> list[int]:
        """Each shard actor's peak resident memory, bytes."""
        return ray.get([a.peak_rss.remote() for a in self.actors])

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []


def local_csr(excl, lo: int, hi: int):
    """The exclusions (CSR over queries, corpus indices) that fall in [lo, hi), as local indices."""
    if excl is None:
        return None
    ptr, idx = excl
    keep = (idx >= lo) & (idx < hi)
    row = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    counts = np.bincount(row[keep], minlength=len(ptr) - 1)
    new_ptr = np.zeros(len(ptr), np.int64)
    np.cumsum(counts, out=new_ptr[1:])
    return new_ptr, idx[keep] - lo


class ShardedSearchFactory:
    """``factory(xb, opts)``: the sharded placement's searcher (``hardrank.scoring.backends.sharded``) over the
    corpus rows ``xb``: joins (or starts) the Ray cluster and shards the corpus over ``shards`` actors
    (default: one per CPU of the cluster; a local cluster has ``threads`` CPUs: ``ray_embed.connect``). ``close``
    ends the actors and the Ray session it started."""

    def __init__(self, shards: int | None = None, address: str | None = None, threads: int | None = None):
        self.shards, self.address, self.threads = shards, address, threads
        self._owned = False
        self._search: ShardedSearch | None = None

    def __call__(self, xb, opts: MineOptions) -> ShardedSearch:
        self._owned = connect(self.address, self.threads) or self._owned
        n = self.shards or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._search = ShardedSearch(xb, opts, n)
        return self._search

    def close(self) -> None:
        if self._search is not None:
            self._search.close()
            self._search = None
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False
