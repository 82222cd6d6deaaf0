"""RoCOCO image alteration (Mix / Patch), batched in torch, reproducing the reference RNG stream."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hardrank.atomic import atomic_path
from hardrank.devices import resolve_device
from hardrank.errors import DataError, UsageError

__all__ = ["METHODS", "alter_images", "variant_name"]

METHODS = ("mix", "patch")  # RoCOCO mix_images: blend (mix) or CutMix box (patch)

# What we match of the reference script (github.com/pseulki/rococo `mix_images.py`):
# * torch's CPU generator seeded with `seed`; a shuffled DataLoader (batch 64) first draws one int64
#   (its worker base seed), then its RandomSampler draws one int64 that seeds a private generator,
#   which does `randperm(N)`: that order, cut into consecutive batches (last one partial), is the
#   batching. Then per batch `randperm(B)` on the same seeded generator gives the partner map.
# * numpy's legacy global RNG seeded with `seed`; for `patch` only, per batch `randint(dim 2)` then
#   `randint(dim 3)` gives the box centre; half-widths are `int(side * sqrt(1 - lam)) // 2` on both
#   sides and the box is clipped to the image, so the box is at most 2 * (cut // 2) wide.
# * PIL bicubic resize to (size, size) (what torchvision Resize does on PIL images), /255 to float32,
#   then `x.mul(255).add(0.5).clamp(0, 255)` to uint8 as torchvision's `save_image` does.
# Differences, on purpose: we use private generators (the global RNG state is left alone); outputs
# keep their relative path under `<method>_<lam>_s<seed>/` instead of a flat folder of basenames;
# JPEG quality is a parameter; its default, 75, is PIL's default, which the reference used.


def check_relative(path: str) -> None:
    """An annotation's image path names a file below the folder variants are written to: relative, no '..'
    (an annotation file must never make hardrank write outside that folder)."""
    if Path(path).is_absolute() or ".." in Path(path).parts:
        raise DataError(f"image path {path!r} must be relative to images_root, without '..'")


def variant_name(method: str, lam: float, seed: int) -> str:
    """Folder name of an altered-image variant, e.g. ``variant_name("mix", 0.9, 1) == "mix_0.9_s1"``."""
    _check_args(method, lam, seed)
    return f"{method}_{float(lam)}_s{int(seed)}"


@dataclass(frozen=True)
class _Batch:
    """One batch of the reference plan: which images, their partner permutation, the patch box."""

    indices: list[int]  # positions into the input list, in batch order
    perm: list[int]  # perm[j] = batch position whose image is mixed/pasted into position j
    box: tuple[int, int, int, int] | None  # (r1, c1, r2, c2): rows r1:r2, cols c1:c2 (patch only)


def _check_args(method: str, lam: float, seed: int) -> None:
    if method not in METHODS:
        raise UsageError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0.0 <= float(lam) <= 1.0:
        raise UsageError(f"lam must be a number in [0, 1] (RoCOCO uses 0.9), got {lam!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be an int >= 0, naming the folder <variant>_s<seed> (RoCOCO uses 1, 10, 100), "
                         f"got {seed!r}")


def _rand_box(rs: np.random.RandomState, rows: int, cols: int, lam: float) -> tuple[int, int, int, int]:
    """The CutMix box of the reference: centre uniform, half-extent int(side*sqrt(1-lam))//2, clipped."""
    cut = math.sqrt(1.0 - lam)
    cut_r, cut_c = int(rows * cut), int(cols * cut)
    r = int(rs.randint(rows))  # the reference draws along dim 2 first, then dim 3
    c = int(rs.randint(cols))
    r1, r2 = min(max(r - cut_r // 2, 0), rows), min(max(r + cut_r // 2, 0), rows)
    c1, c2 = min(max(c - cut_c // 2, 0), cols), min(max(c + cut_c // 2, 0), cols)
    return r1, c1, r2, c2


def _plan(n: int, *, method: str, lam: float, seed: int, size: int, batch_size: int = 64) -> list[_Batch]:
    """The batches, permutations and boxes the reference script draws for n images and a seed."""
    g = torch.Generator().manual_seed(seed)
    torch.empty((), dtype=torch.int64).random_(generator=g)  # DataLoader iterator: worker base seed
    sampler_seed = int(torch.empty((), dtype=torch.int64).random_(generator=g).item())
    order = torch.randperm(n, generator=torch.Generator().manual_seed(sampler_seed)).tolist()
    rs = np.random.RandomState(seed)
    plan = []
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        perm = torch.randperm(len(idx), generator=g).tolist()
        box = _rand_box(rs, size, size, float(lam)) if method == "patch" else None
        plan.append(_Batch(idx, perm, box))
    return plan


def _alter_batch(x: torch.Tensor, perm: torch.Tensor, *, method: str, lam: float,
                 box: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Alter one batch: x (B, 3, H, W) float in [0, 1], perm (B,) long -> (B, 3, H, W) float, new tensor."""
    if method == "mix":
        return lam * x + (1 - lam) * x[perm]
    if method == "patch":
        if box is None:
            raise ValueError("method 'patch' needs a box (r1, c1, r2, c2)")
        r1, c1, r2, c2 = box
        out = x.clone()
        out[:, :, r1:r2, c1:c2] = x[perm, :, r1:r2, c1:c2]
        return out
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) float in [0, 1] -> (B, H, W, 3) uint8 on CPU, rounding as torchvision save_image."""
    return x.mul(255).add_(0.5).clamp_(0, 255).permute(0, 2, 3, 1).to("cpu", torch.uint8)


def _altered_batches(plan: list[_Batch], load: Callable[[list[int]], list[np.ndarray]], *, method: str,
                     lam: float, device: torch.device | str = "cpu",
                     needed: Callable[[_Batch], bool] = lambda b: True) -> Iterator[tuple[_Batch, np.ndarray]]:
    """Yield (batch, altered images (B, S, S, 3) uint8) for each needed batch of the plan.

    load(indices) returns the batch's images as (S, S, 3) uint8 arrays, already resized.
    """
    for b in plan:
        if not needed(b):
            continue
        x = torch.from_numpy(np.stack(load(b.indices))).to(device)  # (B, S, S, 3) uint8
        x = x.permute(0, 3, 1, 2).float().div_(255)  # (B, 3, S, S) in [0, 1], as ToTensor
        perm = torch.tensor(b.perm, dtype=torch.long, device=device)
        yield b, _to_uint8(_alter_batch(x, perm, method=method, lam=lam, box=b.box)).numpy()


def _load(path: Path, size: int) -> np.ndarray:
    """Read one image as RGB, bicubic-resized to (size, size): (size, size, 3) uint8."""
    if not path.is_file():
        raise DataError(f"image not found: {path} (check images_root and the annotation's image paths)")
    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), Image.BICUBIC)
            return np.asarray(im, dtype=np.uint8).copy()
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"cannot decode image {path}: {e} (the file is corrupt or not an image; "
                        f"replace it or drop it from the list)") from e


def _save_jpeg(arr: np.ndarray, out: Path, quality: int) -> None:
    """Atomic JPEG write (a reader never sees half an image)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        Image.fromarray(arr).save(tmp, format="JPEG", quality=quality)


def alter_images(images_root: str | Path, image_paths: list[str], out_root: str | Path, *, method: str,
                 lam: float = 0.9, seed: int = 1, size: int = 384, batch_size: int = 64,
                 device: str | None = None, quality: int = 75) -> dict:
    """Write RoCOCO Mix/Patch copies of ``image_paths`` under ``out_root/<method>_<lam>_s<seed>/``.

    Give ``image_paths`` in the annotation file's order: the seeded batching depends on it. Each
    output keeps its input's relative path with a ``.jpg`` suffix. Existing outputs are kept
    (resumable); a batch whose outputs all exist is not decoded. Returns a report dict with
    method, lam, seed, images, self_pairs (images paired with themselves: left unchanged),
    written, skipped and out_dir.
    """
    _check_args(method, lam, seed)
    if not isinstance(size, int) or size < 1:
        raise UsageError(f"size must be a positive int (RoCOCO uses 384), got {size!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size must be a positive int (RoCOCO uses 64), got {batch_size!r}")
    if not isinstance(quality, int) or not 1 <= quality <= 100:
        raise UsageError(f"quality must be an int in [1, 100], got {quality!r}")
    images_root, out_root = Path(images_root), Path(out_root)
    image_paths = [str(p) for p in image_paths]
    rels = [Path(p).with_suffix(".jpg") for p in image_paths]
    for p in image_paths:
        check_relative(p)
    if len(set(rels)) != len(rels):
        dup = next(r for i, r in enumerate(rels) if r in rels[:i])
        raise DataError(f"two inputs map to the same output {dup} (duplicate image paths, or the same "
                        f"name with different suffixes); deduplicate image_paths")
    dev = torch.device(resolve_device(device or "auto"))
    name = variant_name(method, lam, seed)
    out_dir = out_root / name
    outs = [out_dir / rel for rel in rels]
    lam = float(lam)

    written = 0
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        def load(idx: list[int]) -> list[np.ndarray]:
            return list(pool.map(lambda i: _load(images_root / image_paths[i], size), idx))

        def needed(b: _Batch) -> bool:  # a batch whose outputs all exist is skipped
            return not all(outs[i].exists() for i in b.indices)

        plan = _plan(len(image_paths), method=method, lam=lam, seed=seed, size=size, batch_size=batch_size)
        for b, y in _altered_batches(plan, load, method=method, lam=lam, device=dev, needed=needed):
            todo = [j for j, i in enumerate(b.indices) if not outs[i].exists()]
            list(pool.map(lambda j: _save_jpeg(y[j], outs[b.indices[j]], quality), todo))
            written += len(todo)
    self_pairs = sum(int(p == j) for b in plan for j, p in enumerate(b.perm))
    return {"method": method, "lam": lam, "seed": seed, "images": len(image_paths), "self_pairs": self_pairs,
            "written": written, "skipped": len(image_paths) - written, "out_dir": str(out_dir)}
