"""Hard-negative mining: per query, the top-k corpus items that score highest without being positives."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .store import write_json_atomic

__all__ = ["MineOptions", "MineConfig", "MineProblem", "mine", "mine_arrays", "negatives_schema", "DIRECTIONS"]

log = logging.getLogger("hardrank.mine")

DIRECTIONS = {"t2i": ("text", "image"), "i2t": ("image", "text"), "t2t": ("text", "text"), "i2i": ("image", "image")}
RUN_VERSION = 1
_TARGET_RECALL = 0.95  # nprobe auto-tuning stops once recall@10 on the sample reaches this
_HIST_BINS = 40        # score histogram: 40 bins over [-1, 1]


@dataclass(frozen=True)
class MineOptions:
    k: int = 10                           # negatives per query
    dup_threshold: float | None = 0.95    # drop candidates whose similarity to any positive exceeds this; None = off
    max_sim: float | None = None          # drop candidates scoring above this with the query (likely false negatives)
    min_sim: float | None = None          # drop candidates scoring below this with the query
    search: str = "auto"                  # auto | exact | faiss:<index factory>, e.g. faiss:IVF4096,SQ8
    budget_mb: int = 1024                 # auto: exact while the fp32 corpus fits; also bounds work buffers
    block_size: int = 8192                # queries per output shard (the unit of resumption)
    nprobe: int | None = None             # IVF lists (HNSW efSearch) per query; None = tuned on the sample
    recall_sample: int = 1000             # queries to measure approximate recall@10 against exact search
    seed: int = 0                         # sampling seed (recall sample, IVF training)

    def __post_init__(self):
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be a positive integer, got {self.k!r}")
        for name in ("dup_threshold", "max_sim", "min_sim"):
            v = getattr(self, name)
            if v is not None and not -1.0 <= float(v) <= 1.0:
                raise ValueError(f"{name} is a cosine similarity in [-1, 1], got {v!r}")
        if self.min_sim is not None and self.max_sim is not None and self.min_sim >= self.max_sim:
            raise ValueError(f"min_sim ({self.min_sim}) must be below max_sim ({self.max_sim})")
        if not (self.search in ("auto", "exact") or (self.search.startswith("faiss:") and len(self.search) > 6)):
            raise ValueError(f"search must be 'auto', 'exact' or 'faiss:<factory>' (e.g. faiss:IVF1024,SQ8), "
                             f"got {self.search!r}")
        if self.block_size < 1 or self.budget_mb < 1 or self.recall_sample < 0:
            raise ValueError(f"block_size and budget_mb must be >= 1 and recall_sample >= 0, got "
                             f"{self.block_size}, {self.budget_mb}, {self.recall_sample}")
        if self.nprobe is not None and self.nprobe < 1:
            raise ValueError(f"nprobe must be >= 1, got {self.nprobe}")


@dataclass(frozen=True)
class MineConfig:
    corpus: str                           # Karpathy .json | image folder | .parquet listing | store fingerprint folder
    queries: str                          # same kinds
    out: str                              # output folder (shards, summary.json, mine_run.json)
    direction: str = "t2i"                # t2i | i2t | t2t | i2i (query modality 2 corpus modality)
    model: str | None = None              # open_clip name / config .json / local-dir: (needed unless both are stores)
    checkpoint: str | None = None         # weights file for --model
    store: str | None = None              # embedding store root; embeddings are reused across runs
    images: str | None = None             # root of relative image paths (Karpathy files, Parquet listings)
    options: MineOptions = MineOptions()
    export_training: str | None = None    # optional JSONL of {"query", "positives", "negatives"}
    precision: str = "auto"               # auto | fp32 | fp16 | bf16
    device: str = "auto"                  # auto | cpu | cuda[:i]
    batch_size: int = 256                 # encoder batch
    decode_threads: int = 2               # Pillow decode threads
    max_failures: int | None = 100        # unreadable images tolerated (skipped, counted)

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {sorted(DIRECTIONS)}, got {self.direction!r}")


@dataclass
class MineProblem:
    """Embeddings and exclusions of one mining run (rows are positions in ``xq`` / ``xb``).

    exclude_*: CSR over queries of corpus rows never returned (the query's positives found in the
    corpus: same content key or same Karpathy group). pos_*: CSR of the positives' embeddings in the
    corpus modality, for the near-duplicate filter (positives need not be in the corpus)."""

    xq: np.ndarray                        # (nq, d) float, L2-normalised
    xb: np.ndarray                        # (nb, d) float (an fp16 memmap is fine: read in chunks)
    query_ids: list[str]                  # (nq,) unique
    corpus_ids: list[str]                 # (nb,)
    modality: str = "image"               # modality of the corpus (the negatives)
    direction: str = "t2i"
    exclude_ptr: np.ndarray | None = None  # (nq+1,) int64
    exclude_idx: np.ndarray | None = None  # corpus rows
    pos_ptr: np.ndarray | None = None      # (nq+1,) int64
    pos_emb: np.ndarray | None = None      # (npos, d) float
    pos_ids: list[list[str]] | None = None  # positives' ids per query, for --export-training
    meta: dict = field(default_factory=dict)  # sources, counts: copied into the summary

    def validate(self) -> None:
        nq, nb = len(self.xq), len(self.xb)
        for name, x in (("xq", self.xq), ("xb", self.xb)):
            if getattr(x, "ndim", 0) != 2 or x.dtype.kind != "f":
                raise ValueError(f"{name} must be a 2-D float array, got {getattr(x, 'shape', type(x))}")
        if self.xq.shape[1] != self.xb.shape[1]:
            raise ValueError(f"queries have dimension {self.xq.shape[1]}, the corpus {self.xb.shape[1]}: "
                             f"embed both with the same model")
        if len(self.query_ids) != nq or len(self.corpus_ids) != nb:
            raise ValueError(f"{len(self.query_ids)} query ids for {nq} queries / {len(self.corpus_ids)} corpus ids "
                             f"for {nb} rows")
        if len(set(self.query_ids)) != nq:
            raise ValueError("query ids must be unique (merge duplicate queries and their positives first)")
        for a, b, what in ((self.exclude_ptr, self.exclude_idx, "exclude"), (self.pos_ptr, self.pos_emb, "pos")):
            if (a is None) != (b is None):
                raise ValueError(f"{what}_ptr and its values must be given together")
            if a is not None and (len(a) != nq + 1 or a[0] != 0 or a[-1] != len(b) or np.any(np.diff(a) < 0)):
                raise ValueError(f"{what}_ptr must be a CSR pointer of {nq + 1} entries ending at {len(b)}")
        if self.exclude_idx is not None and len(self.exclude_idx) and (
                self.exclude_idx.min() < 0 or self.exclude_idx.max() >= nb):
            raise ValueError(f"exclude_idx holds rows outside the corpus [0, {nb})")


def negatives_schema() -> pa.Schema:
    """One row per (query, negative): the Parquet shards' schema (a public contract)."""
    return pa.schema([("query_id", pa.string()), ("rank", pa.int32()), ("negative_id", pa.string()),
                      ("score", pa.float32()), ("modality", pa.string())])


