"""`hardrank attack texts|images`: per checkpoint, the RoCOCO-format variants that break it, their
evaluation (summary) and the transfer matrix (variants found against A evaluated on B..K)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from hardrank.atomic import atomic_path, copy_into, write_json_atomic, write_text_atomic
from hardrank.config import PRECISIONS, EmbedOptions, EvalConfig, SuiteOptions, resolve_device
from hardrank.embed import EmbedPipeline
from hardrank.errors import EXIT_OK, DataError, UsageError
from hardrank.evaluate import evaluate
from hardrank.items import ImageRef, Tables
from hardrank.jobs.flags import Formatter, expand_globs
from hardrank.jobs.progress import make_progress
from hardrank.perturb.attack import (
    WORD_CLASSES,
    attack_sources,
    build_vocab,
    concepts_from_rococo,
    image_candidates,
    make_candidates,
    nearest_images,
    no_concepts,
    own_scores,
    pick_partners,
    segment_winners,
    tag_captions,
    vocab_from_file,
    write_image_candidates,
)
from hardrank.perturb.images import variant_name
from hardrank.suites.karpathy import N_PERTURBED, ROCOCO_TEXT_VARIANTS, image_variant_names, read_karpathy
from hardrank.text import pre_caption

__all__ = ["add_attack_parser", "attack_texts", "attack_images", "TRANSFER_KIND"]

TRANSFER_KIND = "hardrank-attack-transfer"
SUMMARY_KIND = "hardrank-attack-summary"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="open_clip model name, config .json, hf-hub:ORG/NAME or "
                   "local-dir:<folder>")
    p.add_argument("--checkpoint", nargs="+", default=None, help="weights file(s), globs ok: each is attacked, "
                   "and every attack is evaluated on every checkpoint (the transfer matrix)")
    p.add_argument("--pretrained", default=None, help="open_clip pretrained tag (without --checkpoint: its weights)")
    p.add_argument("--random-init", action="store_true", help="attack random weights on purpose (tests only)")
    p.add_argument("--annotations", required=True, help="Karpathy-format JSON (image + caption list per item)")
    p.add_argument("--images", required=True, help="image root the annotation paths are relative to (the "
                   "--images of `hardrank eval`)")
    p.add_argument("--out", required=True, help="output folder: summary, transfer matrix, evaluation results")
    p.add_argument("--store", default=None, help="embedding store root (default: $HARDRANK_CACHE/store)")
    p.add_argument("--batch-size", type=int, default=256, help="images/texts per encoder batch")
    p.add_argument("--precision", default="auto", choices=PRECISIONS)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def add_attack_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``attack texts`` and ``attack images`` to the ``hardrank`` sub-commands."""
    p = subparsers.add_parser("attack", help="find, per checkpoint, the caption substitutions and image partners "
                              "that break it; write them as RoCOCO variant files", formatter_class=Formatter,
                              epilog="the examples reuse what `hardrank demo --out results/demo` made\nexamples:\n"
                                     "  hardrank attack texts --model toy-clip --checkpoint "
                                     "engine/assets/toy_checkpoints/toy-clip_step0200.safetensors "
                                     "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --suite rococo "
                                     "--annotations results/demo/toy_world/karpathy_test.json --data "
                                     "results/demo/toy_world/rococo --images results/demo/toy_world/images "
                                     "--store results/demo/store --out results/attack_texts\n"
                                     "  hardrank attack images --model toy-clip --checkpoint "
                                     "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --annotations "
                                     "results/demo/toy_world/karpathy_test.json --images "
                                     "results/demo/toy_world/images --store results/demo/store --out "
                                     "results/attack_images")
    sub = p.add_subparsers(dest="attack_command", required=True)
    t = sub.add_parser("texts", help="per caption, the one-word substitution that most outscores the true caption",
                       formatter_class=Formatter)
    _common(t)
    t.add_argument("--suite", default="rococo", choices=["karpathy", "rococo"], help="rococo: the published variant "
                   "files next to the annotations (or in --data) are evaluated beside the attack, as the random "
                   "baseline of the same size")
    t.add_argument("--data", default=None, help="folder of the RoCOCO variant files (default: the annotations' "
                   "folder); its same_concept.json gives the concept grouping")
    t.add_argument("--concepts", default=None, help="RoCOCO same_concept.json whose word pairs are the concepts "
                   "(default: the one in --data), or 'none' to exclude only the word itself")
    t.add_argument("--budget", type=int, default=64, help="candidates per caption at most (positions take turns)")
    t.add_argument("--positions", nargs="+", default=list(WORD_CLASSES), choices=WORD_CLASSES,
                   help="word classes that may be replaced")
    t.add_argument("--vocab", default="200", help="replacement words: N (the N most frequent words of each class "
                   "in the captions) or a file (JSON list or one word per line)")
    t.set_defaults(func=lambda a: attack_texts(a))
    i = sub.add_parser("images", help="per image, the Mix/Patch partner among its k nearest images that most "
                       "outranks the original for its captions", formatter_class=Formatter)
    _common(i)
    i.add_argument("--method", default="mix", choices=["mix", "patch"])
    i.add_argument("--lam", type=float, default=0.9, help="weight of the original image (RoCOCO: 0.9)")
    i.add_argument("-k", type=int, default=8, help="nearest images tried as partners")
    i.add_argument("--seed", type=int, default=1, help="patch boxes' seed; the folder's _s<seed> suffix")
    i.add_argument("--size", type=int, default=384, help="side the images are resized to (RoCOCO: 384)")
    i.add_argument("--quality", type=int, default=75, help="JPEG quality (75, as perturb images)")
    i.set_defaults(func=lambda a: attack_images(a))
    return p


