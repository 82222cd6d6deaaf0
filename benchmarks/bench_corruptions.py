"""ImageNet-C corruption speed: each of the 15 corruptions at severities 1..5 on one photo-like 224 px image,
one core (the figure docs/classification.md's "Common corruptions" section quotes: images/s through all 75
pairs, and the fastest and slowest corruption).

Usage: python benchmarks/bench_corruptions.py [--side 224] [--repeat 3] [--json benchmarks/results/corruptions.json]
frost needs its photographs (the `hardrank[corrupt]` extra or --frost-dir); without them it is left out and said.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np
import torch

from hardrank.errors import MissingExtra
from hardrank.jobs.bench.timing import best_of
from hardrank.perturb.corruptions import CORRUPTIONS, SEVERITIES, corrupt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--frost-dir", default=None)
    ap.add_argument("--json", default="benchmarks/results/corruptions.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    yy, xx = np.mgrid[:args.side, :args.side]
    noise = np.random.default_rng(0).integers(0, 40, (args.side, args.side, 3))
    x = np.clip(np.stack([xx, yy, (xx + yy) // 2], -1) * 255 // args.side + noise, 0, 255).astype(np.uint8)
    per = {}
    for name in CORRUPTIONS:
        try:
            per[name] = sum(best_of(lambda n=name, s=s: corrupt(x, n, s, np.random.RandomState(0), args.frost_dir),
                                    repeat=args.repeat, warmup=1) for s in SEVERITIES) / len(SEVERITIES)
        except MissingExtra as exc:
            print(f"{name}: left out ({exc})")
    total = sum(per.values()) * len(SEVERITIES)
    print(f"{args.side} px, one thread, best of {args.repeat}, load {os.getloadavg()[0]:.2f}")
    for name, s in sorted(per.items(), key=lambda kv: kv[1]):
        print(f"  {name:<18} {s * 1e3:8.1f} ms per image (mean over severities)")
    print(f"all {len(per) * len(SEVERITIES)} (corruption, severity) pairs: {total:.2f} s per image, "
          f"{1 / total:.2f} images/s")
    out = {"side": args.side, "repeat": args.repeat, "load": os.getloadavg(), "machine": platform.processor(),
           "ms_per_image": {k: v * 1e3 for k, v in per.items()}, "images_per_s_all_pairs": 1 / total}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
