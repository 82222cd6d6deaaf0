"""A Karpathy-format annotation file and its images written as WebDataset tar shards (``hardrank toy shards``)."""
from __future__ import annotations

import json
import os

from hardrank import urls
from hardrank.errors import UsageError
from hardrank.formats.karpathy import merge_repeated_images, read_karpathy
from hardrank.inputs.webdataset import write_shard

__all__ = ["write_karpathy_shards"]



def write_karpathy_shards(annotations: str, images: str, out: str, *, per_shard: int = 1000) -> str:
    """A Karpathy-format file and its images as WebDataset shards ``out/00000.tar ...`` (local or a URL), in
    the file's order: ``KEY.jpg`` (the image's bytes as they are), ``KEY.txt`` (its captions, one per line),
    ``KEY.json`` (``{"captions": [...], "image": path}``). Returns the brace pattern naming the shards
    (the one file's name when there is one shard)."""
    if per_shard < 1:
        raise UsageError(f"per_shard must be >= 1, got {per_shard}")
    clean, _, _ = merge_repeated_images(annotations, read_karpathy(annotations))  # one sample per image
    n = -(-len(clean) // per_shard)
    for si in range(n):
        batch = clean[si * per_shard:(si + 1) * per_shard]
        data = urls.read_many([urls.join(images, im) for im, _ in batch])
        samples = []
        for j, ((im, caps), b) in enumerate(zip(batch, data)):
            if isinstance(b, Exception):
                raise b
            ext = os.path.splitext(im)[1].lstrip(".").lower() or "jpg"
            samples.append((f"{si * per_shard + j:09d}", {ext: b, "txt": "\n".join(caps).encode("utf-8"),
                                                         "json": json.dumps({"captions": caps, "image": im}).encode()}))
        write_shard(urls.join(out, f"{si:05d}.tar"), samples)
    return urls.join(out, "00000.tar" if n == 1 else f"{{00000..{n - 1:05d}}}.tar")