def _say(args, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr, flush=True)


def _pipe(args) -> EmbedPipeline:
    opts = EmbedOptions(store=args.store, precision=args.precision, device=args.device, batch_size=args.batch_size)
    return EmbedPipeline.from_checkpoints(args.model, expand_globs(args.checkpoint), opts,
                                          pretrained=args.pretrained, random_init=args.random_init)


def _evaluate(args, pipe: EmbedPipeline, out: Path, opts: SuiteOptions) -> dict[str, dict]:
    """Every checkpoint on the rococo suite with the given variants (one grouped pass per checkpoint);
    results under ``out``; returns the result per checkpoint label."""
    cfg = EvalConfig(suites=("rococo",), out=str(out), model=args.model,
                     checkpoints=tuple(m.spec.checkpoint for m in pipe.models), pretrained=args.pretrained,
                     random_init=args.random_init, suite_options=opts, embed=pipe.options)
    report = evaluate(cfg, progress=make_progress(args.quiet), echo=lambda s: _say(args, s))
    return {r["checkpoint"]: r for r in report.results}


def _view(result: dict, view: str, direction: str) -> dict:
    m = result["metrics"].get(view, {}).get(direction, {})
    return {"R@1": m.get("R@1"), "false_rate": m.get("false_rate"), "drop_R@1": (m.get("drop") or {}).get("R@1")}


def _transfer(results: dict[str, dict], labels: list[str], views: list[str], direction: str, modality: str,
              model: str) -> dict:
    """attackers x evaluated: R@1 and false rate of checkpoint B with the variants found against A."""
    r1 = [[_view(results[b], v, direction)["R@1"] for b in labels] for v in views]
    fr = [[_view(results[b], v, direction)["false_rate"] for b in labels] for v in views]
    clean = [results[b]["metrics"]["original"][direction]["R@1"] for b in labels]
    return {"kind": TRANSFER_KIND, "modality": modality, "direction": direction, "model": model,
            "attackers": labels, "evaluated": labels, "views": views, "clean_R@1": clean, "R@1": r1,
            "false_rate": fr,
            "drop_R@1": [[None if v is None else round(c - v, 6) for v, c in zip(row, clean)] for row in r1]}


# -- texts ----------------------------------------------------------------------------------------

