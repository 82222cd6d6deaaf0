"""RoCOCO perturbations of tar shards, written back as shards beside them (altered images, perturbed captions).

Layout, as for folders (``<images>/<variant>/<path>``): the shards ``DIR/00000.tar ...`` get

- ``DIR/<method>_<lam>_s<seed>/00000.tar ...``: every sample's image mixed or patched (the reference plan:
  the samples in shard order are the annotation order), its text members copied, same keys;
- ``DIR/<corruption>_<severity>_s<seed>/00000.tar ...``: every sample's image corrupted (ImageNet-C), encoded
  as its member was (``.jpg`` JPEG, ``.png`` PNG), its text members copied, same keys;
- ``DIR/<kind>/00000.tar ...``: text-only samples, same keys, whose captions are the originals followed by
  one perturbed caption for each of the first five (RoCOCO's variant-file layout), as ``.txt`` lines and
  under the ``.json`` key the captions were read from.

``--suite wds --image-variants mix_0.9 --text-variants same_concept`` then reads them back into the RoCOCO
protocol. Each output shard is written atomically; shards that exist are skipped, so a killed run resumes.
"""
from __future__ import annotations

import io
import json
import os

import numpy as np
import torch
from PIL import Image

from hardrank import urls
from hardrank.devices import resolve_device
from hardrank.errors import DataError, UsageError
from hardrank.formats.variants import N_PERTURBED
from hardrank.inputs.webdataset import (
    SampleSet,
    parse_captions,
    read_samples,
    sample_captions,
    variant_shards,
    write_shard,
)
from hardrank.perturb.corruptions import JPEG_QUALITY, corrupt_named, encode_like, frost_textures, image_rng
from hardrank.perturb.corruptions import variant_name as corruption_variant
from hardrank.perturb.images import _altered_batches, _check_args, _plan, variant_name
from hardrank.perturb.texts import _check_kind, _perturb
from hardrank.text import pre_caption

__all__ = ["alter_shards", "corrupt_shards", "perturb_shard_texts"]


def _by_shard(ss: SampleSet) -> list[list[int]]:
    """Sample indices (among samples with an image) of each shard, in order."""
    out: dict[str, list[int]] = {s: [] for s in ss.shards}
    j = 0
    for s in ss.samples:
        if s.image is None:
            continue
        out[urls.parse_member_uri(s.image)[0]].append(j)
        j += 1
    return list(out.values())


def alter_shards(spec: str, out: str | None, *, method: str, lam: float = 0.9, seed: int = 1, size: int = 384,
                 batch_size: int = 64, device: str | None = None, quality: int = 75) -> dict:
    """Write RoCOCO Mix/Patch copies of the images of tar shards as shards (see the module docstring)."""
    _check_args(method, lam, seed)
    ss = read_samples(spec, hash_images=False)
    if ss.layout != "webdataset":
        raise UsageError(f"{spec}: perturb images writes tar shards back for tar shard inputs; for a folder of "
                         f"images use --images FOLDER --annotations FILE")
    name = variant_name(method, lam, seed)
    samples = [s for s in ss.samples if s.image is not None]
    targets = variant_shards(ss, out or "", name)
    groups = _by_shard(ss)
    todo = {i for i, t in enumerate(targets) if not urls.exists(t)}
    shard_of = {j: i for i, g in enumerate(groups) for j in g}
    dev = torch.device(resolve_device(device or "auto"))
    done: dict[int, bytes] = {}
    written = 0

    def load(idx: list[int]) -> list[np.ndarray]:
        return _read_rgb(samples, idx, size)

    plan = _plan(len(samples), method=method, lam=float(lam), seed=seed, size=size, batch_size=batch_size)
    needed = (lambda b: any(shard_of[i] in todo for i in b.indices))
    for b, y in _altered_batches(plan, load, method=method, lam=float(lam), device=dev, needed=needed):
        for j, i in enumerate(b.indices):
            if shard_of[i] in todo:
                buf = io.BytesIO()
                Image.fromarray(y[j]).save(buf, format="JPEG", quality=quality)
                done[i] = buf.getvalue()
        for si in sorted(todo):
            if all(i in done for i in groups[si]):
                write_shard(targets[si], [(samples[i].key, {"jpg": done.pop(i), **_texts(samples[i])})
                                          for i in groups[si]])
                written += len(groups[si])
                todo.discard(si)
    self_pairs = sum(int(p == j) for b in plan for j, p in enumerate(b.perm))
    return {"method": method, "lam": float(lam), "seed": seed, "images": len(samples), "self_pairs": self_pairs,
            "written": written, "skipped": len(samples) - written, "shards": targets}


