"""Decode stages: the model's own transform (Pillow, the reference) and the choice of decoder."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from open_clip.transform import PreprocessCfg, image_transform_v2

from ..config import DECODERS
from ..errors import MissingExtra, UsageError
from ..items import ImageRef, decode_image, failure_reason

__all__ = ["make_transform", "PillowDecoder", "make_decoder", "image_size"]


def make_transform(preprocess_cfg: dict):
    """The model's own eval transform (resize mode, interpolation, crop, mean/std)."""
    cfg = dict(preprocess_cfg)
    if isinstance(cfg.get("size"), list):
        cfg["size"] = tuple(cfg["size"])
    for k in ("mean", "std"):
        if isinstance(cfg.get(k), list):
            cfg[k] = tuple(cfg[k])
    return image_transform_v2(PreprocessCfg(**cfg), is_train=False)


class PillowDecoder:
    """Stage: ``{"ref": [ImageRef]}`` -> ``{"pixels": (B, 3, H, W) float32, "ok": (B,) bool,
    "error": [str|None]}``. Decoding runs in a thread pool (Pillow releases the GIL)."""

    def __init__(self, preprocess_cfg: dict, threads: int = 2):
        self.transform = make_transform(preprocess_cfg)
        self.size = image_size(preprocess_cfg)
        self.pool = ThreadPoolExecutor(max(1, threads))

    def _one(self, ref: ImageRef):
        try:
            return self.transform(decode_image(ref)), None
        except Exception as exc:  # corrupt/truncated/missing: recorded, not fatal
            return None, failure_reason(exc)

    def __call__(self, batch: dict) -> dict:
        out = list(self.pool.map(self._one, batch["ref"]))
        ok = np.array([t is not None for t, _ in out], dtype=bool)
        pixels = torch.zeros((len(out), 3, *self.size), dtype=torch.float32)
        for i, (t, _) in enumerate(out):
            if t is not None:
                pixels[i] = t
        return {**batch, "pixels": pixels, "ok": ok, "error": [e for _, e in out]}


def image_size(preprocess_cfg: dict) -> tuple[int, int]:
    """(H, W) of the model's input images."""
    size = preprocess_cfg.get("size", 224)
    return (size, size) if isinstance(size, int) else tuple(int(s) for s in size)


def make_decoder(preprocess_cfg: dict, decoder: str = "pillow", *, threads: int = 2, batch_size: int = 256):
    """A decode stage ``{"ref": [ImageRef]} -> {"pixels", "ok", "error"}``: Pillow (the reference) or
    DALI (GPU when present, else its CPU-only mode). Build it inside the worker that runs it."""
    if decoder not in DECODERS:
        raise UsageError(f"decoder must be one of {list(DECODERS)}, got {decoder!r}")
    if decoder == "dali":
        try:
            from .dali import DaliDecoder
        except ImportError as exc:
            raise MissingExtra("--decoder dali", "dali", "nvidia-dali-cuda130") from exc
        return DaliDecoder(preprocess_cfg, threads=threads, batch_size=batch_size, device="auto")
    return PillowDecoder(preprocess_cfg, threads=threads)
