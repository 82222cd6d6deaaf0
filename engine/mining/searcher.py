"""Corpus search for mining: the searcher of the chosen backend (``hardrank.scoring.backends``), list merging, recall.

Searchers map (xq (m, d) float32, kk, exclude CSR) to exact-scored (D, I) sorted descending, padded."""
from __future__ import annotations

import hashlib
import json
import time
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from hardrank.atomic import atomic_path
from hardrank.config import MineOptions
from hardrank.mining.block import mine_block
from hardrank.mining.catalog import take
from hardrank.mining.problem import MineProblem, csr_take
from hardrank.scoring import backends
from hardrank.scoring.backends import Backend
from hardrank.scoring.backends.exhaustive import KernelSearch
from hardrank.scoring.backends.faiss import MAX_REFINE
from hardrank.scoring.backends.sharded import merge_topk
from hardrank.vectors import f32

__all__ = ["build_searcher", "searcher_for", "measure_recall", "written_recall", "ExactReference",
           "SampleReference", "TuningMemo"]


def build_searcher(problem: MineProblem, opts: MineOptions, backend: Backend | None = None, nq: int | None = None):
    """``searcher_for`` the problem's corpus; ``nq``: the queries this run searches (default: all of them)."""
    return searcher_for(problem.xb, opts, len(problem.xq) if nq is None else nq, backend=backend)


def searcher_for(xb, opts: MineOptions, nq: int | None = None, *, backend: Backend | None = None):
    """The searcher of the backend ``opts.search`` names (``hardrank.scoring.backends``) over the corpus rows
    ``xb`` (n, d) (also one shard of a sharded corpus); ``backend``: that backend as placed for this run
    (``backends.sharded.for_mining``). ``nq``: the queries it will see (when known), for the exact
    kernel's precision record."""
    return backends.searcher(opts.search_spec, xb, opts, nq, backend=backend)


def _sample(nq: int, n: int, seed: int) -> np.ndarray:
    """The recall sample: ``n`` of ``nq`` query rows, sorted, drawn by ``numpy.random.default_rng(seed)``."""
    return np.sort(np.random.default_rng(seed).choice(nq, n, replace=False))


