"""Mining's promises measured: peak memory against start-up + 1.5 x (vectors + budget), the recall of the
written negatives, and exact search's time quiet vs beside one CPU-bound neighbour.

Usage: python benchmarks/bench_mining.py [--corpus 200000] [--queries 10000] [--d 512] [--k 10]
           [--budgets 100,1024] [--workdir benchmarks/.data/mining] [--skip-neighbour]
Generates random unit vectors (corpus: kind image, queries: kind text) as two embeddings Parquet files
under --workdir once (~1.6 GB per million x 512 rows; never commit them). Each measurement is one
`hardrank mine` child process, so its summary's peak RSS (VmHWM) is that run's alone:

- one run per --budgets value with --search auto (IVF-PQ when the fp32 corpus exceeds the budget, else
  exact), --no-dup-filter: its peak RSS, start-up RSS, the aim, the recall@k of the written negatives;
- --search exact at the largest budget twice: quiet, then beside a busy-loop process (one core taken); the
  search time of each (summary timings.search) and their ratio (aim: <= 1.6 on 2 cores).

Random unit vectors are the hard case for IVF-PQ (no clusters): the recall there is a floor, not a typical
figure (bench_mine_scale.py mines clustered data). Prints one table, writes benchmarks/results/mining.json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent


def generate(path: Path, n: int, d: int, kind: str, seed: int, chunk: int = 20_000) -> None:
    """``n`` random unit vectors of ``d`` dims, written chunk by chunk (kind, id, embedding fixed_size_list)."""
    schema = pa.schema([("kind", pa.string()), ("id", pa.string()), ("embedding", pa.list_(pa.float32(), d))])
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, schema) as w:
        for s in range(0, n, chunk):
            m = min(chunk, n - s)
            x = np.random.default_rng([seed, s]).standard_normal((m, d), dtype=np.float32)
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            w.write_table(pa.table({"kind": [kind] * m, "id": [f"{kind}{i}" for i in range(s, s + m)],
                                    "embedding": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), d)},
                                   schema=schema))
    os.replace(tmp, path)


def _busy() -> None:
    while True:
        pass


def mine(work: Path, name: str, args, *extra: str) -> dict:
    """One `hardrank mine` child process; its summary.json."""
    out = work / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "hardrank.jobs.cli", "mine", "--corpus", str(work / "corpus.parquet"),
           "--queries", str(work / "queries.parquet"), "--direction", "t2i", "-k", str(args.k), "--no-dup-filter",
           "--out", str(out), "--quiet", *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)  # its figures are read from summary.json
    summary = json.loads((out / "summary.json").read_text())
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    return summary


def row(name: str, s: dict, k: int) -> dict:
    m, r, srch = s["memory"], s.get("recall", {}), s["search"]
    return {"run": name, "search": srch.get("factory") or srch.get("method"), "nprobe": srch.get("nprobe"),
            "budget_mb": m["budget_mb"], "vectors_mb": m["vectors_mb"], "start_rss_mb": m["start_rss_mb"],
            "peak_rss_mb": m["peak_rss_mb"], "aim_mb": m["aim_mb"], "within_aim": m["within_aim"],
            "peak_over_start_mb": round(m["peak_rss_mb"] - m["start_rss_mb"], 1),
            f"recall@{k}": r.get(f"recall@{k}"), "target_met": r.get("met"), "shortfall": r.get("shortfall"),
            "index_s": s["timings"].get("index"), "search_s": s["timings"].get("search"), "wall_s": s["wall_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=int, default=200_000)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--budgets", default="100,1024", help="MiB, comma-separated")
    p.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / ".data" / "mining")
    p.add_argument("--skip-neighbour", action="store_true", help="no quiet / one-neighbour exact search timing")
    args = p.parse_args()
    work = args.workdir / f"{args.corpus}x{args.d}_{args.queries}"
    work.mkdir(parents=True, exist_ok=True)
    for name, n, kind, seed in (("corpus", args.corpus, "image", 0), ("queries", args.queries, "text", 1)):
        if not (work / f"{name}.parquet").exists():
            generate(work / f"{name}.parquet", n, args.d, kind, seed)
    budgets = [int(b) for b in args.budgets.split(",")]
    rows = [row(f"auto@{b}", mine(work, f"auto{b}", args, "--budget-mb", str(b)), args.k) for b in budgets]
    neighbour = None
    if not args.skip_neighbour:
        b = str(max(budgets))
        quiet = row("exact quiet", mine(work, "exact_quiet", args, "--search", "exact", "--budget-mb", b), args.k)
        busy = multiprocessing.get_context("spawn").Process(target=_busy, daemon=True)
        busy.start()
        try:
            loaded = row("exact + 1 busy neighbour",
                         mine(work, "exact_neighbour", args, "--search", "exact", "--budget-mb", b), args.k)
        finally:
            busy.terminate()
            busy.join()
        rows += [quiet, loaded]
        neighbour = {"quiet_search_s": quiet["search_s"], "neighbour_search_s": loaded["search_s"],
                     "ratio": round(loaded["search_s"] / quiet["search_s"], 2) if quiet["search_s"] else None,
                     "aim": 1.6}
    print(f"{args.corpus:,} x {args.d} corpus, {args.queries:,} queries, k {args.k}; {os.cpu_count()} CPUs "
          f"(load average {os.getloadavg()[0]:.1f} at the end)")
    print(f"{'run':<26} {'search':<20} {'budget':>6} {'vectors':>7} {'start':>6} {'peak':>6} {'aim':>6} "
          f"{'recall':>6} {'search s':>8} {'wall s':>7}")
    for r in rows:
        print(f"{r['run']:<26} {str(r['search']):<20} {r['budget_mb']:>6} {r['vectors_mb']:>7.0f} "
              f"{r['start_rss_mb']:>6.0f} {r['peak_rss_mb']:>6.0f} {r['aim_mb']:>6.0f} "
              f"{r[f'recall@{args.k}'] or 0:>6.3f} {r['search_s'] or 0:>8.1f} {r['wall_s']:>7.1f}")
        if r["shortfall"]:
            print(f"  {r['shortfall']}")
    if neighbour:
        print(f"exact search beside one busy neighbour: {neighbour['ratio']}x the quiet time (aim <= 1.6x)")
    res = ROOT / "benchmarks" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "mining.json").write_text(json.dumps({
        "corpus": args.corpus, "queries": args.queries, "d": args.d, "k": args.k, "rows": rows,
        "neighbour": neighbour, "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                            "load_average": os.getloadavg()}}, indent=1))


if __name__ == "__main__":
    main()
