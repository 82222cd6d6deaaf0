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
    ap.add_argument("--entries", type=int, default=1,
                    help="consecutive calls through one RayRunner, each with its own K checkpoints and stores (a job "
                         "file's entries): the first starts the actors (cold), later ones reuse them (warm)")
    ap.add_argument("--decode-actors", type=int, default=None,
                    help="decode actors feeding a separate encoder actor (the GPU layout); default: the runner's "
                         "choice, on CPUs one actor per node that decodes and encodes")
    ap.add_argument("--json", default="benchmarks/results/bench_ray.json")
    args = ap.parse_args()
    import numpy as np

    from hardrank.embed import embed_tables
    from hardrank.items import ImageRef, Tables
    from hardrank.jobs.bench.inputs import images_and_models
    from hardrank.jobs.bench.timing import Timeline, timed
    from hardrank.store.embedding_store import EmbeddingStore

    paths, all_models, work = images_and_models(args.data, args.images, args.k * args.entries, args.model)
    entry_models = [all_models[e * args.k:(e + 1) * args.k] for e in range(args.entries)]
    models = entry_models[0]
    threads = os.cpu_count() or 1

    def run(tag, timeline, runner=None, models=models):
        tables = Tables.empty()
        tables.images.add_many(ImageRef(p) for p in paths)
        tables.images.keys()  # same for both executors: not timed
        stores = [EmbeddingStore(work / tag, m.fingerprint, dim=m.embed_dim, dtype=m.store_dtype) for m in models]
        timeline.start = time.perf_counter()
        wall, st = timed(lambda: embed_tables(tables, models, stores, batch_size=args.batch, decode_threads=threads,
                                              decoder=args.decoder, runner=runner, progress=timeline))
        assert st["image"].encoded == len(paths), st["image"].as_dict()
        return wall, [s.read("image", tables.images.keys()) for s in stores]

    import ray

    from hardrank.executors.ray_embed import RayRunner

    n = len(paths)
    local_tl = Timeline()
    local_wall, local_emb = run("local", local_tl)
    local_rate = local_tl.rate()
    init_s = timed(lambda: ray.init(include_dashboard=False, logging_level=logging.WARNING))[0]
    runner = RayRunner(decode_actors=args.decode_actors)
    entries, pids = [], []
    for e, ms in enumerate(entry_models):
        tl = Timeline()
        wall, emb = run(f"ray{e}", tl, runner, ms)
        pids.append({name: sorted(w["pid"] for w in ws) for name, ws in runner.workers().items()})
        entries.append({"entry": e + 1, "seconds": wall, "images_per_s": n / wall, "steady_images_per_s": tl.rate(),
                        "first_result_s": tl.events[0][0] - tl.start,
                        "identical": all(np.array_equal(a, b) for a, b in zip(local_emb, emb)) if e == 0 else None})
    runner.close()
    ray.shutdown()
    local_after = None
    if args.entries > 1:  # the load of a shared machine drifts: the in-process run again, after Ray
        after_tl = Timeline()
        after_wall = run("local-after", after_tl)[0]
        local_after = {"seconds": after_wall, "images_per_s": n / after_wall, "steady_images_per_s": after_tl.rate()}
    ref_wall = local_wall if local_after is None else (local_wall + local_after["seconds"]) / 2
    ref_rate = local_rate if local_after is None else (local_rate + local_after["steady_images_per_s"]) / 2
    for r in entries:
        r["overhead"], r["overhead_steady"] = r["seconds"] / ref_wall - 1, ref_rate / r["steady_images_per_s"] - 1
    first = entries[0]
    identical = first["identical"]
    rows = {"in-process": {"seconds": local_wall, "images_per_s": n / local_wall, "steady_images_per_s": local_rate},
            **({"in-process, after Ray": local_after} if local_after else {}),
            "ray (warm cluster)": {k: first[k] for k in ("seconds", "images_per_s", "steady_images_per_s")},
            "ray (incl. ray.init)": {"seconds": first["seconds"] + init_s,
                                     "images_per_s": n / (first["seconds"] + init_s),
                                     "steady_images_per_s": first["steady_images_per_s"]}}
    print(f"{n} JPEGs 640x480 -> {args.k} checkpoints of {models[0].arch_name}, {args.decoder}, {threads} cores, "
          f"batch {args.batch}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'executor':22s} {'seconds':>8s} {'img/s':>8s} {'steady img/s':>13s}")
    for name, r in rows.items():
        print(f"{name:22s} {r['seconds']:8.2f} {r['images_per_s']:8.1f} {r['steady_images_per_s']:13.1f}")
    overhead, steady = first["seconds"] / local_wall - 1, local_rate / first["steady_images_per_s"] - 1
    print(f"Ray overhead: {100 * overhead:+.0f}% end to end on a warm cluster "
          f"({100 * (first['seconds'] + init_s) / local_wall - 100:+.0f}% with ray.init {init_s:.1f}s; first result "
          f"after {first['first_result_s']:.1f}s: worker processes, imports, model loads); {100 * steady:+.0f}% per "
          f"image in steady state (second half of the rows); target <= 10%")
    print(f"embeddings identical to in-process: {identical}")
    if args.entries > 1:
        print(f"\n{args.entries} entries through one RayRunner (entry 1 starts the actors; later entries reuse them "
              f"and load only their own checkpoints), against the mean of the two in-process runs: {ref_wall:.2f} s, "
              f"{ref_rate:.1f} img/s steady")
        print(f"{'entry':>5s} {'actors':>6s} {'seconds':>8s} {'vs local':>9s} {'first result s':>15s} "
              f"{'steady img/s':>13s} {'steady vs local':>16s}")
        for r in entries:
            print(f"{r['entry']:5d} {'cold' if r['entry'] == 1 else 'warm':>6s} {r['seconds']:8.2f} "
                  f"{100 * r['overhead']:+8.0f}% {r['first_result_s']:15.1f} {r['steady_images_per_s']:13.1f} "
                  f"{100 * r['overhead_steady']:+15.0f}%")
        print(f"same actor processes in every entry: {all(p == pids[0] for p in pids)} {pids[0]}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "images": n, "k": args.k, "model": args.model, "decoder": args.decoder, "rows": rows,
        "ray_init_s": init_s, "ray_first_result_s": first["first_result_s"], "overhead_warm": overhead,
        "overhead_steady": steady, "identical": identical, "entries": entries,
        "same_actors": all(p == pids[0] for p in pids), "decode_actors": args.decode_actors, "actors": pids[0],
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "loadavg": os.getloadavg()}}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
