"""Threads under contention: the K=4 toy eval and exact mining search, quiet and beside one CPU-bound neighbour.

Usage: python benchmarks/bench_contention.py [--repeats 3] [--only eval|mine] [--json PATH]

Each timing is a fresh process (as a user's command is): the eval is `hardrank eval` on the toy world with
4 toy checkpoints and a cold store (everything decoded and encoded); the mining search is exact top-10
(kernels.topk, the `--search exact` searcher) of 5,000 queries over 50,000 512-d unit vectors, search only.
Sizings: `--threads 2` (what every pool used before on this 2-core machine: all cores), `--threads 1`, and
`auto` (no flag: the default budget; eval looks at the idle cores once at start, mining keeps all cores).
The neighbour is a spawned busy-loop process, started before the run (the case the start-up probe can see).
Other processes share this machine too: the load average and CPU pressure before each timing are recorded,
so "quiet" is only as quiet as the machine was. Writes benchmarks/results/bench_contention.json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hardrank.jobs.bench.timing import timed

ROOT = Path(__file__).resolve().parent.parent
CKPTS = ["toy-clip_step0050", "toy-clip_step0200", "toy-clip_step0400", "toy-clip_step0700"]
SIZINGS = ("2", "1", "auto")

# the mining child: times the exact searcher alone and says which threads it ran with
_MINE = """
import sys
import numpy as np
from hardrank.jobs.bench.timing import timed
from hardrank.scoring.backends.exhaustive import KernelSearch
from hardrank.mining.run import mining_settings
b = mining_settings(None if sys.argv[1] == "auto" else int(sys.argv[1])).budget  # auto: what `hardrank mine` chooses
r = np.random.default_rng(0)
xb = r.standard_normal((50_000, 512), dtype=np.float32); xb /= np.linalg.norm(xb, axis=1, keepdims=True)
xq = r.standard_normal((5_000, 512), dtype=np.float32); xq /= np.linalg.norm(xq, axis=1, keepdims=True)
s = KernelSearch(xb, 1024 << 20)
s(xq[:64], 10, None)  # warm-up: allocator, first-GEMM probe
dt, _ = timed(lambda: s(xq, 10, None))
print(f"SECONDS {dt:.3f} THREADS {b.threads} {b.describe()}")
"""


def _busy() -> None:
    while True:
        pass


def _machine() -> dict:
    pressure = Path("/proc/pressure/cpu")
    return {"loadavg": [round(x, 2) for x in os.getloadavg()],
            "cpu_pressure": pressure.read_text().splitlines()[0] if pressure.exists() else None}


def _eval_once(sizing: str, world: Path, work: Path) -> tuple[float, str]:
    store, out = tempfile.mkdtemp(dir=work), tempfile.mkdtemp(dir=work)
    ck = [str(ROOT / "engine" / "assets" / "toy_checkpoints" / f"{c}.safetensors") for c in CKPTS]
    cmd = [sys.executable, "-m", "hardrank.jobs.cli", "eval", "--model", "toy-clip", "--checkpoint", *ck,
           "--suite", "toy", "--data", str(world), "--store", store, "--out", out, "--device", "cpu"]
    cmd += [] if sizing == "auto" else ["--threads", sizing]
    dt, p = timed(lambda: subprocess.run(cmd, capture_output=True, text=True))  # the wall a user waits
    if p.returncode != 0:
        raise SystemExit(f"eval failed: {p.stderr[-2000:]}")
    m = re.search(r"^threads: (.*)$", p.stderr, re.M)
    return dt, m.group(1) if m else "?"


def _mine_once(sizing: str) -> tuple[float, str]:
    p = subprocess.run([sys.executable, "-c", _MINE, sizing], capture_output=True, text=True)
    m = re.search(r"SECONDS (\S+) THREADS \d+ (.*)$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        raise SystemExit(f"mining search failed: {p.stderr[-2000:]}")
    return float(m.group(1)), m.group(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=["eval", "mine"], default=None)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "bench_contention.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hardrank-contention-"))
    world = work / "toy_world"
    rows = []
    workloads = [w for w in ("eval", "mine") if args.only in (None, w)]
    if "eval" in workloads:  # builds the toy world once, untimed
        _eval_once("auto", world, work)
    for workload in workloads:
        for neighbour in (False, True):
            proc = None
            if neighbour:
                proc = mp.get_context("spawn").Process(target=_busy, daemon=True)
                proc.start()
                time.sleep(1.0)  # let it settle on a core
            try:
                for sizing in SIZINGS:
                    times, chosen, loads = [], set(), []
                    for _ in range(args.repeats):
                        loads.append(_machine())
                        dt, why = _eval_once(sizing, world, work) if workload == "eval" else _mine_once(sizing)
                        times.append(round(dt, 2))
                        chosen.add(why)
                    rows.append({"workload": workload, "neighbour": neighbour, "sizing": sizing, "seconds": times,
                                 "min": min(times), "max": max(times), "threads": sorted(chosen),
                                 "machine_before": loads})
                    print(f"{workload:5s} {'neighbour' if neighbour else 'quiet':9s} {sizing:>4s}: "
                          f"min {min(times):6.2f}s max {max(times):6.2f}s  threads {sorted(chosen)}  "
                          f"load {loads[0]['loadavg'][0]}", flush=True)
            finally:
                if proc is not None:
                    proc.terminate()
                    proc.join()
    print("\nbeside one neighbour / quiet (min over repeats):")
    ratios = {}
    for workload in workloads:
        quiet_best = min(r["min"] for r in rows if r["workload"] == workload and not r["neighbour"])
        for sizing in SIZINGS:
            n = next(r for r in rows if r["workload"] == workload and r["neighbour"] and r["sizing"] == sizing)
            ratios[f"{workload}/{sizing}"] = round(n["min"] / quiet_best, 2)
            print(f"  {workload:5s} {sizing:>4s}: {n['min']:.2f}s / {quiet_best:.2f}s (best quiet) = "
                  f"{n['min'] / quiet_best:.2f}x")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "ratios_vs_best_quiet": ratios, "repeats": args.repeats,
                               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "affinity": len(os.sched_getaffinity(0)), **_machine()},
                               "note": "other engineers' processes share this machine: see loadavg per timing"},
                              indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
