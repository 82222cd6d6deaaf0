"""--rerank itm:K: the batched cross-encoder stage vs the reference's per-query loop, and its share of a whole run.

Usage: python benchmarks/bench_rerank.py [--images 32] [--k 16] [--size small] [--device cpu] [--pair-batch 256]
       [--rounds 2] [--threads N]

A random BLIP (``hardrank.jobs.bench.inputs.small_blip``) on COCO-like JPEGs with five captions each (a Karpathy
file). The run: embed (decode + both encoders, into the store), then per direction the re-ranking stage
(``rerank_ranks`` with ``ItmScorer``: exact top K, image vision states computed once and cached, (text, image)
pairs ``--pair-batch`` per forward, captions cut to the batch's longest). The baseline is RoCOCO's
``eval_blip_*.py`` loop: every image's vision states computed first, then per query ``topk`` and one forward
over its K pairs; the two are timed in interleaved rounds from warm inputs, and give the same ranks (checked).
Prints one table and writes benchmarks/results/rerank.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import torch

from hardrank.config import EmbedOptions
from hardrank.embed import EmbedPipeline
from hardrank.embed.itm import ItmScorer
from hardrank.encoding.decoders import make_decoder
from hardrank.items import Tables
from hardrank.jobs.bench.inputs import WORDS, coco_like_jpegs, small_blip
from hardrank.jobs.bench.timing import interleaved, sync
from hardrank.models.runs import user_specs
from hardrank.scoring.rerank import RerankSpec, rerank_ranks, rescored_ranks
from hardrank.suites import SuiteOptions, load_suites


def _karpathy(root: Path, paths: list[str]) -> Path:
    rng = random.Random(0)
    items = [{"image": os.path.relpath(p, root / "images"),
              "caption": [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) for _ in range(5)]}
             for p in paths]
    out = root / "karpathy_test.json"
    out.write_text(json.dumps(items))
    return out


@torch.inference_mode()
def _reference_inputs(model, tables: Tables, decoder) -> tuple[torch.Tensor, torch.Tensor]:
    """What the reference computes before its loop: every image's vision states, every caption's ids."""
    pix = decoder({"ref": tables.images.entries})["pixels"]
    dev = model.device
    states = torch.cat([model.model.vision_states(pix[s:s + 64].to(dev, model.dtype)) for s in range(0, len(pix), 64)])
    return states, model.tokenizer(list(tables.texts.entries)).to(dev)


@torch.inference_mode()
def _naive(model, task, emb, k: int, states, ids) -> tuple[torch.Tensor, torch.Tensor]:
    """RoCOCO's loop as its code runs it: per query, ``topk`` of its similarity row and one forward over its K
    candidates (``.repeat`` of the query, captions at their padded 35 tokens, ``[ENC]`` first). Returns (nq, K)
    candidates and their re-scored values."""
    dev = model.device
    xq = torch.from_numpy(emb[task.query_modality][task.query_items]).float().to(dev)
    xb = torch.from_numpy(emb[task.gallery_modality][task.gallery_items]).float().to(dev)
    gal = torch.from_numpy(task.gallery_items).to(dev)
    net, pad, enc = model.model.net, model.model.pad_id, model.model.enc_id
    mask = (ids != pad).long()  # (N, 35): the reference runs every caption at its padded length
    ids = ids.clone()
    if enc is not None:
        ids[:, 0] = enc
    out, cand = [], []
    for i in range(task.num_queries):
        top_s, top_i = (xb @ xq[i]).topk(k)
        q = int(task.query_items[i])
        if task.query_modality == "image":
            t, m, img = ids[gal[top_i]], mask[gal[top_i]], states[q:q + 1].repeat(k, 1, 1)
        else:
            t, m, img = ids[q:q + 1].repeat(k, 1), mask[q:q + 1].repeat(k, 1), states[gal[top_i]]
        h = net.text_encoder(input_ids=t, attention_mask=m, encoder_hidden_states=img,
                             encoder_attention_mask=torch.ones(img.shape[:-1], dtype=torch.long, device=dev))
        logit = net.itm_head(h.last_hidden_state[:, 0, :])[:, 1].float()
        out.append((logit + top_s).cpu())
        cand.append(top_i.cpu())
    return torch.stack(cand), torch.stack(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--size", default="small", choices=("tiny", "small", "base"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--pair-batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved timed rounds of the stage vs the loop")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "hardrank-bench-rerank"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "rerank.json"))
    args = ap.parse_args(argv)
    if args.threads:  # on a shared machine, one thread per process avoids OpenMP spin-waits against other load
        torch.set_num_threads(args.threads)
    data = Path(args.data)
    paths = coco_like_jpegs(data / "images", args.images)
    ann = _karpathy(data, paths)
    folder = small_blip(data / "models", args.size)
    store = tempfile.mkdtemp(prefix="hardrank-bench-rerank-store-")
    opts = EmbedOptions(store=store, device=args.device, batch_size=args.pair_batch)

    t_run = time.perf_counter()
    pipe = EmbedPipeline(user_specs(f"blip:{folder}", device=args.device), opts)
    model = pipe.models[0]
    tables = Tables.empty()
    suite = load_suites(["karpathy"], tables, SuiteOptions(annotations=str(ann), images=str(data / "images")))[0]
    t0 = time.perf_counter()
    pipe.run(tables)
    emb = pipe.embeddings(0, tables)
    t_embed = time.perf_counter() - t0
    scorer = ItmScorer(model, tables, batch_size=args.pair_batch, decoder=opts.decoder)
    batched, info = {}, {}
    for task in suite.ranking:
        t0 = time.perf_counter()
        ranks = rerank_ranks(task, emb[task.query_modality], emb[task.gallery_modality], scorer,
                             RerankSpec("itm", args.k), device=args.device, pair_batch=args.pair_batch)
        sync(args.device)
        batched[task.name], info[task.name] = time.perf_counter() - t0, ranks
    t_total = time.perf_counter() - t_run
    info_parts = scorer.take_stats()

    # the stage alone against the reference's loop, in interleaved rounds (a shared machine's load hits both
    # alike); both start from computed vision states (the scorer's cache is warm; the reference computes all
    # images' states before its loop, timed apart as "reference set-up")
    dec = make_decoder(model.preprocess_cfg, threads=opts.decode_threads)  # BLIP's own image processor
    t0 = time.perf_counter()
    states, ids = _reference_inputs(model, tables, dec)
    t_setup = time.perf_counter() - t0
    spec = RerankSpec("itm", args.k)
    rows, naive, agree = [], {}, {}
    for task in suite.ranking:
        k = min(args.k, len(task.gallery_items))
        qe, ge = emb[task.query_modality], emb[task.gallery_modality]
        secs = interleaved({"batched": lambda: rerank_ranks(task, qe, ge, scorer, spec, device=args.device,
                                                            pair_batch=args.pair_batch),
                            "naive": lambda: _naive(model, task, emb, k, states, ids)},
                           args.device, rounds=args.rounds, warmup=0)
        ref_i, ref_s = _naive(model, task, emb, k, states, ids)
        # the reference's ranks from its own re-scored matrix equal the stage's (up to float near-ties)
        ref = rescored_ranks(ref_i, ref_s, len(task.gallery_items), task.group_bounds, task.pos_ptr, task.pos_idx)
        agree[task.name] = float((ref.counts.sum(1) == info[task.name].counts.sum(1)).float().mean())
        naive[task.name] = secs
        tb, tn = min(secs["batched"]), min(secs["naive"])
        rows.append((task.name, task.num_queries, len(task.gallery_items), task.num_queries * k, batched[task.name],
                     tb, tn, agree[task.name]))
    seconds = info_parts
    stage = sum(batched.values())
    print(f"BLIP {args.size} ({model.preprocess_cfg['size'][0]} px), K={args.k}, pair batch {args.pair_batch}, "
          f"{args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads; best of {args.rounds} "
          f"interleaved rounds")
    print("| direction | queries | gallery | pairs | stage in the run s (cold cache) | stage s (warm) | "
          "reference loop s | reference / stage | same ranks |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, nq, nb, pairs, tr, tb, tn, ag in rows:
        print(f"| {name} | {nq} | {nb} | {pairs} | {tr:.3f} | {tb:.3f} | {tn:.3f} | {tn / tb:.2f}x | {100 * ag:.0f}% |")
    print(f"whole run {t_total:.2f} s: embed {t_embed:.2f} s, re-ranking (both directions) {stage:.2f} s "
          f"= {100 * stage / t_total:.0f}% of the run; its parts {seconds}; reference set-up (all vision states "
          f"and ids) {t_setup:.2f} s")
    out = {"args": vars(args), "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "whole_run_s": t_total, "embed_s": t_embed, "rerank_s": batched,
           "rerank_share": stage / t_total, "stage_parts": seconds, "interleaved_s": naive, "same_ranks": agree,
           "reference_setup_s": t_setup, "per_task": {n: info[n].info for n in info}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
