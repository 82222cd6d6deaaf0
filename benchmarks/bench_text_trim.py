"""Text batches at their longest caption vs full context padding: speed and embedding difference."""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="ViT-B-32", help="open_clip architecture (random init, offline)")
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--json", default="benchmarks/results/bench_text_trim.json")
    args = ap.parse_args()
    import numpy as np
    import open_clip
    import torch

    from hardrank.embed import encode_text
    from hardrank.jobs.bench.timing import timed

    torch.manual_seed(0)
    model = open_clip.create_model(args.model, pretrained=None).eval()
    tok = open_clip.get_tokenizer(args.model)
    rng = np.random.default_rng(0)
    words = "a man woman dog cat red blue small large sitting on the next to with under near table car street".split()
    texts = [" ".join(rng.choice(words, rng.integers(4, 22))) for _ in range(args.texts)]  # COCO-like lengths
    texts.sort(key=len)  # as embed_tables orders them
    batches = [tok(texts[s:s + args.batch]) for s in range(0, len(texts), args.batch)]

    def run(fn):
        with torch.inference_mode():
            t, out = timed(lambda: torch.cat([fn(b) for b in batches]))
            return t, torch.nn.functional.normalize(out.float(), dim=-1)

    run(model.encode_text)
    t_full, full = run(model.encode_text)
    t_trim, trim = run(lambda b: encode_text(model, b))
    diff = (full - trim).abs().max().item()
    cos = (full * trim).sum(-1).min().item()
    lengths = [int(b.argmax(-1).max()) + 1 for b in batches]
    print(f"{args.model} text tower, {len(texts)} captions, batch {args.batch}, context {batches[0].shape[1]}, "
          f"batch lengths {lengths}, {torch.get_num_threads()} threads")
    print(f"full padding {len(texts) / t_full:8.1f} texts/s")
    print(f"trimmed      {len(texts) / t_trim:8.1f} texts/s  ({t_full / t_trim:.2f}x)")
    print(f"max |diff| of normalised embeddings {diff:.2e}, min cosine {cos:.8f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "model": args.model, "texts": len(texts), "speedup": t_full / t_trim, "max_abs_diff": diff,
        "min_cosine": cos, "batch_lengths": lengths,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "loadavg": os.getloadavg()}}, indent=2))


if __name__ == "__main__":
    main()
