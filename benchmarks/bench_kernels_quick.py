"""Quick speed check of the kernels against a bare tiled GEMM and a full-matrix baseline.

Usage: python benchmarks/bench_kernels_quick.py [--nq 5000] [--nb 25010] [--d 512] [--sweep] [--device cpu]
Prints one table and writes benchmarks/results/bench_kernels_quick.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from hardrank.jobs.bench.timing import bare_gemm, best_of, interleaved, timed
from hardrank.kernels import grouped_ranks, topk
from hardrank.kernels._common import plan_tiles

OUT = Path(__file__).resolve().parent / "results"


def full_matrix_ranks(xq, xb, pos_first):
    """Naive baseline: the full score matrix, a descending argsort per row, the positive's position."""
    S = xq.float() @ xb.float().T  # (nq, nb)
    order = torch.argsort(S, dim=1, descending=True, stable=True)
    return (order == pos_first[:, None]).int().argmax(1)


def coco_like(nq, nb, d, device, dtype, seed=0):
    """Random unit vectors shaped like COCO i2t: query i owns gallery items [5i, 5i + 5) (the last
    queries take what is left over: 25,010 = 4,990 x 5 + 10 x 6), the gallery cut in two groups."""
    g = torch.Generator().manual_seed(seed)
    xq = torch.nn.functional.normalize(torch.randn(nq, d, generator=g), dim=1).to(device, dtype)
    xb = torch.nn.functional.normalize(torch.randn(nb, d, generator=g), dim=1).to(device, dtype)
    per = max(1, nb // nq)
    lens = torch.full((nq,), per)
    extra = nb - per * nq
    if extra > 0:
        lens[nq - extra:] += 1  # never more than nb - per * nq < nq
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)])
    idx = torch.arange(int(ptr[-1])) % nb
    bounds = torch.tensor([0, nb // 2, nb])
    return xq, xb, bounds, ptr, idx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nq", type=int, default=5000)
    ap.add_argument("--nb", type=int, default=25010)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="time with process CPU time instead of wall time: on a shared machine with "
                         "--threads 1 this ignores time spent descheduled")
    ap.add_argument("--baseline-nq", type=int, default=500, help="queries for the full-matrix baseline")
    ap.add_argument("--q-block", type=int, default=None)
    ap.add_argument("--g-block", type=int, default=None)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16", "auto"],
                    help="the kernels' first GEMM (the bare GEMM is fp32: bf16/fp16 show the low-precision "
                         "path against the fp32 limit)")
    ap.add_argument("--sweep", action="store_true", help="also time grouped_ranks over a grid of block sizes")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="also time grouped_ranks with the torch.compile'd tile reduction (CPU)")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_clock else time.perf_counter
    device = torch.device(args.device)
    xq, xb, bounds, ptr, idx = coco_like(args.nq, args.nb, args.d, device, getattr(torch, args.dtype))
    nq, nb, d = args.nq, args.nb, args.d
    flop = 2.0 * nq * nb * d
    budget = 64 << 20
    plan = plan_tiles(nq, budget, args.q_block, args.g_block, nb)  # the fp32 path's plan
    qb, gb = plan.q_block, plan.g_block
    rows = []

    def gr():
        grouped_ranks(xq, xb, bounds, ptr, idx, budget_bytes=budget, q_block=args.q_block, g_block=args.g_block,
                      precision=args.precision)

    def record(name, t, n_flop=flop, note=""):
        rows.append({"stage": name, "seconds": t, "gflops": n_flop / t / 1e9, "note": note})

    def bare():  # the fp32 GEMM of the kernels' blocks, nothing else
        bare_gemm(xq, xb, qb, gb, torch.float32)

    # warm-up (thread pools, allocator), then alternate so drifting machine load hits all alike
    bare_gemm(xq[:256], xb, qb, gb, torch.float32)
    os.environ["HARDRANK_COMPILE"] = "0"  # eager reduction
    gr()
    t = interleaved({"bare": bare, "eager": gr}, device, args.reps, warmup=0, clock=clock)
    t_bare = min(t["bare"])
    record("bare tiled GEMM", t_bare, note=f"q_block={qb} g_block={gb}")
    record("grouped_ranks (eager)", min(t["eager"]))
    if args.compile and device.type == "cpu":
        os.environ["HARDRANK_COMPILE"] = "1"
        t_compile = timed(gr, device)[0]  # compiles
        t = interleaved({"bare": bare, "compiled": gr}, device, args.reps, warmup=0, clock=clock)
        t_bare = min(t_bare, *t["bare"])
        rows[0].update(seconds=t_bare, gflops=flop / t_bare / 1e9)
        record("grouped_ranks (compiled)", min(t["compiled"]), note=f"first call incl. compile {t_compile:.1f}s")
    topk(xq[:64], xb, 10, precision=args.precision)
    record("topk k=10", best_of(lambda: topk(xq, xb, 10, budget_bytes=budget, q_block=args.q_block,
                                             g_block=args.g_block, precision=args.precision),
                                device, args.reps, warmup=0, clock=clock))
    bq = min(args.baseline_nq, nq)
    pos_first = idx[ptr[:bq]].to(device)  # smallest positive index; random data: no ties
    record(f"full matrix + argsort ({bq} queries)",
           best_of(lambda: full_matrix_ranks(xq[:bq], xb, pos_first), device, args.reps, warmup=0, clock=clock),
           2.0 * bq * nb * d)

    if args.sweep:
        os.environ["HARDRANK_COMPILE"] = "1" if args.compile else "0"
        for sq in (512, 768, 1024, 1536, 2048):
            for sg in (512, 768, 1024, 1536):
                if sq * sg * 8 > (256 << 20):
                    continue
                t_b = best_of(lambda: bare_gemm(xq, xb, sq, sg, torch.float32), device, args.reps, warmup=0,
                              clock=clock)
                t_g = best_of(lambda: grouped_ranks(xq, xb, bounds, ptr, idx, budget_bytes=256 << 20,
                                                    q_block=sq, g_block=sg, precision=args.precision),
                              device, args.reps, warmup=0, clock=clock)
                rows.append({"stage": f"sweep q_block={sq} g_block={sg}", "seconds": t_g, "gflops": flop / t_g / 1e9,
                             "note": f"bare {flop / t_b / 1e9:.0f} GFLOP/s, ratio {t_b / t_g:.2f}"})

    bare = rows[0]["gflops"]
    clock = "process CPU time" if args.cpu_clock else "wall time"
    print(f"{nq} x {nb} x {d} {args.dtype} on {device} ({torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, {clock})")
    print(f"{'stage':42s} {'seconds':>9s} {'GFLOP/s':>9s} {'vs bare':>8s}  note")
    for r in rows:
        r["ratio_to_bare"] = r["gflops"] / bare
        print(f"{r['stage']:42s} {r['seconds']:9.3f} {r['gflops']:9.1f} {r['ratio_to_bare']:8.2f}  {r['note']}")
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / "bench_kernels_quick.json"
    meta = {"nq": nq, "nb": nb, "d": d, "dtype": args.dtype, "precision": args.precision, "device": str(device),
            "threads": torch.get_num_threads(), "clock": clock, "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "q_block": qb, "g_block": gb}
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
