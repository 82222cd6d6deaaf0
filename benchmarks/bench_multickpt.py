"""K checkpoints in one embed pass (one decode + K encodes) vs K separate passes, in-process."""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--decoder", default="pillow", choices=["pillow", "dali"])
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"],
                    help="tiny: decode-bound on CPU (as a GPU encoder is); small: encode-bound on CPU")
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-coco"))
    ap.add_argument("--json", default=None, help="default: benchmarks/results/bench_multickpt_<model>.json")
    args = ap.parse_args()
    import torch

    from hardrank.embed import embed_tables
    from hardrank.items import ImageRef, Tables
    from hardrank.jobs.bench.inputs import images_and_models
    from hardrank.jobs.bench.timing import timed
    from hardrank.store.embedding_store import EmbeddingStore

    paths, models, work = images_and_models(args.data, args.images, args.k, args.model)
    threads = os.cpu_count() or 1

    def run(ms, tag):
        tables = Tables.empty()
        tables.images.add_many(ImageRef(p) for p in paths)
        tables.images.keys()  # hashing is the same for both plans: keep it out of the timing
        stores = [EmbeddingStore(work / tag, m.fingerprint, dim=m.embed_dim, dtype=m.store_dtype) for m in ms]
        sec, st = timed(lambda: embed_tables(tables, ms, stores, batch_size=args.batch, decode_threads=threads,
                                             decoder=args.decoder))
        return sec, st["image"].stage_seconds

    run(models[:1], "warm")  # page cache, allocator, DALI/torch init
    joint, joint_stages = run(models, "joint")
    separate = [run([m], f"sep{i}") for i, m in enumerate(models)]
    sep_total = sum(s for s, _ in separate)
    dec = joint_stages.get("decode", 0.0)
    enc = joint_stages.get("encode", 0.0)
    print(f"{args.images} JPEGs 640x480, {args.k} checkpoints of {models[0].arch_name} (224 px), {args.decoder}, "
          f"{threads} threads, torch {torch.get_num_threads()} threads")
    print(f"{'plan':28s} {'seconds':>8s} {'img x ckpt/s':>13s}")
    print(f"{'one pass, K checkpoints':28s} {joint:8.2f} {args.images * args.k / joint:13.1f}")
    print(f"{'K separate passes':28s} {sep_total:8.2f} {args.images * args.k / sep_total:13.1f}")
    print(f"speed-up {sep_total / joint:.2f}x; one pass = decode {dec:.2f}s (once) + encode {enc:.2f}s "
          f"({enc / args.k:.2f}s per checkpoint; decode runs in a thread alongside encode)")
    print(f"separate passes decoded {args.k}x: {sum(s.get('decode', 0) for _, s in separate):.2f}s decode in total")
    out = Path(args.json or f"benchmarks/results/bench_multickpt_{args.model}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "images": args.images, "k": args.k, "decoder": args.decoder, "model": args.model, "joint_s": joint,
        "separate_s": sep_total,
        "speedup": sep_total / joint, "joint_stage_seconds": joint_stages,
        "separate_stage_seconds": [s for _, s in separate],
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "loadavg": os.getloadavg()}}, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
