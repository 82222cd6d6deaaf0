"""COCO/Flickr Karpathy-format retrieval and RoCOCO (perturbed captions, altered images)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hardrank import urls
from hardrank.formats.karpathy import merge_repeated_images, read_karpathy, read_rococo_variant
from hardrank.formats.variants import TEXT_VARIANTS, image_variant_names, is_corruption_variant, variant_hint
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions, caption_protocol, find_annotation
from hardrank.tasks import RankingTask, Suite
from hardrank.text import pre_caption

__all__ = ["build_retrieval", "load_karpathy", "load_rococo"]


def build_retrieval(tables: Tables, images_root: str | Path | None, clean: list[tuple[str, list[str]]], *,
                    text_variants: dict[str, list[list[str]]] | None = None,
                    image_variants: list[str] = (), normalise=pre_caption,
                    refs: list[ImageRef] | None = None, image_keys: list[str | None] | None = None,
                    variant_refs: dict[str, list[tuple[ImageRef, str | None]]] | None = None,
                    query_variants: list[str] = (), variants_root: str | Path | None = None,
                    ) -> list[RankingTask]:
    """i2t and t2i ranking tasks. Gallery groups: ``original`` then one per variant; views:
    ``original`` and ``original + variant``. Ground truth = originals only: every perturbed caption
    or altered image is a distractor. Images are ``images_root/<path>`` (a folder or a URL), or
    ``refs`` (one per entry of ``clean``; ``image_keys``: their content keys when already known); an image
    variant's are ``variants_root/<variant>/<path>`` (default ``images_root``) unless ``variant_refs`` names them.
    Each of ``query_variants`` (among ``image_variants``) also replaces the query images: a task
    ``i2t@<variant>`` whose queries are that variant's images, against the original captions (the
    same image rows as its gallery group: embedded once, in the same pass)."""
    text_variants = text_variants or {}
    # -- i2t: images -> captions
    image_ids = [im for im, _ in clean]
    if refs is None:
        refs = [ImageRef(urls.join(images_root, im)) for im in image_ids]
    keys = image_keys or [None] * len(refs)
    img_rows = np.array([tables.images.add(r, i, k) for r, i, k in zip(refs, image_ids, keys)], dtype=np.int64)
    texts, text_ids, pos_ptr, pos_idx = [], [], [0], []
    for _i, (_im, caps) in enumerate(clean):
        for c in caps:
            pos_idx.append(len(texts))
            texts.append(normalise(c))
            text_ids.append(c)
        pos_ptr.append(len(pos_idx))
    bounds = [0, len(texts)]
    for _name, per_image in text_variants.items():
        for caps in per_image:
            texts.extend(normalise(c) for c in caps)
            text_ids.extend(caps)
        bounds.append(len(texts))
    groups = ["original", *text_variants]
    # units: the images; a caption, perturbed or not, belongs to its image, an altered image to its original
    n_img = len(clean)
    owner = np.repeat(np.arange(n_img), [len(c) for _, c in clean])
    caption_units = [owner] + [np.repeat(np.arange(n_img), [len(c) for c in per_image])
                               for per_image in text_variants.values()]
    units = {"unit_ids": image_ids, "query_units": np.arange(n_img, dtype=np.int64)}
    i2t = RankingTask(
        name="i2t", query_modality="image", query_items=img_rows, query_ids=image_ids,
        groups=groups, group_bounds=np.array(bounds, dtype=np.int64),
        gallery_items=tables.texts.add_many(texts, text_ids), gallery_ids=text_ids,
        pos_ptr=np.array(pos_ptr, dtype=np.int64), pos_idx=np.array(pos_idx, dtype=np.int64),
        views={"original": ["original"], **{v: ["original", v] for v in text_variants}},
        gallery_units=np.concatenate(caption_units).astype(np.int64), **units)
    # -- t2i: captions -> images
    n_orig = bounds[1]
    caption_rows = i2t.gallery_items[:n_orig]
    gal_rows, gal_ids = [img_rows], list(image_ids)
    for v in image_variants:
        v_ids = [f"{v}/{im}" for im in image_ids]
        if variant_refs is not None:
            gal_rows.append(np.array([tables.images.add(r, i, k) for (r, k), i in zip(variant_refs[v], v_ids)],
                                     dtype=np.int64))
        else:
            vroot = images_root if variants_root is None else variants_root
            gal_rows.append(tables.images.add_many((ImageRef(urls.join(vroot, v, im)) for im in image_ids),
                                                   v_ids))
        gal_ids.extend(v_ids)
    unknown = [v for v in query_variants if v not in image_variants]
    if unknown:
        raise ValueError(f"query variants {unknown} are not among the image variants {list(image_variants)}")
    query_tasks = [RankingTask(
        name=f"i2t@{v}", query_modality="image", query_items=gal_rows[1 + list(image_variants).index(v)],
        query_ids=[f"{v}/{im}" for im in image_ids],
        groups=["original"], group_bounds=np.array(bounds[:2], dtype=np.int64),
        gallery_items=i2t.gallery_items[:bounds[1]], gallery_ids=text_ids[:bounds[1]],
        pos_ptr=i2t.pos_ptr, pos_idx=i2t.pos_idx, views={"original": ["original"]},
        gallery_units=owner.astype(np.int64), **units) for v in query_variants]
    t2i = RankingTask(
        name="t2i", query_modality="text", query_items=caption_rows, query_ids=text_ids[:n_orig],
        groups=["original", *image_variants],
        group_bounds=np.arange(len(image_variants) + 2, dtype=np.int64) * n_img,
        gallery_items=np.concatenate(gal_rows), gallery_ids=gal_ids,
        pos_ptr=np.arange(n_orig + 1, dtype=np.int64), pos_idx=owner.astype(np.int64),
        views={"original": ["original"], **{v: ["original", v] for v in image_variants}},
        unit_ids=image_ids, query_units=owner.astype(np.int64),
        gallery_units=np.tile(np.arange(n_img, dtype=np.int64), len(image_variants) + 1))
    for t in (i2t, t2i, *query_tasks):
        t.validate()
    return [i2t, t2i, *query_tasks]


def load_karpathy(tables: Tables, opts: SuiteOptions, name: str = "karpathy") -> Suite:
    """Plain Karpathy retrieval (COCO 5k, Flickr30k 1k, ...): the clean protocol, plus any image variants
    (``--image-variants --seeds``: gallery distractors; ImageNet-C ones also as queries, see build_retrieval)."""
    ann = find_annotation(opts, "coco_karpathy_test.json", f"suite {name}")
    errors = [] if opts.images is not None else [
        ValueError(f"suite {name} needs --images DIR (the folder the paths in {ann.name} are relative to)")]
    clean, _, repeated = merge_repeated_images(ann, read_karpathy(ann))
    img_variants = image_variant_names(opts.image_variants, opts.seeds)
    errors += _missing_variants(opts, img_variants)
    protocol, normalise = caption_protocol(opts)
    # no --images: paths as written (ids only)
    tasks = build_retrieval(tables, opts.images or "", clean, image_variants=img_variants,
                            query_variants=[v for v in img_variants if is_corruption_variant(v)], normalise=normalise,
                            variants_root=opts.variants_dir)
    return Suite(name=name, ranking=tasks, tie_rule=opts.tie_rule, view_average=_seed_averages(opts),
                 image_errors=errors,
                 meta={"annotations": str(ann), "images": len(clean), "captions": int(tasks[0].pos_ptr[-1]),
                       "caption_protocol": protocol,
                       **({"image_variants": img_variants} if img_variants else {}),
                       **({"repeated_images": repeated} if repeated else {})})


def _missing_variants(opts: SuiteOptions, img_variants: list[str]) -> list[Exception]:
    errors = []
    for v in img_variants:
        root = opts.variants_dir or opts.images
        d = urls.join(root, v) if root is not None else None
        if d is not None and not urls.is_dir(d):
            errors.append(FileNotFoundError(f"altered images {d} do not exist; make them with "
                                            f"`{variant_hint(v)}`"))
    return errors


def _seed_averages(opts: SuiteOptions) -> dict[str, list[str]]:
    """The views averaged over seeds (``mix_0.9`` = mean of ``mix_0.9_s1``, ``mix_0.9_s10``, ...)."""
    return {v: [f"{v}_s{s}" for s in opts.seeds] for v in opts.image_variants if len(opts.seeds) > 1}


def load_rococo(tables: Tables, opts: SuiteOptions, name: str = "rococo") -> Suite:
    """RoCOCO: every text variant in one i2t task and every image variant (x seeds) in one t2i task."""
    ann = find_annotation(opts, "coco_karpathy_test.json", f"suite {name}")
    # the perturbed-caption files sit next to the clean file unless --data names their folder
    folder = Path(opts.data) if opts.data and opts.annotations else ann.parent
    errors = [] if opts.images is not None else [
        ValueError(f"suite {name} needs --images DIR (holding val2014/ and the altered image folders)")]
    clean = read_karpathy(ann)
    wanted = opts.text_variants if opts.text_variants is not None else TEXT_VARIANTS
    text_variants = {}
    for v in wanted:
        f = folder / f"{v}.json"
        if f.is_file():
            text_variants[v] = read_rococo_variant(f, clean)
        elif opts.text_variants is not None:
            raise FileNotFoundError(f"{f} does not exist (asked for text variant {v!r})")
    clean, text_variants, repeated = merge_repeated_images(ann, clean, text_variants)
    img_variants = image_variant_names(opts.image_variants, opts.seeds)
    errors += _missing_variants(opts, img_variants)
    protocol, normalise = caption_protocol(opts)
    tasks = build_retrieval(tables, opts.images or "", clean, text_variants=text_variants,
                            image_variants=img_variants,
                            query_variants=[v for v in img_variants if is_corruption_variant(v)], normalise=normalise,
                            variants_root=opts.variants_dir)
    return Suite(name=name, ranking=tasks, tie_rule=opts.tie_rule, view_average=_seed_averages(opts),
                 image_errors=errors,
                 meta={"annotations": str(ann), "images": len(clean), "captions": int(tasks[0].pos_ptr[-1]),
                       "caption_protocol": protocol,
                       "text_variants": list(text_variants), "image_variants": img_variants,
                       **({"repeated_images": repeated} if repeated else {})})
