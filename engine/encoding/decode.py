"""Decode stages: the model's own transform (Pillow, the reference) and the choice of decoder."""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from open_clip.transform import (
    CenterCropOrPad,
    MaybeConvertMode,
    MaybeToTensor,
    PreprocessCfg,
    ResizeKeepRatio,
    image_transform_v2,
)
from torchvision.transforms import CenterCrop, Normalize, Resize, ToTensor

from hardrank.errors import UsageError
from hardrank.items import ImageRef, decode_image, failure_reason
from hardrank.models.hf_models import PROCESSOR_KEY, hf_image_processor

__all__ = ["make_transform", "PillowDecoder", "ProcessorDecoder", "is_processor_cfg", "image_size"]

# transform steps that take and return a PIL image, run in the decode threads
_PIL_STEPS = (Resize, CenterCrop, MaybeConvertMode, ResizeKeepRatio, CenterCropOrPad)


def make_transform(preprocess_cfg: dict):
    """The model's own eval transform (resize mode, interpolation, crop, mean/std)."""
    if is_processor_cfg(preprocess_cfg):
        raise UsageError(f"a transformers model ({preprocess_cfg[PROCESSOR_KEY].get('image_processor_type')}) has no "
                         f"open_clip transform: its own image processor preprocesses it (ProcessorDecoder); the "
                         f"`hardrank bench` stages take open_clip models, benchmarks/bench_hf_models.py measures "
                         f"transformers ones")
    cfg = dict(preprocess_cfg)
    if isinstance(cfg.get("size"), list):
        cfg["size"] = tuple(cfg["size"])
    for k in ("mean", "std"):
        if isinstance(cfg.get(k), list):
            cfg[k] = tuple(cfg[k])
    return image_transform_v2(PreprocessCfg(**cfg), is_train=False)