def attack_texts(args) -> int:
    t_start = time.perf_counter()
    ann, out = Path(args.annotations), Path(args.out)
    clean = read_karpathy(ann)
    data = Path(args.data) if args.data else ann.parent
    if args.budget < 1:
        raise UsageError(f"--budget must be >= 1, got {args.budget}")
    if args.concepts == "none":
        concepts = no_concepts()
    else:
        sc = Path(args.concepts) if args.concepts else data / "same_concept.json"
        if not sc.is_file():
            raise UsageError(f"no concept grouping: {sc} does not exist; pass --concepts FILE (a RoCOCO "
                             f"same_concept.json made from {ann.name}) or --concepts none")
        concepts = concepts_from_rococo(ann, sc)
    sources, owner, forbidden = attack_sources(clean)
    t0 = time.perf_counter()
    classes = tag_captions(sources)
    if args.vocab.isdigit():
        vocab = build_vocab(classes, sources, int(args.vocab))
    else:
        vocab = vocab_from_file(args.vocab)
    cands = make_candidates(sources, classes, vocab, concepts, positions=tuple(args.positions), budget=args.budget,
                            forbidden=forbidden)
    t_cand = time.perf_counter() - t0
    _say(args, f"{len(cands.texts)} candidates for {len(sources)} captions ({t_cand:.1f}s to tag and build)")
    pipe = _pipe(args)
    tables = Tables.empty()
    img_rows = tables.images.add_many(ImageRef(os.fspath(Path(args.images) / im)) for im, _ in clean)
    src_rows = tables.texts.add_many(sources)
    cand_rows = tables.texts.add_many(cands.texts)
    t0 = time.perf_counter()
    stats = pipe.run(tables, progress=make_progress(args.quiet))
    t_embed = time.perf_counter() - t0
    if tables.images.failed:
        bad = sorted(tables.images.failed)[0]
        raise DataError(f"image {tables.images.entries[bad].uri} could not be read ({tables.images.failed[bad]}); "
                        f"the attack needs every image: fix or remove it from {ann}")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "concepts.json", concepts.to_json())
    write_json_atomic(out / "vocab.json", vocab.to_json())
    copy = out / ann.name
    copy_into(ann, copy)
    published = [v for v in ROCOCO_TEXT_VARIANTS if args.suite == "rococo" and (data / f"{v}.json").is_file()]
    for v in published:
        copy_into(data / f"{v}.json", out / f"{v}.json")
    device = resolve_device(args.device)
    per, views, t_score = [], [], 0.0
    for k, label in enumerate(pipe.labels):
        emb = pipe.embeddings(k, tables)
        t0 = time.perf_counter()
        img = emb["image"][img_rows]
        true = own_scores(img, emb["text"][src_rows], owner, device=device)
        scores = own_scores(img, emb["text"][cand_rows], owner[cands.owner], device=device)
        margin = scores - true[cands.owner]
        win, top = segment_winners(margin, cands.ptr)
        t_score += time.perf_counter() - t0
        name = f"adv_{label}"
        items, s = [], 0
        for im, caps in clean:
            m = min(len(caps), N_PERTURBED)
            new = [cands.texts[w] if w >= 0 else sources[s + j] for j, w in enumerate(win[s:s + m])]
            s += m
            items.append({"image": im, "caption": list(caps) + new})
        write_text_atomic(out / f"{name}.json", json.dumps(items, ensure_ascii=False))
        views.append(name)
        per.append(_text_stats(label, cands, win, top))
    opts = SuiteOptions(annotations=str(copy), data=str(out), images=args.images,
                        text_variants=tuple(views + published), image_variants=())
    results = _evaluate(args, pipe, out / "eval", opts)
    labels = list(pipe.labels)
    for p, label, view in zip(per, labels, views):
        res = results[label]
        p["clean"] = _view(res, "original", "i2t")
        p["adversarial"] = _view(res, view, "i2t")
        p["published"] = {v: _view(res, v, "i2t") for v in published}
        p["file"] = str(out / f"{view}.json")
    transfer = _transfer(results, labels, views, "i2t", "texts", args.model)
    write_json_atomic(out / "transfer_texts.json", transfer)
    summary = {"kind": SUMMARY_KIND, "modality": "texts", "model": args.model, "suite": args.suite,
               "annotations": str(ann), "captions": len(sources), "candidates": len(cands.texts),
               "budget": args.budget, "positions": list(args.positions), "vocab": vocab.source,
               "vocab_sizes": {c: len(w) for c, w in vocab.words.items()}, "concepts": concepts.source,
               "concept_words": len(concepts.groups), "checkpoints": per,
               "evaluate_with": f"hardrank eval --suite rococo --annotations {copy} --images {args.images} "
                                f"--text-variants {' '.join(views)} ...",
               "timings": {"candidates": t_cand, "embed": t_embed, "score": t_score,
                           "total": time.perf_counter() - t_start},
               "embed": {m: s.as_dict() for m, s in stats.items()}}
    write_json_atomic(out / "summary_texts.json", summary)
    for p in per:
        a = p["adversarial"]
        print(f"{p['checkpoint']}: attack success {p['success_rate']:.1f}% of captions; i2t R@1 "
              f"{p['clean']['R@1']:.1f} clean -> {a['R@1']:.1f} adversarial (false rate {a['false_rate']:.1f})")
    _say(args, f"summary: {out / 'summary_texts.json'}; transfer matrix: {out / 'transfer_texts.json'}; "
               f"report: hardrank report {out}")
    return EXIT_OK


