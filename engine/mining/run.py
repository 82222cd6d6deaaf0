"""A mining run: blocks of queries mined into resumable Parquet shards, then the summary."""
from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hardrank import urls
from hardrank.atomic import atomic_path, write_json_atomic
from hardrank.config import DIRECTIONS, MineConfig, MineOptions, build, check_writable_dir
from hardrank.devices import resolve_device
from hardrank.errors import DataError, UsageError
from hardrank.executors import executor
from hardrank.mining import memory
from hardrank.mining.block import mine_block
from hardrank.mining.catalog import digest, take
from hardrank.mining.index import built_factory, check_index, index_searcher
from hardrank.mining.inputs import build_problem
from hardrank.mining.problem import MineProblem, negatives_schema
from hardrank.mining.progress import Progress
from hardrank.mining.searcher import SampleReference, TuningMemo, build_searcher, measure_recall, written_recall
from hardrank.mining.training_table import check_training, shard_path, training_format, write_training
from hardrank.scoring import backends, corpus_io
from hardrank.scoring.backends import Backend
from hardrank.scoring.backends.auto import gemm_rate
from hardrank.scoring.backends.faiss import faiss_searcher
from hardrank.scoring.backends.sharded import for_mining
from hardrank.settings import RunSettings, start_run
from hardrank.units import hms
from hardrank.vectors import UnitRows

__all__ = ["mine", "mine_arrays", "mining_settings", "recall_line"]

RUN_VERSION = 2  # 2: human ids (image paths relative to one root), query_key / negative_key columns
_HIST_BINS = 40  # score histogram: 40 bins over [-1, 1]
# a search of at least this many (query, corpus item) pairs gets an estimate of its time in the plan
_ESTIMATE_PAIRS = 1 << 28


def _plan_line(problem: MineProblem, opts: MineOptions, n_blocks: int, n_todo: int, how: str) -> str:
    """The search about to run, in one line: queries x corpus, k, how, blocks."""
    nq, nb, d = len(problem.xq), len(problem.xb), problem.xq.shape[1]
    done = f" ({n_blocks - n_todo} done, {n_todo} to run)" if n_todo < n_blocks else ""
    return (f"plan: {nq:,} {DIRECTIONS[problem.direction][0]} queries x {nb:,} {problem.modality} corpus items "
            f"({d}-d), top {opts.k} each by {how}; {n_blocks} block(s) of up to {opts.block_size:,} queries{done}")


def _check_run(out: Path, problem: MineProblem, opts: MineOptions) -> dict:
    """The run record: a rerun resumes only with the same inputs and options."""
    record = {"run_version": RUN_VERSION, "direction": problem.direction, "modality": problem.modality,
              "queries": len(problem.xq), "corpus": len(problem.xb), "dim": int(problem.xq.shape[1]),
              "query_ids": digest(problem.query_ids),
              "corpus_ids": (problem.meta.get("corpus") or {}).get("ids_digest") or digest(problem.corpus_ids),
              # dup_filter off is dup_threshold None already: records written before the flag was an option match
              "options": {k: v for k, v in asdict(opts).items()
                          if k not in ("recall_sample", "recall_target", "shards", "dup_filter", "index", "index_out")}}
    path = out / "mine_run.json"
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: unreadable run record ({exc}); it pins the inputs of the mining run in "
                            f"{out}: delete {out} to start over, or use another --out") from None
        if old != json.loads(json.dumps(record)):
            diff = sorted(k for k in set(old) | set(record) if old.get(k) != json.loads(json.dumps(record)).get(k))
            raise UsageError(f"{out} holds a mining run with different inputs or options (differs in {diff}); "
                             f"use another --out, or delete {out} to start over")
    else:
        write_json_atomic(path, record)
    return record