# -- CSR helpers ------------------------------------------------------------------------------
def _csr_take(ptr, vals, rows):
    """Rows ``rows`` of a CSR (ptr, vals) as a new CSR."""
    if ptr is None:
        return None
    lens = (ptr[1:] - ptr[:-1])[rows]
    new_ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    src = np.repeat(ptr[:-1][rows] - new_ptr[:-1], lens) + np.arange(new_ptr[-1])
    return new_ptr, vals[src]


def _f32(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def _gather(xb, I) -> np.ndarray:
    """(m, kk, d) float32 rows of ``xb`` for candidate indices ``I`` (-1 -> row 0, masked by callers)."""
    return xb[np.where(I >= 0, I, 0)].astype(np.float32, copy=False)


# -- searchers: (xq (m, d) f32, kk, exclude CSR) -> exact-scored (D, I) sorted desc, padded ----------
class _KernelSearch:
    """Exact streaming top-k with ``kernels.topk`` over the corpus held in memory as fp32."""

    exact = True

    def __init__(self, xb, budget_bytes: int):
        import torch

        from hardrank import kernels

        self._topk = getattr(kernels, "topk", None)
        if self._topk is None:
            raise RuntimeError("kernels.topk is not available in this installation; pass "
                               "--search faiss:Flat for exact search with FAISS")
        self._torch = torch
        self.xb = torch.from_numpy(_f32(xb))
        self.budget = budget_bytes
        self.info = {"method": "exact", "backend": "kernels.topk"}

    def __call__(self, xq, kk, excl):
        t = self._torch
        kw = {}
        if excl is not None:
            kw = {"exclude_ptr": t.from_numpy(excl[0]), "exclude_idx": t.from_numpy(excl[1])}
        D, I = self._topk(t.from_numpy(xq), self.xb, kk, budget_bytes=self.budget, **kw)
        return D.float().numpy(), I.numpy().astype(np.int64)


class _FaissSearch:
    """A FAISS index; approximate ones over-fetch candidates (``_refine``) and re-score them exactly from ``xb``."""

    def __init__(self, xb, factory: str, opts: MineOptions, budget_bytes: int):
        from .faiss_search import FaissIndex

        refine = _refine(factory, xb.shape[1])
        self.index = FaissIndex(xb, factory, nprobe=opts.nprobe, budget_bytes=budget_bytes // 4, seed=opts.seed,
                                refine=refine)
        self.exact = self.index.exact
        self.info = {"method": "faiss", "factory": factory, "gpu": self.index.gpu, "refine": refine}

    def __call__(self, xq, kk, excl):
        return self.index.search(xq, kk, exclude=excl)


def _auto_factory(nb: int, d: int, budget_bytes: int) -> str:
    """IVF with about 2*sqrt(nb) lists (a power of two, >= 39 training rows each) and 4-bit fast-scan
    PQ codes of 2 dims per sub-quantiser (d/4 bytes a row; 4 or 8 dims when that exceeds the budget).
    Candidates are re-scored exactly, so recall is set by nprobe, not by the codes, and fast-scan
    scans lists several times faster than SQ8 on AVX2 (benchmarks/README.md)."""
    nlist = 2 ** max(4, round(math.log2(2 * math.sqrt(max(nb, 1)))))
    while nlist > 16 and nb < 39 * nlist:
        nlist //= 2
    if d % 2:
        return f"IVF{nlist},SQ8"
    for dims in (2, 4, 8):
        if d % dims == 0 and nb * (d // dims) // 2 <= budget_bytes:
            break
    return f"IVF{nlist},PQ{d // dims}x4fs"


def _refine(factory: str, d: int) -> int:
    """Candidates fetched per result before exact re-scoring: 2 for SQ/flat codes, 4 for PQ with
    <= 2 dims per sub-quantiser, 8 for coarser PQ."""
    m = re.search(r"PQ(\d+)", factory)
    if m is None:
        return 2
    return 4 if 2 * int(m.group(1)) >= d else 8


def _choose(problem: MineProblem, opts: MineOptions) -> tuple[str, str | None]:
    nb, d = problem.xb.shape
    budget = opts.budget_mb << 20
    if opts.search == "exact":
        return "exact", None
    if opts.search.startswith("faiss:"):
        return "faiss", opts.search[len("faiss:"):]
    if nb * d * 4 <= budget:
        return "exact", None
    return "faiss", _auto_factory(nb, d, budget)


def _build_searcher(problem: MineProblem, opts: MineOptions):
    method, factory = _choose(problem, opts)
    budget = opts.budget_mb << 20
    if method == "exact":
        return _KernelSearch(problem.xb, budget // 4)  # corpus (<= budget) + score tiles
    return _FaissSearch(problem.xb, factory, opts, budget)


def _measure_recall(search, problem: MineProblem, opts: MineOptions) -> dict:
    """recall@10 of the approximate path (no exclusions) against exact FAISS search on a sample;
    with ``nprobe`` unset, nprobe is doubled from nlist/512 until the recall reaches _TARGET_RECALL."""
    from .faiss_search import FaissIndex, recall_at_k

    nq = len(problem.xq)
    n = min(nq, opts.recall_sample)
    if n == 0 or search.exact:
        return {"recall@10": 1.0 if search.exact else None, "recall_sample": n}
    rows = np.sort(np.random.default_rng(opts.seed).choice(nq, n, replace=False))
    xs = _f32(problem.xq[rows])
    t0 = time.perf_counter()
    _, Ie = FaissIndex(problem.xb, "Flat", budget_bytes=(opts.budget_mb << 20) // 4).search(xs, 10)
    out = {"recall_sample": n, "exact_seconds": round(time.perf_counter() - t0, 3)}
    index = search.index
    tune = opts.nprobe is None and index.nlist is not None
    top = index.nlist or 0
    if tune:
        index.set_nprobe(max(1, top // 512))
    tried = []
    while True:
        _, Ia = search(xs, 10, None)
        r = recall_at_k(Ia, Ie, 10)
        tried.append({"nprobe": index.nprobe, "recall@10": round(r, 4)})
        if not tune or r >= _TARGET_RECALL or index.nprobe >= top:
            break
        index.set_nprobe(min(top, index.nprobe * 2))
    out.update({"recall@10": r, "nprobe": index.nprobe, "tuning": tried})
    return out


# -- one block --------------------------------------------------------------------------------
def _filter(D, I, xq, xb, pos, opts: MineOptions, budget_bytes: int):
    """Reason codes per candidate: 0 keep, 1 near-duplicate of a positive, 2 above max_sim,
    3 below min_sim, -1 missing."""
    reason = np.where(I >= 0, 0, -1).astype(np.int8)
    if opts.min_sim is not None:
        reason[(reason == 0) & (D < opts.min_sim)] = 3
    if opts.max_sim is not None:
        reason[(reason == 0) & (D > opts.max_sim)] = 2
    if opts.dup_threshold is not None and pos is not None and len(pos[1]):
        ptr, emb = pos
        m, kk = I.shape
        d = xb.shape[1]
        step = max(1, budget_bytes // max(1, kk * d * 8))
        for s in range(0, m, step):
            r = np.arange(s, min(m, s + step))
            lens = ptr[r + 1] - ptr[r]
            if not lens.any():
                continue
            P = np.zeros((len(r), int(lens.max()), d), np.float32)  # (m, maxp, d) padded positives
            sub_ptr, sub_emb = _csr_take(ptr, emb, r)
            slot = np.arange(sub_ptr[-1]) - np.repeat(sub_ptr[:-1], lens)
            P[np.repeat(np.arange(len(r)), lens), slot] = _f32(sub_emb)
            sims = np.einsum("mkd,mpd->mkp", _gather(xb, I[r]), P)
            sims = np.where(np.arange(P.shape[1])[None, None, :] < lens[:, None, None], sims, -np.inf)
            near = sims.max(2) > opts.dup_threshold
            sub = reason[r]
            sub[(sub == 0) & near] = 1
            reason[r] = sub
    return reason


def _mine_block(search, problem: MineProblem, rows: np.ndarray, opts: MineOptions, stats: Counter):
    """(S (n, k) float32, I (n, k) int64) negatives of queries ``rows``, padded with -inf / -1."""
    n, k, nb = len(rows), opts.k, len(problem.xb)
    budget = opts.budget_mb << 20
    xq = _f32(problem.xq[rows])
    excl = _csr_take(problem.exclude_ptr, problem.exclude_idx, rows)
    pos = _csr_take(problem.pos_ptr, problem.pos_emb, rows)
    out_S = np.full((n, k), -np.inf, np.float32)
    out_I = np.full((n, k), -1, np.int64)
    todo = np.arange(n)
    kk = min(nb, k + max(4, k // 2))  # headroom for filtered candidates; grows x4 for queries left short
    cap = min(nb, max(1024, 100 * k))  # past this many candidates a query stays short (counted)
    while len(todo) and nb:
        D, I = search(xq[todo], kk, _csr_take(*excl, todo) if excl else None)
        reason = _filter(D, I, xq[todo], problem.xb, _csr_take(*pos, todo) if pos else None, opts, budget // 4)
        keep = reason == 0
        kept = np.cumsum(keep, 1)
        exhausted = (I[:, -1] < 0) | (kk >= cap)
        if opts.min_sim is not None:
            exhausted |= D[:, -1] < opts.min_sim  # sorted: nothing further can pass
        done = (kept[:, -1] >= k) | exhausted
        for j in np.nonzero(done)[0]:
            sel = np.nonzero(keep[j])[0][:k]
            q = todo[j]
            out_S[q, :len(sel)], out_I[q, :len(sel)] = D[j, sel], I[j, sel]
            cut = sel[-1] + 1 if len(sel) == k else kk  # reasons counted among candidates above the cut
            for code, name in ((1, "near_duplicate"), (2, "above_max_sim"), (3, "below_min_sim")):
                stats[name] += int((reason[j, :cut] == code).sum())
            stats["short"] += int(len(sel) < k)
        todo = todo[~done]
        kk = min(cap, kk * 4)
    return out_S, out_I


# -- outputs ----------------------------------------------------------------------------------
def _digest(strings) -> str:
    return hashlib.blake2b("\0".join(strings).encode("utf-8"), digest_size=12).hexdigest()


def _write_parquet_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _shard_path(out: Path, block: int) -> Path:
    return out / "negatives" / f"part-{block:06d}.parquet"


def _check_run(out: Path, problem: MineProblem, opts: MineOptions) -> dict:
    """The run record: a rerun resumes only with the same inputs and options."""
    record = {"run_version": RUN_VERSION, "direction": problem.direction, "modality": problem.modality,
              "queries": len(problem.xq), "corpus": len(problem.xb), "dim": int(problem.xq.shape[1]),
              "query_ids": _digest(problem.query_ids), "corpus_ids": _digest(problem.corpus_ids),
              "options": {k: v for k, v in asdict(opts).items() if k not in ("recall_sample",)}}
    path = out / "mine_run.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != json.loads(json.dumps(record)):
            diff = sorted(k for k in set(old) | set(record) if old.get(k) != json.loads(json.dumps(record)).get(k))
            raise ValueError(f"{out} holds a mining run with different inputs or options (differs in {diff}); "
                             f"use another --out, or delete {out} to start over")
    else:
        write_json_atomic(path, record)
    return record


def _export_training(path: Path, out: Path, problem: MineProblem, n_blocks: int, B: int) -> int:
    """One JSON line per query: {"query", "positives", "negatives"} (ids), in query order."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for b in range(n_blocks):
            t = pq.read_table(_shard_path(out, b), columns=["query_id", "negative_id"])
            negs: dict[str, list[str]] = {}
            for q, neg in zip(t.column("query_id").to_pylist(), t.column("negative_id").to_pylist()):
                negs.setdefault(q, []).append(neg)
            for r in range(b * B, min(len(problem.query_ids), (b + 1) * B)):
                qid = problem.query_ids[r]
                pos = problem.pos_ids[r] if problem.pos_ids is not None else []
                f.write(json.dumps({"query": qid, "positives": list(pos), "negatives": negs.get(qid, [])},
                                   ensure_ascii=False) + "\n")
                n += 1
    os.replace(tmp, path)
    return n


def mine_arrays(problem: MineProblem, opts: MineOptions, out: str | os.PathLike, *,
                export_training: str | os.PathLike | None = None, echo=None) -> dict:
    """Mine ``opts.k`` negatives per query into ``out/negatives/part-*.parquet`` (one shard per
    block of ``opts.block_size`` queries, written atomically; existing shards are skipped, so a
    killed run resumes), then write ``out/summary.json`` and return it.

    Search: ``exact`` = kernels.topk over the fp32 corpus in memory; ``faiss:<factory>`` = a FAISS
    index (approximate ones over-fetch 2-8x candidates and re-score them exactly); ``auto`` = exact
    while the fp32 corpus fits ``budget_mb``, else IVF with fast-scan PQ codes (``_auto_factory``)."""
    echo = echo or (lambda s: None)
    problem.validate()
    t_start = time.perf_counter()
    out = Path(out)
    (out / "negatives").mkdir(parents=True, exist_ok=True)
    record = _check_run(out, problem, opts)
    nq, B = len(problem.xq), opts.block_size
    n_blocks = math.ceil(nq / B)
    todo = [b for b in range(n_blocks) if not _shard_path(out, b).exists()]
    timings: dict[str, float] = {}
    prev = out / "summary.json"
    search_info = json.loads(prev.read_text()).get("search", {}) if prev.exists() and not todo else {}
    ids_q = pa.array(problem.query_ids, pa.string())
    ids_b = pa.array(problem.corpus_ids, pa.string())
    if todo:
        t0 = time.perf_counter()
        search = _build_searcher(problem, opts)
        timings["index"] = time.perf_counter() - t0
        search_info = dict(search.info)
        if hasattr(search, "index") and search.index.nprobe is not None:
            search_info["nprobe"] = search.index.nprobe
        if opts.recall_sample and not search.exact:
            t0 = time.perf_counter()
            search_info.update(_measure_recall(search, problem, opts))
            timings["recall"] = time.perf_counter() - t0
            echo(f"approximate search {search_info.get('factory')}: recall@10 {search_info['recall@10']:.3f} "
                 f"at nprobe {search_info.get('nprobe')} on {search_info['recall_sample']} queries")
        t0 = time.perf_counter()
        for i, b in enumerate(todo):
            rows = np.arange(b * B, min(nq, (b + 1) * B))
            st: Counter = Counter()
            S, I = _mine_block(search, problem, rows, opts, st)
            valid = I >= 0
            qrow = np.repeat(rows, valid.sum(1))
            table = pa.Table.from_arrays([
                ids_q.take(pa.array(qrow)), pa.array(np.nonzero(valid)[1].astype(np.int32)),
                ids_b.take(pa.array(I[valid])), pa.array(S[valid], pa.float32()),
                pa.array([problem.modality] * int(valid.sum()), pa.string())], schema=negatives_schema())
            table = table.replace_schema_metadata({"hardrank_block": json.dumps({"block": b, "queries": len(rows), **st})})
            _write_parquet_atomic(table, _shard_path(out, b))
            echo(f"block {b + 1}/{n_blocks}: {len(rows)} queries ({i + 1}/{len(todo)} this run, "
                 f"{time.perf_counter() - t0:.1f}s)")
        timings["search"] = time.perf_counter() - t0
    # summary over every shard, also those written by earlier runs
    stats: Counter = Counter()
    scores = []
    for b in range(n_blocks):
        f = pq.ParquetFile(_shard_path(out, b))
        meta = json.loads((f.schema_arrow.metadata or {}).get(b"hardrank_block", b"{}"))
        stats.update({k: v for k, v in meta.items() if k not in ("block", "queries")})
        scores.append(f.read(columns=["score"]).column("score").to_numpy())
    scores = np.concatenate(scores) if scores else np.zeros(0, np.float32)
    hist, edges = np.histogram(scores, bins=_HIST_BINS, range=(-1.0, 1.0))
    files = {"negatives": str(out / "negatives"), "summary": str(out / "summary.json")}
    if export_training:
        t0 = time.perf_counter()
        _export_training(Path(export_training), out, problem, n_blocks, B)
        timings["export"] = time.perf_counter() - t0
        files["training"] = str(export_training)
    timings["total"] = time.perf_counter() - t_start
    searched = sum(min(nq, (b + 1) * B) - b * B for b in todo)
    summary = {
        "direction": problem.direction, "modality": problem.modality, "k": opts.k, "options": asdict(opts),
        "inputs": problem.meta, "search": search_info, "run": record,
        "counts": {"queries": nq, "corpus": len(problem.xb), "negatives": int(len(scores)),
                   "queries_short": int(stats.get("short", 0)),
                   "excluded_positive_pairs": int(len(problem.exclude_idx)) if problem.exclude_idx is not None else 0,
                   "dropped": {k: int(stats.get(k, 0)) for k in ("near_duplicate", "above_max_sim", "below_min_sim")}},
        "score_histogram": {"edges": [round(float(e), 4) for e in edges], "counts": hist.tolist()},
        "scores": {"mean": float(scores.mean()) if len(scores) else None,
                   "min": float(scores.min()) if len(scores) else None,
                   "max": float(scores.max()) if len(scores) else None},
        "blocks": {"total": n_blocks, "computed": len(todo), "skipped": n_blocks - len(todo), "size": B},
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "throughput": {"queries_per_s": round(searched / timings["search"], 2) if todo and timings["search"] > 0 else None},
        "files": files,
    }
    write_json_atomic(out / "summary.json", summary)
    return summary


def mine(cfg: MineConfig, *, progress=None, echo=None) -> dict:
    """Load the corpus and queries, embed what the store lacks (or read a store folder), mine, write."""
    from .mine_sources import build_problem

    echo = echo or (lambda s: None)
    t0 = time.perf_counter()
    problem = build_problem(cfg, progress=progress, echo=echo)
    t_inputs = time.perf_counter() - t0
    echo(f"{len(problem.query_ids)} {DIRECTIONS[cfg.direction][0]} queries, {len(problem.corpus_ids)} "
         f"{problem.modality} corpus items ({t_inputs:.1f}s)")
    problem.meta.setdefault("timings", {})["inputs"] = round(t_inputs, 3)
    return mine_arrays(problem, cfg.options, cfg.out, export_training=cfg.export_training, echo=echo)
