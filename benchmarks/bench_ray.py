"""Ray executor vs the in-process executor on the same embed job (>= 2,000 COCO-sized JPEGs)."""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=4000)
    ap.add_argument("--k", type=int, default=2, help="checkpoints per pass")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--decoder", default="pillow", choices=["pillow", "dali"])
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-coco"))
    ap.add_argument("--json", default="benchmarks/results/bench_ray.json")
    args = ap.parse_args()
    import numpy as np

    from benchmarks._common import Timeline, images_and_models
    from hardrank.embed import embed_tables
    from hardrank.items import ImageRef, Tables
    from hardrank.store import EmbeddingStore

    paths, models, work = images_and_models(args.data, args.images, args.k, args.model)
    threads = os.cpu_count() or 1

    def run(tag, timeline, runner=None):
        tables = Tables.empty()
        tables.images.add_many(ImageRef(p) for p in paths)
        tables.images.keys()  # same for both executors: not timed
        stores = [EmbeddingStore(work / tag, m.fingerprint, dim=m.embed_dim, dtype=m.store_dtype) for m in models]
        t = timeline.start = time.perf_counter()
        st = embed_tables(tables, models, stores, batch_size=args.batch, decode_threads=threads,
                          decoder=args.decoder, runner=runner, progress=timeline)
        wall = time.perf_counter() - t
        assert st["image"].encoded == len(paths), st["image"].as_dict()
        return wall, [s.read("image", tables.images.keys()) for s in stores]

    import ray

    from hardrank.jobs.ray_executor import RayRunner

    n = len(paths)
    local_tl = Timeline()
    local_wall, local_emb = run("local", local_tl)
    t = time.perf_counter()
    ray.init(include_dashboard=False, logging_level=logging.WARNING)
    init_s = time.perf_counter() - t
    ray_tl = Timeline()
    ray_wall, ray_emb = run("ray", ray_tl, RayRunner())
    ray.shutdown()
    identical = all(np.array_equal(a, b) for a, b in zip(local_emb, ray_emb))
    local_rate, ray_rate = local_tl.rate(), ray_tl.rate()
    first = ray_tl.events[0][0] - ray_tl.start
    rows = {"in-process": {"seconds": local_wall, "images_per_s": n / local_wall, "steady_images_per_s": local_rate},
            "ray (warm cluster)": {"seconds": ray_wall, "images_per_s": n / ray_wall, "steady_images_per_s": ray_rate},
            "ray (incl. ray.init)": {"seconds": ray_wall + init_s, "images_per_s": n / (ray_wall + init_s),
                                     "steady_images_per_s": ray_rate}}
    print(f"{n} JPEGs 640x480 -> {args.k} checkpoints of {models[0].arch_name}, {args.decoder}, {threads} cores, "
          f"batch {args.batch}")
    print(f"{'executor':22s} {'seconds':>8s} {'img/s':>8s} {'steady img/s':>13s}")
    for name, r in rows.items():
        print(f"{name:22s} {r['seconds']:8.2f} {r['images_per_s']:8.1f} {r['steady_images_per_s']:13.1f}")
    overhead = ray_wall / local_wall - 1
    steady = local_rate / ray_rate - 1
    print(f"Ray overhead: {100 * overhead:+.0f}% end to end on a warm cluster "
          f"({100 * (ray_wall + init_s) / local_wall - 100:+.0f}% with ray.init {init_s:.1f}s; first result after "
          f"{first:.1f}s: worker processes, imports, model loads); {100 * steady:+.0f}% per image in steady "
          f"state (second half of the rows); target <= 10%")
    print(f"embeddings identical to in-process: {identical}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "images": n, "k": args.k, "model": args.model, "decoder": args.decoder, "rows": rows,
        "ray_init_s": init_s, "ray_first_result_s": first, "overhead_warm": overhead, "overhead_steady": steady,
        "identical": identical, "machine": {"cpu": platform.processor() or platform.machine(),
                                            "cores": os.cpu_count(), "loadavg": os.getloadavg()}}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
