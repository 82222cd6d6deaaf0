"""Crossmodal-3600 (Thapliyal et al., EMNLP 2022): image-text retrieval per caption language, from captions.jsonl."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from hardrank import urls
from hardrank.config import opt
from hardrank.errors import UsageError
from hardrank.items import Tables
from hardrank.suites._common import SuiteFormatError, SuiteOptions, caption_protocol, find_annotation
from hardrank.suites.karpathy import build_retrieval, merge_repeated_images
from hardrank.tasks import Suite

__all__ = ["load_xm3600", "XM3600Options", "read_xm3600", "entry_captions", "XM3600_DEFAULT_PROTOCOL",
           "CAPTIONS_PER_IMAGE"]

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


def read_xm3600(path: str | Path) -> tuple[list[tuple[str, dict]], dict[str, int]]:
    """([(image key, {language: entry})] in file order, {image key: its line number}) from XM3600's
    captions.jsonl: one JSON object per line
    with ``image/key`` (the image is ``images/<key>.jpg``), ``image/locale`` and one object per language
    holding ``caption`` (a list; also ``caption/tokenized`` and ``caption/tokenized/lowercase``, unused)."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8-sig") as f:  # a byte-order mark is not JSON
        try:
            lines = list(enumerate(f, start=1))
        except UnicodeDecodeError as exc:
            raise SuiteFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); XM3600's "
                                   f"captions.jsonl is UTF-8: re-save it as UTF-8") from None
    for n, line in lines:
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteFormatError(f"{path}: line {n} is not valid JSON ({exc}); expected one object per line "
                                   f"as in XM3600's captions.jsonl") from None
        if not isinstance(item, dict) or not isinstance(item.get("image/key"), str) or not item["image/key"]:
            got = sorted(item) if isinstance(item, dict) else type(item).__name__
            raise SuiteFormatError(f"{path}: line {n} has no 'image/key' string (got {got}); expected XM3600's "
                                   f"captions.jsonl: {{\"image/key\": ..., \"<language>\": {{\"caption\": [...]}}}}")
        out.append((item["image/key"], {k: v for k, v in item.items() if not k.startswith("image/")}, n))
    if not out:
        raise SuiteFormatError(f"{path}: holds no images (no JSON lines); expected XM3600's captions.jsonl")
    return [(key, langs) for key, langs, _ in out], {key: n for key, _, n in out}


def entry_captions(path: Path, line: int, key: str, lang: str, entry) -> list[str]:
    """The captions of one language entry of one line; an entry without captions raises naming both."""
    caps = entry.get("caption") if isinstance(entry, dict) else None
    if not isinstance(caps, list) or not caps or not all(isinstance(c, str) and c.strip() for c in caps):
        got = (f"'caption' = {caps!r}" if isinstance(entry, dict) and "caption" in entry else
               f"keys {sorted(entry)}" if isinstance(entry, dict) else f"a {type(entry).__name__}")
        raise SuiteFormatError(f"{path}: line {line} (image {key}), language {lang!r}: expected an object whose "
                               f"'caption' is a non-empty list of non-empty strings, got {got}; fix or drop the "
                               f"entry, or leave {lang!r} out of --language")
    return caps


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
