"""The 15 ImageNet-C common corruptions (Hendrycks & Dietterich, ICLR 2019) at their published severities, in numpy."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import math
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image

from hardrank.atomic import atomic_path
from hardrank.errors import DataError, MissingExtra, UsageError
from hardrank.formats.variants import IMAGE_CORRUPTIONS, SEVERITIES
from hardrank.perturb.images import check_relative

__all__ = ["CORRUPTIONS", "SEVERITIES", "IMAGE_SUFFIXES", "JPEG_QUALITY", "corrupt", "corrupt_images", "corrupt_named",
           "encode_like", "frost_textures", "image_rng", "parse_corruptions", "variant_name", "walk_images"]

# Parameters and arithmetic follow `imagecorruptions` 1.1.2 (bethgelab; the ImageNet-C code made to take any image
# size, motion blur without ImageMagick), which no longer runs on numpy 2 / scikit-image >= 0.19 (fog, glass_blur)
# and draws from numpy's global RNG. Here every random draw comes from a private RandomState per image, in the
# library's order, so `tests/golden/corruptions_reference.npz` (made by tests/golden/make_corruptions_reference.py
# with the library) matches draw for draw. The published code's quirks are kept on purpose: glass blur's "swap"
# copies one pixel onto the other (numpy views), frost picks among the first five textures, outputs truncate
# (np.uint8) rather than round.
CORRUPTIONS = IMAGE_CORRUPTIONS  # the names, written once (the suites read the variants back by them)
MIN_SIDE = 32  # imagecorruptions refuses smaller images (its blur kernels are sized for 224 px)
FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
JPEG_QUALITY = 85  # ImageNet-C saved its corrupted images as JPEG, quality 85


def parse_corruptions(method: str) -> tuple[str, ...]:
    """``corrupt:<name>`` (or several, comma-separated) or ``corrupt:all`` -> corruption names."""
    if not method.startswith("corrupt:"):
        raise UsageError(f"method {method!r} is not a corruption; write corrupt:<name> or corrupt:all, with <name> "
                         f"one of {', '.join(CORRUPTIONS)}")
    names = [n.strip() for n in method.partition(":")[2].split(",") if n.strip()]
    if names == ["all"]:
        return CORRUPTIONS
    bad = [n for n in names if n not in CORRUPTIONS]
    if bad or not names:
        raise UsageError(f"unknown corruption {bad[0] if bad else ''!r} in --method {method}; the 15 ImageNet-C "
                         f"corruptions are: {', '.join(CORRUPTIONS)} (or corrupt:all)")
    return tuple(dict.fromkeys(names))


def _check(name: str, severity) -> None:
    if name not in CORRUPTIONS:
        raise UsageError(f"unknown corruption {name!r}; the 15 ImageNet-C corruptions are: {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or severity not in SEVERITIES:
        raise UsageError(f"severity must be an int in 1..5 (ImageNet-C's five levels), got {severity!r}")


def variant_name(name: str, severity: int, seed: int) -> str:
    """Folder name of a corruption variant, e.g. ``variant_name("gaussian_noise", 3, 0) == "gaussian_noise_3_s0"``."""
    _check(name, severity)
    return f"{name}_{int(severity)}_s{int(seed)}"


# -- helpers: the scipy / OpenCV / scikit-image operations the published code uses, written out in numpy ------------

def _gauss_weights(sigma: float, truncate: float) -> np.ndarray:
    """scipy.ndimage's 1-D Gaussian: radius int(truncate * sigma + 0.5), normalised to sum 1."""
    r = int(truncate * float(sigma) + 0.5)
    x = np.arange(-r, r + 1, dtype=np.float64)
    w = np.exp(-0.5 * x * x / float(sigma) ** 2)
    return w / w.sum()


