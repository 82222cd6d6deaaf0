"""`attack texts` and `attack images` as one call each: per checkpoint, the RoCOCO-format variants that break
it, their evaluation (summary) and the transfer matrix (variants found against A evaluated on B..K)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hardrank.atomic import atomic_path, copy_into, write_json_atomic, write_text_atomic
from hardrank.config import EmbedOptions, EvalConfig, SuiteOptions, build, check_options, check_writable_dir, opt
from hardrank.devices import resolve_device
from hardrank.embed import EmbedPipeline
from hardrank.errors import DataError, UsageError
from hardrank.evaluate import evaluate
from hardrank.formats.karpathy import merge_repeated_images, read_karpathy
from hardrank.formats.variants import N_PERTURBED, TEXT_VARIANTS, image_variant_names
from hardrank.items import ImageRef, Tables
from hardrank.models.runs import user_specs
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
from hardrank.perturb.images import METHODS, check_relative, variant_name
from hardrank.settings import RunSettings, start_run
from hardrank.text import pre_caption

__all__ = ["AttackConfig", "AttackTextsConfig", "AttackImagesConfig", "attack_texts", "attack_images",
           "TRANSFER_KIND", "SUMMARY_KIND"]

TRANSFER_KIND = "hardrank-attack-transfer"
SUMMARY_KIND = "hardrank-attack-summary"


@dataclass(frozen=True)
class AttackConfig:
    """What both attacks take: the checkpoints attacked (each also evaluated on the others' variants),
    the clean Karpathy file and its images, the output folder, and how items are embedded."""

    model: str = opt("", "the model attacked", listing="models")
    checkpoints: tuple[str | None, ...] = opt((None,), "weights file(s), globs ok: each is attacked, and every "
                                              "attack is evaluated on every checkpoint (the transfer matrix)",
                                              flag="--checkpoint", path=True)
    pretrained: str | None = opt(None, "open_clip pretrained tag (without --checkpoint: its weights)")
    random_init: bool = opt(False, "attack random weights on purpose (tests only)")
    annotations: str = opt("", "Karpathy-format JSON (image + caption list per item)", path=True)
    images: str = opt("", "image root the annotation paths are relative to (as `hardrank eval --images`)",
                      path=True)
    out: str = opt("", "output folder: summary, transfer matrix, evaluation results", path=True)
    embed: EmbedOptions = EmbedOptions()

    def __post_init__(self):
        object.__setattr__(self, "checkpoints", tuple(self.checkpoints) or (None,))
        check_options(self)
        for name in ("model", "annotations", "images", "out"):
            if not getattr(self, name):
                raise UsageError(f"option {name} (--{name}) is required")


@dataclass(frozen=True)
class AttackTextsConfig(AttackConfig):
    """Per caption, the one-word substitution that most outscores the true caption."""

    suite: str = opt("rococo", "rococo: the published variant files next to the annotations (or in --data) are "
                     "evaluated beside the attack, as the random baseline of the same size",
                     choices=("karpathy", "rococo"))
    data: str | None = opt(None, "folder of the RoCOCO variant files (default: the annotations' folder); its "
                           "same_concept.json gives the concept grouping", path=True)
    concepts: str | None = opt(None, "RoCOCO same_concept.json whose word pairs are the concepts (default: the one "
                               "in --data), or 'none' to exclude only the word itself")
    budget: int = opt(64, "candidates per caption at most (positions take turns)", minimum=1)
    positions: tuple[str, ...] = opt(WORD_CLASSES, "word classes that may be replaced", choices=WORD_CLASSES)
    vocab: str = opt("200", "replacement words: N (the N most frequent words of each class in the captions) or a "
                     "file (JSON list or one word per line)")


@dataclass(frozen=True)
class AttackImagesConfig(AttackConfig):
    """Per image, the Mix/Patch partner among its k nearest images that most outranks the original."""

    method: str = opt("mix", "mix: the image blended with its partner; patch: a box of the partner pasted in",
                      choices=METHODS)
    lam: float = opt(0.9, "weight of the original image (RoCOCO: 0.9)")
    k: int = opt(8, "nearest images tried as partners", minimum=1, flag="-k")
    seed: int = opt(1, "patch boxes' seed; the folder's _s<seed> suffix (>= 0)", minimum=0)
    size: int = opt(384, "side the images are resized to (RoCOCO: 384)", minimum=1)
    quality: int = opt(75, "JPEG quality (75, as perturb images)")

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.lam <= 1.0:
            raise UsageError(f"option lam (--lam) must be in [0, 1] (the weight of the original image), got {self.lam}")
        if not 1 <= self.quality <= 100:
            raise UsageError(f"option quality (--quality) must be in [1, 100], got {self.quality}")


def _config(cls, cfg, options: dict):
    if cfg is not None and options:
        raise UsageError(f"pass a {cls.__name__} or keyword options, not both (got {sorted(options)})")
    return cfg if cfg is not None else build(cls, options)


def _check_usage(cfg: AttackConfig) -> None:
    """What can fail about the options, before any caption is tagged or image decoded: the device,
    the output folder, the store."""
    resolve_device(cfg.embed.device)
    check_writable_dir(cfg.out, "out (--out)")
    cfg.embed.check_store()


def _pipe(cfg: AttackConfig, settings: RunSettings) -> EmbedPipeline:
    return EmbedPipeline(user_specs(cfg.model, cfg.checkpoints, precision=cfg.embed.precision,
                                    device=cfg.embed.device, pretrained=cfg.pretrained, random_init=cfg.random_init),
                         cfg.embed, settings=settings)


def _check_read(tables: Tables, ann: Path) -> None:
    if tables.images.failed:
        bad = sorted(tables.images.failed)[0]
        raise DataError(f"image {tables.images.entries[bad].uri} could not be read ({tables.images.failed[bad]}); "
                        f"the attack needs every image: fix or remove it from {ann}")


def _evaluate(cfg: AttackConfig, pipe: EmbedPipeline, out: Path, opts: SuiteOptions, progress, echo) -> dict[str, dict]:
    """Every checkpoint on the rococo suite with the given variants (one grouped pass per checkpoint);
    results under ``out`` (with the attack's own threads: ``pipe.settings``); returns the result per checkpoint
    label."""
    ev = EvalConfig(suites=("rococo",), out=str(out), model=cfg.model,
                    checkpoints=tuple(m.spec.checkpoint for m in pipe.models), pretrained=cfg.pretrained,
                    random_init=cfg.random_init, suite_options=opts, embed=pipe.options)
    report = evaluate(ev, progress=progress, echo=echo, settings=pipe.settings)
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

def attack_texts(cfg: AttackTextsConfig | None = None, *, progress=None, echo=None, **options) -> dict:
    """Attack every checkpoint's captions: write ``adv_<checkpoint>.json`` (RoCOCO format) per
    checkpoint into ``cfg.out``, evaluate each checkpoint on every checkpoint's variants, write
    ``summary_texts.json`` and ``transfer_texts.json``; returns the summary. The options as keywords
    work too: ``attack_texts(model=..., checkpoints=[...], annotations=..., images=..., out=...)``."""
    cfg = _config(AttackTextsConfig, cfg, options)
    echo = echo or (lambda s: None)
    settings = start_run(cfg.embed.threads, cfg.embed.decode_threads)  # (a bad $HARDRANK_THREADS: usage, first)
    _check_usage(cfg)
    t_start = time.perf_counter()
    ann, out = Path(cfg.annotations), Path(cfg.out)
    clean = read_karpathy(ann)
    data = Path(cfg.data) if cfg.data else ann.parent
    if cfg.concepts == "none":
        concepts = no_concepts()
    else:
        sc = Path(cfg.concepts) if cfg.concepts else data / "same_concept.json"
        if not sc.is_file():
            raise UsageError(f"no concept grouping: {sc} does not exist; pass --concepts FILE (a RoCOCO "
                             f"same_concept.json made from {ann.name}) or --concepts none")
        concepts = concepts_from_rococo(ann, sc)
    sources, owner, forbidden = attack_sources(clean)
    t0 = time.perf_counter()
    echo(f"tagging {len(sources)} captions and building their substitutions")
    classes = tag_captions(sources)
    vocab = build_vocab(classes, sources, int(cfg.vocab)) if cfg.vocab.isdigit() else vocab_from_file(cfg.vocab)
    cands = make_candidates(sources, classes, vocab, concepts, positions=cfg.positions, budget=cfg.budget,
                            forbidden=forbidden)
    t_cand = time.perf_counter() - t0
    echo(f"{len(cands.texts)} candidates for {len(sources)} captions ({t_cand:.1f}s to tag and build); embedding "
         f"them with their images")
    pipe = _pipe(cfg, settings)
    tables = Tables.empty()
    img_rows = tables.images.add_many(ImageRef(os.fspath(Path(cfg.images) / im)) for im, _ in clean)
    src_rows = tables.texts.add_many(sources)
    cand_rows = tables.texts.add_many(cands.texts)
    t0 = time.perf_counter()
    stats = pipe.run(tables, progress=progress)
    t_embed = time.perf_counter() - t0
    _check_read(tables, ann)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "concepts.json", concepts.to_json())
    write_json_atomic(out / "vocab.json", vocab.to_json())
    copy = out / ann.name
    copy_into(ann, copy)
    published = [v for v in TEXT_VARIANTS if cfg.suite == "rococo" and (data / f"{v}.json").is_file()]
    for v in published:
        copy_into(data / f"{v}.json", out / f"{v}.json")
    device = resolve_device(cfg.embed.device)
    per, views, t_score = [], [], 0.0
    for k, label in enumerate(pipe.labels):
        echo(f"{label}: scoring {len(cands.texts)} candidates against their images, writing adv_{label}.json")
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
    opts = SuiteOptions(annotations=str(copy), data=str(out), images=cfg.images,
                        text_variants=tuple(views + published), image_variants=())
    echo(f"evaluating {len(pipe.labels)} checkpoint(s) on {len(views) + len(published)} caption variant(s)")
    results = _evaluate(cfg, pipe, out / "eval", opts, progress, echo)
    labels = list(pipe.labels)
    for p, label, view in zip(per, labels, views):
        res = results[label]
        p["clean"] = _view(res, "original", "i2t")
        p["adversarial"] = _view(res, view, "i2t")
        p["published"] = {v: _view(res, v, "i2t") for v in published}
        p["file"] = str(out / f"{view}.json")
    transfer = _transfer(results, labels, views, "i2t", "texts", cfg.model)
    write_json_atomic(out / "transfer_texts.json", transfer)
    summary = {"kind": SUMMARY_KIND, "modality": "texts", "model": cfg.model, "suite": cfg.suite,
               "annotations": str(ann), "captions": len(sources), "candidates": len(cands.texts),
               "budget": cfg.budget, "positions": list(cfg.positions), "vocab": vocab.source,
               "vocab_sizes": {c: len(w) for c, w in vocab.words.items()}, "concepts": concepts.source,
               "concept_words": len(concepts.groups), "checkpoints": per,
               "evaluate_with": f"hardrank eval --suite rococo --annotations {copy} --images {cfg.images} "
                                f"--text-variants {' '.join(views)} ...",
               "timings": {"candidates": t_cand, "embed": t_embed, "score": t_score,
                           "total": time.perf_counter() - t_start},
               "embed": {m: s.as_dict() for m, s in stats.items()}}
    write_json_atomic(out / "summary_texts.json", summary)
    return summary


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

def attack_images(cfg: AttackImagesConfig | None = None, *, progress=None, echo=None, **options) -> dict:
    """Attack every checkpoint's images: per checkpoint, write the chosen partner's altered copy of
    each image into ``<cfg.images>/adv_<checkpoint>_<method>_<lam>_s<seed>/``, evaluate every
    checkpoint on every such folder, write ``summary_images.json`` and ``transfer_images.json`` into
    ``cfg.out``; returns the summary. Keyword options work as for ``attack_texts``."""
    cfg = _config(AttackImagesConfig, cfg, options)
    echo = echo or (lambda s: None)
    settings = start_run(cfg.embed.threads, cfg.embed.decode_threads)  # (a bad $HARDRANK_THREADS: usage, first)
    _check_usage(cfg)
    t_start = time.perf_counter()
    ann, out, root = Path(cfg.annotations), Path(cfg.out), Path(cfg.images)
    if not root.is_dir():
        raise FileNotFoundError(f"--images {root} is not a folder")
    clean, _, _ = merge_repeated_images(ann, read_karpathy(ann))  # one image per path, as the rococo suite
    paths = [im for im, _ in clean]
    for im in paths:  # the adversarial copies are written under <images>/adv_*/<path>
        check_relative(im)
    if len(paths) < 2:  # checked here, before any encoding: each image's partner is another image
        raise DataError(f"{ann}: {len(paths)} image(s); the image attack needs at least 2 (each image's partner "
                        f"is another image): pass a Karpathy file with more images")
    pipe = _pipe(cfg, settings)
    tables = Tables.empty()
    img_rows = tables.images.add_many(ImageRef(os.fspath(root / im)) for im in paths)
    caps, cap_img = [], []
    for i, (_, cs) in enumerate(clean):
        caps.extend(pre_caption(c) for c in cs)
        cap_img.extend([i] * len(cs))
    cap_img = np.array(cap_img, dtype=np.int64)
    cap_rows = tables.texts.add_many(caps)
    t0 = time.perf_counter()
    echo(f"embedding {len(paths)} images and {len(caps)} captions with {len(pipe.labels)} checkpoint(s)")
    pipe.run(tables, progress=progress)
    _check_read(tables, ann)
    embs = [pipe.embeddings(k, tables) for k in range(len(pipe.models))]
    echo(f"each image's {min(cfg.k, len(paths) - 1)} nearest images, per checkpoint")
    neighbours = [nearest_images(e["image"][img_rows], cfg.k) for e in embs]
    pairs = list(dict.fromkeys(p for nb in neighbours for p in image_candidates(paths, nb)))
    # the folder keys all the files depend on: kept files are reused only for the same images, order
    # (partners are named by index, patch boxes drawn in image order), size and quality
    order = hashlib.blake2b("\n".join([os.path.abspath(root), *paths]).encode(), digest_size=4).hexdigest()
    tag = f"{cfg.method}_{cfg.lam:g}_s{cfg.seed}_{cfg.size}px_q{cfg.quality}_{order}"
    # `perturb images`' folder for these settings, less its seed: the published baseline, and the stem of
    # the adversarial folders' names
    published = variant_name(cfg.method, cfg.lam, cfg.seed).removesuffix(f"_s{cfg.seed}")
    device = resolve_device(cfg.embed.device)
    t1 = time.perf_counter()
    echo(f"{len(pairs)} candidate images ({cfg.method}, an image with each of its partners) into "
         f"{out / 'candidates' / tag}")
    files, written = write_image_candidates(root, paths, pairs, out / "candidates" / tag, method=cfg.method,
                                            lam=cfg.lam, seed=cfg.seed, size=cfg.size, quality=cfg.quality,
                                            device=device, progress=progress)
    t_write = time.perf_counter() - t1
    echo(f"{len(pairs)} candidate images ({written} written, {len(pairs) - written} kept) in {t_write:.1f}s; "
         f"embedding them")
    file_of = dict(zip(pairs, files))
    cand_rows = dict(zip(pairs, tables.images.add_many(ImageRef(os.fspath(f)) for f in files)))
    pipe.run(tables, progress=progress)
    if tables.images.failed:
        bad = sorted(tables.images.failed)[0]
        raise DataError(f"candidate {tables.images.entries[bad].uri} could not be read; delete it and rerun")
    t_embed = time.perf_counter() - t0 - t_write
    n, kk = len(paths), neighbours[0].shape[1]
    cmax = int(np.bincount(cap_img).max())
    slot = np.arange(len(cap_img)) - np.searchsorted(cap_img, cap_img)  # caption's index within its image
    per, views, t_score = [], [], 0.0
    for k, label in enumerate(pipe.labels):
        echo(f"{label}: scoring {n} x {kk} candidates against their images' {len(cap_img)} captions, writing the "
             f"winners")
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
        folder = root / f"{name}_s{cfg.seed}"
        bar = progress(total=n, desc=f"write {name}_s{cfg.seed}") if progress else None
        for i in range(n):
            src = file_of[(i, int(neighbours[k][i, choice[i]]))]
            dst = folder / Path(paths[i]).with_suffix(".jpg")
            dst.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dst) as tmp:
                shutil.copyfile(src, tmp)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        views.append(name)
        per.append({"checkpoint": label, "images": n, "captions": len(cap_img), "folder": str(folder),
                    "image_success_rate": 100.0 * float((wins > 0).mean()),
                    "caption_success_rate": 100.0 * float(wins.sum()) / len(cap_img),
                    "mean_margin": float(mean.mean()),
                    "partner_rank": {str(r): int((choice == r).sum()) for r in range(kk)}})
    base_views = [published] if (root / f"{published}_s{cfg.seed}").is_dir() else []
    opts = SuiteOptions(annotations=str(ann), images=str(root), text_variants=(),
                        image_variants=tuple(views + base_views), seeds=(cfg.seed,))
    echo(f"evaluating {len(pipe.labels)} checkpoint(s) on {len(views) + len(base_views)} variant folder(s)")
    results = _evaluate(cfg, pipe, out / "eval", opts, progress, echo)
    labels = list(pipe.labels)
    seeded = image_variant_names(views, [cfg.seed])
    for p, label, view in zip(per, labels, seeded):
        res = results[label]
        p["clean"] = _view(res, "original", "t2i")
        p["adversarial"] = _view(res, view, "t2i")
        p["published"] = {f"{v}_s{cfg.seed}": _view(res, f"{v}_s{cfg.seed}", "t2i") for v in base_views}
    write_json_atomic(out / "transfer_images.json", _transfer(results, labels, seeded, "t2i", "images", cfg.model))
    summary = {"kind": SUMMARY_KIND, "modality": "images", "model": cfg.model, "annotations": str(ann),
               "method": cfg.method, "lam": cfg.lam, "k": kk, "seed": cfg.seed, "size": cfg.size,
               "candidates": len(pairs), "checkpoints": per,
               "evaluate_with": f"hardrank eval --suite rococo --annotations {ann} --images {root} "
                                f"--image-variants {' '.join(views)} --seeds {cfg.seed} ...",
               "timings": {"write_candidates": t_write, "embed": t_embed, "score": t_score,
                           "total": time.perf_counter() - t_start}}
    write_json_atomic(out / "summary_images.json", summary)
    return summary
