"""Mining past memory: a clip-retrieval corpus larger than RAM, exact pass vs index, the index built once and reused.

Usage: python benchmarks/bench_mining_scale.py [--scale 1] [--rows N] [--d 512] [--queries 2000,100000]
           [--workdir /tmp/hardrank-bench-mining-scale] [--budget-mb 1024] [--recall-sample 1000]
           [--skip-100k] [--generate-only] [--resume] [--out benchmarks/results/mining_scale.json]

--rows defaults to the machine's RAM x 1.25 in fp16 rows (23 GiB RAM, d 512: 30.2M rows, 30.9 GB), times --scale;
--scale also scales the two query sets (at least 200 and 1,000 queries) and the recall sample (at most the smaller
set), so `--scale 0.005` (151k rows, 155 MB) checks the whole sequence in minutes; the result of a run at another
scale than 1 goes to --workdir unless --out names a file. The data is
generated once under --workdir (never commit it) as clip-retrieval writes it: img_emb/img_emb_N.npy (fp16, 1M
rows a part) and metadata/metadata_N.parquet (image_path), plus the query sets as embeddings .parquet files.
Clustered like real embeddings (``bench_mine_scale.generate``'s model: a 32-d latent from 1,000 overlapping
clusters mapped to d dims, plus noise); each query is a corpus row's latent plus noise.

Each run is a `hardrank` child process (its memory its own, sampled: anonymous and file-backed apart, and VmHWM):

  exact   2k   mine the 2,000 queries with --search auto (the planner's choice: an exact pass, expected)
  build+2k     mine them with the index auto would size (--search faiss:F --index-out IDX): the first run builds
  reuse 2k     mine them again from the saved index (--index IDX): the second run, build time saved
  index 100k   mine the 100,000 queries from the saved index
  plan 100k    what auto plans for 100,000 queries without an index (the cost model's estimates; not run)

Figures: wall time, build time, peak anonymous and file-backed memory against start-up + budget + 10%, recall@10 of
the written negatives against an exact search of --recall-sample queries (the run's own figure), the second run's
speed-up over the first. Prints one table; writes JSON.
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
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
_PART = 1_000_000  # rows a clip-retrieval part


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _ram_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("MemTotal:"))


def generate(work: Path, nb: int, d: int, query_sets: list[int], seed: int = 0, chunk: int = 50_000) -> None:
    """The corpus as a clip-retrieval folder and each query set as an embeddings file (``work``)."""
    m = 32
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, d), dtype=np.float32) / np.sqrt(m)
    centers = rng.standard_normal((1000, m), dtype=np.float32)
    cr = work / "cr"
    for sub in ("img_emb", "metadata"):
        (cr / sub).mkdir(parents=True, exist_ok=True)
    parts = -(-nb // _PART)
    width = len(str(parts - 1))
    t0 = time.perf_counter()
    for p in range(parts):
        tag = str(p).zfill(width)
        final = cr / "img_emb" / f"img_emb_{tag}.npy"
        if final.exists() and (cr / "metadata" / f"metadata_{tag}.parquet").exists():
            continue
        lo, hi = p * _PART, min(nb, (p + 1) * _PART)
        tmp = final.with_suffix(".tmp.npy")
        xb = np.lib.format.open_memmap(tmp, "w+", np.float16, (hi - lo, d))
        for s in range(lo, hi, chunk):
            r = np.random.default_rng([seed, 1, s])
            n = min(chunk, hi - s)
            z = centers[r.integers(0, len(centers), n)] + r.standard_normal((n, m), dtype=np.float32)
            xb[s - lo:s - lo + n] = _unit(_unit(z @ A) + 0.5 * _unit(r.standard_normal((n, d), dtype=np.float32)))
        xb.flush()
        del xb
        os.replace(tmp, final)
        pq.write_table(pa.table({"image_path": [f"laion/{p:05d}/{i:09d}.jpg" for i in range(lo, hi)]}),
                       cr / "metadata" / f"metadata_{tag}.parquet")
        print(f"generated part {p + 1}/{parts} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    for nq in query_sets:
        path = work / f"q{nq}.parquet"
        if path.exists():
            continue
        r = np.random.default_rng([seed, 2, nq])
        src = np.sort(r.choice(nb, nq, replace=False))
        z = np.empty((nq, m), np.float32)
        starts = src - src % chunk  # each source row's latent, redrawn as its chunk drew it (the d-dim noise is not)
        for c0 in np.unique(starts):
            rr = np.random.default_rng([seed, 1, int(c0)])
            n = min(chunk, nb - int(c0))
            zz = centers[rr.integers(0, len(centers), n)] + rr.standard_normal((n, m), dtype=np.float32)
            sel = np.flatnonzero(starts == c0)
            z[sel] = zz[src[sel] - c0]
        q = _unit(_unit((z + 0.5 * r.standard_normal((nq, m), dtype=np.float32)) @ A)
                  + 0.5 * _unit(r.standard_normal((nq, d), dtype=np.float32))).astype(np.float32)
        pq.write_table(pa.table({"kind": ["text"] * nq, "id": [f"q{i}" for i in range(nq)],
                                 "embedding": pa.FixedSizeListArray.from_arrays(pa.array(q.reshape(-1)), d)}),
                       path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)
    (work / "params.json").write_text(json.dumps({"rows": nb, "d": d, "queries": query_sets, "seed": seed}))


_CHILD = """
import json, sys, time
from hardrank.jobs.cli import main
from hardrank.mining.memory import MemoryWatch, status
import hardrank.scoring.faiss_index
start = status()
watch = MemoryWatch().start()
t0 = time.perf_counter()
rc = main(sys.argv[1:])
wall = time.perf_counter() - t0
watch.stop()
end = status()
print("BENCH " + json.dumps({"rc": rc, "wall_s": round(wall, 1), "start_anon_mb": round((start.get("RssAnon", 0)
      + start.get("RssShmem", 0)) / 2**20), "start_file_mb": round(start.get("RssFile", 0) / 2**20),
      "peak_anon_mb": round(watch.peak_anon / 2**20), "peak_file_mb": round(watch.peak_file / 2**20),
      "vmhwm_mb": round(end.get("VmHWM", 0) / 2**20)}))
