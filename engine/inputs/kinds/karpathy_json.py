"""Input kind ``karpathy``: a Karpathy-format .json, its captions and (with --images) their images."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hardrank import urls
from hardrank.formats.karpathy import read_karpathy
from hardrank.inputs.kind import InputKind, InputOptions, Items, Source
from hardrank.items import ImageRef
from hardrank.text import pre_caption

__all__ = ["KIND"]


class _KarpathyJson(InputKind):
    name = "karpathy"
    describe = "a Karpathy-format .json (with --images)"
    suffixes = (".json",)

    def detect(self, path: str) -> bool:
        p = Path(path)
        return p.suffix == ".json" and p.is_file()

    def open(self, path: str, options: InputOptions) -> Source:
        """An image and its captions are each other's positives; the groups are named by image path."""
        clean = read_karpathy(path)
        owner = np.repeat(np.arange(len(clean)), [len(c) for _, c in clean])
        caps = [c for _, cs in clean for c in cs]
        items = {"text": Items(caps, [pre_caption(c) for c in caps], owner)}
        paths = [im for im, _ in clean]
        if options.images is not None:
            items["image"] = Items(paths, [ImageRef(urls.join(options.images, im)) for im in paths],
                                   np.arange(len(clean)))
        return Source(self.name, path, items, group_names=paths, paired=True, path_ids=True,
                      hint="" if options.images is not None else "pass --images for the Karpathy file's images")


KIND = _KarpathyJson()
