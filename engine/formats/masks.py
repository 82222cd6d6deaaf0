"""Mask encodings read and written as COCO tooling does: the RLE codec and the polygon rasteriser."""
from __future__ import annotations

import numpy as np

from hardrank.errors import DataError

__all__ = ["rle_encode", "rle_decode", "polygons_to_mask"]


def _counts_to_string(counts) -> str:
    """COCO's compressed counts: each count (minus the one two back, from the 4th on) as a
    little-endian base-32 varint, 5 data bits + a continuation bit per char, offset by 48."""
    out = []
    for i, c in enumerate(counts):
        x = int(c) - (int(counts[i - 2]) if i > 2 else 0)
        while True:
            chunk = x & 0x1F
            x >>= 5  # arithmetic shift: negative deltas end in ...11111
            done = (x == -1) if (chunk & 0x10) else (x == 0)
            out.append(chr(48 + (chunk if done else chunk | 0x20)))
            if done:
                break
    return "".join(out)


def _string_to_counts(s: str) -> list[int]:
    counts: list[int] = []
    p, n = 0, len(s)
    while p < n:
        x, k = 0, 0
        while True:
            if p >= n:
                raise DataError(f"compressed RLE string ends inside a count (at char {p})")
            c = ord(s[p]) - 48
            if not 0 <= c < 64:
                raise DataError(f"compressed RLE string has an invalid char {s[p]!r} at {p}")
            x |= (c & 0x1F) << (5 * k)
            p, k = p + 1, k + 1
            if not c & 0x20:
                if c & 0x10:
                    x -= 1 << (5 * k)  # sign-extend
                break
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def rle_encode(mask: np.ndarray, compress: bool = True) -> dict:
    """COCO RLE of a 2-D mask (foreground = value > 0): ``{"size": [h, w], "counts": str|list}``."""
    m = np.asarray(mask)
    if m.ndim != 2:
        raise ValueError(f"rle_encode needs a 2-D mask, got shape {m.shape}")
    flat = (m > 0).ravel(order="F").astype(np.int8)  # column-major, as COCO
    change = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0] == 1:
        counts = [0] + counts  # runs start with background
    if flat.size == 0:
        counts = []
    return {"size": [int(m.shape[0]), int(m.shape[1])], "counts": _counts_to_string(counts) if compress else counts}


def rle_decode(rle: dict) -> np.ndarray:
    """(h, w) uint8 0/1 mask of a COCO RLE (compressed string, bytes, or uncompressed list)."""
    h, w = (int(v) for v in rle["size"])
    counts = rle["counts"]
    if isinstance(counts, bytes):
        counts = counts.decode("ascii")
    if isinstance(counts, str):
        counts = _string_to_counts(counts)
    counts = np.asarray(counts, dtype=np.int64)
    if counts.size and counts.min() < 0:
        raise DataError(f"RLE counts must be >= 0, got {int(counts.min())}")
    if int(counts.sum()) != h * w:
        raise DataError(f"RLE counts sum to {int(counts.sum())} but size {h}x{w} has {h * w} pixels")
    values = (np.arange(counts.size) % 2).astype(np.uint8)
    flat = np.repeat(values, counts)
    return flat.reshape((w, h)).T.copy()  # column-major -> (h, w)


def polygons_to_mask(polygons, h: int, w: int) -> np.ndarray:
    """(h, w) uint8 mask of COCO polygons, rasterised the way pycocotools' ``frPyObjects`` +
    ``decode`` do (so boundary pixels agree with COCO tooling; a [0,0,4,0,4,4,0,4] square covers
    pixels 0..3, not PIL's 0..4), several polygons united."""
    out = np.zeros((h, w), dtype=np.uint8)
    for poly in polygons:
        out |= _one_polygon(np.asarray(poly, dtype=np.float64).reshape(-1, 2), h, w)
    return out


def _one_polygon(xy: np.ndarray, h: int, w: int) -> np.ndarray:
    # pycocotools' algorithm: walk the boundary on a 5x finer integer grid, keep the points where
    # it crosses a pixel-centre column, and fill each column between successive crossings (parity).
    scale = 5.0
    x = np.trunc(scale * xy[:, 0] + 0.5).astype(np.int64)  # C's (int) cast truncates toward zero
    y = np.trunc(scale * xy[:, 1] + 0.5).astype(np.int64)
    x, y = np.append(x, x[0]), np.append(y, y[0])
    u_parts, v_parts = [], []
    for xs, ys, xe, ye in zip(x[:-1], y[:-1], x[1:], y[1:]):
        dx, dy = abs(int(xe - xs)), abs(int(ye - ys))
        # walk every edge from its lower end (x-major edges by x, y-major by y), emitting points in
        # the edge's own direction, so rounding is the same whichever way the polygon turns
        flip = (dx >= dy and xs > xe) or (dx < dy and ys > ye)
        if flip:
            xs, xe, ys, ye = xe, xs, ye, ys
        steps = np.arange(max(dx, dy) + 1)
        t = steps[::-1] if flip else steps
        if dx >= dy:
            s = (ye - ys) / dx if dx else 0.0
            u_parts.append(t + xs)
            v_parts.append(np.trunc(ys + s * t + 0.5).astype(np.int64))
        else:
            s = (xe - xs) / dy
            v_parts.append(t + ys)
            u_parts.append(np.trunc(xs + s * t + 0.5).astype(np.int64))
    u, v = np.concatenate(u_parts), np.concatenate(v_parts)
    moved = np.flatnonzero(u[1:] != u[:-1]) + 1              # j with u[j] != u[j-1]
    uj, up, vj, vp = u[moved], u[moved - 1], v[moved], v[moved - 1]
    xd = (np.where(uj < up, uj, uj - 1) + 0.5) / scale - 0.5  # the pixel column crossed
    keep = (np.floor(xd) == xd) & (xd >= 0) & (xd <= w - 1)
    yd = (np.minimum(vj, vp) + 0.5) / scale - 0.5
    yd = np.ceil(np.clip(yd, 0, h))                           # first pixel row below the crossing
    a = np.sort(np.append(xd[keep].astype(np.int64) * h + yd[keep].astype(np.int64), h * w))
    runs = np.diff(np.concatenate([[0], a]))
    counts: list[int] = [int(runs[0])]
    j = 1
    while j < len(runs):  # a zero-length run toggles twice: fold the next run into the previous
        if runs[j] > 0:
            counts.append(int(runs[j]))
            j += 1
        else:
            j += 1
            if j < len(runs):
                counts[-1] += int(runs[j])
                j += 1
    return rle_decode({"size": [h, w], "counts": counts})
