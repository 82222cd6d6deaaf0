"""Intervals and paired comparisons against the evaluation they come with: 6 checkpoints, 25,000-query suites.

1. The largest toy world (``--images`` 2,016 test images, ~11,000 captions) is evaluated with the toy model's 6
   bundled checkpoints on ``toy-rococo`` (four caption variants, two altered galleries: both directions, every
   view), cold store, intervals off (``bootstrap=0``): the evaluation's own time. The world's build is not
   counted.
2. On those very results, timed apart: intervals (``statistics.annotate`` of each of the 6 results,
   ``--resamples`` bootstrap resamples over the suite's images, every metric) and comparisons (``hardrank
   compare``'s work for the 5 consecutive pairs: every headline metric's interval of the difference, exact
   McNemar or ``--resamples`` permutations, Holm).
3. The same on a COCO-5k-shaped suite: 5,000 images, 25,000 captions (the t2i queries), the same views, outcome
   rows as a random model's for 6 checkpoints (the statistics' cost does not depend on the values).

Prints one table and writes JSON: seconds of each part and their share of the evaluation in 1 (target: under
10%; the toy world cannot describe 25,000 captions, and a 25,000-query evaluation costs more than this one, so
the share in 3 overstates the one it would have).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import hardrank
from hardrank.compare import compare_checkpoints, pick
from hardrank.scoring.results import headline_paths, outcome_schema
from hardrank.scoring.statistics import annotate, compare, holm
from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL, WorldConfig, build_world

TEXT_VIEWS = ("same_concept", "diff_concept", "rand_voca", "danger")
IMAGE_VIEWS = ("mix_0.9_s1", "patch_0.9_s1")


def coco_shaped(seed: int, n_images: int = 5000, per_image: int = 5) -> tuple[dict, pa.Table]:
    """A toy-rococo-shaped result of ``n_images`` x ``per_image`` captions: outcome rows and metrics (R@K,
    false rate, mean rank, drops, mean, rsum) of a random model whose skill grows with ``seed``."""
    rng = np.random.default_rng(seed)
    skill = 0.3 + 0.1 * seed
    parts, metrics = [], {}
    images = np.array([f"val2014/{i:012d}.jpg" for i in range(n_images)], dtype=object)
    captions = np.array([f"caption {i} {j}" for i in range(n_images) for j in range(per_image)], dtype=object)
    owner = np.repeat(images, per_image)
    for task, views, queries, units in (("i2t", TEXT_VIEWS, images, images), ("t2i", IMAGE_VIEWS, captions, owner)):
        for view in ("original", *views):
            n = len(queries)
            rank = np.where(rng.random(n) < skill, 0, rng.integers(1, 50, n))
            fooled = (view != "original") & (rank > 0) & (rng.random(n) < 0.5)
            parts.append(pa.Table.from_pydict({
                "kind": ["ranking"] * n, "task": [task] * n, "view": [view] * n, "query_id": queries, "rank": rank,
                "top1_id": [None] * n, "top1_group": np.where(fooled, view, "original"), "subset": [None] * n,
                "scores": [None] * n, "correct": rank == 0, "unit": units, "verdicts": [None] * n,
            }, schema=outcome_schema()))
            vm = {f"R@{k}": 100.0 * np.mean(rank < k) for k in (1, 5, 10)}
            vm["mean_rank"] = float(np.mean(rank + 1))
            if view != "original":
                vm["false_rate"] = 100.0 * np.mean(fooled)
            metrics.setdefault(view, {})[task] = vm
    o = metrics["original"]
    for view, dirs in metrics.items():
        for d, vm in dirs.items():
            if view != "original":
                vm["drop"] = {k: o[d][k] - vm[k] for k in ("R@1", "R@5", "R@10")}
    o["mean"] = {k: (o["i2t"][k] + o["t2i"][k]) / 2 for k in ("R@1", "R@5", "R@10")}
    o["rsum"] = sum(o[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    return ({"suite": "coco-shaped", "checkpoint": f"step{seed}", "task_type": "ranking", "metrics": metrics},
            pa.concat_tables(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=2016, help="test images of the toy world (~5.5 captions each)")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--work", default=None, help="folder for the world, store and results (default: a temp dir)")
    ap.add_argument("--out", default="bench_stats.json")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_stats_"))
    world = build_world(work / "world", WorldConfig(n_train=10, n_test=args.images, n_inpaint=10))
    ckpts = sorted(str(p) for p in TOY_CHECKPOINTS.glob("*.safetensors"))
    out = work / f"results_{time.time_ns()}"
    t0 = time.perf_counter()
    rep = hardrank.evaluate(model=str(TOY_MODEL), checkpoints=ckpts, suites=["toy-rococo"], data=str(world),
                            out=str(out), store=str(out / "store"), bootstrap=0)
    t_eval = time.perf_counter() - t0
    results = hardrank.read_results(out)
    rows = sum(r.outcomes().num_rows for r in results)
    counts = rep.results[0]["counts"]["original"]
    t0 = time.perf_counter()
    for r in results:
        annotate(r.data, r.outcomes(), resamples=args.resamples, seed=0)
    t_ci = time.perf_counter() - t0
    labels = sorted({r.data["checkpoint"] for r in results})
    t0 = time.perf_counter()
    compared = 0
    for a, b in zip(labels, labels[1:]):
        ca, cb = pick(out, None, a, b)
        compared += len(compare_checkpoints(ca, cb, resamples=args.resamples, seed=0).metrics)
    t_cmp = time.perf_counter() - t0
    synthetic = [coco_shaped(seed) for seed in range(len(ckpts))]
    t0 = time.perf_counter()
    for result, table in synthetic:
        annotate(result, table, resamples=args.resamples, seed=0)
    t_ci25 = time.perf_counter() - t0
    t0 = time.perf_counter()
    compared25 = 0
    for (ra, ta), (rb, tb) in zip(synthetic, synthetic[1:]):
        diffs = compare(ra, ta, rb, tb, paths=list(headline_paths(ra).values()), resamples=args.resamples, seed=0)
        holm([d.p for d in diffs])
        compared25 += len(diffs)
    t_cmp25 = time.perf_counter() - t0
    doc = {"images": args.images, "t2i_queries": counts["t2i"]["queries"], "i2t_queries": counts["i2t"]["queries"],
           "outcome_rows": rows, "checkpoints": len(ckpts), "resamples": args.resamples,
           "eval_seconds": t_eval, "intervals_seconds": t_ci, "compare_seconds": t_cmp, "pairs": len(labels) - 1,
           "metrics_compared": compared, "share": (t_ci + t_cmp) / t_eval,
           "coco_shaped": {"images": 5000, "t2i_queries": 25000,
                           "outcome_rows": sum(t.num_rows for _, t in synthetic),
                           "intervals_seconds": t_ci25, "compare_seconds": t_cmp25, "metrics_compared": compared25,
                           "share_of_toy_eval": (t_ci25 + t_cmp25) / t_eval}}
    print(f"toy-rococo, {args.images} images: {doc['t2i_queries']} t2i + {doc['i2t_queries']} i2t queries per view, "
          f"{rows} outcome rows over {len(ckpts)} checkpoints; {args.resamples} resamples")
    print(f"{'part':<58}{'seconds':>10}{'of eval':>10}")
    for name, s in (("evaluation (cold store, no intervals)", t_eval),
                    ("intervals: 6 results, every metric", t_ci),
                    (f"comparisons: {len(labels) - 1} pairs, {compared} metrics, Holm", t_cmp),
                    ("intervals + comparisons", t_ci + t_cmp),
                    ("25,000-query suite x 6: intervals", t_ci25),
                    (f"25,000-query suite: {len(synthetic) - 1} comparisons, {compared25} metrics", t_cmp25),
                    ("25,000-query suite: intervals + comparisons", t_ci25 + t_cmp25)):
        print(f"{name:<58}{s:>10.2f}{s / t_eval:>9.1%}")
    Path(args.out).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
