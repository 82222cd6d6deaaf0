"""Decode + preprocess throughput per core: DALI CPU-only vs Pillow + torchvision (open_clip's transform)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--size", type=int, default=224, help="model input size (ViT-B/32: 224)")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--naive", action="store_true", help="also time the transform run image by image")
    ap.add_argument("--core", type=int, default=0, help="pin the process to this core (per-core numbers)")
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-coco"))
    ap.add_argument("--json", default="benchmarks/results/bench_decode.json")
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.core})
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from hardrank.embed import PillowDecoder
    from hardrank.encoding.dali import DaliDecoder
    from hardrank.items import ImageRef
    from hardrank.jobs.bench.inputs import coco_like_jpegs
    from hardrank.jobs.bench.timing import interleaved

    paths = coco_like_jpegs(args.data, args.images)
    refs = [ImageRef(p) for p in paths]
    cfg = {"size": args.size, "mode": "RGB", "mean": [0.48145466, 0.4578275, 0.40821073],
           "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic", "resize_mode": "shortest",
           "fill_color": 0}
    stages = {"pillow+torchvision": PillowDecoder(cfg, threads=1),
              "dali-cpu": DaliDecoder(cfg, threads=1, batch_size=args.batch, device="cpu"),
              "pillow-draft": PillowDecoder(cfg, threads=1, draft=True)}
    if args.naive:  # torchvision's transform image by image (the engine's decoder before batching ToTensor+Normalize)
        from hardrank.embed import make_transform
        from hardrank.items import decode_image

        tr = make_transform(cfg)
        stages["per-image transform"] = lambda b: {"ok": np.array([tr(decode_image(r)) is not None for r in b["ref"]])}

    def run(stage):
        for s in range(0, len(refs), args.batch):
            out = stage({"ref": refs[s:s + args.batch]})
            assert out["ok"].all()

    # a warm-up round (page cache, pipeline build, allocator), then rounds in turn, so load from other
    # processes hits every backend alike
    times = interleaved({name: lambda stage=stage: run(stage) for name, stage in stages.items()},
                        rounds=args.repeats)
    rows = {}
    for name, ts in times.items():
        rows[name] = {"images_per_s_per_core_best": len(refs) / min(ts),
                      "images_per_s_per_core_median": len(refs) / statistics.median(ts)}
    base = rows["pillow+torchvision"]
    speedup_best = rows["dali-cpu"]["images_per_s_per_core_best"] / base["images_per_s_per_core_best"]
    speedup_med = rows["dali-cpu"]["images_per_s_per_core_median"] / base["images_per_s_per_core_median"]
    print(f"decode + preprocess, {len(refs)} JPEGs 640x480 -> {args.size}x{args.size}, 1 core, "
          f"best / median of {args.repeats}")
    print(f"{'backend':22s} {'img/s best':>11s} {'img/s median':>13s}")
    for name, r in rows.items():
        print(f"{name:22s} {r['images_per_s_per_core_best']:11.1f} {r['images_per_s_per_core_median']:13.1f}")
    print(f"DALI / Pillow: {speedup_best:.2f}x (best), {speedup_med:.2f}x (median); target 1.5x")
    for name in rows:
        r = rows[name]["images_per_s_per_core_median"] / base["images_per_s_per_core_median"]
        print(f"{name} / Pillow: {r:.2f}x (median)")
    exact, draft = stages["pillow+torchvision"]({"ref": refs[:20]}), stages["pillow-draft"]({"ref": refs[:20]})
    dali = stages["dali-cpu"]({"ref": refs[:20]})
    err = {k: float((v["pixels"] - exact["pixels"]).abs().mean())
           for k, v in (("pillow-draft", draft), ("dali-cpu", dali))}
    print("mean |pixel - pillow| (normalised units, 20 images): " + ", ".join(f"{k} {v:.4f}" for k, v in err.items()))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "rows": rows, "mean_abs_pixel_diff_vs_pillow": err, "speedup_best": speedup_best,
        "speedup_median": speedup_med, "images": len(refs),
        "size": args.size, "machine": {"cpu": platform.processor() or platform.machine(),
                                        "cores": os.cpu_count(), "loadavg": os.getloadavg()}}, indent=2))


if __name__ == "__main__":
    main()
