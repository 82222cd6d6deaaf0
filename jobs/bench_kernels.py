"""`hardrank bench kernels`: our ranking kernels against a bare GEMM, FAISS flat and full-matrix baselines."""
from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path

__all__ = ["add_kernels_bench", "run_kernels_bench"]


def add_kernels_bench(bsub) -> None:
    p = bsub.add_parser("kernels", help="ranking kernels vs bare GEMM, FAISS IndexFlatIP top-10, full-matrix baselines",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  hardrank bench kernels                      # COCO-shaped RoCOCO i2t, all views\n"
                               "  hardrank bench kernels --nq 100000 --nb 100000 --variants 0\n"
                               "  hardrank bench kernels --device cuda")
    p.add_argument("--nq", type=int, default=5000, help="queries (RoCOCO i2t: 5,000 images)")
    p.add_argument("--nb", type=int, default=25010, help="clean gallery (25,010 captions)")
    p.add_argument("--variants", type=int, default=4, help="added groups of 25,000 items (RoCOCO: 4 caption files)")
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--positives", type=int, default=5, help="positives per query")
    p.add_argument("--baseline-queries", type=int, default=500,
                   help="queries for the full-matrix baselines (they hold a queries x gallery matrix); "
                        "their time is scaled to --nq")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--budget-mb", type=int, default=256, help="kernel tile budget")
    p.add_argument("--repeat", type=int, default=2, help="timed runs per method (best is kept), after a warm-up")
    p.add_argument("--skip", nargs="*", default=[], help="methods to skip (gemm grouped topk faiss argsort onehot)")
    p.add_argument("--gemm-tiling", default=None, metavar="QxG",
                   help="time the bare GEMM with this tiling only (e.g. 4096x1024) instead of the fastest of six")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed first run (large shapes)")
    p.add_argument("--out", default="benchmarks/results/bench_kernels.json")
    p.set_defaults(func=run_kernels_bench)


class _PeakRSS:
    """Peak resident memory above the level at entry, sampled every 2 ms (CPU runs)."""

    def __init__(self):
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        self.base = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss() - self.base)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss() - self.base)


