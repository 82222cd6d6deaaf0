"""Benchmark inputs: COCO-sized natural-ish JPEGs (gradients, noise, shapes), generated once."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def coco_like_jpegs(folder: str | Path, n: int = 200, size=(640, 480), seed: int = 0, quality: int = 90) -> list[str]:
    """``n`` JPEGs of ``size`` (w, h) in ``folder`` (reused if present): smooth colour gradients,
    sensor-like noise and filled shapes, so the entropy coder and resampler see photo-like content."""
    from PIL import Image, ImageDraw

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
        im.save(path, quality=quality)
    return paths
