"""`hardrank attack texts`: candidates scored per second against the text-encode limit, on real COCO captions.

Candidates come from the first --images images of the COCO Karpathy test file (real captions, the
attack's tagger, vocabulary and budget); images are generated COCO-sized JPEGs (the images are not
what is measured). Rates, all in candidates per second on the same texts and model:
  encode limit (full context)  bare ``model.encode_text`` on pre-tokenised 77-token batches
  encode limit (trimmed)       hardrank's ``encode_text`` (batches cut to their longest caption), length-sorted
  attack, cold store           tokenise + encode through the store (EmbedPipeline) + the grouped scoring pass
  attack, warm store           the same run again: every candidate a store hit
  scoring pass alone           own_scores + segment_winners
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--annotations", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "rococo"
                                                 / "coco_karpathy_test.json"))
    ap.add_argument("--images", type=int, default=100, help="COCO images whose captions are attacked")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--size", default="small", choices=["small", "tiny"],
                    help="bench model (hardrank.jobs.bench.inputs.CONFIGS)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "hardrank-bench-data"))
    ap.add_argument("--json", default="benchmarks/results/bench_attack.json")
    args = ap.parse_args()
    import torch

    from hardrank.config import EmbedOptions
    from hardrank.embed import EmbedPipeline, encode_text
    from hardrank.formats.karpathy import read_karpathy
    from hardrank.items import ImageRef, Tables
    from hardrank.jobs.bench.inputs import coco_like_jpegs, small_checkpoints
    from hardrank.jobs.bench.timing import timed
    from hardrank.models import ModelSpec, load_model
    from hardrank.perturb.attack import (
        attack_sources,
        build_vocab,
        concepts_from_rococo,
        make_candidates,
        own_scores,
        segment_winners,
        tag_captions,
    )
    from hardrank.text import pre_caption

    ann = Path(args.annotations)
    clean = read_karpathy(ann)[:args.images]
    sources, owner, forbidden = attack_sources(clean)

    def build():
        classes = tag_captions(sources)
        concepts = concepts_from_rococo(ann, ann.parent / "same_concept.json")
        every = [pre_caption(c) for _, cs in read_karpathy(ann) for c in cs]  # the file's captions, all images
        vocab = build_vocab(tag_captions(every), every, 200)
        return make_candidates(sources, classes, vocab, concepts, budget=args.budget, forbidden=forbidden)

    t_build, cands = timed(build)
    n = len(cands.texts)
    jpegs = coco_like_jpegs(Path(args.data) / "jpegs", len(clean))
    cfg, (ckpt,) = small_checkpoints(Path(args.data) / "models", 1, args.size)
    lm = load_model(ModelSpec(cfg, ckpt, "fp32", "cpu"))
    torch.set_grad_enabled(False)

    full = [lm.tokenizer(cands.texts[s:s + args.batch]) for s in range(0, n, args.batch)]
    t_full = timed(lambda: [lm.model.encode_text(b) for b in full])[0]
    srt = sorted(cands.texts, key=len)
    trimmed = [lm.tokenizer(srt[s:s + args.batch]) for s in range(0, n, args.batch)]
    t_trim = timed(lambda: [encode_text(lm.model, b) for b in trimmed])[0]

    store = tempfile.mkdtemp(prefix="hardrank-bench-attack-")
    pipe = EmbedPipeline.from_checkpoints(cfg, [ckpt], EmbedOptions(store=store, device="cpu", precision="fp32",
                                                                     batch_size=args.batch))
    tables = Tables.empty()
    img_rows = tables.images.add_many(ImageRef(p) for p in jpegs)
    src_rows = tables.texts.add_many(sources)
    cand_rows = tables.texts.add_many(cands.texts)

    def score():
        emb = pipe.embeddings(0, tables)
        img = emb["image"][img_rows]
        true = own_scores(img, emb["text"][src_rows], owner)
        margin = own_scores(img, emb["text"][cand_rows], owner[cands.owner]) - true[cands.owner]
        segment_winners(margin, cands.ptr)

    def attack():  # (seconds of the whole attack, seconds of its scoring pass)
        t_embed = timed(lambda: pipe.run(tables))[0]
        t_score = timed(score)[0]
        return t_embed + t_score, t_score

    t_cold, _ = attack()
    t_warm, t_score = attack()
    rows = [("encode limit (full context)", t_full), ("encode limit (trimmed, length-sorted)", t_trim),
            ("attack, cold store (encode + score)", t_cold), ("attack, warm store (all hits + score)", t_warm),
            ("scoring pass alone (read + own_scores + winners)", t_score)]
    print(f"{n} candidates for {len(sources)} captions of {len(clean)} COCO images (budget {args.budget}; "
          f"tag + build {t_build:.2f}s); model {args.size}, {torch.get_num_threads()} threads")
    print(f"{'stage':52s} {'seconds':>8s} {'cand/s':>10s} {'x full-context limit':>21s}")
    for name, sec in rows:
        print(f"{name:52s} {sec:8.2f} {n / sec:10.0f} {t_full / sec:21.2f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"candidates": n, "captions": len(sources), "budget": args.budget,
                                           "build_seconds": t_build, "model": args.size,
                                           "seconds": dict(rows), "cpu": platform.processor(),
                                           "threads": torch.get_num_threads(), "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
