"""Karpathy-style retrieval built from WebDataset shards' (or img2dataset outputs') own images and captions."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hardrank import urls
from hardrank.config import opt
from hardrank.errors import DataError, UsageError
from hardrank.formats.annotations import SuiteFormatError
from hardrank.formats.variants import N_PERTURBED, TEXT_VARIANTS, image_variant_names, is_corruption_variant
from hardrank.inputs import SampleSet, parse_captions, read_samples, read_shards, sample_captions
from hardrank.inputs.webdataset import variant_shards
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions, caption_protocol
from hardrank.suites.karpathy import build_retrieval
from hardrank.tasks import Suite

__all__ = ["load_wds", "WdsOptions"]


@dataclass(frozen=True)
class WdsOptions:
    """The suite's own options."""

    captions: str = opt("txt", "where each sample's captions are: txt (the .txt member or Parquet "
                        "caption column, one caption per line) or json:KEY (a string or list in the .json member)")


def load_wds(tables: Tables, opts: SuiteOptions, own: WdsOptions, name: str = "wds") -> Suite:
    """i2t and t2i over every sample that has an image and at least one caption, in shard order: the
    protocol of ``karpathy`` (each image's captions are its positives; a caption's image is its one
    positive). ``--images`` names the shards (``dir/{00000..00099}.tar``, local or a URL), an img2dataset
    files folder or its Parquet files; ``--captions`` where the captions are (``txt`` | ``json:KEY``).

    RoCOCO on shards: caption variants ``dir/<kind>/<shard>`` and altered images
    ``dir/<method>_<lam>_s<seed>/<shard>`` (what ``hardrank perturb texts|images`` write for shards) join
    as in ``rococo``: ``--text-variants`` (default: every kind present), ``--image-variants --seeds``."""
    if not opts.images:
        raise UsageError(f"suite {name} needs --images: tar shards (e.g. 'shards/{{00000..00099}}.tar', local or "
                         f"s3://...), an img2dataset output folder, or img2dataset .parquet files")
    how = parse_captions(own.captions)
    ss = read_samples(opts.images)
    clean, refs, keys = [], [], []
    skipped: Counter = Counter()
    for s in ss.samples:
        if s.image is None:
            skipped["no image"] += 1
            continue
        caps = sample_captions(s, how)
        if not caps:
            skipped["no caption"] += 1
            continue
        clean.append((s.id, caps))
        refs.append(ImageRef(s.image))
        keys.append(s.image_key)
    if not clean:
        raise DataError(f"suite {name}: {opts.images} holds {len(ss.samples)} sample(s) and none has both an image "
                        f"and a caption ({dict(skipped)}); the captions are read with --captions {own.captions}: "
                        f"try --captions txt or --captions json:KEY naming the .json field that holds them")
    kept = [s for s in ss.samples if s.image is not None and sample_captions(s, how)]
    text_variants, img_variants, variant_refs = {}, [], {}
    if ss.layout == "webdataset":
        text_variants = _text_variants(ss, kept, clean, opts, how)
        img_variants = image_variant_names(opts.image_variants, opts.seeds)
        variant_refs = {v: _image_variant(ss, kept, v, opts.variants_dir or "") for v in img_variants}
    elif opts.image_variants or opts.text_variants:
        raise UsageError(f"suite {name}: --image-variants / --text-variants need tar shard inputs (written back by "
                         f"hardrank perturb images|texts); {opts.images} is {ss.layout}")
    protocol, normalise = caption_protocol(opts)
    tasks = build_retrieval(tables, None, clean, refs=refs, image_keys=keys, text_variants=text_variants,
                            image_variants=img_variants, variant_refs=variant_refs or None,
                            query_variants=[v for v in img_variants if is_corruption_variant(v)], normalise=normalise)
    averages = {v: [f"{v}_s{s}" for s in opts.seeds] for v in opts.image_variants if len(opts.seeds) > 1}
    return Suite(name=name, ranking=tasks, tie_rule=opts.tie_rule, view_average=averages,
                 meta={**ss.meta(), "captions_from": own.captions, "caption_protocol": protocol, "images": len(clean),
                       "captions": int(tasks[0].pos_ptr[-1]), "samples_skipped": dict(skipped),
                       "text_variants": list(text_variants), "image_variants": img_variants})


def _variant(ss: SampleSet, v: str, required: bool, folder: str = "") -> SampleSet | None:
    """The variant shards ``<folder>/<v>/<shard>`` (``folder``: default the shards' own folder)."""
    shards = variant_shards(ss, folder, v)
    missing = [s for s in shards if not urls.exists(s)]
    if missing:
        if required:
            raise FileNotFoundError(f"variant {v}: shard {missing[0]} does not exist ({len(missing)} of {len(shards)} "
                                    f"missing); make them with `hardrank perturb texts|images --images "
                                    f"<the shards> ...` (written to <--out>/{v}/; eval reads <shard folder>/{v}/ "
                                    f"unless --variants-dir names that --out)")
        return None
    return read_shards(shards, source=v)


def _text_variants(ss, kept, clean, opts, how) -> dict[str, list[list[str]]]:
    out = {}
    wanted = opts.text_variants if opts.text_variants is not None else TEXT_VARIANTS
    for v in wanted:
        vs = _variant(ss, v, required=opts.text_variants is not None)
        if vs is None:
            continue
        by_id = {s.id: s for s in vs.samples}  # <shard>#<key>: keys may repeat across shards
        per = []
        for s, (sid, caps) in zip(kept, clean):
            got = sample_captions(by_id[s.id], how) if s.id in by_id else None
            if got is None or got[:len(caps)] != caps or len(got) - len(caps) != min(len(caps), N_PERTURBED):
                raise SuiteFormatError(f"variant {v}: sample {sid} "
                                       + ("is missing" if got is None else "does not hold its originals followed by "
                                          f"{min(len(caps), N_PERTURBED)} perturbed captions")
                                       + "; were the variant shards made from these shards?")
            per.append(got[len(caps):])
        out[v] = per
    return out


def _image_variant(ss, kept, v, folder: str) -> list[tuple[ImageRef, str | None]]:
    vs = _variant(ss, v, required=True, folder=folder)
    by_id = {s.id: s for s in vs.samples if s.image is not None}  # <shard>#<key>: keys may repeat across shards
    missing = [s.id for s in kept if s.id not in by_id]
    if missing:
        raise DataError(f"image variant {v}: {len(missing)} sample(s) have no altered image, e.g. {missing[:3]}; "
                        f"make the variant again with hardrank perturb images")
    return [(ImageRef(by_id[s.id].image), by_id[s.id].image_key) for s in kept]