def _filter1d(x: np.ndarray, w: np.ndarray, axis: int, pad_mode: str) -> np.ndarray:
    """Correlate x with the odd-length weights w along axis; borders by np.pad(pad_mode)."""
    r = len(w) // 2
    pad = [(0, 0)] * x.ndim
    pad[axis] = (r, r)
    xp = np.pad(x, pad, mode=pad_mode)
    n = x.shape[axis]
    out = np.zeros(x.shape, dtype=np.float64)
    for i, wi in enumerate(w):
        out += wi * np.take(xp, np.arange(i, i + n), axis=axis)
    return out


def _gaussian(x: np.ndarray, sigma, *, mode: str = "nearest", truncate: float = 4.0) -> np.ndarray:
    """skimage.filters.gaussian on float data: per spatial axis (not across channels); scipy's 'nearest' is
    np.pad 'edge', its 'reflect' np.pad 'symmetric'."""
    pad_mode = {"nearest": "edge", "reflect": "symmetric"}[mode]
    sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (2,))
    out = x.astype(np.float64)
    for axis in (0, 1):
        out = _filter1d(out, _gauss_weights(sig[axis], truncate), axis, pad_mode)
    return out


def _disk(radius: int, alias_blur: float) -> np.ndarray:
    """ImageNet-C's anti-aliased disk kernel (float32), the 3x3 / 5x5 Gaussian as cv2.GaussianBlur does it."""
    L = np.arange(-8, 9) if radius <= 8 else np.arange(-radius, radius + 1)
    k = 3 if radius <= 8 else 5
    X, Y = np.meshgrid(L, L)
    d = ((X ** 2 + Y ** 2) <= radius ** 2).astype(np.float32)
    d /= d.sum()
    g = np.exp(-((np.arange(k) - (k - 1) / 2) ** 2) / (2 * alias_blur ** 2))
    g = g / g.sum()  # cv2.getGaussianKernel(k, sigma)
    d = _filter1d(_filter1d(d, g, 0, "reflect"), g, 1, "reflect")  # cv2's default border: reflect 101
    return d.astype(np.float32)


