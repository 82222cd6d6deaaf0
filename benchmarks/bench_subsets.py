"""Lite subsets against the full suites: how well a subset ranks the toy model's 6 checkpoints, and at what cost.

The default toy world (1,000 test images) is evaluated with the 6 bundled checkpoints on ``toy-rococo``,
``toy-hard-positives`` and ``toy-classify``: once in full, then with ``--subset N --seed S`` for each N of
``--sizes`` and S of ``--seeds``, each from a cold store. Per suite and size: Kendall's tau (tau-b) between the
checkpoints' order by the subset's main metric (the leaderboard's) and by the full suite's, its mean and
minimum over the seeds, and the cost: seconds of the run and items embedded, as a fraction of the full run's.
Prints one table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from itertools import combinations
from pathlib import Path

import numpy as np

import hardrank
from hardrank.jobs.report.tables import main_metric
from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL, WorldConfig, build_world

SUITES = ["toy-rococo", "toy-hard-positives", "toy-classify"]


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two equally long lists (ties in either count as neither agreeing nor not)."""
    conc = disc = tx = ty = 0
    for i, j in combinations(range(len(x)), 2):
        a, b = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if a == 0 and b == 0:
            continue
        if a == 0:
            tx += 1
        elif b == 0:
            ty += 1
        elif a == b:
            conc += 1
        else:
            disc += 1
    den = np.sqrt((conc + disc + tx) * (conc + disc + ty))
    return float((conc - disc) / den) if den else float("nan")


def _run(world: Path, work: Path, ckpts: list[str], **options) -> tuple[dict, float, int]:
    out = work / f"r{time.time_ns()}"
    t0 = time.perf_counter()
    rep = hardrank.evaluate(model=str(TOY_MODEL), checkpoints=ckpts, suites=SUITES, data=str(world), out=str(out),
                            store=str(out / "store"), bootstrap=0, **options)
    seconds = time.perf_counter() - t0
    mains = {}
    for r in rep.results:
        mains.setdefault(r["suite"], {})[r["checkpoint"]] = main_metric(r)[1]
    embedded = sum(s.get("encoded", 0) for s in rep.embed_stats.values())
    return mains, seconds, embedded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100, 200, 400])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default="bench_subsets.json")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_subsets_"))
    world = build_world(work / "world", WorldConfig())
    ckpts = sorted(str(p) for p in TOY_CHECKPOINTS.glob("*.safetensors"))
    full, full_s, full_items = _run(world, work, ckpts)
    labels = sorted(full[SUITES[0]])
    rows = []
    for n in args.sizes:
        taus = {s: [] for s in SUITES}
        secs, items = [], []
        for seed in args.seeds:
            sub, s, k = _run(world, work, ckpts, subset=n, seed=seed)
            secs.append(s)
            items.append(k)
            for suite in SUITES:
                taus[suite].append(kendall_tau_b([full[suite][c] for c in labels], [sub[suite][c] for c in labels]))
        rows.append({"units": n, "seconds": float(np.mean(secs)), "cost": float(np.mean(secs)) / full_s,
                     "embedded": float(np.mean(items)), "embedded_share": float(np.mean(items)) / full_items,
                     "tau_mean": {s: float(np.nanmean(t)) for s, t in taus.items()},
                     "tau_min": {s: float(np.nanmin(t)) for s, t in taus.items()}})
    print(f"full suites: {full_s:.1f} s, {full_items} items embedded (x {len(ckpts)} checkpoints); "
          f"{len(args.seeds)} seeds per size")
    head = f"{'units':>6}{'time':>8}{'embedded':>10}" + "".join(f"{s + ' tau':>24}" for s in SUITES)
    print(head)
    for r in rows:
        taus = "".join(f"{r['tau_mean'][s]:>15.2f} (min {r['tau_min'][s]:>4.2f})" for s in SUITES)
        print(f"{r['units']:>6}{r['cost']:>8.0%}{r['embedded_share']:>10.0%}{taus}")
    Path(args.out).write_text(json.dumps({"full_seconds": full_s, "full_embedded": full_items,
                                          "checkpoints": labels, "full_main": full, "sizes": rows}, indent=2))


if __name__ == "__main__":
    main()