def _block_top(S: np.ndarray, pos: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """(D, I) of one block's scores ``S`` (m, b) (-inf: excluded) over corpus rows ``pos`` (b,): per query,
    every item scoring at least its kk-th best (ties kept, so the merge can break them by index)."""
    m, b = S.shape
    keep = S >= np.partition(S, b - kk, axis=1)[:, b - kk, None] if b > kk else np.ones(S.shape, bool)
    keep &= S > -np.inf
    cnt = keep.sum(1)
    r, c = np.nonzero(keep)  # row-major: each query's items in column order
    slot = np.arange(len(r)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    w = max(1, int(cnt.max(initial=0)))
    D, I = np.full((m, w), -np.inf, np.float32), np.full((m, w), -1, np.int64)
    D[r, slot], I[r, slot] = S[r, c], pos[c]
    return D, I


class _StreamedExact:
    """Exact top-kk over corpus rows read again from the input's file a block at a time (``FileRows``): float32
    scores, excluded pairs dropped, blocks merged as shards are (``merge_topk``: score desc, then lower index).
    Holds nothing of the corpus between calls; each call reads the file once."""

    exact = True

    def __init__(self, xb):
        self.xb = xb

    def gather(self, I: np.ndarray) -> np.ndarray:
        return self.xb[np.where(I >= 0, I, 0)]

    def __call__(self, xq, kk, excl):
        xq = f32(xq)
        m, nb = len(xq), len(self.xb)
        kk = min(kk, nb)
        best = (np.full((m, kk), -np.inf, np.float32), np.full((m, kk), -1, np.int64))
        if excl is not None:
            q_ex, i_ex = np.repeat(np.arange(m), np.diff(excl[0])), np.asarray(excl[1], np.int64)
        parts = [best]
        for pos, rows in self.xb.blocks():
            S = (torch.from_numpy(xq) @ torch.from_numpy(rows).T).numpy()  # (m, b) float32 (torch: the thread budget's)
            if excl is not None and len(i_ex):  # excluded pairs whose corpus row is in this block
                sorter = np.argsort(pos)
                at = np.minimum(np.searchsorted(pos, i_ex, sorter=sorter), len(pos) - 1)
                hit = pos[sorter[at]] == i_ex
                S[q_ex[hit], sorter[at[hit]]] = -np.inf
            parts.append(_block_top(S, pos, kk))
            if sum(p[0].shape[1] for p in parts) > 4 * kk:
                parts = [merge_topk(parts, kk)]
        return merge_topk(parts, kk)


class ExactReference:
    """Exact search of the corpus rows, the reference of the recall checks: the kernels' exact top-k streamed
    over the corpus in tiles within half the budget (``backends.exhaustive.KernelSearch``), or (a sharded
    corpus) the shards' own exact search, merged; a corpus read again from its file on each access
    (``MineProblem.reference``), streamed from the file."""

    exact = True

    def __init__(self, problem: MineProblem, opts: MineOptions, search=None):
        self.gather = None
        if hasattr(problem.xb, "blocks"):
            streamed = _StreamedExact(problem.xb)
            self._search, self.gather = streamed, streamed.gather
        elif search is not None and hasattr(search, "exact_topk"):
            self._search = search.exact_topk
            self.gather = search.gather  # candidates' rows for the near-duplicate filter
        else:
            self._search = KernelSearch(problem.xb, (opts.budget_mb << 20) // 2, opts.rank_precision)

    def __call__(self, xq, kk, excl):
        return self._search(xq, kk, excl)


class _FirstCall:
    """A searcher that also keeps the first call's exact top-``keep`` (at least), as asked beside it."""

    exact = True

    def __init__(self, search, keep: int):
        self.search, self.keep, self.first = search, keep, None
        if getattr(search, "gather", None) is not None:
            self.gather = search.gather

    def __call__(self, xq, kk, excl):
        if self.first is not None:
            return self.search(xq, kk, excl)
        D, I = self.search(xq, max(kk, self.keep), excl)
        self.first = I[:, :self.keep]
        return D[:, :kk], I[:, :kk]


class _Remembered:
    """An exact searcher whose answers for each query vector are kept in a file (``cache``: an index folder's
    ``exact_topk.npz``), without exclusions, and served again with a request's exclusions dropped from them: a
    later run of the same queries over the same corpus (the folder's index checks it is) searches the corpus
    for none of them. A row whose kept list runs short once its exclusions are dropped is searched again."""

    exact = True
    _MAX = 200_000  # query vectors kept (the oldest go first)

    def __init__(self, search, cache: Path, nb: int):
        self.search, self.cache, self.hits, self.changed = search, cache, 0, False
        self.gather = getattr(search, "gather", None)
        self.kept: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        try:  # (np.load refuses pickles: allow_pickle is off)
            with np.load(cache) as f:
                keys, D, I, n = f["keys"], f["D"], f["I"], f["n"]
                whole = (keys.dtype == np.uint8 and keys.ndim == 2 and keys.shape[1] == 16 and D.dtype == np.float32
                         and I.dtype == np.int64 and D.ndim == 2 and D.shape == I.shape == (len(keys), D.shape[1])
                         and n.shape == (len(keys),) and n.dtype == np.int64 and ((n >= 0) & (n <= D.shape[1])).all()
                         and ((I >= -1) & (I < nb)).all())
                if whole:  # else not as ``save`` writes it for this corpus (the folder is a user's): passed over
                    for h, d, i, m in zip(keys, D, I, n):
                        self.kept[h.tobytes()] = (d[:m], i[:m])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile):
            self.kept = {}

    def __call__(self, xq, kk, excl):
        m = len(xq)
        D, I = np.full((m, kk), -np.inf, np.float32), np.full((m, kk), -1, np.int64)
        keys = [hashlib.blake2b(np.ascontiguousarray(r, np.float32).tobytes(), digest_size=16).digest() for r in xq]
        bad = [set(excl[1][excl[0][j]:excl[0][j + 1]].tolist()) if excl is not None else set() for j in range(m)]
        todo = []
        for j, key in enumerate(keys):
            got = self.kept.get(key)
            if got is not None:
                keep = [i for i, r in enumerate(got[1]) if r not in bad[j] and r >= 0][:kk]
                full = len(keep) == kk or (len(got[1]) and got[1][-1] < 0)  # enough, or the corpus ran out
                if full:
                    D[j, :len(keep)], I[j, :len(keep)] = got[0][keep], got[1][keep]
                    self.hits += 1
                    continue
            todo.append(j)
        if todo:
            more = kk + max((len(bad[j]) for j in todo), default=0)
            Dt, It = self.search(np.ascontiguousarray(xq[todo]), more, None)
            for t, j in enumerate(todo):
                self.kept[keys[j]] = (Dt[t], It[t])
                keep = [i for i, r in enumerate(It[t]) if r not in bad[j] and r >= 0][:kk]
                D[j, :len(keep)], I[j, :len(keep)] = Dt[t][keep], It[t][keep]
            self.changed = True
        return D, I

    def save(self) -> None:
        if not self.changed:
            return
        items = list(self.kept.items())[-self._MAX:]
        width = max(len(v[1]) for _, v in items)
        D = np.full((len(items), width), -np.inf, np.float32)
        I = np.full((len(items), width), -1, np.int64)
        for j, (_, (d, i)) in enumerate(items):
            D[j, :len(d)], I[j, :len(i)] = d, i
        with atomic_path(self.cache) as tmp, open(tmp, "wb") as f:
            # the digests as (n, 16) bytes: numpy's "S16" would drop a digest's trailing zero bytes
            keys = np.frombuffer(b"".join(k for k, _ in items), np.uint8).reshape(len(items), 16)
            np.savez(f, keys=keys, D=D, I=I, n=np.array([len(v[1]) for _, v in items], np.int64))


class SampleReference:
    """One exact search of the recall sample (``opts.recall_sample`` queries drawn with ``opts.seed``), kept:
    its exact top-10 (exclusions applied) tunes nprobe (``measure_recall``), and its mining with the same
    exclusions, filters and k is the reference of the written negatives (``written_recall``). Nothing of it
    is computed twice or thrown away. ``progress``: called with the corpus rows each tile searched.
    ``cache``: a file of an index folder keeping exact answers by query vector (``_Remembered``): a later run
    with the same queries over that index's corpus searches the corpus for none it has."""

    def __init__(self, problem: MineProblem, opts: MineOptions, search=None, progress=None,
                 cache: Path | None = None):
        nq = len(problem.xq)
        n = min(nq, opts.recall_sample)
        self.rows = _sample(nq, n, opts.seed)
        t0 = time.perf_counter()
        problem = problem.reference or problem  # the vectors as the inputs' files store them
        exact = ExactReference(problem, opts, search)
        if progress is not None and hasattr(exact._search, "progress"):
            exact._search.progress = progress
        kept = _Remembered(exact, cache, len(problem.xb)) if cache is not None else None
        rec = _FirstCall(kept or exact, 10)
        _, self.negatives = mine_block(rec, problem, self.rows, opts, Counter())  # (n, k) corpus rows
        self.top10 = rec.first if rec.first is not None else np.full((n, 10), -1, np.int64)
        self.reused = kept.hits if kept is not None else 0
        if kept is not None:
            try:
                kept.save()
            except OSError:  # a folder this user may not write (a shared index), a full disk: a cache, kept or not
                pass
        self.seconds = time.perf_counter() - t0


class TuningMemo:
    """The nprobe and refine a tuning settled on, kept in an index folder (``tuning.json``) by recall target,
    as (index folder) ``exact_topk.npz`` keeps exact answers. A later tuning of that index starts from the kept
    setting instead of nlist/512 (another query set: measured there first, doubled on from it when short). A
    sample whose vectors, exclusions and exact top-10 all equal the kept one's (the same queries again) gets
    the kept measurements back without searching: FAISS's search of the same vectors at the same setting
    returns the same lists, so its recall is the one measured. Unreadable or unwritable: no memo."""

    _MAX = 64  # samples kept per folder (the oldest go first)

    def __init__(self, path: Path):
        self.path = path
        try:
            self.kept = [r for r in json.loads(path.read_text()).get("tunings", []) if self._valid(r)]
        except (OSError, ValueError, AttributeError, TypeError):
            self.kept = []

    @staticmethod
    def _valid(r) -> bool:
        """A record as ``save`` writes it (the folder is a user's: anything else is passed over, not trusted)."""
        def whole(v, top):
            return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= top
        return (isinstance(r, dict) and isinstance(r.get("sample"), str) and isinstance(r.get("target"), float)
                and whole(r.get("nprobe"), 1 << 20) and (r.get("refine") is None or whole(r["refine"], MAX_REFINE))
                and isinstance(r.get("tuning_recall@10"), float) and isinstance(r.get("seconds_per_query"), float)
                and isinstance(r.get("tuning"), list) and isinstance(r.get("met"), bool))

    @staticmethod
    def key(xs: np.ndarray, excl, top10: np.ndarray, k: int) -> str:
        h = hashlib.blake2b(digest_size=16)
        for a in (xs, top10, *(excl if excl is not None else ())):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(str(k).encode())
        return h.hexdigest()

    def same(self, key: str, target: float) -> dict | None:
        return next((r for r in reversed(self.kept) if r.get("sample") == key and r.get("target") == target), None)

    def start(self, target: float) -> dict | None:
        """The setting of the latest tuning that met ``target`` (the first to try), if any."""
        return next((r for r in reversed(self.kept) if r.get("target") == target and r.get("met")), None)

    def save(self, record: dict) -> None:
        self.kept = [r for r in self.kept if not (r.get("sample") == record["sample"]
                                                  and r.get("target") == record["target"])] + [record]
        try:
            with atomic_path(self.path) as tmp:
                Path(tmp).write_text(json.dumps({"tunings": self.kept[-self._MAX:]}, indent=1))
        except OSError:  # a folder this user may not write (a shared index), a full disk: a memo, kept or not
            pass


def measure_recall(search, problem: MineProblem, opts: MineOptions, ref: SampleReference | None = None,
                   memo: TuningMemo | None = None) -> dict:
    """The tuning recall: recall@10 of the search alone (exclusions applied, no filters) against the exact
    top-10 of the recall sample (``ref``: computed once for the run, also the written recall's reference).

    With ``--nprobe`` unset, nprobe is doubled from nlist/512 until the recall reaches ``opts.recall_target``;
    when doubling it gains less than 0.005 (the codes, not the lists, limit it) or every list is probed, the
    candidates re-scored per result (``refine``) are doubled instead, up to ``backends.faiss.MAX_REFINE``. A
    searcher without an IVF-like ``index``: measured once. What the run reports is the recall of what it wrote
    (``written_recall``); this one only picks nprobe and refine. ``memo``: an index folder's kept tunings
    (``TuningMemo``): the start, or (the same sample again) the answer."""
    from hardrank.scoring.faiss_index import recall_at_k  # faiss: imported by that module alone

    nq = len(problem.xq)
    n = min(nq, opts.recall_sample)
    if n == 0 or search.exact:
        return {"tuning_recall@10": 1.0 if search.exact else None, "tuning_sample": n}
    ref = ref or SampleReference(problem, opts, search)
    xs = f32(problem.xq[ref.rows])
    excl = csr_take(problem.exclude_ptr, problem.exclude_idx, ref.rows) if problem.exclude_ptr is not None else None
    out = {"tuning_sample": n, "exact_seconds": round(ref.seconds, 3)}
    index = getattr(search, "index", None)
    top = (index.nlist or 0) if index is not None else 0
    tune = opts.nprobe is None and top > 0
    can_refine = index is not None and hasattr(index, "set_refine")
    key = TuningMemo.key(xs, excl, ref.top10, 10) if memo is not None and tune else None
    same = memo.same(key, opts.recall_target) if key is not None else None
    if same is not None and same.get("nprobe", 0) <= top and (same.get("refine") is None or can_refine):
        index.set_nprobe(int(same["nprobe"]))
        if same.get("refine") is not None:
            index.set_refine(int(same["refine"]))
        out.update({k: same[k] for k in ("tuning_recall@10", "nprobe", "refine", "tuning", "seconds_per_query")},
                   nlist=top, tuning_reused=f"{memo.path}: this sample's tuning (same queries, exclusions and "
                                            f"exact answers), not searched again")
        return out
    start = memo.start(opts.recall_target) if key is not None else None
    if tune:
        index.set_nprobe(min(top, int(start["nprobe"])) if start else max(1, top // 512))
        if start and start.get("refine") is not None and can_refine:
            index.set_refine(int(start["refine"]))
    tried, prev = [], None
    while True:
        t0 = time.perf_counter()
        _, Ia = search(xs, 10, excl)
        dt = time.perf_counter() - t0
        r = recall_at_k(Ia, ref.top10, 10)
        tried.append({"nprobe": getattr(index, "nprobe", None), "refine": getattr(index, "refine", None),
                      "recall@10": round(r, 4), "seconds": round(dt, 3)})
        if r >= opts.recall_target:
            break
        stalled = prev is not None and r - prev < 0.005
        prev = r
        if tune and index.nprobe < top and not (stalled and can_refine and index.refine < MAX_REFINE):
            index.set_nprobe(min(top, index.nprobe * 2))
        elif can_refine and index.refine < MAX_REFINE:
            index.set_refine(min(MAX_REFINE, index.refine * 2))
            prev = None  # the next doubling of nprobe is judged afresh
        else:
            break
    out.update({"tuning_recall@10": r, "nprobe": getattr(index, "nprobe", None), "nlist": top or None,
                "refine": getattr(index, "refine", None), "tuning": tried, "seconds_per_query": dt / max(1, n)})
    if start:
        out["tuning_start"] = f"{memo.path}: nprobe {start['nprobe']}, refine {start.get('refine')} (a tuning of " \
                              f"this index that met the target)"
    if key is not None:
        memo.save({"sample": key, "target": float(opts.recall_target), "met": r >= opts.recall_target,
                   **{k: out[k] for k in ("tuning_recall@10", "nprobe", "refine", "tuning", "seconds_per_query")}})
    return out


def _as_stored(problem: MineProblem, ref: MineProblem, rows: np.ndarray) -> bool:
    """Whether the vectors the run searched equal, bit for bit as float32, those its inputs' files store
    (``ref``: ``MineProblem.reference``) for the recall sample ``rows``: its queries, their positives, and the
    corpus (read once, in the file's blocks, when the corpus is read again). Then an exact search of the loaded
    vectors is an exact search of the stored ones, its own reference; else a loading fault shows in the recall."""
    if not np.array_equal(f32(problem.xq[rows]), f32(ref.xq[rows])):
        return False
    if ref.pos_emb is not problem.pos_emb and problem.pos_ptr is not None:
        at = np.concatenate([np.arange(problem.pos_ptr[r], problem.pos_ptr[r + 1]) for r in rows] or
                            [np.zeros(0, np.int64)]).astype(np.int64)
        if len(at) and not np.array_equal(f32(problem.pos_emb[at]), f32(ref.pos_emb[at])):
            return False
    if ref.xb is not problem.xb:
        if not hasattr(ref.xb, "blocks"):
            return False
        for pos, block in ref.xb.blocks():
            if not np.array_equal(f32(problem.xb[pos]), f32(block)):
                return False
    return True


def written_recall(problem: MineProblem, opts: MineOptions, written, search=None,
                   ref: SampleReference | None = None) -> dict:
    """recall@k of the negatives a run wrote, on the recall sample (``_sample``: ``opts.recall_sample``
    queries drawn with ``opts.seed``).

    For each sampled query, the reference is what mining with an exact search writes (``mine_block`` with
    ``ExactReference``: the same exclusions, near-duplicate and similarity filters, the same k: ``ref``,
    computed once for the run), over the vectors as the inputs store them: ``problem.reference`` where an
    input's files are read again (an embeddings file), so a fault in loading them shows here instead of
    passing as recall 1.0. The query's recall is |written ∩ reference| / |reference| (negatives compared by
    corpus id), and the figure is its mean over the sampled queries whose reference is not empty.
    ``written(rows)`` gives the written negative ids of query rows ``rows``, each list in rank order. An exact
    search (``search.exact``) of vectors equal to those stored (``_as_stored``: no ``problem.reference``, or
    one whose vectors read back equal) is its own reference: what it wrote is what mining with exact search
    writes, so nothing is searched again."""
    nq = len(problem.xq)
    n = min(nq, opts.recall_sample)
    if n == 0:
        return {}
    t0 = time.perf_counter()
    rows = _sample(nq, n, opts.seed)
    got = written(rows)
    exact = search is not None and search.exact and (problem.reference is None
                                                     or _as_stored(problem, problem.reference, rows))
    if exact:
        per = [1.0 for negs in got if negs]
        reference = "the run's own search, which is exact: what it wrote is what mining with exact search writes"
        if problem.reference is not None:
            reference += " (its vectors read back from the inputs' files: equal to those it searched)"
    else:
        ref = ref or SampleReference(problem, opts, search)
        ok = ref.negatives >= 0
        names = take(problem.corpus_ids, ref.negatives[ok]).to_pylist()  # one read of the ids, all queries' at once
        per, at = [], 0
        for j, negs in enumerate(got):
            refset = set(names[at:at + int(ok[j].sum())])
            at += int(ok[j].sum())
            if refset:
                per.append(len(refset & set(negs)) / len(refset))
        reference = ("mining with exact search (the kernels' exact top-k, or the shards' exact search) of the "
                     "vectors as the inputs store them (an embeddings file's read again from the file): same "
                     "exclusions, filters and k")
    r = float(np.mean(per)) if per else None
    return {f"recall@{opts.k}": r, "k": opts.k, "sample": n, "compared": len(per), "seed": opts.seed,
            "target": opts.recall_target, "met": r is not None and r >= opts.recall_target, "reference": reference,
            "definition": "mean over the sampled queries (numpy default_rng(seed).choice(queries, sample, "
                          "replace=False)) of |written negatives ∩ reference negatives| / |reference negatives|",
            "seconds": round(time.perf_counter() - t0, 3)}
