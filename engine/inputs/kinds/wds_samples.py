"""Input kind ``wds``: WebDataset tar shards or img2dataset Parquet, each sample's image with its captions."""
from __future__ import annotations

import numpy as np

from hardrank.inputs.kind import InputKind, InputOptions, Items, Source, UnknownInput
from hardrank.inputs.webdataset import is_sample_source, parse_captions, read_samples, sample_captions
from hardrank.items import ImageRef
from hardrank.text import pre_caption

__all__ = ["KIND"]


class _Samples(InputKind):
    name = "wds"
    describe = ("WebDataset tar shards ('dir/{00000..00099}.tar', local or a URL) or img2dataset Parquet files "
                "('dir/*.parquet'): each sample's image and its captions (--captions)")
    remote = True  # shards are read where they are: workers fetch their members by range requests

    def detect(self, path: str) -> bool:
        return is_sample_source(path)

    def open(self, path: str, options: InputOptions) -> Source:
        """Each sample's image and its captions, positives of each other (like a Karpathy file's image
        and captions); ids are the samples' (``<shard>#<key>``)."""
        how = parse_captions(options.captions)
        ss = read_samples(path)
        ids, refs, known, caps, owner = [], [], [], [], []
        for s in ss.samples:
            if s.image is None:
                continue
            g = len(ids)
            ids.append(s.id)
            refs.append(ImageRef(s.image))
            known.append(s.image_key)
            for c in sample_captions(s, how):
                caps.append(c)
                owner.append(g)
        if not ids:
            raise UnknownInput(f"{path}: holds {len(ss.samples)} sample(s), none with an image")
        items = {"image": Items(ids, refs, np.arange(len(ids)), known=known)}
        if caps:
            items["text"] = Items(caps, [pre_caption(c) for c in caps], np.array(owner, dtype=np.int64))
        return Source(self.name, path, items, group_names=ids, paired=True)


KIND = _Samples()