"""


def _run(label: str, args: list[str], log: Path) -> dict:
    """One `hardrank` command in a child process: its wall time and memory, its stderr kept in ``log``."""
    print(f"[{label}] hardrank {' '.join(args)}", file=sys.stderr, flush=True)
    with open(log, "w") as err:
        got = subprocess.run([sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE, stderr=err, text=True)
    line = next((x for x in got.stdout.splitlines() if x.startswith("BENCH ")), None)
    if got.returncode != 0 or line is None:
        raise SystemExit(f"[{label}] failed (exit {got.returncode}); see {log}")
    row = json.loads(line[6:])
    print(f"[{label}] {row['wall_s']:.0f}s", file=sys.stderr, flush=True)
    return row


def _summary(out: Path) -> dict:
    s = json.loads((out / "summary.json").read_text())
    r, srch = s.get("recall", {}), s["search"]
    return {"search": srch.get("factory") or srch.get("method"), "nprobe": srch.get("nprobe"),
            "refine": srch.get("refine"), "tuning_recall@10": srch.get("tuning_recall@10"),
            "written_recall@10": r.get("recall@10"), "recall_sample": r.get("sample"), "plan": srch.get("plan"),
            "timings": s["timings"], "memory": {k: s["memory"].get(k) for k in
                                                ("peak_anon_mb", "peak_file_mb", "start_anon_mb", "aim_mb",
                                                 "within_aim", "peak_rss_mb")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full size (rows, query sets)")
    ap.add_argument("--rows", type=int, default=None, help="corpus rows (default: RAM x 1.25 in fp16 rows, x --scale)")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--queries", default="2000,100000", help="the two query set sizes")
    ap.add_argument("--workdir", default="/tmp/hardrank-bench-mining-scale")
    ap.add_argument("--budget-mb", type=int, default=1024)
    ap.add_argument("--recall-sample", type=int, default=1000)
    ap.add_argument("--skip-100k", action="store_true", help="leave the large query set out")
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--resume", action="store_true", help="keep the runs an earlier call finished (their rows in "
                    "--out and their outputs under --workdir), run the others: e.g. the 100,000-query run after a "
                    "--skip-100k call, from its saved index")
    ap.add_argument("--out", default=None, help="result JSON (default: benchmarks/results/mining_scale.json at "
                    "--scale 1, else in the work folder)")
    args = ap.parse_args(argv)
    if not 0 < args.scale <= 1:
        ap.error(f"--scale must be in (0, 1], got {args.scale}")
    few, many = (int(x) for x in args.queries.split(","))
    if args.scale != 1:
        few, many = max(200, round(few * args.scale)), max(1000, round(many * args.scale))
        args.recall_sample = min(args.recall_sample, few)
    nb = args.rows or int(_ram_bytes() * 1.25 * args.scale // (args.d * 2))
    work = Path(args.workdir) / f"clustered_{nb}x{args.d}"
    if args.out is None:
        args.out = str(ROOT / "benchmarks" / "results" / "mining_scale.json") if args.scale == 1 else \
            str(work / "result.json")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    generate(work, nb, args.d, [few] + ([] if args.skip_100k else [many]))
    t_gen = time.perf_counter() - t0
    if args.generate_only:
        return 0
    from hardrank.config import MineOptions
    from hardrank.scoring.backends.auto import gemm_rate, plan, size_index

    budget = args.budget_mb << 20
    factory = size_index(nb, args.d, budget).factory
    cr = str(work / "cr")
    runs = work / "runs"
    done = {}
    if args.resume and Path(args.out).is_file():
        done = json.loads(Path(args.out).read_text()).get("runs", {})
    elif runs.exists():
        import shutil

        shutil.rmtree(runs)  # full runs, not resumes
    runs.mkdir(exist_ok=True)
    common = ["--corpus", cr, "-k", "10", "--budget-mb", str(args.budget_mb), "--recall-sample",
              str(args.recall_sample), "--no-dup-filter"]
    q = {n: str(work / f"q{n}.parquet") for n in (few, many)}
    rows = {}
    idx = runs / "idx"

    def step(name: str, label: str, tag: str, extra: list[str]) -> None:
        if name in done and (runs / tag / "summary.json").is_file():
            print(f"[{label}] kept from {args.out}", file=sys.stderr, flush=True)
            rows[name] = done[name]
            return
        rows[name] = _run(label, ["mine", *common, *extra, "--out", str(runs / tag)], runs / f"{tag}.log") | \
            _summary(runs / tag)

    step("exact_2k", "exact 2k", "a", ["--queries", q[few]])
    step("build_2k", "build+2k", "b", ["--queries", q[few], "--search", f"faiss:{factory}", "--index-out", str(idx)])
    rows["build_2k"]["index"] = json.loads((idx / "index.json").read_text())
    step("reuse_2k", "reuse 2k", "c", ["--queries", q[few], "--index", str(idx)])
    if not args.skip_100k:
        step("index_100k", "index 100k", "d", ["--queries", q[many], "--index", str(idx)])
    opts = MineOptions(k=10, budget_mb=args.budget_mb, recall_sample=args.recall_sample)
    p = plan(many, (nb, args.d), opts, mapped=True)
    m = rows["build_2k"]["index"]
    result = {
        "corpus": {"rows": nb, "d": args.d, "bytes_fp16": nb * args.d * 2, "ram_bytes": _ram_bytes(),
                   "generate_s": round(t_gen, 1)},
        "factory": factory, "budget_mb": args.budget_mb, "runs": rows,
        "build_s": m["seconds"].get("total"),
        "second_run_speedup": round(rows["build_2k"]["wall_s"] / rows["reuse_2k"]["wall_s"], 2),
        "plan_100k_without_index": {"index": p.index, "why": p.why, "exact_s": p.exact_s, "index_s": p.index_s},
        "gemm_rate": gemm_rate(args.d, "auto"), "gemm_rate_fp32": gemm_rate(args.d, "fp32"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_after": os.getloadavg()},
    }
    print(f"corpus {nb:,} x {args.d} fp16 ({nb * args.d * 2 / 1e9:.1f} GB; RAM {_ram_bytes() / 2**30:.1f} GiB), "
          f"budget {args.budget_mb} MiB, index {factory}")
    print(f"{'run':>11} {'search':>22} {'nprobe':>6} {'refine':>6} {'R@10':>6} {'wall s':>8} {'anon MiB':>9} "
          f"{'aim MiB':>8} {'file MiB':>9} {'VmHWM MiB':>9}")
    for name, r in rows.items():
        mem = r["memory"]
        print(f"{name:>11} {str(r['search']):>22} {str(r['nprobe']):>6} {str(r['refine']):>6} "
              f"{(r['written_recall@10'] or 0):>6.3f} {r['wall_s']:>8.0f} {r['peak_anon_mb']:>9,} "
              f"{(mem['aim_mb'] or 0):>8,.0f} {r['peak_file_mb']:>9,} {r['vmhwm_mb']:>9,}")
    print(f"build {result['build_s']}s; second run from the saved index {result['second_run_speedup']}x faster than "
          f"the first (build + mine); auto for {many:,} queries without an index: {p.index or 'exact'} ({p.why})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
