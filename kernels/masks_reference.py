"""Slow, obviously correct numpy twin of kernels.masks: one mask pair at a time, explicit resizing."""
from __future__ import annotations

import numpy as np

__all__ = ["mask_iou_stats_ref", "giou_ciou_ref"]


def _nearest_exact(x: np.ndarray, H: int, W: int) -> np.ndarray:
    """Output pixel (i, j) takes source pixel (floor((i + .5) * h / H), floor((j + .5) * w / W))."""
    h, w = x.shape
    out = np.empty((H, W), dtype=x.dtype)
    for i in range(H):
        si = min(int(np.floor((i + 0.5) * h / H)), h - 1)
        for j in range(W):
            sj = min(int(np.floor((j + 0.5) * w / W)), w - 1)
            out[i, j] = x[si, sj]
    return out


def _bilinear(x: np.ndarray, H: int, W: int) -> np.ndarray:
    """align_corners=False: source coordinate (i + .5) * h / H - .5, clamped at 0; neighbours
    clamped at the last pixel."""
    h, w = x.shape
    x = x.astype(np.float64)
    out = np.empty((H, W), dtype=np.float64)
    for i in range(H):
        si = max((i + 0.5) * h / H - 0.5, 0.0)
        i0 = int(np.floor(si))
        i1 = min(i0 + 1, h - 1)
        a = si - i0
        for j in range(W):
            sj = max((j + 0.5) * w / W - 0.5, 0.0)
            j0 = int(np.floor(sj))
            j1 = min(j0 + 1, w - 1)
            b = sj - j0
            out[i, j] = ((1 - a) * ((1 - b) * x[i0, j0] + b * x[i0, j1])
                         + a * ((1 - b) * x[i1, j0] + b * x[i1, j1]))
    return out


def mask_iou_stats_ref(preds, gts, *, pred_kind: str = "binary", ignore_index: int | None = 255):
    """Lists of 2-D numpy arrays in, numpy (inter, union, gt_empty, pred_empty) out."""
    inter, union, gt_empty, pred_empty = [], [], [], []
    for p, g in zip(preds, gts):
        p, g = np.asarray(p), np.asarray(g)
        H, W = g.shape
        if pred_kind == "binary":
            pb = p > 0
            if pb.shape != g.shape:
                pb = _nearest_exact(pb, H, W)
        else:
            v = p.astype(np.float64)
            if v.shape != g.shape:
                v = _bilinear(v, H, W)
            pb = v > (0.5 if pred_kind == "prob" else 0.0)
        valid = np.ones(g.shape, dtype=bool) if ignore_index is None else (g != ignore_index)
        gb = (g > 0) & valid
        pb = pb & valid
        inter.append(int(np.sum(pb & gb)))
        union.append(int(np.sum(pb | gb)))
        gt_empty.append(not gb.any())
        pred_empty.append(not pb.any())
    return (np.array(inter, dtype=np.int64), np.array(union, dtype=np.int64),
            np.array(gt_empty, dtype=bool), np.array(pred_empty, dtype=bool))


def giou_ciou_ref(inter, union, gt_empty, pred_empty) -> tuple[float, float]:
    """LISA's loop, literally: acc += I / (U + 1e-5); acc += 1 where U == 0; cIoU = sum I / (sum U + 1e-10)."""
    acc = 0.0
    for i, u, ge, pe in zip(inter, union, gt_empty, pred_empty):
        acc += i / (u + 1e-5)
        if ge and pe:  # union is 0 exactly then
            acc += 1.0
    return acc / len(inter), float(np.sum(inter)) / (float(np.sum(union)) + 1e-10)