def _filter2d(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """cv2.filter2D per channel: x (H, W, C) float, kernel (k, k) correlated; reflect-101 borders. A sum of
    shifted copies (the disk kernels are mostly zeros), faster here than torch's float64 conv2d on a CPU."""
    r = kernel.shape[0] // 2
    h, w = x.shape[:2]
    xp = np.pad(x.astype(np.float64), ((r, r), (r, r), (0, 0)), mode="reflect")
    out = np.zeros(x.shape, dtype=np.float64)
    for (i, j), k in np.ndenumerate(kernel.astype(np.float64)):
        if k != 0:
            out += k * xp[i:i + h, j:j + w]
    return out


def _zoom_linear(x: np.ndarray, z: float) -> np.ndarray:
    """scipy.ndimage.zoom(x, (z, z, 1), order=1): output side round(n * z); corners map to corners; a position
    computed past the last pixel (float error) reads 0, as scipy's default mode='constant' does."""
    out = x.astype(np.float64)
    for axis in (0, 1):
        n = out.shape[axis]
        m = int(round(n * z))
        pos = np.arange(m) * ((n - 1) / (m - 1)) if m > 1 else np.zeros(1)
        i0 = np.clip(np.floor(pos).astype(np.int64), 0, n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        t = (pos - i0).reshape([-1 if a == axis else 1 for a in range(out.ndim)])
        inside = (pos <= n - 1).reshape(t.shape)  # scipy's float error can land past the edge: cval 0 there
        out = (np.take(out, i0, axis=axis) * (1 - t) + np.take(out, i1, axis=axis) * t) * inside
    return out


def _clipped_zoom(x: np.ndarray, z: float) -> np.ndarray:
    """Zoom into the centre by z; the result is at least x's size (callers crop it, top-left, as the library)."""
    h, w = x.shape[:2]
    ch, cw = int(np.ceil(h / z)), int(np.ceil(w / z))
    top, left = (h - ch) // 2, (w - cw) // 2
    return _zoom_linear(x[top:top + ch, left:left + cw], z)


def _shift(x: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """Translate by (dx, dy), repeating the edge row / column into the uncovered part."""
    out = x
    if dx < 0:
        out = np.roll(out, x.shape[1] + dx, axis=1)
        out[:, dx:] = out[:, dx - 1:dx]
    elif dx > 0:
        out = np.roll(out, dx, axis=1)
        out[:, :dx] = out[:, dx:dx + 1]
    if dy < 0:
        out = np.roll(out, x.shape[0] + dy, axis=0)
        out[dy:, :] = out[dy - 1:dy, :]
    elif dy > 0:
        out = np.roll(out, dy, axis=0)
        out[:dy, :] = out[dy:dy + 1, :]
    return out


def _motion_blur(x: np.ndarray, radius: int, sigma: float, angle: float) -> np.ndarray:
    """A one-sided Gaussian streak along `angle` (degrees): imagecorruptions' stand-in for ImageMagick's."""
    width = radius * 2 + 1
    k = np.exp(-np.arange(width) ** 2 / (2 * sigma ** 2)) / (np.sqrt(2 * np.pi) * sigma)
    k = k / k.sum()
    py, px = width * np.sin(np.deg2rad(angle)), width * np.cos(np.deg2rad(angle))
    hyp = math.hypot(py, px)
    out = np.zeros(x.shape, dtype=np.float64)
    for i in range(width):
        dy = -math.ceil(((i * py) / hyp) - 0.5)
        dx = -math.ceil(((i * px) / hyp) - 0.5)
        if abs(dy) >= x.shape[0] or abs(dx) >= x.shape[1]:
            break  # the streak left the image
        out = out + k[i] * _shift(x, dx, dy)
    return out


def _plasma(mapsize: int, decay: float, rs: np.random.RandomState) -> np.ndarray:
    """Diamond-square height map in [0, 1], (mapsize, mapsize); mapsize a power of two."""
    a = np.empty((mapsize, mapsize), dtype=np.float64)
    a[0, 0] = 0
    step, wibble = mapsize, 100.0

    def wibbled(arr):
        return arr / 4 + wibble * rs.uniform(-wibble, wibble, arr.shape)

    while step >= 2:
        h = step // 2
        corners = a[0:mapsize:step, 0:mapsize:step]
        sq = corners + np.roll(corners, -1, axis=0)
        sq += np.roll(sq, -1, axis=1)
        a[h:mapsize:step, h:mapsize:step] = wibbled(sq)
        dr = a[h:mapsize:step, h:mapsize:step]
        ul = a[0:mapsize:step, 0:mapsize:step]
        a[0:mapsize:step, h:mapsize:step] = wibbled(dr + np.roll(dr, 1, axis=0) + ul + np.roll(ul, -1, axis=1))
        a[h:mapsize:step, 0:mapsize:step] = wibbled(dr + np.roll(dr, 1, axis=1) + ul + np.roll(ul, -1, axis=0))
        step //= 2
        wibble /= decay
    a -= a.min()
    return a / a.max()


def _reflect_index(i: np.ndarray, n: int) -> np.ndarray:
    """Integer index folded into 0..n-1 by half-sample symmetric reflection (scipy's 'reflect')."""
    i = np.mod(i, 2 * n)
    return np.where(i >= n, 2 * n - 1 - i, i)


def _map_linear(img: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Bilinear sample img (H, W, C) at (rows, cols) (H, W), reflecting outside: map_coordinates(order=1)."""
    h, w = img.shape[:2]
    r0, c0 = np.floor(rows), np.floor(cols)
    tr, tc = (rows - r0)[..., None], (cols - c0)[..., None]
    r0, c0 = r0.astype(np.int64), c0.astype(np.int64)
    ra, rb = _reflect_index(r0, h), _reflect_index(r0 + 1, h)
    ca, cb = _reflect_index(c0, w), _reflect_index(c0 + 1, w)
    return ((1 - tr) * ((1 - tc) * img[ra, ca] + tc * img[ra, cb])
            + tr * ((1 - tc) * img[rb, ca] + tc * img[rb, cb]))


# -- the corruptions: x (H, W, 3) uint8 -> float array in [0, 255] ----------------------------------------------------

def _gaussian_noise(x, s, rs, _):
    c = [.08, .12, 0.18, 0.26, 0.38][s - 1]
    x = x / 255.
    return np.clip(x + rs.normal(size=x.shape, scale=c), 0, 1) * 255


def _shot_noise(x, s, rs, _):
    c = [60, 25, 12, 5, 3][s - 1]
    return np.clip(rs.poisson(x / 255. * c) / float(c), 0, 1) * 255


def _impulse_noise(x, s, rs, _):
    c = [.03, .06, .09, 0.17, 0.27][s - 1]
    # skimage.util.random_noise('s&p', amount=c): a Generator, here seeded from this image's RandomState
    g = np.random.default_rng(int(rs.randint(2 ** 31)))
    out = x / 255.
    flipped = g.random(x.shape) <= c
    salted = g.random(x.shape) <= 0.5
    out[flipped & salted] = 1
    out[flipped & ~salted] = 0
    return np.clip(out, 0, 1) * 255


def _defocus_blur(x, s, rs, _):
    radius, alias = [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)][s - 1]
    return np.clip(_filter2d(x / 255., _disk(radius, alias)), 0, 1) * 255


def _glass_blur(x, s, rs, _):
    sigma, delta, iterations = [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)][s - 1]
    x = np.uint8(_gaussian(x / 255., sigma) * 255)
    h, w = x.shape[:2]
    rows, cols = range(h - delta, delta, -1), range(w - delta, delta, -1)
    # pixels as Python ints in a flat list: the sequential loop is ~100x faster than numpy item assignment
    flat = (x[..., 0].astype(np.int64) << 16 | x[..., 1].astype(np.int64) << 8 | x[..., 2]).ravel().tolist()
    at = (np.asarray(rows)[:, None] * w + np.asarray(cols)[None, :]).ravel()  # (r, c) in the library's order
    for _ in range(iterations):
        d = rs.randint(-delta, delta, size=(len(at), 2))  # the library's (dx, dy) draws, one pair per pixel
        # the published "swap" (a, b = b, a on numpy views) copies b onto a and leaves b, pixel after pixel
        for a, b in zip(at.tolist(), (at + d[:, 1] * w + d[:, 0]).tolist()):
            flat[a] = flat[b]
    p = np.array(flat, dtype=np.int64).reshape(h, w)
    x = np.stack([p >> 16, (p >> 8) & 255, p & 255], axis=-1).astype(np.uint8)
    return np.clip(_gaussian(x / 255., sigma), 0, 1) * 255


def _motion(x, s, rs, _):
    radius, sigma = [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)][s - 1]
    return np.clip(_motion_blur(x, radius, sigma, rs.uniform(-45, 45)), 0, 255)


def _zoom_blur(x, s, rs, _):
    zooms = [np.arange(1, 1.11, 0.01), np.arange(1, 1.16, 0.01), np.arange(1, 1.21, 0.02),
             np.arange(1, 1.26, 0.02), np.arange(1, 1.31, 0.03)][s - 1]
    x = (x / 255.).astype(np.float32)
    h, w = x.shape[:2]
    out = np.zeros(x.shape, dtype=np.float32)
    for z in zooms:
        out += _clipped_zoom(x, z)[:h, :w].astype(np.float32)
    return np.clip((x + out) / (len(zooms) + 1), 0, 1) * 255


def _snow(x, s, rs, _):
    c = [(0.1, 0.3, 3, 0.5, 10, 4, 0.8), (0.2, 0.3, 2, 0.5, 12, 4, 0.7), (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
         (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65), (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55)][s - 1]
    x = x.astype(np.float32) / 255.
    h, w = x.shape[:2]
    layer = rs.normal(size=(h, w), loc=c[0], scale=c[1])
    layer = _clipped_zoom(layer[..., None], c[2])
    layer[layer < c[3]] = 0
    layer = np.clip(layer[..., 0], 0, 1)
    layer = _motion_blur(layer, c[4], c[5], rs.uniform(-135, -45))
    layer = (np.round(layer * 255).astype(np.uint8) / 255.)[..., None][:h, :w]
    gray = (x @ np.array([0.299, 0.587, 0.114], dtype=np.float32))[..., None]  # cv2 RGB2GRAY
    x = c[6] * x + (1 - c[6]) * np.maximum(x, gray * 1.5 + 0.5)
    return np.clip(x + layer + np.rot90(layer, k=2), 0, 1) * 255


def _frost(x, s, rs, frost_dir):
    c = [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)][s - 1]
    idx = rs.randint(5)  # the published code draws among the first five of its six textures
    h, w = x.shape[:2]
    tex = _frost_texture(str(frost_textures(frost_dir)[idx]), h, w)
    top, left = rs.randint(0, tex.shape[0] - h), rs.randint(0, tex.shape[1] - w)
    return np.clip(c[0] * x + c[1] * tex[top:top + h, left:left + w], 0, 255)


def _fog(x, s, rs, _):
    c = [(1.5, 2), (2., 2), (2.5, 1.7), (2.5, 1.5), (3., 1.4)][s - 1]
    h, w = x.shape[:2]
    mapsize = 2 ** (max(h, w) - 1).bit_length()  # the next power of two: the plasma map covers the image
    x = x / 255.
    top = x.max()
    x = x + c[0] * _plasma(mapsize, c[1], rs)[:h, :w][..., None]
    return np.clip(x * top / (top + c[0]), 0, 1) * 255


def _brightness(x, s, rs, _):
    c = [.1, .2, .3, .4, .5][s - 1]
    # skimage's rgb2hsv, V + c clipped, hsv2rgb: with hue and saturation fixed, RGB scales with V (grey for V = 0)
    x = x / 255.
    v = x.max(axis=2, keepdims=True)
    v2 = np.clip(v + c, 0, 1)
    out = np.where(v > 0, x * (v2 / np.where(v > 0, v, 1)), v2)
    return np.clip(out, 0, 1) * 255


def _contrast(x, s, rs, _):
    c = [0.4, .3, .2, .1, .05][s - 1]
    x = x / 255.
    means = np.mean(x, axis=(0, 1), keepdims=True)
    return np.clip((x - means) * c + means, 0, 1) * 255


def _elastic(x, s, rs, _):
    x = x.astype(np.float32) / 255.
    h, w = x.shape[:2]
    sigma = np.array([h, w]) * 0.01
    alpha = [250 * 0.05, 250 * 0.065, 250 * 0.085, 250 * 0.1, 250 * 0.12][s - 1]
    m = h * 0.005  # the library uses the height for both directions
    dx = (_gaussian(rs.uniform(-m, m, size=(h, w)), sigma, mode="reflect", truncate=3) * alpha).astype(np.float32)
    dy = (_gaussian(rs.uniform(-m, m, size=(h, w)), sigma, mode="reflect", truncate=3) * alpha).astype(np.float32)
    cols, rows = np.meshgrid(np.arange(w), np.arange(h))
    out = _map_linear(x.astype(np.float64), rows + dy.astype(np.float64), cols + dx.astype(np.float64))
    return np.clip(out, 0, 1) * 255


def _pixelate(x, s, rs, _):
    c = [0.6, 0.5, 0.4, 0.3, 0.25][s - 1]
    h, w = x.shape[:2]
    small = Image.fromarray(x).resize((max(1, int(w * c)), max(1, int(h * c))), Image.BOX)
    return np.asarray(small.resize((w, h), Image.NEAREST))


def _jpeg(x, s, rs, _):
    c = [25, 18, 15, 10, 7][s - 1]
    buf = io.BytesIO()
    Image.fromarray(x).save(buf, "JPEG", quality=c)
    with Image.open(buf) as im:
        return np.asarray(im.convert("RGB"))


_FUNCS = {"gaussian_noise": _gaussian_noise, "shot_noise": _shot_noise, "impulse_noise": _impulse_noise,
          "defocus_blur": _defocus_blur, "glass_blur": _glass_blur, "motion_blur": _motion, "zoom_blur": _zoom_blur,
          "snow": _snow, "frost": _frost, "fog": _fog, "brightness": _brightness, "contrast": _contrast,
          "elastic_transform": _elastic, "pixelate": _pixelate, "jpeg_compression": _jpeg}


# -- frost textures ---------------------------------------------------------------------------------------------------

def frost_textures(frost_dir: str | Path | None = None) -> list[Path]:
    """The six ImageNet-C frost photographs: from ``frost_dir``, else from the installed ``imagecorruptions``
    package (``pip install 'hardrank[corrupt]'``; found on disk, never imported or downloaded)."""
    if frost_dir is None:
        spec = importlib.util.find_spec("imagecorruptions")
        if spec is None or not spec.submodule_search_locations:
            raise MissingExtra("the frost corruption (ImageNet-C's frost photographs, unless --frost-dir names a "
                               "folder of them)", "corrupt", "imagecorruptions")
        frost_dir = Path(list(spec.submodule_search_locations)[0]) / "frost"
    paths = [Path(frost_dir) / f for f in FROST_FILES]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"frost texture {missing[0]} not found; --frost-dir must hold {', '.join(FROST_FILES)} "
                        f"(ImageNet-C's frost images, shipped in the imagecorruptions package: pip install "
                        f"'hardrank[corrupt]' and leave --frost-dir unset)")
    return paths


@lru_cache(maxsize=16)
def _frost_texture(path: str, h: int, w: int) -> np.ndarray:
    """A frost texture (RGB float64) scaled by 1.1x what it takes to cover an (h, w) image (bicubic)."""
    with Image.open(path) as im:
        im = im.convert("RGB")
        fw, fh = im.size
        scale = max(1.0, h / fh, w / fw) * 1.1
        im = im.resize((int(np.ceil(fw * scale)), int(np.ceil(fh * scale))), Image.BICUBIC)
        return np.asarray(im, dtype=np.float64)


# -- one image, and a folder ------------------------------------------------------------------------------------------

def corrupt(x: np.ndarray, name: str, severity: int, rs: np.random.RandomState,
            frost_dir: str | Path | None = None) -> np.ndarray:
    """Corrupt x (H, W, 3) uint8 with ``name`` at ``severity`` 1..5, drawing from ``rs`` only: (H, W, 3) uint8.
    Sides must be at least 32 px (the parameters are ImageNet's, for 224 px; smaller sides are refused as by
    imagecorruptions); other sizes use the same pixel parameters, so larger images are relatively less corrupted."""
    _check(name, severity)
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 3 or x.shape[2] != 3:
        raise UsageError(f"corrupt takes an (H, W, 3) uint8 array, got {getattr(x, 'dtype', type(x).__name__)} "
                         f"{getattr(x, 'shape', '')}")
    if min(x.shape[:2]) < MIN_SIDE:
        raise DataError(f"image of {x.shape[1]}x{x.shape[0]} px is too small to corrupt: ImageNet-C's parameters "
                        f"need both sides >= {MIN_SIDE} px; resize the images first")
    return np.uint8(_FUNCS[name](x, int(severity), rs, frost_dir))  # truncation, as ImageNet-C saved them


def corrupt_named(where, x: np.ndarray, name: str, severity: int, rs: np.random.RandomState,
                  frost_dir: str | Path | None = None) -> np.ndarray:
    """``corrupt``, its refusal of the image (too small) naming ``where`` (the file, or the shard's sample)."""
    try:
        return corrupt(x, name, severity, rs, frost_dir)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None


def image_rng(seed: int, name: str, severity: int, rel: str) -> np.random.RandomState:
    """The private RNG of one output: a function of (seed, corruption, severity, image path) only, so a rerun, a
    resumed run or a different image order writes the same bytes."""
    h = hashlib.sha256(f"{int(seed)}\0{name}\0{int(severity)}\0{rel}".encode()).digest()
    return np.random.RandomState(int.from_bytes(h[:4], "little"))


def encode_like(arr: np.ndarray, suffix: str, quality: int = JPEG_QUALITY) -> bytes:
    """Encode an RGB image in the format its file suffix names (JPEG at ``quality``; PNG and others lossless)."""
    buf = io.BytesIO()
    suffix = suffix.lower().lstrip(".")
    if suffix in ("jpg", "jpeg"):
        Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    else:
        fmt = Image.registered_extensions().get(f".{suffix}")
        if fmt is None:
            raise DataError(f"cannot write a corrupted image as .{suffix}: PIL knows no such format; convert the "
                            f"images to .jpg or .png")
        Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def _load_rgb(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"image not found: {path} (check --images and the image paths)")
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"cannot decode image {path}: {e} (the file is corrupt or not an image; replace it or drop "
                        f"it from the list)") from e


_VARIANT_DIR = re.compile(r".+_s\d+$")  # <variant>_s<seed>: an earlier perturb's output under the same root


def walk_images(root: str | Path) -> list[str]:
    """Every image file under ``root`` (by suffix), as sorted relative POSIX paths; top-level variant folders
    (``<variant>_s<seed>/``, where perturb images writes) are not inputs."""
    root = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if not _VARIANT_DIR.match(d)]
        for f in filenames:
            if f.lower().endswith(IMAGE_SUFFIXES):
                out.append((Path(dirpath) / f).relative_to(root).as_posix())
    return sorted(out)


def corrupt_images(images_root: str | Path, image_paths: Iterable[str], out_root: str | Path, *,
                   corruptions: Iterable[str], severities: Iterable[int] = (3,), seed: int = 0,
                   quality: int = JPEG_QUALITY, frost_dir: str | Path | None = None,
                   workers: int | None = None) -> dict:
    """Write every (corruption, severity) copy of ``image_paths`` to ``out_root/<name>_<severity>_s<seed>/<path>``
    (same relative path and suffix). Each image is decoded once for all its variants; outputs are written
    atomically and existing ones are kept (resumable). Returns a report: variants, images, written, skipped."""
    corruptions, severities = tuple(corruptions), tuple(severities)
    for n in corruptions:
        for s in severities:
            _check(n, s)
    if not corruptions or not severities:
        raise UsageError("name at least one corruption and one severity")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed must be an int >= 0 (it names the folders <variant>_s<seed>), got {seed!r}")
    if not isinstance(quality, int) or not 1 <= quality <= 100:
        raise UsageError(f"quality must be an int in [1, 100], got {quality!r}")
    if "frost" in corruptions:
        frost_textures(frost_dir)  # a missing extra fails before any work
    images_root, out_root = Path(images_root), Path(out_root)
    paths = list(dict.fromkeys(str(p) for p in image_paths))
    for p in paths:
        check_relative(p)
    variants = [(n, s, variant_name(n, s, seed)) for n in corruptions for s in severities]

    def one(rel: str) -> int:
        todo = [(n, s, out_root / v / rel) for n, s, v in variants if not (out_root / v / rel).exists()]
        if not todo:
            return 0
        x = _load_rgb(images_root / rel)
        for n, s, out in todo:
            y = corrupt_named(images_root / rel, x, n, s, image_rng(seed, n, s, rel), frost_dir)
            data = encode_like(y, out.suffix, quality)
            out.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(out) as tmp:
                Path(tmp).write_bytes(data)
        return len(todo)

    n_workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        written = sum(pool.map(one, paths))
    total = len(paths) * len(variants)
    return {"method": "corrupt", "corruptions": list(corruptions), "severities": list(severities), "seed": seed,
            "images": len(paths), "variants": [v for _, _, v in variants], "written": written,
            "skipped": total - written, "out_dir": str(out_root)}