def _rss(field: str = "VmRSS") -> int | None:
    """This process's resident memory in bytes (``VmHWM``: its peak so far); None where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) << 10 for line in f if line.startswith(field + ":")), None)
    except OSError:
        return None


def _peak_rss() -> int:
    """Peak resident memory of this process so far, bytes (VmHWM; else getrusage: KiB on Linux, bytes on macOS)."""
    peak = _rss("VmHWM")
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return peak


def _resident_bytes(*arrays) -> int:
    """Bytes of the arrays held in memory (memory maps and lazy views are read on demand: not counted; a
    float16 file's ``UnitRows`` holds its values)."""
    return sum(int(a.nbytes) for a in arrays
               if isinstance(a, UnitRows) or isinstance(a, np.ndarray) and not corpus_io.mapped(a))


_BUDGET_BOUNDS = ("the search: its index (in memory: IVF lists and codes up to half the budget; larger lists are "
                  "memory-mapped from disk), its training sample (a quarter), a block of rows being added, the exact "
                  "pass's corpus tile and score tiles, exact re-scoring of candidates, the near-duplicate filter, "
                  "FAISS's per-query search memory; not the vectors read from the inputs into memory, the ids and "
                  "keys held in memory (both counted beside it), the process's start-up (torch, FAISS), or one "
                  "block's output")
# the aim on anonymous memory: start-up + vectors + ids + budget + 10% of those three, at least 64 MiB (allocator
# pools, FAISS's and Arrow's working memory and first-use allocations, one block's output)
_AIM_SLACK, _AIM_FLOOR = 0.1, 64 << 20


def _memory(problem: MineProblem, opts: MineOptions, start: dict, watch: memory.MemoryWatch) -> dict:
    """Peak anonymous memory against the aim start-up + (vectors + ids + budget) + 10% of it (at least 64 MiB);
    the file-backed peak (the libraries mapped at start-up, then pages of a memory-mapped corpus or index: the
    kernel reclaims them) and the total peak beside it."""
    watch.sample()
    vectors = _resident_bytes(problem.xb, problem.xq, problem.pos_emb)
    mapped = str((problem.meta.get("corpus") or {}).get("ids", "")).startswith("memory-mapped")
    ids = memory.ids_bytes(problem.query_ids, problem.query_keys,
                           *(() if mapped else (problem.corpus_ids, problem.corpus_keys)))
    mb = lambda b: None if b is None else round(b / 2**20, 1)
    peak = _peak_rss()
    start_anon = (start.get("RssAnon", 0) + start.get("RssShmem", 0)) if start else None
    known = bool(start) and watch.peak_anon > 0
    held = vectors + ids + (opts.budget_mb << 20)
    aim = start_anon + held + max(_AIM_SLACK * held, _AIM_FLOOR) if known else None
    return {"peak_rss_mb": mb(peak), "peak_anon_mb": mb(watch.peak_anon) if known else None,
            "peak_file_mb": mb(watch.peak_file) if known else None, "start_file_mb": mb(start.get("RssFile")),
            "start_rss_mb": mb(start.get("VmRSS")),
            "start_anon_mb": mb(start_anon), "vectors_mb": mb(vectors), "ids_mb": mb(ids),
            "budget_mb": opts.budget_mb, "aim_mb": mb(aim), "within_aim": None if aim is None else
            watch.peak_anon <= aim,
            "peak": "peak_anon_mb: anonymous memory (RssAnon + RssShmem, sampled every 50 ms); peak_file_mb: "
                    "file-backed pages (a memory-mapped corpus or index as read: reclaimable); peak_rss_mb: the "
                    "total's peak (VmHWM)",
            "aim": "peak_anon_mb <= start_anon_mb + held + max(10% of held, 64 MiB), held = vectors_mb + ids_mb + "
                   "budget_mb",
            "budget_bounds": _BUDGET_BOUNDS}


def _written(out: Path, problem: MineProblem, B: int):
    """``written(rows)``: the negative ids written for query rows ``rows``, in rank order, read from the shards."""
    def written(rows: np.ndarray) -> list[list[str]]:
        at = {problem.query_ids[r]: j for j, r in enumerate(rows)}
        got: list[list[tuple[int, str]]] = [[] for _ in rows]
        for b in np.unique(np.asarray(rows) // B):
            t = pq.read_table(shard_path(out, int(b)), columns=["query_id", "rank", "negative_id"])
            for q, rank, neg in zip(*(t.column(c).to_pylist() for c in ("query_id", "rank", "negative_id"))):
                if q in at:
                    got[at[q]].append((rank, neg))
        return [[neg for _, neg in sorted(g)] for g in got]
    return written


def recall_line(recall: dict) -> str:
    """The recall of the written negatives in one line (printed, and by `hardrank mine` after the run)."""
    k, r = recall["k"], recall.get(f"recall@{recall['k']}")
    got = "n/a (no sampled query has a negative)" if r is None else f"{r:.3f}"
    return (f"recall@{k} of the written negatives {got} on {recall['sample']:,} sampled queries, against mining "
            f"with exact search (target {recall['target']}: {'met' if recall['met'] else 'NOT met'})")


def _exact_estimate(problem: MineProblem, opts: MineOptions, nq: int | None = None) -> float:
    """Seconds an exact pass of ``nq`` queries (default: every one) over the corpus takes here (the kernel's
    measured rate)."""
    nb, d = problem.xb.shape
    return (len(problem.xq) if nq is None else nq) * nb * d / gemm_rate(d, opts.rank_precision)


def _shortfall(recall: dict, search: dict, exact: bool, problem: MineProblem, opts: MineOptions) -> str | None:
    """One line when the written negatives miss the recall target: what they reached, what was tried, and
    what would reach it here (exact search, which streams the corpus within the budget; its time)."""
    r = recall.get(f"recall@{opts.k}")
    if not recall or recall["met"] or r is None:
        return None
    what = search.get("factory") or search.get("method")
    line = (f"recall target {opts.recall_target} not met within --budget-mb {opts.budget_mb}: the written negatives "
            f"reach recall@{opts.k} {r:.3f} with {what}")
    if search.get("nlist"):
        tuned = search.get("tuning_recall@10")
        best = search.get("nprobe") == search["nlist"] or search.get("refine") is not None
        line += (f" at nprobe {search.get('nprobe')} of {search['nlist']} lists"
                 + (f", {search['refine']} candidates a result re-scored" if search.get("refine") else "")
                 + (f" (tuning recall@10 {tuned:.3f}, the best it reached)" if tuned is not None and best else
                    ", --nprobe can go up to every list"))
    if exact:
        return line + " (exact search: ties at the k-th score decide the rest)"
    est = _exact_estimate(problem, opts)
    recall["exact_estimate_s"] = round(est, 1)
    return line + (f"; exact search reaches it: --search exact (a pass over the corpus per block of queries, "
                   f"within --budget-mb: about {hms(est)} here)")


def mine_arrays(problem: MineProblem, opts: MineOptions, out: str | os.PathLike, *,
                export_training: str | os.PathLike | None = None, echo=None, backend: Backend | None = None,
                settings: RunSettings | None = None) -> dict:
    """Mine ``opts.k`` negatives per query into ``out/negatives/part-*.parquet`` (one shard per
    block of ``opts.block_size`` queries, written atomically; existing shards are skipped, so a
    killed run resumes), then write ``out/summary.json`` and return it.

    Search: the backend ``opts.search`` names (``hardrank.scoring.backends``): ``exact`` = kernels.topk
    streamed over the corpus in tiles; ``faiss:<factory>`` = a FAISS index (approximate ones over-fetch
    candidates and re-score them exactly); ``auto`` = whichever of the two the cost model says is cheaper
    (``backends.auto.plan``). An IVF index lives in a folder when ``opts.index`` (reused, checked against
    the corpus), ``opts.index_out`` (built there, resumable) or when its lists exceed half the budget
    (``out/index``). ``backend``: that backend as placed for this run, e.g. on the Ray shards of
    ``hardrank.executors.ray_search`` (``backends.sharded``); the blocks, filters and outputs are the same.
    ``settings``: the run's threads (``mine`` decides them); None: this call is a run of its own, with
    mining's default (``mining_settings``)."""
    settings = settings or mining_settings()
    echo = echo or (lambda s: None)
    start = problem.meta.get("start_memory") or memory.status()  # mine(): before the inputs were read
    watch = memory.MemoryWatch().start()
    try:
        return _mine_arrays(problem, opts, Path(out), export_training, echo, backend, start, watch, settings)
    finally:
        watch.stop()


def _plan(problem: MineProblem, opts: MineOptions, backend: Backend, n_todo: int):
    """How the search will run (``backends.base.MinePlan``: auto weighs an exact pass against an index), said
    before anything is built."""
    spec = opts.search_spec
    built = built_factory(opts.index) if opts.index else None
    plan = backend.mining_plan(spec, n_todo, tuple(problem.xb.shape), opts, mapped=corpus_io.mapped(problem.xb),
                               built=built)
    if opts.index and plan.index is None:
        raise UsageError(f"--index {opts.index} is a FAISS index, and --search {spec} does not search one: use "
                         f"--search auto (or faiss:{built}) with --index, or drop --index")
    return plan


def _searcher(problem: MineProblem, opts: MineOptions, backend: Backend, plan, n_todo: int, out: Path, echo):
    """The run's searcher for ``plan``: the backend's own, or the IVF index the plan names, built in memory or
    in a folder (reused, resumed, or built)."""
    if plan.index is None:
        if opts.index_out:
            echo(f"--index-out {opts.index_out}: no index to keep, the search is {plan.how}")
        return build_searcher(problem, opts, backend, n_todo)  # the queries the plan was made for
    from hardrank.scoring.faiss_index import ondisk  # faiss: imported by that package alone

    nb, d = problem.xb.shape
    if opts.index:
        return index_searcher(problem, opts, plan.index, opts.index, build=False, echo=echo)
    big = not ondisk.fits_memory(plan.index, nb, d, opts.budget_mb << 20)
    if opts.index_out or big:
        folder = Path(opts.index_out) if opts.index_out else out / "index"
        if big and not opts.index_out:
            echo(f"index: {plan.index}'s lists exceed half of --budget-mb {opts.budget_mb}: built in {folder} "
                 f"(memory-mapped; kept, so a rerun reuses it; --index-out DIR keeps it elsewhere)")
        return index_searcher(problem, opts, plan.index, folder, build=True, echo=echo)
    return faiss_searcher(problem.xb, plan.index, opts)


def _mine_arrays(problem: MineProblem, opts: MineOptions, out: Path, export_training, echo, backend: Backend | None,
                 start: dict, watch: memory.MemoryWatch, settings: RunSettings) -> dict:
    problem.validate()
    if export_training:
        check_training(export_training, problem)  # a bad name or missing pairs fail before any work
    t_start = time.perf_counter()
    if opts.index:  # another corpus's, damaged or unfinished: said before anything is written
        check_index(problem, opts.index)
    (out / "negatives").mkdir(parents=True, exist_ok=True)
    record = _check_run(out, problem, opts)
    nq, B = len(problem.xq), opts.block_size
    n_blocks = math.ceil(nq / B)
    todo = [b for b in range(n_blocks) if not shard_path(out, b).exists()]
    timings: dict[str, float] = {}
    prev = out / "summary.json"
    search_info, recall = {}, {}
    if prev.exists() and not todo:
        try:
            old = json.loads(prev.read_text(encoding="utf-8"))
            search_info, recall = old.get("search", {}), old.get("recall", {})
        except (OSError, ValueError, AttributeError):  # rewritten below; only its search and recall are reused
            search_info, recall = {}, {}
    ids_q = pa.array(problem.query_ids, pa.string())
    ids_b = problem.corpus_ids if isinstance(problem.corpus_ids, (pa.Array, pa.ChunkedArray)) else pa.array(
        problem.corpus_ids, pa.string())
    keys_q = pa.array(problem.query_keys if problem.query_keys is not None else [None] * nq, pa.string())
    keys_b = problem.corpus_keys if isinstance(problem.corpus_keys, (pa.Array, pa.ChunkedArray)) else pa.array(
        problem.corpus_keys if problem.corpus_keys is not None else [None] * len(problem.xb), pa.string())
    if todo:
        todo_rows = np.concatenate([np.arange(b * B, min(nq, (b + 1) * B)) for b in todo])
        backend = backend or backends.get(opts.search_spec)
        t0 = time.perf_counter()
        plan = _plan(problem, opts, backend, len(todo_rows))
        echo(_plan_line(problem, opts, n_blocks, len(todo), plan.how))
        if plan.why:
            echo(f"why: {plan.why}")
        for alt in plan.alternatives:
            echo(f"  {alt}")
        search = _searcher(problem, opts, backend, plan, len(todo_rows), out, echo)
        timings["index"] = time.perf_counter() - t0
        search_info = dict(search.info)
        if plan.why:
            search_info["plan"] = plan.why
        if plan.exact_s is not None:
            search_info["estimates_s"] = {"exact": round(plan.exact_s, 1),
                                          **{k: round(v, 1) for k, v in (plan.index_s or {}).items()}}
        if hasattr(search, "index") and search.index.nprobe is not None:
            search_info["nprobe"] = search.index.nprobe
        nb = len(problem.xb)
        ref = None
        if opts.recall_sample and not search.exact:
            t0 = time.perf_counter()
            n_ref = min(nq, opts.recall_sample)
            folder = search_info.get("index_folder")  # exact answers kept there for a later run of the same queries
            ref = SampleReference(problem, opts, search, progress=Progress(
                echo, f"recall sample: exact search of {n_ref:,} queries", nb).update,
                cache=Path(folder) / "exact_topk.npz" if folder else None)
            search_info["recall_sample_reused"] = ref.reused
            if ref.reused:
                echo(f"recall sample: {ref.reused:,} exact answers reused from {folder}")
            memo = TuningMemo(Path(folder) / "tuning.json") if folder else None  # this index's tunings
            search_info.update(measure_recall(search, problem, opts, ref, memo))
            timings["recall"] = time.perf_counter() - t0
            what = search_info.get("factory", search_info["method"])
            refine = f", {search_info['refine']} candidates a result" if search_info.get("refine") else ""
            echo(f"approximate search {what}: tuning recall@10 {search_info['tuning_recall@10']:.3f} (the search "
                 f"alone, before filters) at nprobe {search_info.get('nprobe')}{refine} on "
                 f"{search_info['tuning_sample']} queries ({timings['recall']:.1f}s, of which the sample's exact "
                 f"search {ref.seconds:.1f}s)")
            for kept in ("tuning_reused", "tuning_start"):
                if search_info.get(kept):
                    echo(f"tuning: {'reused' if kept == 'tuning_reused' else 'started at'} {search_info[kept]}")
        if len(todo_rows) * nb >= _ESTIMATE_PAIRS:
            if search.exact and hasattr(search, "progress"):
                est = plan.exact_s if plan.exact_s is not None else _exact_estimate(problem, opts, len(todo_rows))
                echo(f"estimated search time {hms(est)} (a pass over the corpus per block of queries, at the exact "
                     f"kernel's measured rate)")
            elif search_info.get("seconds_per_query"):
                est = search_info["seconds_per_query"] * len(todo_rows)
                echo(f"estimated search time {hms(est)} (the tuned search timed on the recall sample)")
        t0, done_q = time.perf_counter(), 0
        for i, b in enumerate(todo):
            rows = np.arange(b * B, min(nq, (b + 1) * B))
            if hasattr(search, "progress"):  # an exact pass: progress through the corpus
                search.progress = Progress(echo, f"block {b + 1}/{n_blocks}: exact pass", nb).update
            st: Counter = Counter()
            S, I = mine_block(search, problem, rows, opts, st)
            valid = I >= 0
            qrow = np.repeat(rows, valid.sum(1))
            table = pa.Table.from_arrays([
                ids_q.take(pa.array(qrow)), pa.array(np.nonzero(valid)[1].astype(np.int32)),
                take(ids_b, I[valid]), pa.array(S[valid], pa.float32()),
                pa.array([problem.modality] * int(valid.sum()), pa.string()),
                keys_q.take(pa.array(qrow)), take(keys_b, I[valid])], schema=negatives_schema())
            block_meta = json.dumps({"block": b, "queries": len(rows), **st})
            table = table.replace_schema_metadata({"hardrank_block": block_meta})
            with atomic_path(shard_path(out, b), table.nbytes) as tmp:
                pq.write_table(table, tmp)
            elapsed, done_q = time.perf_counter() - t0, done_q + len(rows)
            left = len(todo_rows) - done_q
            rate = f", {done_q / elapsed:,.0f} queries/s" if elapsed > 0 else ""
            eta = f", ETA {hms(elapsed / done_q * left)}" if left else ""
            echo(f"block {b + 1}/{n_blocks}: {len(rows)} queries ({i + 1}/{len(todo)} this run, {elapsed:.1f}s"
                 f"{rate}{eta})")
        timings["search"] = time.perf_counter() - t0
        if hasattr(search, "progress"):
            search.progress = None
        if opts.recall_sample:  # what was written, against exact search on a sample (the reference found above)
            recall = written_recall(problem, opts, _written(out, problem, B), search, ref)
            timings["recall_written"] = recall["seconds"]
            shortfall = _shortfall(recall, search_info, search.exact, problem, opts)
            if shortfall:
                recall["shortfall"] = shortfall
    if recall:
        echo(recall_line(recall))
        if recall.get("shortfall"):
            echo(recall["shortfall"])
    # summary over every shard, also those written by earlier runs
    stats: Counter = Counter()
    scores = []
    for b in range(n_blocks):
        f = pq.ParquetFile(shard_path(out, b))
        meta = json.loads((f.schema_arrow.metadata or {}).get(b"hardrank_block", b"{}"))
        stats.update({k: v for k, v in meta.items() if k not in ("block", "queries")})
        scores.append(f.read(columns=["score"]).column("score").to_numpy())
    scores = np.concatenate(scores) if scores else np.zeros(0, np.float32)
    hist, edges = np.histogram(scores, bins=_HIST_BINS, range=(-1.0, 1.0))
    files = {"negatives": str(out / "negatives"), "summary": str(out / "summary.json")}
    training = None
    if export_training:
        t0 = time.perf_counter()
        training = write_training(Path(export_training), out, problem, n_blocks, B)
        timings["export"] = time.perf_counter() - t0
        files["training"] = str(export_training)
    timings["total"] = time.perf_counter() - t_start
    searched = sum(min(nq, (b + 1) * B) - b * B for b in todo)  # (the estimate's sample is not counted)
    summary = {
        "direction": problem.direction, "modality": problem.modality, "k": opts.k, "options": asdict(opts),
        "inputs": {k: v for k, v in problem.meta.items() if k != "start_memory"}, "search": search_info,
        "recall": recall, "run": record,
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
        "throughput": {"queries_per_s": (round(searched / timings["search"], 2)
                                         if todo and timings["search"] > 0 else None)},
        "files": files,
        "memory": _memory(problem, opts, start, watch),
        "threads": settings.record(),  # how many threads computed it, and why (results do not depend on it)
    }
    if training is not None:
        summary["training"] = training
    write_json_atomic(out / "summary.json", summary)
    return summary


def mining_settings(threads: int | None = None, decode_threads: int | None = None) -> RunSettings:
    """A mining run's settings (``hardrank.settings.start_run``), torch sized to them. The thread budget: all the
    cores this process may use (or ``--threads``), no look at the idle ones. Its time is a long GEMM-bound search,
    whose parallel regions are large: beside one busy process on 2 cores, exact search of 5,000 x 50,000 took 1.09x
    its quiet time with 2 threads and 1.76x with the 1 the idle look gives (``benchmarks/bench_contention.py``;
    OpenMP's waits are passive). An evaluation's many small ops are another matter: it keeps the look
    (``evaluate``)."""
    return start_run(threads, decode_threads, probe=False)


def mine(cfg: MineConfig | None = None, *, progress=None, echo=None, runner=None, **options) -> dict:
    """Load the corpus and queries, embed what the store lacks (or read a store folder), mine, write.
    ``cfg`` or the same options as keywords (the CLI flags' names): ``mine(corpus=..., queries=...,
    out=..., model=..., checkpoint=..., k=20)``. Returns the summary (also in ``out/summary.json``)."""
    if cfg is not None and options:
        raise UsageError(f"pass a MineConfig or keyword options, not both (got {sorted(options)})")
    cfg = cfg if cfg is not None else build(MineConfig, options)
    echo = echo or (lambda s: None)
    settings = mining_settings(cfg.embed.threads, cfg.embed.decode_threads)  # usage first (a bad $HARDRANK_THREADS)
    resolve_device(cfg.embed.device)  # usage first: nothing is embedded for a missing device or unwritable output
    check_writable_dir(cfg.out, "out (--out)")
    if cfg.model is not None:
        cfg.embed.check_store()
    if cfg.export_training:
        training_format(cfg.export_training)  # .tsv / .csv / .jsonl: a wrong name fails before any work
        if Path(cfg.export_training).is_dir():
            raise UsageError(f"option export_training (--export-training) is {cfg.export_training!r}, which is a "
                             f"folder; name the file to write (.tsv, .csv or .jsonl)")
        check_writable_dir(Path(cfg.export_training).parent, "export_training (--export-training)")
    o = cfg.options
    if o.index_out:
        check_writable_dir(o.index_out, "index_out (--index-out)")
    if o.index and not Path(o.index).is_dir():
        raise DataError(f"--index {o.index}: no such folder; build an index there first (hardrank index build "
                        f"--corpus {cfg.corpus} --out {o.index}, or mine with --index-out {o.index})")
    echo(f"threads: {settings.budget.describe()}")
    t0 = time.perf_counter()
    import hardrank.scoring.faiss_index  # noqa: F401  (FAISS's start-up counts as start-up, whichever search runs)
    start = memory.status()  # start-up (torch, FAISS, the CLI) before any input is read: the memory aim's base
    backend = for_mining(backends.get(o.search_spec), executor(cfg.embed, settings), o.shards)
    if backend.remote and (o.index or o.index_out):
        backend.close()
        raise UsageError("--index / --index-out keep one index of the whole corpus; with --executor ray each shard "
                         "builds its own in memory: drop one or the other")
    try:
        with urls.staged_dir(cfg.out) as out:  # a URL: written here, uploaded (shards before the summary)
            # the corpus's ids: reused from --index (never written there), kept in --index-out, else in --out
            problem = build_problem(cfg, progress=progress, echo=echo, runner=runner, lazy_corpus=backend.remote,
                                    ids_dir=Path(o.index_out or out), ids_mapped=bool(o.index_out),
                                    ids_reuse=Path(o.index) if o.index else None, settings=settings)
            t_inputs = time.perf_counter() - t0
            echo(f"{len(problem.query_ids)} {DIRECTIONS[cfg.direction][0]} queries, {len(problem.corpus_ids)} "
                 f"{problem.modality} corpus items ({t_inputs:.1f}s)")
            problem.meta.setdefault("timings", {})["inputs"] = round(t_inputs, 3)
            problem.meta["start_memory"] = start
            return mine_arrays(problem, o, out, export_training=cfg.export_training, echo=echo, backend=backend,
                               settings=settings)
    finally:
        backend.close()
