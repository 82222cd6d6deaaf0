"""Mask IoU statistics for many (prediction, ground-truth) pairs, and gIoU/cIoU exactly as LISA."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["mask_iou_stats", "giou_ciou", "PRED_KINDS"]

# How a prediction becomes a binary mask (docs/masks.md, "Metrics"):
PRED_KINDS = (
    "binary",  # any dtype, foreground = value > 0 (0/1 or 0/255 masks); resized with nearest-exact
    "logit",   # float, resized bilinearly to the GT size, then foreground = value > 0
    "prob",    # float in [0, 1], resized bilinearly to the GT size, then foreground = value > 0.5
)
_THRESHOLD = {"binary": 0.0, "logit": 0.0, "prob": 0.5}

# Resolution alignment, matching LISA: its model upsamples SAM's low-resolution logits with
# F.interpolate(mode="bilinear", align_corners=False) to the GT's size (postprocess_masks) and the
# validate loop thresholds them (> 0) there; the GT is never resized. So logits/probabilities are
# interpolated bilinearly (no antialias, align_corners=False) *before* thresholding; binary masks
# have nothing to interpolate and take the nearest source pixel ("nearest-exact": the pixel whose
# centre is nearest, as PIL does, not torch's legacy "nearest" that drifts by half a pixel).

Masks = torch.Tensor | Sequence[torch.Tensor]


def _as_list(x: Masks, what: str) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        if x.ndim != 3:
            raise ValueError(f"{what}: expected a (n, H, W) tensor or a sequence of (H, W) tensors, "
                             f"got a tensor of shape {tuple(x.shape)}")
        return list(x.unbind(0))
    out = list(x)
    for i, m in enumerate(out):
        if not isinstance(m, torch.Tensor) or m.ndim != 2:
            got = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
            raise ValueError(f"{what}[{i}]: expected a 2-D (H, W) tensor, got {got}")
    return out


def _binarise(pred: torch.Tensor, size: tuple[int, int], pred_kind: str) -> torch.Tensor:
    """(b, h, w) any dtype -> (b, H, W) bool, resized per the module's alignment rule."""
    thr = _THRESHOLD[pred_kind]
    if pred_kind == "binary":
        fg = pred > 0
        if tuple(fg.shape[-2:]) != size:
            fg = F.interpolate(fg[:, None].to(torch.uint8), size=size, mode="nearest-exact")[:, 0].bool()
        return fg
    x = pred.float()  # bilinear and the threshold in fp32 whatever the input precision
    if tuple(x.shape[-2:]) != size:
        x = F.interpolate(x[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]
    return x > thr


@torch.no_grad()
def mask_iou_stats(pred: Masks, gt: Masks, *, pred_kind: str = "binary", ignore_index: int | None = 255,
                   block: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair intersection and union of binarised predictions against ground truths.

    pred: ``(n, h, w)`` tensor or n ``(h_i, w_i)`` tensors; binarised per ``pred_kind`` at the GT's
          resolution (see ``PRED_KINDS`` and the alignment note above).
    gt:   ``(n, H, W)`` integer/bool tensor or n ``(H_i, W_i)`` ones. Pixels equal to
          ``ignore_index`` are removed from both masks; other values > 0 are foreground (GT values
          > 1 are binarised), values <= 0 background.
    block: pairs processed per step (memory: about ``block * H * W * 5`` bytes).

    Pairs are grouped by (pred shape, GT shape) and computed on the GT's device.
    Returns ``inter (n,) int64, union (n,) int64, gt_empty (n,) bool, pred_empty (n,) bool``
    (empty = no foreground left after removing ignored pixels), on the first GT's device
    (CPU when n == 0).
    """
    if pred_kind not in PRED_KINDS:
        raise ValueError(f"pred_kind must be one of {PRED_KINDS}, got {pred_kind!r}")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    preds, gts = _as_list(pred, "pred"), _as_list(gt, "gt")
    if len(preds) != len(gts):
        raise ValueError(f"pred has {len(preds)} masks but gt has {len(gts)}; pass one prediction per GT mask")
    for i, g in enumerate(gts):
        if g.dtype.is_floating_point or g.dtype.is_complex:
            raise TypeError(f"gt[{i}] has dtype {g.dtype}; GT masks must be integer or bool "
                            f"(0 background, > 0 foreground, {ignore_index} ignored): cast with .to(torch.uint8)")
    for i, p in enumerate(preds):
        if p.numel() == 0 and gts[i].numel() > 0:
            raise ValueError(f"pred[{i}] has no pixels ({tuple(p.shape)}) but its GT is {tuple(gts[i].shape)}")
        if pred_kind != "binary" and not p.dtype.is_floating_point:
            raise TypeError(f"pred[{i}] has dtype {p.dtype} but pred_kind={pred_kind!r} needs floats; "
                            f"use pred_kind='binary' for 0/1 masks")
    n = len(gts)
    device = gts[0].device if n else torch.device("cpu")
    inter = torch.zeros(n, dtype=torch.int64, device=device)
    union = torch.zeros(n, dtype=torch.int64, device=device)
    gt_empty = torch.ones(n, dtype=torch.bool, device=device)
    pred_empty = torch.ones(n, dtype=torch.bool, device=device)

    groups: dict[tuple, list[int]] = {}
    for i, (p, g) in enumerate(zip(preds, gts)):
        groups.setdefault((tuple(p.shape), tuple(g.shape), g.device), []).append(i)
    for (_, gshape, gdev), idx in groups.items():
        if gshape[0] * gshape[1] == 0:
            continue  # zero-pixel masks: nothing to count, both empty
        for s in range(0, len(idx), block):
            sel = idx[s:s + block]
            g = torch.stack([gts[i] for i in sel])                       # (b, H, W)
            p = torch.stack([preds[i] for i in sel]).to(gdev)            # (b, h, w)
            pf = _binarise(p, gshape, pred_kind)                         # (b, H, W) bool
            gf = g > 0
            if ignore_index is not None:
                valid = g != ignore_index
                gf &= valid
                pf &= valid
            pf, gf = pf.flatten(1), gf.flatten(1)
            i_ = torch.count_nonzero(pf & gf, dim=1)
            g_ = torch.count_nonzero(gf, dim=1)
            p_ = torch.count_nonzero(pf, dim=1)
            out = torch.tensor(sel, device=device)
            inter[out] = i_.to(device)
            union[out] = (g_ + p_ - i_).to(device)
            gt_empty[out] = (g_ == 0).to(device)
            pred_empty[out] = (p_ == 0).to(device)
    return inter, union, gt_empty, pred_empty


def giou_ciou(inter, union, gt_empty, pred_empty) -> tuple[float, float]:
    """(gIoU, cIoU) as LISA's validate loop computes them, as fractions in [0, 1].

    gIoU = mean over masks of ``I / (U + 1e-5)``, a mask whose GT and prediction are both empty
    scoring 1 (and empty GT with a non-empty prediction 0); cIoU = ``sum I / (sum U + 1e-10)``.
    Computed in float64. Raises ValueError for zero masks (the mean is undefined).
    """
    t = [torch.as_tensor(v).reshape(-1).cpu() for v in (inter, union, gt_empty, pred_empty)]
    inter, union, gt_empty, pred_empty = t
    if not (len(inter) == len(union) == len(gt_empty) == len(pred_empty)):
        raise ValueError(f"inter/union/gt_empty/pred_empty lengths differ: {[len(v) for v in t]}")
    if len(inter) == 0:
        raise ValueError("giou_ciou needs at least one mask; got 0")
    i, u = inter.double(), union.double()
    per_mask = torch.where(gt_empty.bool() & pred_empty.bool(), torch.ones_like(i), i / (u + 1e-5))
    return float(per_mask.mean()), float(i.sum() / (u.sum() + 1e-10))