def _text_stats(label: str, cands, win: np.ndarray, top: np.ndarray, n_top: int = 10) -> dict:
    has = win >= 0
    ok = has & (top > 0)
    by: dict[str, dict] = {}
    pairs: dict[str, Counter] = defaultdict(Counter)
    margins: dict[str, list[float]] = defaultdict(list)
    for w, t in zip(win[ok], top[ok]):
        c = cands.wclass[w]
        pairs[c][(cands.original[w], cands.replacement[w])] += 1
        margins[c].append(float(t))
    winners = Counter(cands.wclass[w] for w in win[has])
    for c in WORD_CLASSES:
        if not winners[c] and not margins[c]:
            continue
        by[c] = {"winners": winners[c], "successes": len(margins[c]),
                 "mean_margin": float(np.mean(margins[c])) if margins[c] else None,
                 "top": [{"from": a, "to": b, "count": n}
                         for (a, b), n in sorted(pairs[c].items(), key=lambda kv: (-kv[1], kv[0]))[:n_top]]}
    n = len(win)
    return {"checkpoint": label, "captions": n, "no_candidates": int((~has).sum()),
            "successes": int(ok.sum()), "success_rate": 100.0 * float(ok.sum()) / max(n, 1),
            "mean_winning_margin": float(top[ok].mean()) if ok.any() else None, "by_class": by}


# -- images ---------------------------------------------------------------------------------------

