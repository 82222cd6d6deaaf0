"""Karpathy-style retrieval built from WebDataset shards' (or img2dataset outputs') own images and captions."""
from __future__ import annotations

from collections import Counter

from ..errors import DataError, UsageError
from ..items import ImageRef, Tables
from ..sources import parse_captions, read_samples, sample_captions
from ..tasks import Suite
from ._common import SuiteOptions
from .karpathy import build_retrieval

__all__ = ["load_wds"]


def load_wds(tables: Tables, opts: SuiteOptions, name: str = "wds") -> Suite:
    """i2t and t2i over every sample that has an image and at least one caption, in shard order: the
    protocol of ``karpathy`` (each image's captions are its positives; a caption's image is its one
    positive). ``--images`` names the shards (``dir/{00000..00099}.tar``, local or a URL), an img2dataset
    files folder or its Parquet files; ``--captions`` where the captions are (``txt`` | ``json:KEY``)."""
    if not opts.images:
        raise UsageError(f"suite {name} needs --images: tar shards (e.g. 'shards/{{00000..00099}}.tar', local or "
                         f"s3://...), an img2dataset output folder, or img2dataset .parquet files")
    how = parse_captions(opts.captions)
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
                        f"and a caption ({dict(skipped)}); the captions are read with --captions {opts.captions}: "
                        f"try --captions txt or --captions json:KEY naming the .json field that holds them")
    i2t, t2i = build_retrieval(tables, None, clean, refs=refs, image_keys=keys)
    return Suite(name=name, ranking=[i2t, t2i], tie_rule=opts.tie_rule,
                 meta={**ss.meta(), "captions_from": opts.captions, "images": len(clean),
                       "captions": int(i2t.pos_ptr[-1]), "samples_skipped": dict(skipped)})
