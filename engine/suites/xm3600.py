"""Crossmodal-3600 (Thapliyal et al., EMNLP 2022): image-text retrieval per caption language, from captions.jsonl."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from hardrank import urls
from hardrank.config import opt
from hardrank.errors import UsageError
from hardrank.formats.karpathy import merge_repeated_images
from hardrank.formats.xm3600 import entry_captions, read_xm3600
from hardrank.items import Tables
from hardrank.suites._common import SuiteOptions, caption_protocol, find_annotation
from hardrank.suites.karpathy import build_retrieval
from hardrank.tasks import Suite

__all__ = ["load_xm3600", "XM3600Options", "XM3600_DEFAULT_PROTOCOL", "CAPTIONS_PER_IMAGE"]

log = logging.getLogger("hardrank.suites")

# pre_caption is BLIP's English clean-up (lower-casing, ASCII punctuation, 30 space-separated words): not fit for
# Thai, Chinese or Arabic text, and CLIP_benchmark feeds XM3600 captions as written, so raw is this suite's default
XM3600_DEFAULT_PROTOCOL = "raw"
CAPTIONS_PER_IMAGE = ("all", "first")  # every caption of the image in the language, or CLIP_benchmark's first one


@dataclass(frozen=True)
class XM3600Options:
    """The suite's own options (flags, job-file keys and keywords like every other option)."""

    languages: tuple[str, ...] | None = opt(None, "caption languages to evaluate, one result each "
                                            "from one encode pass (e.g. en de zh); default: every language in "
                                            "the file", flag="--language")
    captions_per_image: str = opt("all", "all = every caption of an image in the language is a "
                                  "positive (Karpathy protocol); first = its first caption only (CLIP_benchmark's "
                                  "crossmodal3600)", choices=CAPTIONS_PER_IMAGE)


def load_xm3600(tables: Tables, opts: SuiteOptions, own: XM3600Options, name: str = "xm3600") -> list[Suite]:
    """One retrieval suite per language (``xm3600-<lang>``, the Karpathy protocol: i2t and t2i over the
    images holding captions in that language; ``--captions-per-image all`` makes every caption of an image a
    positive, ``first`` keeps the first as CLIP_benchmark's crossmodal3600 does). All languages share the
    image rows, so every image is decoded and encoded once. ``--language`` picks languages (default: every one
    in the file); captions are fed as written unless ``--caption-protocol blip``. An image without an entry
    for a language is left out of that language (counted); an entry without captions is an error."""
    ann = find_annotation(opts, "captions.jsonl", f"suite {name}")
    images = opts.images if opts.images is not None else str(ann.parent / "images")
    errors = [] if urls.is_dir(images) else [FileNotFoundError(
        f"suite {name}: images folder {images} does not exist; pass --images DIR holding <image/key>.jpg "
        f"(XM3600's images/)")]
    items, line_of = read_xm3600(ann)
    present = list(dict.fromkeys(lang for _, langs in items for lang in langs))
    wanted = list(dict.fromkeys(own.languages)) if own.languages else present
    unknown = [lang for lang in wanted if lang not in present]
    if unknown:
        raise UsageError(f"suite {name}: language(s) {unknown} not in {ann}; it has {sorted(present)} "
                         f"(--language takes XM3600's codes, e.g. en de zh)")
    protocol, normalise = caption_protocol(opts, XM3600_DEFAULT_PROTOCOL)
    suites = []
    for lang in wanted:
        clean, missing = [], 0
        for key, langs in items:
            if lang not in langs:
                missing += 1
                continue
            caps = entry_captions(ann, line_of[key], key, lang, langs[lang])
            clean.append((f"{key}.jpg", caps[:1] if own.captions_per_image == "first" else caps))
        if missing:
            log.warning("%s: %d of %d image(s) have no %r captions; they are left out of %s-%s", ann, missing,
                        len(items), lang, name, lang)
        clean, _, repeated = merge_repeated_images(ann, clean)  # a key on two lines is one image
        i2t, t2i = build_retrieval(tables, images, clean, normalise=normalise)
        suites.append(Suite(name=f"{name}-{lang}", ranking=[i2t, t2i], tie_rule=opts.tie_rule, image_errors=errors,
                            meta={"annotations": str(ann), "language": lang, "images": len(clean),
                                  "captions": int(i2t.pos_ptr[-1]), "caption_protocol": protocol,
                                  "captions_per_image": own.captions_per_image,
                                  "images_without_language": missing, "languages_in_file": present,
                                  **({"repeated_images": repeated} if repeated else {})}))
    return suites
