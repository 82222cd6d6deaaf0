"""Hard-negative mining at scale: clustered fp16 corpus on disk (default 1M x 512), 100k queries, approx vs exact.

Usage: python benchmarks/bench_mine_scale.py [--corpus 1000000] [--queries 100000] [--d 512]
           [--workdir /tmp/hardrank-bench-mine] [--budget-mb 1024] [--search auto] [--threads N]
           [--ray-shards N]   (mine the same data again with the corpus sharded over N Ray actors)
Generates the data once under --workdir (never commit it; ~1.1 GB at the default size) in a child
process, so the peak RSS reported is the mining run's alone. Prints one table and writes
benchmarks/results/mine_scale.json. The hardware-relative number: speed-up over exact brute force
(FAISS flat), whose time is measured on the recall sample and extrapolated to all queries.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared cores: spinning OpenMP threads starve each other

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def generate(work: Path, nb: int, nq: int, d: int, seed: int = 0, chunk: int = 50_000) -> None:
    """Clustered data on a low-dimensional manifold, like real embeddings: a 32-d latent drawn from
    1,000 overlapping Gaussian clusters, mapped to d dims by a fixed random matrix, plus isotropic
    noise (cos ~0.9 to the noiseless point); 1% of rows are near-duplicates (cos > 0.99) of another.
    A query is its positive's latent + noise, mapped the same way. IVF recall then grows with nprobe
    as on real data (on well-separated clusters every setting scores recall 1.0 and says little)."""
    m = 32
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, d), dtype=np.float32) / np.sqrt(m)
    centers = rng.standard_normal((1000, m), dtype=np.float32)
    embed = lambda z, r: _unit(_unit(z @ A) + 0.5 * _unit(r.standard_normal((len(z), d), dtype=np.float32)))
    xb = np.lib.format.open_memmap(work / "corpus.tmp.npy", "w+", np.float16, (nb, d))
    zs = np.empty((nb, m), np.float32)
    for s in range(0, nb, chunk):
        r = np.random.default_rng([seed, 1, s])
        n = min(chunk, nb - s)
        z = centers[r.integers(0, len(centers), n)] + r.standard_normal((n, m), dtype=np.float32)
        x = embed(z, r)
        dup = np.nonzero(r.random(n) < 0.01)[0]
        src = r.integers(0, n, len(dup))
        x[dup] = _unit(x[src] + 0.05 * _unit(r.standard_normal((len(dup), d), dtype=np.float32)))
        z[dup] = z[src]
        xb[s:s + n], zs[s:s + n] = x, z
    xb.flush()
    pos = np.random.default_rng([seed, 2]).choice(nb, nq, replace=False)
    xq = np.lib.format.open_memmap(work / "queries.tmp.npy", "w+", np.float16, (nq, d))
    for s in range(0, nq, chunk):
        r = np.random.default_rng([seed, 3, s])
        p = pos[s:s + chunk]
        xq[s:s + len(p)] = embed(zs[p] + 0.5 * r.standard_normal((len(p), m), dtype=np.float32), r)
    xq.flush()
    np.save(work / "positives.npy", pos)
    del xb, xq
    os.replace(work / "corpus.tmp.npy", work / "corpus.npy")
    os.replace(work / "queries.tmp.npy", work / "queries.npy")
    (work / "params.json").write_text(json.dumps({"nb": nb, "nq": nq, "d": d, "seed": seed, "data": "latent32"}))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--workdir", default="/tmp/hardrank-bench-mine")
    ap.add_argument("--budget-mb", type=int, default=1024)
    ap.add_argument("--search", default="auto")
    ap.add_argument("--nprobe", type=int, default=None)
    ap.add_argument("--block-size", type=int, default=8192)
    ap.add_argument("--recall-sample", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch and FAISS threads (default: mining's, all cores: hardrank.mining.run.mining_settings)")
    ap.add_argument("--ray-shards", type=int, default=None,
                    help="also mine with the corpus sharded over this many Ray actors (hardrank mine --executor ray)")
    ap.add_argument("--no-local", action="store_true",
                    help="with --ray-shards: skip the local run (a re-measurement of the sharded path alone)")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mine_scale.json"))
    args = ap.parse_args(argv)
    if args.no_local and not args.ray_shards:
        ap.error("--no-local skips the local run in favour of the sharded one: give --ray-shards N too")
    work = Path(args.workdir) / f"latent_{args.corpus}x{args.d}_q{args.queries}"
    work.mkdir(parents=True, exist_ok=True)
    if args.generate_only:
        generate(work, args.corpus, args.queries, args.d)
        return 0
    t0 = time.perf_counter()
    if not (work / "params.json").exists():
        subprocess.run([sys.executable, __file__, "--generate-only", "--corpus", str(args.corpus), "--queries",
                        str(args.queries), "--d", str(args.d), "--workdir", args.workdir], check=True)
    t_gen = time.perf_counter() - t0

    from hardrank.config import MineOptions
    from hardrank.jobs.bench.timing import PeakRSS
    from hardrank.mining import MineProblem
    rss = PeakRSS(interval=0.2).start()  # VmRSS: also counts the memmapped corpus pages, as ru_maxrss would
    t0 = time.perf_counter()
    xb = np.load(work / "corpus.npy", mmap_mode="r")   # (nb, d) float16, on disk
    xq = np.load(work / "queries.npy", mmap_mode="r")  # (nq, d) float16
    pos = np.load(work / "positives.npy")
    nq = len(xq)
    problem = MineProblem(
        xq=xq, xb=xb, query_ids=[f"q{i}" for i in range(nq)], corpus_ids=[f"c{j}" for j in range(len(xb))],
        modality="image", direction="t2i", exclude_ptr=np.arange(nq + 1, dtype=np.int64),
        exclude_idx=pos.astype(np.int64), pos_ptr=np.arange(nq + 1, dtype=np.int64),
        pos_emb=xb[np.sort(pos)][np.argsort(np.argsort(pos))],  # sorted reads from disk, back in query order
        pos_ids=None, meta={"benchmark": "synthetic clustered"})
    t_load = time.perf_counter() - t0
    out = work / "mined"
    opts = MineOptions(k=args.k, search=args.search, budget_mb=args.budget_mb, block_size=args.block_size,
                       nprobe=args.nprobe, recall_sample=args.recall_sample)
    local = not args.no_local
    rows = [_run(problem, opts, out, rss, args, t_gen, t_load, shards=None)] if local else []
    if args.ray_shards:
        rows.append(_run(problem, opts, work / "mined_ray", rss, args, t_gen, t_load, shards=args.ray_shards))
    print(f"{'path':>10} {'corpus x d':>14} {'queries':>8} {'index':>12} {'nprobe':>6} {'R@10':>6} {'build s':>8} "
          f"{'search s':>8} {'total s':>8} {'q/s':>7} {'RSS GB':>14} {'exact est s':>11}")
    for row in rows:
        rss_s = f"{row['peak_rss_gb']:.2f}" + (f" + {max(row['shard_peak_rss_gb']):.2f}/shard"
                                               if row.get("shard_peak_rss_gb") else "")
        print(f"{row['path']:>10} {row['corpus']:>8} x {args.d:<3} {row['queries']:>8} {row['search']:>12} "
              f"{str(row['nprobe']):>6} {row['recall@10'] or 1.0:>6.3f} {row['seconds'].get('index', 0):>8.1f} "
              f"{row['seconds'].get('search', 0):>8.1f} {row['seconds']['mine_total']:>8.1f} "
              f"{row['queries_per_s']:>7.0f} {rss_s:>14} {str(row['exact_bruteforce_estimate_s']):>11}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else []
    runs.extend(rows)
    Path(args.out).write_text(json.dumps(runs, indent=1))
    return 0


def _run(problem, opts, out: Path, rss, args, t_gen: float, t_load: float, shards: int | None) -> dict:
    """One full mining run (output removed first: a full run, not a resume), measured."""
    from hardrank.mining import mine_arrays
    from hardrank.mining.run import mining_settings
    from hardrank.scoring import backends, faiss_index
    from hardrank.scoring.backends.sharded import Sharded

    for f in sorted(out.glob("negatives/*.parquet")) + [out / "mine_run.json", out / "summary.json"]:
        if f.exists():
            f.unlink()
    factory, shard_rss = None, None
    if shards:
        import ray

        from hardrank.executors.ray_search import ShardedSearchFactory

        ray.init(include_dashboard=False, logging_level="WARNING")
        factory = ShardedSearchFactory(shards=shards)
    rss.reset()
    t0 = time.perf_counter()
    try:
        backend = Sharded(backends.get(opts.search_spec), search=factory) if factory is not None else None
        s = mine_arrays(problem, opts, out, echo=lambda m: print(m, file=sys.stderr, flush=True), backend=backend,
                        settings=mining_settings(args.threads))
        t_mine = time.perf_counter() - t0
        if factory is not None:
            shard_rss = [round(b / 2**30, 2) for b in factory._search.peak_rss()]
    finally:
        if factory is not None:
            factory.close()
            ray.shutdown()
    peak = rss.high
    nq, nb = len(problem.xq), len(problem.xb)
    srch = s["search"]
    exact_s = srch.get("exact_seconds")
    exact_est = exact_s / srch["tuning_sample"] * nq if exact_s else None
    return {
        "path": f"ray x{shards}" if shards else "local",
        "corpus": nb, "queries": nq, "d": args.d, "k": args.k, "search": srch.get("factory", srch.get("method")),
        "nprobe": srch.get("nprobe"), "recall@10": srch.get("tuning_recall@10"),
        "written_recall": s.get("recall", {}).get(f"recall@{s['k']}"), "tuning": srch.get("tuning"),
        "seconds": {"generate": round(t_gen, 1), "load": round(t_load, 1), **s["timings"],
                    "mine_total": round(t_mine, 1)},
        "queries_per_s": round(nq / t_mine, 1), "search_queries_per_s": s["throughput"]["queries_per_s"],
        "peak_rss_gb": round(peak / 2**30, 2), "shard_peak_rss_gb": shard_rss,
        "exact_bruteforce_estimate_s": round(exact_est, 1) if exact_est else None,
        "speedup_vs_exact": round(exact_est / t_mine, 1) if exact_est else None,
        "negatives": s["counts"]["negatives"], "queries_short": s["counts"]["queries_short"],
        "dropped": s["counts"]["dropped"], "faiss_threads": faiss_index.faiss.omp_get_max_threads(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_after": os.getloadavg()},
    }


if __name__ == "__main__":
    sys.exit(main())
