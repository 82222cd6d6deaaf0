"""Benchmark inputs: COCO-sized natural-ish JPEGs and small random open_clip checkpoints, generated once."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import open_clip
import torch
from PIL import Image, ImageDraw
from safetensors.torch import save_file

from hardrank.atomic import atomic_path, write_text_atomic
from hardrank.models.load import load_model
from hardrank.models.runs import user_specs

__all__ = ["coco_like_jpegs", "CONFIGS", "small_checkpoints", "images_and_models"]


def coco_like_jpegs(folder: str | Path, n: int = 200, size=(640, 480), seed: int = 0, quality: int = 90) -> list[str]:
    """``n`` JPEGs of ``size`` (w, h) in ``folder`` (reused if present): smooth colour gradients,
    sensor-like noise and filled shapes, so the entropy coder and resampler see photo-like content."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    paths = []
    for i in range(n):
        path = folder / f"{i:05d}_{w}x{h}.jpg"
        paths.append(str(path))
        if path.exists():
            rng.random(4)  # keep later images independent of which ones were cached
            continue
        f = rng.uniform(15, 60, 3)
        ph = rng.uniform(0, 6.3, 3)
        img = np.stack([128 + 90 * np.sin(xx / f[0] + ph[0]) * np.cos(yy / (2 * f[0])),
                        128 + 90 * np.cos(yy / f[1] + ph[1]),
                        128 + 90 * np.sin((xx + yy) / f[2] + ph[2])], -1)
        img += rng.normal(0, 6, img.shape)
        im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(im)
        for _ in range(rng.integers(4, 12)):
            x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
            x1, y1 = x0 + int(rng.integers(20, 250)), y0 + int(rng.integers(20, 250))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
        with atomic_path(path) as tmp:  # a killed run leaves no half JPEG to be reused
            im.save(tmp, format="JPEG", quality=quality)
    return paths


CONFIGS = {  # ViT-B/32-shaped (224 px, patch 32) but narrow CLIPs, cheap enough for 2 CPU cores
    "small": {"embed_dim": 256,
              "vision_cfg": {"image_size": 224, "layers": 4, "width": 256, "head_width": 64, "patch_size": 32},
              "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 256, "heads": 4, "layers": 4}},
    "tiny": {"embed_dim": 64,
             "vision_cfg": {"image_size": 224, "layers": 1, "width": 64, "head_width": 32, "patch_size": 32},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1}},
}


def small_checkpoints(folder: str | Path, k: int, size: str = "small") -> tuple[str, list[str]]:
    """(model config path, k random-init checkpoint files) of ``CONFIGS[size]``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"bench-{size}-clip"
    cfg = folder / f"{name}.json"
    write_text_atomic(cfg, json.dumps(CONFIGS[size]))
    open_clip.add_model_config(cfg)
    out = []
    for i in range(k):
        path = folder / f"{name}-{i}.safetensors"
        if not path.exists():
            torch.manual_seed(i)
            model = open_clip.create_model(name, pretrained=None)
            with atomic_path(path) as tmp:
                save_file({n: t.contiguous() for n, t in model.state_dict().items()}, str(tmp))
        out.append(str(path))
    return str(cfg), out


def images_and_models(data: str | Path, n_images: int, k: int, size: str):
    """The shared set-up of the embed benchmarks: COCO-like JPEGs, K loaded checkpoints of one
    bench model, and a fresh work folder for their stores."""
    paths = coco_like_jpegs(data, n_images)
    cfg, ckpts = small_checkpoints(Path(data) / "models", k, size)
    models = [load_model(s) for s in user_specs(cfg, ckpts)]
    return paths, models, Path(tempfile.mkdtemp(prefix="hardrank-bench-"))