def attack_images(args) -> int:
    t_start = time.perf_counter()
    ann, out, root = Path(args.annotations), Path(args.out), Path(args.images)
    if not 0.0 <= args.lam <= 1.0:
        raise UsageError(f"--lam must be in [0, 1] (the weight of the original image), got {args.lam}")
    if args.k < 1 or args.size < 1 or not 1 <= args.quality <= 100:
        raise UsageError("-k and --size must be >= 1 and --quality in [1, 100]")
    if not root.is_dir():
        raise FileNotFoundError(f"--images {root} is not a folder")
    clean = read_karpathy(ann)
    paths = [im for im, _ in clean]
    if len(paths) < 2:  # checked here, before any encoding: each image's partner is another image
        raise DataError(f"{ann}: {len(paths)} image(s); the image attack needs at least 2 (each image's partner "
                        f"is another image): pass a Karpathy file with more images")
    pipe = _pipe(args)
    tables = Tables.empty()
    img_rows = tables.images.add_many(ImageRef(os.fspath(root / im)) for im in paths)
    caps, cap_img = [], []
    for i, (_, cs) in enumerate(clean):
        caps.extend(pre_caption(c) for c in cs)
        cap_img.extend([i] * len(cs))
    cap_img = np.array(cap_img, dtype=np.int64)
    cap_rows = tables.texts.add_many(caps)
    t0 = time.perf_counter()
    pipe.run(tables, progress=make_progress(args.quiet))
    if tables.images.failed:
        bad = sorted(tables.images.failed)[0]
        raise DataError(f"image {tables.images.entries[bad].uri} could not be read ({tables.images.failed[bad]}); "
                        f"the attack needs every image: fix or remove it from {ann}")
    embs = [pipe.embeddings(k, tables) for k in range(len(pipe.models))]
    neighbours = [nearest_images(e["image"][img_rows], args.k) for e in embs]
    pairs = list(dict.fromkeys(p for nb in neighbours for p in image_candidates(paths, nb)))
    # the folder keys all the files depend on: kept files are reused only for the same images, order
    # (partners are named by index, patch boxes drawn in image order), size and quality
    order = hashlib.blake2b("\n".join([os.path.abspath(root), *paths]).encode(), digest_size=4).hexdigest()
    tag = f"{args.method}_{args.lam:g}_s{args.seed}_{args.size}px_q{args.quality}_{order}"
    # `perturb images`' folder for these settings, less its seed: the published baseline, and the stem of
    # the adversarial folders' names
    published = variant_name(args.method, args.lam, args.seed).removesuffix(f"_s{args.seed}")
    device = resolve_device(args.device)
    t1 = time.perf_counter()
    files, written = write_image_candidates(root, paths, pairs, out / "candidates" / tag, method=args.method,
                                            lam=args.lam, seed=args.seed, size=args.size, quality=args.quality,
                                            device=device)
    t_write = time.perf_counter() - t1
    _say(args, f"{len(pairs)} candidate images ({written} written, {len(pairs) - written} kept) in {t_write:.1f}s")
    file_of = dict(zip(pairs, files))
    cand_rows = dict(zip(pairs, tables.images.add_many(ImageRef(os.fspath(f)) for f in files)))
    pipe.run(tables, progress=make_progress(args.quiet))
    if tables.images.failed:
        bad = sorted(tables.images.failed)[0]
        raise DataError(f"candidate {tables.images.entries[bad].uri} could not be read; delete it and rerun")
    t_embed = time.perf_counter() - t0 - t_write
    n, kk = len(paths), neighbours[0].shape[1]
    cmax = int(np.bincount(cap_img).max())
    slot = np.arange(len(cap_img)) - np.searchsorted(cap_img, cap_img)  # caption's index within its image
    per, views, t_score = [], [], 0.0
    for k, label in enumerate(pipe.labels):
        emb = pipe.embeddings(k, tables)  # now with the candidates' rows
        ts = time.perf_counter()
        img = emb["image"][img_rows]
        ctext = emb["text"][cap_rows]
        base = own_scores(img, ctext, cap_img, device=device)
        margins = np.full((n, kk, cmax), np.nan, dtype=np.float32)
        for t in range(kk):
            alt = emb["image"][[cand_rows[(i, int(neighbours[k][i, t]))] for i in range(n)]]
            margins[cap_img, t, slot] = own_scores(alt, ctext, cap_img, device=device) - base
        choice, wins, mean = pick_partners(margins, kk)
        t_score += time.perf_counter() - ts
        name = f"adv_{label}_{published}"
        folder = root / f"{name}_s{args.seed}"
        for i in range(n):
            src = file_of[(i, int(neighbours[k][i, choice[i]]))]
            dst = folder / Path(paths[i]).with_suffix(".jpg")
            dst.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dst) as tmp:
                shutil.copyfile(src, tmp)
        views.append(name)
        per.append({"checkpoint": label, "images": n, "captions": len(cap_img), "folder": str(folder),
                    "image_success_rate": 100.0 * float((wins > 0).mean()),
                    "caption_success_rate": 100.0 * float(wins.sum()) / len(cap_img),
                    "mean_margin": float(mean.mean()),
                    "partner_rank": {str(r): int((choice == r).sum()) for r in range(kk)}})
    base_views = [published] if (root / f"{published}_s{args.seed}").is_dir() else []
    opts = SuiteOptions(annotations=str(ann), images=str(root), text_variants=(),
                        image_variants=tuple(views + base_views), seeds=(args.seed,))
    results = _evaluate(args, pipe, out / "eval", opts)
    labels = list(pipe.labels)
    seeded = image_variant_names(views, [args.seed])
    for p, label, view in zip(per, labels, seeded):
        res = results[label]
        p["clean"] = _view(res, "original", "t2i")
        p["adversarial"] = _view(res, view, "t2i")
        p["published"] = {f"{v}_s{args.seed}": _view(res, f"{v}_s{args.seed}", "t2i") for v in base_views}
    write_json_atomic(out / "transfer_images.json", _transfer(results, labels, seeded, "t2i", "images", args.model))
    summary = {"kind": SUMMARY_KIND, "modality": "images", "model": args.model, "annotations": str(ann),
               "method": args.method, "lam": args.lam, "k": kk, "seed": args.seed, "size": args.size,
               "candidates": len(pairs), "checkpoints": per,
               "evaluate_with": f"hardrank eval --suite rococo --annotations {ann} --images {root} "
                                f"--image-variants {' '.join(views)} --seeds {args.seed} ...",
               "timings": {"write_candidates": t_write, "embed": t_embed, "score": t_score,
                           "total": time.perf_counter() - t_start}}
    write_json_atomic(out / "summary_images.json", summary)
    for p in per:
        a = p["adversarial"]
        print(f"{p['checkpoint']}: altered copy beats the original for {p['caption_success_rate']:.1f}% of captions; "
              f"t2i R@1 {p['clean']['R@1']:.1f} clean -> {a['R@1']:.1f} adversarial (false rate {a['false_rate']:.1f})")
    _say(args, f"summary: {out / 'summary_images.json'}; report: hardrank report {out}")
    return EXIT_OK

