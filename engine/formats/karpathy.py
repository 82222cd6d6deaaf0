"""The Karpathy-format JSON (COCO/Flickr retrieval splits) and RoCOCO's perturbed-caption files beside it."""
from __future__ import annotations

import logging
from pathlib import Path

from hardrank.formats.annotations import SuiteFormatError, read_json, require_keys
from hardrank.formats.variants import N_PERTURBED

__all__ = ["read_karpathy", "read_rococo_variant", "merge_repeated_images"]

log = logging.getLogger("hardrank.suites")


def read_karpathy(path: str | Path) -> list[tuple[str, list[str]]]:
    """[(image path as written, [raw captions])]. Caption counts vary (COCO 5k: ten images have 6)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise SuiteFormatError(f"{path}: expected a JSON list of {{'image', 'caption'}} objects, "
                               f"got {type(data).__name__}")
    if not data:
        raise SuiteFormatError(f"{path}: holds no images (an empty list); expected a JSON list of "
                               f"{{'image', 'caption'}} objects")
    out = []
    for i, item in enumerate(data):
        require_keys(path, i, item, ("image", "caption"), {"image": str})
        caps = item["caption"]
        if isinstance(caps, str):
            caps = [caps]
        if not isinstance(caps, list) or not caps or not all(isinstance(c, str) for c in caps):
            raise SuiteFormatError(f"{path}: item {i} ({item['image']}) 'caption' must be a non-empty list of strings")
        out.append((item["image"], caps))
    return out


def read_rococo_variant(path: str | Path, clean: list[tuple[str, list[str]]]) -> list[list[str]]:
    """Perturbed captions per image from a RoCOCO file: each caption list is the image's n originals
    (n from the clean file) followed by exactly 5 perturbed captions (one per original 1..5)."""
    data = read_json(path)
    if not isinstance(data, list) or len(data) != len(clean):
        n = len(data) if isinstance(data, list) else type(data).__name__
        raise SuiteFormatError(f"{path}: has {n} images, the clean file has {len(clean)}; "
                               f"use the variant file made from the same split")
    out = []
    for i, (item, (image, caps)) in enumerate(zip(data, clean)):
        require_keys(path, i, item, ("image", "caption"))
        if item["image"] != image:
            raise SuiteFormatError(f"{path}: image {i} is {item['image']!r}, the clean file has {image!r} "
                                   f"(files must share the image order)")
        got = item["caption"]
        n = len(caps)
        if got[:n] != caps:
            bad = next(j for j in range(n) if j >= len(got) or got[j] != caps[j])
            raise SuiteFormatError(
                f"{path}: image {i} ({image}): caption {bad} does not equal the clean file's original "
                f"(expected the {n} originals first, unchanged); is the clean file the right split?")
        pert = got[n:]
        if len(pert) != min(n, N_PERTURBED):
            raise SuiteFormatError(f"{path}: image {i} ({image}) has {len(pert)} perturbed captions after its "
                                   f"{n} originals, expected {min(n, N_PERTURBED)}")
        out.append(pert)
    return out


def merge_repeated_images(path, clean: list[tuple[str, list[str]]], variants: dict[str, list[list[str]]] | None = None,
                          ) -> tuple[list[tuple[str, list[str]]], dict[str, list[list[str]]], dict]:
    """One entry per image path: an image the file lists more than once (a file with one entry per
    caption, or two files joined) is one image, at its first entry, whose captions are those of all its
    entries in file order; each variant's perturbed captions follow the same entries (``variants``: per
    entry, as ``read_rococo_variant`` returns them). BLIP's and RoCOCO's dataset code would make every
    listing its own gallery item, so the copies of one image would compete with each other (R@1 drops).
    Returns (clean, variants, record): ``record`` is empty when nothing repeats, else {"images",
    "entries", "examples": {path: [entry indices]}} for the suite's meta; a repeat is logged as a warning."""
    variants = variants or {}
    at: dict[str, list[int]] = {}
    for i, (im, _) in enumerate(clean):
        at.setdefault(im, []).append(i)
    if len(at) == len(clean):
        return clean, variants, {}
    groups = list(at.values())
    merged = [(clean[g[0]][0], [c for i in g for c in clean[i][1]]) for g in groups]
    merged_variants = {v: [[c for i in g for c in per[i]] for g in groups] for v, per in variants.items()}
    repeated = {im: g for im, g in at.items() if len(g) > 1}
    first = next(iter(repeated.items()))
    log.warning("%s: %d image(s) listed more than once (e.g. %r at entries %s); each is scored as one image "
                "whose captions are those of all its entries (%d entries -> %d images)", path, len(repeated),
                first[0], first[1], len(clean), len(merged))
    record = {"images": len(repeated), "entries": len(clean),
              "examples": {im: g for im, g in list(repeated.items())[:20]}}
    return merged, merged_variants, record