def corrupt_shards(spec: str, out: str | None, *, corruptions, severities, seed: int = 0,
                   quality: int = JPEG_QUALITY, frost_dir=None) -> dict:
    """Write ImageNet-C corrupted copies of the images of tar shards as shards, one shard set per corruption and
    severity (see the module docstring). Each shard's images are read once for all its missing variants."""
    corruptions, severities = tuple(corruptions), tuple(severities)
    names = [(c, s, corruption_variant(c, s, seed)) for c in corruptions for s in severities]
    if not names:
        raise UsageError("name at least one corruption and one severity")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be an int >= 0 (it names the shard folders <variant>_s<seed>), got {seed!r}")
    if "frost" in corruptions:
        frost_textures(frost_dir)  # a missing extra fails before any work
    ss = read_samples(spec, hash_images=False)
    if ss.layout != "webdataset":
        raise UsageError(f"{spec}: perturb images writes tar shards back for tar shard inputs; for a folder of "
                         f"images use --images FOLDER")
    samples = [s for s in ss.samples if s.image is not None]
    targets = {v: variant_shards(ss, out or "", v) for _, _, v in names}
    written = 0
    for si, group in enumerate(_by_shard(ss)):
        todo = [(c, sev, v) for c, sev, v in names if not urls.exists(targets[v][si])]
        if not todo:
            continue
        images = _read_rgb(samples, group)
        for c, sev, v in todo:
            rows = []
            for i, x in zip(group, images):
                member = urls.parse_member_uri(samples[i].image)[3]
                ext = member[len(samples[i].key) + 1:] if member.startswith(samples[i].key + ".") else "jpg"
                y = corrupt_named(f"{samples[i].image} (sample {samples[i].id})", x, c, sev,
                                  image_rng(seed, c, sev, samples[i].key), frost_dir)
                rows.append((samples[i].key, {ext: encode_like(y, ext.rsplit(".", 1)[-1], quality),
                                              **_texts(samples[i])}))
            write_shard(targets[v][si], rows)
            written += len(rows)
    total = len(samples) * len(names)
    return {"method": "corrupt", "corruptions": list(corruptions), "severities": list(severities), "seed": seed,
            "images": len(samples), "variants": [v for _, _, v in names], "written": written,
            "skipped": total - written, "shards": [t for _, _, v in names for t in targets[v]]}


def _texts(sample) -> dict[str, bytes]:
    return {ext: str(v).encode("utf-8") for ext, v in sample.texts.items() if ext in ("txt", "json", "cls")}


def perturb_shard_texts(spec: str, out: str | None, kind: str, model, tokenizer, seed: int, *, captions: str = "txt",
                        vocab=None, influence=None, batch_size: int = 512) -> dict:
    """Write the ``kind`` caption variant of tar shards as text-only shards (see the module docstring)."""
    _check_kind(kind)
    how = parse_captions(captions)
    ss = read_samples(spec, hash_images=False)
    if ss.layout != "webdataset":
        raise UsageError(f"{spec}: perturb texts writes tar shards back for tar shard inputs")
    samples = [s for s in ss.samples if s.image is not None]
    caps = [sample_captions(s, how) for s in samples]
    sources = [c for cs in caps for c in cs[:N_PERTURBED]]
    perturbed, n_fallback = _perturb(sources, model, tokenizer, kind, seed, vocab, influence, batch_size)
    targets = variant_shards(ss, out or "", kind)
    json_key = how[1] or "captions"
    per_sample, k, unchanged = [], 0, 0
    for cs in caps:
        m = min(len(cs), N_PERTURBED)
        new = perturbed[k:k + m]
        k += m
        unchanged += sum(p in {pre_caption(c) for c in cs} for p in new)
        per_sample.append(list(cs) + new)
    written = 0
    for si, group in enumerate(_by_shard(ss)):
        if urls.exists(targets[si]):
            continue
        write_shard(targets[si], [(samples[i].key, {"txt": "\n".join(per_sample[i]).encode("utf-8"),
                                                    "json": json.dumps({json_key: per_sample[i]}).encode("utf-8")})
                                  for i in group])
        written += 1
    return {"kind": kind, "seed": int(seed), "images": len(samples), "originals": sum(len(c) for c in caps),
            "perturbed": len(perturbed), "fallback": n_fallback, "unchanged": unchanged, "shards": targets,
            "shards_written": written, "folder": os.path.dirname(targets[0]) if targets else None}


def _read_rgb(samples, idx: list[int], size: int | None = None) -> list[np.ndarray]:
    """The samples ``idx`` as (H, W, 3) uint8 RGB arrays (bicubic-resized to ``size`` x ``size`` if given);
    an unreadable or undecodable sample stops the run naming it (its shard must be re-written without it)."""
    data = urls.read_many([samples[i].image for i in idx])
    arrs = []
    for i, b in zip(idx, data):
        if isinstance(b, Exception):
            raise DataError(f"cannot read {samples[i].id}: {b}") from b
        try:
            with Image.open(io.BytesIO(b)) as im:
                im = im.convert("RGB")
                if size is not None and im.size != (size, size):
                    im = im.resize((size, size), Image.BICUBIC)
                arrs.append(np.asarray(im, dtype=np.uint8).copy())
        except (OSError, SyntaxError, ValueError) as e:
            raise DataError(f"cannot decode image {samples[i].id}: {e} (the sample is corrupt; re-write the "
                            f"shard without it)") from e
    return arrs
