"""`hardrank bench kernels`: our ranking kernels against a bare GEMM, FAISS flat and full-matrix baselines."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from hardrank.config import resolve_device
from hardrank.errors import EXIT_OK, UsageError
from hardrank.jobs.flags import Formatter
from hardrank.kernels import grouped_ranks, topk

from .timing import PeakRSS, sync

__all__ = ["add_kernels_parser", "run_kernels_bench"]

# the bare GEMM's query x gallery tilings tried; the fastest is the limit the kernels are held to
_TILINGS = [(1024, 1024), (2048, 1024), (2048, 2048), (4096, 1024), (1024, 4096), (512, 8192)]
_VARIANT_SIZE = 25000  # items per added gallery group (one RoCOCO caption file)


def add_kernels_parser(bsub) -> None:
    """Register ``hardrank bench kernels`` on the ``bench`` sub-parsers."""
    p = bsub.add_parser("kernels", help="ranking kernels vs bare GEMM, FAISS IndexFlatIP top-10, full-matrix baselines",
                        formatter_class=Formatter,
                        epilog="examples:\n"
                               "  hardrank bench kernels                      # COCO-shaped RoCOCO i2t, all views\n"
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


def _tilings(text: str | None) -> list[tuple[int, int]]:
    if not text:
        return _TILINGS
    try:
        tiling = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        tiling = ()
    if len(tiling) != 2 or min(tiling) < 1:
        raise UsageError(f"--gemm-tiling must be two positive sizes like 4096x1024, got {text!r}")
    return [tiling]


class _Problem:
    """A COCO-shaped ranking problem: ``xq (nq, d)`` queries against ``xb (nb, d)``, a clean group
    of ``nb0`` items then ``variants`` added groups, ``npos`` positives per query in the clean group."""

    def __init__(self, args, dev: torch.device):
        self.dev = dev
        self.dtype = torch.float16 if dev.type == "cuda" else torch.float32
        g = torch.Generator().manual_seed(0)
        self.nq, n0, self.d = args.nq, args.nb, args.d
        self.nb = n0 + args.variants * _VARIANT_SIZE
        norm = torch.nn.functional.normalize
        self.xq = norm(torch.randn(self.nq, self.d, generator=g), dim=1).to(dev, self.dtype)  # (nq, d)
        self.xb = norm(torch.randn(self.nb, self.d, generator=g), dim=1).to(dev, self.dtype)  # (nb, d)
        self.bounds = torch.tensor([0, n0] + [n0 + (i + 1) * _VARIANT_SIZE for i in range(args.variants)], device=dev)
        self.npos = min(args.positives, max(1, n0 // max(self.nq, 1)))
        q = torch.arange(self.nq, device=dev)
        self.pos_idx = (q[:, None] * self.npos + torch.arange(self.npos, device=dev)).reshape(-1) % n0
        self.pos_ptr = torch.arange(self.nq + 1, device=dev) * self.npos

    def bare_gemm(self, qb: int = 2048, gb: int = 1024) -> None:
        """Every (qb, gb) score tile into one reused buffer, nothing else done."""
        out = torch.empty((qb, gb), device=self.dev, dtype=torch.float32 if self.dev.type == "cpu" else self.dtype)
        for q0 in range(0, self.nq, qb):
            a = self.xq[q0:q0 + qb]
            for c0 in range(0, self.nb, gb):
                b = self.xb[c0:c0 + gb]
                torch.mm(a, b.T, out=out[:len(a), :len(b)])

    def full_argsort(self, m: int):
        """RoCOCO/BLIP reference style: whole score matrix, argsort each row."""
        s = self.xq[:m].float() @ self.xb.float().T
        order = torch.argsort(s, dim=1, descending=True, stable=True)
        pos = self.pos_idx.view(self.nq, self.npos)[:m]
        hit = (order[:, :, None] == pos[:, None, :]).any(-1)
        return hit.float().argmax(1)

    def full_onehot(self, m: int, k: int = 10):
        """CLIP_benchmark style: whole matrix, topk, one-hot of (Q, k, N)."""
        s = self.xq[:m].float() @ self.xb.float().T
        top = s.topk(k, dim=1).indices
        onehot = torch.zeros((m, k, self.nb), dtype=torch.bool, device=self.dev)
        onehot.scatter_(2, top[:, :, None], True)
        pos = torch.zeros((m, self.nb), dtype=torch.bool, device=self.dev)
        pos.scatter_(1, self.pos_idx.view(self.nq, self.npos)[:m], True)
        return (onehot & pos[:, None, :]).any(-1).any(-1)

    def faiss_flat(self) -> None:
        from hardrank.faiss_search import faiss_topk  # faiss: heavy, imported by that module alone

        faiss_topk(self.xq.float().cpu().numpy(), self.xb.float().cpu().numpy(), 10, factory="Flat", gpu="auto")


def _time(fn, dev: torch.device, repeat: int, warmup: bool) -> tuple[float, int]:
    """Best seconds of ``repeat`` runs and the peak extra memory (bytes) over them."""
    if warmup:
        fn()  # warm-up (and torch.compile, where used)
        sync(dev)
    best, peak = float("inf"), 0
    for _ in range(repeat):
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with PeakRSS() as mem:
            t = time.perf_counter()
            fn()
            sync(dev)
            best = min(best, time.perf_counter() - t)
        peak = max(peak, (torch.cuda.max_memory_allocated() - base) if dev.type == "cuda" else mem.peak)
    return best, peak


def run_kernels_bench(args) -> int:
    """Time each method on one problem, print the table, write the JSON to ``args.out``."""
    dev = torch.device(resolve_device(args.device))
    tilings = _tilings(args.gemm_tiling)
    pb = _Problem(args, dev)
    nq, nb, d = pb.nq, pb.nb, pb.d
    budget = args.budget_mb << 20
    flops = 2.0 * nq * nb * d

    # the GEMM limit: the fastest of a few tilings (each output tile reused, nothing else done)
    gemm_times = {}
    for qb, gb in tilings:
        if len(tilings) > 1:
            pb.bare_gemm(qb, gb)
            sync(dev)
        t = time.perf_counter()
        pb.bare_gemm(qb, gb)
        sync(dev)
        gemm_times[(qb, gb)] = time.perf_counter() - t
    best_tiling = min(gemm_times, key=gemm_times.get)

    m = min(args.baseline_queries, nq)
    methods = [  # (key, name, run, time scale to nq queries, what it returns)
        ("gemm", f"bare GEMM (best tiling {best_tiling[0]}x{best_tiling[1]})", lambda: pb.bare_gemm(*best_tiling),
         1.0, "-"),
        ("grouped", "hardrank grouped_ranks (all views)",
         lambda: grouped_ranks(pb.xq, pb.xb, pb.bounds, pb.pos_ptr, pb.pos_idx, budget_bytes=budget), 1.0,
         "exact ranks"),
        ("topk", "hardrank topk k=10", lambda: topk(pb.xq, pb.xb, 10, budget_bytes=budget), 1.0, "exact top-10"),
        ("faiss", "FAISS IndexFlatIP top-10", pb.faiss_flat, 1.0, "top-10 only"),
        ("argsort", f"full matrix + argsort ({m} q, scaled)", lambda: pb.full_argsort(m), nq / m, "exact ranks"),
        ("onehot", f"full matrix + topk + one-hot ({m} q, scaled)", lambda: pb.full_onehot(m), nq / m, "R@10 only"),
    ]
    rows = []
    for key, name, fn, scale, what in methods:
        if key in args.skip:
            continue
        best, peak = _time(fn, dev, args.repeat, not args.no_warmup)
        rows.append({"method": name, "key": key, "seconds": best * scale, "measured_seconds": best,
                     "scale": scale, "peak_extra_mb": peak / 2**20, "returns": what})
    t_gemm = next((r["seconds"] for r in rows if r["key"] == "gemm"), None)
    emb_mb = (pb.xq.numel() + pb.xb.numel()) * pb.xq.element_size() / 2**20
    print(f"{nq} queries x {nb} gallery ({args.variants} added groups), d={d}, {dev} {pb.dtype}, "
          f"torch threads {torch.get_num_threads()}; embeddings {emb_mb:.0f} MB, tile budget {args.budget_mb} MB")
    print(f"{'method':<44} {'seconds':>9} {'GFLOP/s':>8} {'x GEMM':>7} {'peak MB':>8}  returns")
    for r in rows:
        r["gflops"] = flops / r["seconds"] / 1e9
        r["ratio_to_gemm_time"] = r["seconds"] / t_gemm if t_gemm else None
        ratio = f"{r['ratio_to_gemm_time']:.2f}" if t_gemm else "-"
        print(f"{r['method']:<44} {r['seconds']:9.3f} {r['gflops']:8.1f} {ratio:>7} {r['peak_extra_mb']:8.0f}  "
              f"{r['returns']}")
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
           "shape": {"nq": nq, "nb": nb, "d": d, "groups": args.variants + 1, "dtype": str(pb.dtype),
                     "embeddings_mb": emb_mb, "budget_mb": args.budget_mb}, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")
    return EXIT_OK