def run_kernels_bench(args) -> int:
    import torch

    from hardrank.kernels import grouped_ranks, topk

    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                       ("cpu" if args.device == "auto" else args.device))
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)
    nq, n0, nv, d = args.nq, args.nb, 25000, args.d
    nb = n0 + args.variants * nv
    xq = torch.nn.functional.normalize(torch.randn(nq, d, generator=g), dim=1).to(dev, dtype)
    xb = torch.nn.functional.normalize(torch.randn(nb, d, generator=g), dim=1).to(dev, dtype)
    bounds = torch.tensor([0, n0] + [n0 + (i + 1) * nv for i in range(args.variants)], device=dev)
    npos = min(args.positives, max(1, n0 // max(nq, 1)))
    pos_idx = (torch.arange(nq, device=dev)[:, None] * npos + torch.arange(npos, device=dev)).reshape(-1) % n0
    pos_ptr = torch.arange(nq + 1, device=dev) * npos
    budget = args.budget_mb << 20
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    flops = 2.0 * nq * nb * d

    def bare_gemm(qb=2048, gb=1024):
        out = torch.empty((qb, gb), device=dev, dtype=torch.float32 if dev.type == "cpu" else dtype)
        for q0 in range(0, nq, qb):
            a = xq[q0:q0 + qb]
            for c0 in range(0, nb, gb):
                b = xb[c0:c0 + gb]
                torch.mm(a, b.T, out=out[:len(a), :len(b)])

    # the GEMM limit: the fastest of a few tilings (each output tile reused, nothing else done)
    tilings = [(1024, 1024), (2048, 1024), (2048, 2048), (4096, 1024), (1024, 4096), (512, 8192)]
    if args.gemm_tiling:
        try:
            tilings = [tuple(int(v) for v in args.gemm_tiling.lower().split("x"))]
        except ValueError:
            raise ValueError(f"--gemm-tiling must look like 4096x1024, got {args.gemm_tiling!r}") from None
    gemm_times = {}
    for qb, gb in tilings:
        if len(tilings) > 1:
            bare_gemm(qb, gb)
            sync()
        t = time.perf_counter()
        bare_gemm(qb, gb)
        sync()
        gemm_times[(qb, gb)] = time.perf_counter() - t
    best_tiling = min(gemm_times, key=gemm_times.get)

    m = min(args.baseline_queries, nq)

    def full_argsort():  # RoCOCO/BLIP reference style: whole score matrix, argsort each row
        s = xq[:m].float() @ xb.float().T
        order = torch.argsort(s, dim=1, descending=True, stable=True)
        pos = pos_idx.view(nq, npos)[:m]
        hit = (order[:, :, None] == pos[:, None, :]).any(-1)
        return hit.float().argmax(1)

    def full_onehot():  # CLIP_benchmark style: whole matrix, topk, one-hot of (Q, k, N)
        s = xq[:m].float() @ xb.float().T
        k = 10
        top = s.topk(k, dim=1).indices
        onehot = torch.zeros((m, k, nb), dtype=torch.bool, device=dev)
        onehot.scatter_(2, top[:, :, None], True)
        pos = torch.zeros((m, nb), dtype=torch.bool, device=dev)
        pos.scatter_(1, pos_idx.view(nq, npos)[:m], True)
        return (onehot & pos[:, None, :]).any(-1).any(-1)

    def faiss_flat():
        from hardrank.faiss_search import faiss_topk

        faiss_topk(xq.float().cpu().numpy(), xb.float().cpu().numpy(), 10, factory="Flat", gpu="auto")

    methods = [
        ("gemm", f"bare GEMM (best tiling {best_tiling[0]}x{best_tiling[1]})", lambda: bare_gemm(*best_tiling), 1.0,
         "-"),
        ("grouped", "hardrank grouped_ranks (all views)", lambda: grouped_ranks(xq, xb, bounds, pos_ptr, pos_idx,
                                                                                budget_bytes=budget), 1.0, "exact ranks"),
        ("topk", "hardrank topk k=10", lambda: topk(xq, xb, 10, budget_bytes=budget), 1.0, "exact top-10"),
        ("faiss", "FAISS IndexFlatIP top-10", faiss_flat, 1.0, "top-10 only"),
        ("argsort", f"full matrix + argsort ({m} q, scaled)", full_argsort, nq / m, "exact ranks"),
        ("onehot", f"full matrix + topk + one-hot ({m} q, scaled)", full_onehot, nq / m, "R@10 only"),
    ]
    rows = []
    for key, name, fn, scale, what in methods:
        if key in args.skip:
            continue
        if not args.no_warmup:
            fn()  # warm-up (and torch.compile, where used)
            sync()
        best, peak = float("inf"), 0
        for _ in range(args.repeat):
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            with _PeakRSS() as mem:
                t = time.perf_counter()
                fn()
                sync()
                best = min(best, time.perf_counter() - t)
            peak = max(peak, (torch.cuda.max_memory_allocated() - base) if dev.type == "cuda" else mem.peak)
        rows.append({"method": name, "key": key, "seconds": best * scale, "measured_seconds": best,
                     "scale": scale, "peak_extra_mb": peak / 2**20, "returns": what})
    t_gemm = next((r["seconds"] for r in rows if r["key"] == "gemm"), None)
    emb_mb = (xq.numel() + xb.numel()) * xq.element_size() / 2**20
    print(f"{nq} queries x {nb} gallery ({args.variants} added groups), d={d}, {dev} {dtype}, "
          f"torch threads {torch.get_num_threads()}; embeddings {emb_mb:.0f} MB, tile budget {args.budget_mb} MB")
    print(f"{'method':<44} {'seconds':>9} {'GFLOP/s':>8} {'x GEMM':>7} {'peak MB':>8}  returns")
    for r in rows:
        r["gflops"] = flops / r["seconds"] / 1e9
        r["ratio_to_gemm_time"] = r["seconds"] / t_gemm if t_gemm else None
        ratio = f"{r['ratio_to_gemm_time']:.2f}" if t_gemm else "-"
        print(f"{r['method']:<44} {r['seconds']:9.3f} {r['gflops']:8.1f} {ratio:>7} {r['peak_extra_mb']:8.0f}  {r['returns']}")
    by = {r["key"]: r for r in rows}
    if "gemm" in by and "grouped" in by:
        print(f"grouped_ranks reaches {100 * by['gemm']['seconds'] / by['grouped']['seconds']:.0f}% of bare GEMM "
              f"throughput (aim >= 85%)")
    if "faiss" in by and "grouped" in by:
        print(f"grouped_ranks vs FAISS flat top-10: {by['faiss']['seconds'] / by['grouped']['seconds']:.2f}x")
    if "argsort" in by and "grouped" in by:
        print(f"grouped_ranks vs full argsort: {by['argsort']['seconds'] / by['grouped']['seconds']:.1f}x faster")
    out = {"machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                       "device": str(dev), "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
                       "torch": torch.__version__, "threads": torch.get_num_threads()},
           "gemm_tilings_seconds": {f"{a}x{b}": t for (a, b), t in gemm_times.items()},
           "shape": {"nq": nq, "nb": nb, "d": d, "groups": args.variants + 1, "dtype": str(dtype),
                     "embeddings_mb": emb_mb, "budget_mb": args.budget_mb}, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    return 0
