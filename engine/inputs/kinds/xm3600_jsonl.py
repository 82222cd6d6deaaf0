"""Input kind ``xm3600``: Crossmodal-3600's captions.jsonl, its captions in every language and its images."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hardrank import urls
from hardrank.formats.xm3600 import entry_captions, read_xm3600
from hardrank.inputs.kind import InputKind, InputOptions, Items, Source
from hardrank.items import ImageRef

__all__ = ["KIND"]


class _Xm3600Jsonl(InputKind):
    name = "xm3600"
    describe = "Crossmodal-3600's captions.jsonl (images: --images, else images/ beside it)"
    suffixes = (".jsonl",)

    def detect(self, path: str) -> bool:
        p = Path(path)
        if p.suffix != ".jsonl" or not p.is_file():
            return False
        with p.open(encoding="utf-8-sig", errors="replace") as f:
            first = next((line for line in f if line.strip()), "")
        try:
            return isinstance(item := json.loads(first), dict) and "image/key" in item
        except json.JSONDecodeError:
            return False

    def open(self, path: str, options: InputOptions) -> Source:
        """An image and its captions in every language are each other's positives, fed as written (the xm3600
        suite's default protocol); the groups are named by image file (``<image/key>.jpg``)."""
        items, line_of = read_xm3600(path)
        names = [f"{key}.jpg" for key, _ in items]
        caps, owner = [], []
        for g, (key, langs) in enumerate(items):
            for lang, entry in langs.items():
                got = entry_captions(Path(path), line_of[key], key, lang, entry)
                caps.extend(got)
                owner.extend([g] * len(got))
        out = {"text": Items(caps, list(caps), np.array(owner, dtype=np.int64))}
        root = options.images if options.images is not None else str(Path(path).parent / "images")
        out["image"] = Items(names, [ImageRef(urls.join(root, n)) for n in names], np.arange(len(names)))
        return Source(self.name, path, out, group_names=names, paired=True, path_ids=True)


KIND = _Xm3600Jsonl()