class PillowDecoder:
    """Stage: ``{"ref": [ImageRef]}`` -> ``{"pixels": (B, 3, H, W) float32, "ok": (B,) bool,
    "error": [str|None]}``, equal bit for bit to the model's own transform run image by image on
    ``Image.open(path)`` (``decode_image``: every mode as Pillow opens it; the transform resizes and
    crops in that mode and converts to RGB after, as open_clip's users get it).

    Threads run the Pillow part of the transform (decode, resize, crop: Pillow releases the GIL in
    each) up to 8-bit pixels, written into one ``(B, H, W, 3) uint8`` batch; ``ToTensor`` + ``Normalize``
    then run once on the whole batch with the same float32 operations in the same order (``x / 255``,
    ``- mean``, ``/ std``), so every value is identical. Per image, those two tensor steps cost ~130 us
    of Python and small-tensor dispatch under the GIL, which kept two threads from scaling (see
    benchmarks/README.md). A transform of another shape runs whole, image by image (``fused`` False).

    draft: decode each uncropped JPEG at the largest 1/2, 1/4 or 1/8 scale (libjpeg's scaled IDCT)
    that still covers the size the resize step produces, then run the same transform. Bit-identical to
    the reference only where no reduction applies (an image under twice the resized size in either
    side, or not a JPEG, or cropped); otherwise the pixels differ by a small tested amount, so it is
    ``--decoder pillow-draft``, off by default, and its embeddings are stored in their own folder."""

    def __init__(self, preprocess_cfg: dict, threads: int = 2, draft: bool = False):
        self.transform = make_transform(preprocess_cfg)
        self.size = image_size(preprocess_cfg)
        self.draft = _draft_size(preprocess_cfg) if draft else None
        self.threads = max(1, threads)
        self.pool = ThreadPoolExecutor(self.threads)
        split = _split_transform(self.transform)
        self.fused = split is not None
        self._pil, mean, std = split or ([], None, None)
        if self.fused:  # (1, 3, 1, 1) float32, as torchvision's normalize builds them
            self._mean = torch.as_tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
            self._std = torch.as_tensor(std, dtype=torch.float32).view(1, -1, 1, 1)

    def _one(self, ref: ImageRef):
        try:
            return self.transform(decode_image(ref, draft=self.draft)), None
        except Exception as exc:  # corrupt/truncated/missing: recorded, not fatal
            return None, failure_reason(exc)

    def _pil_one(self, i: int, ref: ImageRef, u8: np.ndarray):
        """Image ``i`` through the Pillow steps into ``u8[i]``; returns (kind, value): ("u8", None) when
        written there, ("tensor", t) for an image that left them in another mode or size (run the rest
        of the transform on it alone), ("error", why)."""
        try:
            img = decode_image(ref, draft=self.draft)
            for t in self._pil:
                if isinstance(t, MaybeConvertMode) and img.mode == t.mode:
                    continue  # convert() to its own mode only copies
                img = t(img)
            h, w = self.size
            if img.mode == "RGB" and img.size == (w, h):
                u8[i] = np.asarray(img)
                return "u8", None
            return "tensor", self.transform.transforms[-1](self.transform.transforms[-2](img))
        except Exception as exc:  # corrupt/truncated/missing: recorded, not fatal
            return "error", failure_reason(exc)

    def __call__(self, batch: dict) -> dict:
        refs = list(batch["ref"])
        if not self.fused:
            out = list(self.pool.map(self._one, refs))
            ok = np.array([t is not None for t, _ in out], dtype=bool)
            pixels = torch.zeros((len(out), 3, *self.size), dtype=torch.float32)
            for i, (t, _) in enumerate(out):
                if t is not None:
                    pixels[i] = t
            return {**batch, "pixels": pixels, "ok": ok, "error": [e for _, e in out]}
        n = len(refs)
        u8 = np.zeros((n, *self.size, 3), dtype=np.uint8)  # (B, H, W, 3)
        chunks = [range(s, min(n, s + step)) for step in [max(1, -(-n // self.threads))] for s in range(0, n, step)]
        out = [r for part in self.pool.map(lambda idx: [self._pil_one(i, refs[i], u8) for i in idx], chunks)
               for r in part]  # one task per thread: per-image futures cost more than a small image's decode
        pixels = torch.empty((n, 3, *self.size), dtype=torch.float32)  # (B, 3, H, W)
        pixels.copy_(torch.from_numpy(u8).permute(0, 3, 1, 2))  # uint8 -> float32: exact
        pixels.div_(255).sub_(self._mean).div_(self._std)  # ToTensor's x / 255, then Normalize
        ok = np.ones(n, dtype=bool)
        error: list[str | None] = [None] * n
        for i, (kind, v) in enumerate(out):
            if kind == "tensor":
                pixels[i] = v
            elif kind == "error":
                ok[i], error[i] = False, v
                pixels[i] = 0.0
        return {**batch, "pixels": pixels, "ok": ok, "error": error}


def _split_transform(transform):
    """(Pillow steps, mean, std) when ``transform`` is ``Compose([Pillow steps..., ToTensor, Normalize])``
    with steps that keep a PIL image (resize, crop, convert) and a plain per-channel Normalize; None
    otherwise (the transform then runs whole, image by image)."""
    steps = list(getattr(transform, "transforms", ()))
    if len(steps) < 2 or type(steps[-2]) not in (ToTensor, MaybeToTensor) or type(steps[-1]) is not Normalize:
        return None
    norm = steps[-1]
    if norm.inplace or len(norm.mean) != 3 or len(norm.std) != 3:
        return None
    pil = steps[:-2]
    if not all(isinstance(t, _PIL_STEPS) for t in pil):
        return None
    return pil, [float(m) for m in norm.mean], [float(s) for s in norm.std]


def _draft_size(preprocess_cfg: dict):
    """``(w, h) -> (w', h')``: the size the transform's resize step makes from a ``w x h`` image (every
    later step reads at most that many pixels), for ``PillowDecoder``'s ``draft``."""
    th, tw = image_size(preprocess_cfg)
    mode = preprocess_cfg.get("resize_mode", "shortest")

    def need(w: int, h: int):
        if mode == "squash":
            return tw, th
        r = (max if mode == "shortest" else min)(tw / w, th / h)  # shortest: covers the crop; longest: fits
        return max(1, math.ceil(w * r)), max(1, math.ceil(h * r))
    return need


def image_size(preprocess_cfg: dict) -> tuple[int, int]:
    """(H, W) of the model's input images."""
    size = preprocess_cfg.get("size", 224)
    return (size, size) if isinstance(size, int) else tuple(int(s) for s in size)


class ProcessorDecoder:
    """Stage: ``{"ref": [ImageRef]}`` -> ``{"pixels", "ok", "error"}`` as ``PillowDecoder`` gives them, for a
    transformers model: its own image processor (``preprocess_cfg["hf_image_processor"]``, rebuilt here) on
    ``Image.open``'s image, so the pixels are ``processor(images=[Image.open(p) ...])["pixel_values"]``
    exactly: resize with its resample filter and size rule, its crop, rescale and normalise as it does them.

    A processor that gives each image several arrays (``preprocess_cfg["inputs"]``: name -> per-image shape
    and dtype; SigLIP 2's patches, patch mask and patch grid) makes ``pixels`` a dict of ``(B, *shape)``
    tensors, each the processor's own array; a failed row is zeros in each.

    Each thread decodes its share of the batch and runs the processor on it (a processor groups images by
    shape and runs each step per image: batching changes no value). An image the processor refuses, or
    whose arrays come out in another shape, is found by running the share image by image, and recorded
    like an unreadable one."""

    def __init__(self, preprocess_cfg: dict, threads: int = 2):
        self.processor = hf_image_processor(preprocess_cfg)
        self.several = "inputs" in preprocess_cfg
        fixed = {"pixel_values": {"shape": [3, *image_size(preprocess_cfg)], "dtype": "float32"}}
        self.inputs = {k: (tuple(v["shape"]), getattr(torch, v["dtype"]))  # name -> (per-image shape, dtype)
                       for k, v in (preprocess_cfg["inputs"] if self.several else fixed).items()}
        self.threads = max(1, threads)
        self.pool = ThreadPoolExecutor(self.threads)

    def _arrays(self, images: list) -> dict:
        """name -> (n, *shape) tensor of the processor's output for ``images``."""
        got = self.processor(images=images, return_tensors="pt")
        out = {}
        for k, (shape, dtype) in self.inputs.items():
            t = got[k]
            if tuple(t.shape[1:]) != shape:
                raise ValueError(f"the image processor gave {k} of shape {tuple(t.shape[1:])}, not {shape}")
            out[k] = t.to(dtype)
        return out

    def _share(self, refs: list) -> list:
        """({name: array of one image} | None, error | None) per ref."""
        out: list = [None] * len(refs)
        images = {}
        for i, ref in enumerate(refs):
            try:
                images[i] = decode_image(ref)
            except Exception as exc:  # corrupt/truncated/missing: recorded, not fatal
                out[i] = (None, failure_reason(exc))
        if not images:
            return out
        try:
            arrays = self._arrays(list(images.values()))
            for j, i in enumerate(images):
                out[i] = ({k: v[j] for k, v in arrays.items()}, None)
        except Exception:  # one image the processor cannot take: find it, keep the others
            for i, img in images.items():
                try:
                    out[i] = ({k: v[0] for k, v in self._arrays([img]).items()}, None)
                except Exception as exc:
                    out[i] = (None, failure_reason(exc))
        return out

    def __call__(self, batch: dict) -> dict:
        refs = list(batch["ref"])
        n = len(refs)
        step = max(1, -(-n // self.threads))
        out = [r for part in self.pool.map(self._share, [refs[s:s + step] for s in range(0, n, step)]) for r in part]
        arrays = {k: torch.zeros((n, *shape), dtype=dtype) for k, (shape, dtype) in self.inputs.items()}
        for i, (a, _) in enumerate(out):
            if a is not None:
                for k, v in a.items():
                    arrays[k][i] = v
        return {**batch, "pixels": arrays if self.several else arrays["pixel_values"],  # (B, 3, H, W) float32
                "ok": np.array([a is not None for a, _ in out], dtype=bool), "error": [e for _, e in out]}


def is_processor_cfg(preprocess_cfg: dict) -> bool:
    """Whether ``preprocess_cfg`` is a transformers image processor's (``ProcessorDecoder``), not open_clip's."""
    return PROCESSOR_KEY in preprocess_cfg
