"""Choice-task scores: every row's small grid of left x right dot products, in bounded row blocks."""
from __future__ import annotations

import torch

from ._common import check_embeddings, check_int_tensor

__all__ = ["choice_scores"]

_STEP_BYTES = 32 << 20  # fp64 product buffer per step


def _check_index(name: str, idx, n: int, table: str) -> torch.Tensor:
    idx = check_int_tensor(name, idx, 2)
    if idx.numel():
        bad = (idx < 0) | (idx >= n)
        if bool(bad.any()):
            i, j = (int(v) for v in torch.nonzero(bad)[0])
            raise ValueError(f"{name}[{i}, {j}] = {int(idx[i, j])} is out of range for {table} with {n} rows "
                             f"(valid: 0..{n - 1})")
    return idx


def choice_scores(left: torch.Tensor, right: torch.Tensor, left_idx, right_idx, *,
                  block: int = 65536) -> torch.Tensor:
    """Scores (n, A, B) float32 with ``[i, a, b] = left[left_idx[i, a]] . right[right_idx[i, b]]``.

    left (nl, d), right (nr, d) embedding tables; left_idx (n, A), right_idx (n, B) int64 rows into
    them. Runs on left's device; at most ``block`` rows at a time (fewer when a step's fp64
    products would pass 32 MiB), so memory stays bounded whatever n is.
    """
    check_embeddings("left", left)
    check_embeddings("right", right, d=left.shape[1])
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise ValueError(f"block must be a positive int, got {block!r}")
    li = _check_index("left_idx", left_idx, left.shape[0], "left")
    ri = _check_index("right_idx", right_idx, right.shape[0], "right")
    if li.shape[0] != ri.shape[0]:
        raise ValueError(f"left_idx and right_idx need the same number of rows (one per choice set), "
                         f"got {li.shape[0]} and {ri.shape[0]}")
    device = left.device
    n, A, B = li.shape[0], li.shape[1], ri.shape[1]
    d = left.shape[1]
    out = torch.empty(n, A, B, dtype=torch.float32, device=device)  # (n, A, B) float32
    if out.numel() == 0:
        return out
    li, ri = li.to(device), ri.to(device)
    right = right.to(device)
    # Products and sums in fp64, rounded once to fp32: every score goes through the same reduction
    # code, so identical embeddings give bitwise identical scores (choice rules count ties as wrong;
    # a small GEMM could round two equal columns differently). The work is tiny next to encoding.
    step = max(1, min(block, _STEP_BYTES // max(1, A * B * d * 8)))
    for r0 in range(0, n, step):
        r1 = min(r0 + step, n)
        lb = left[li[r0:r1]].double()   # (b, A, d) float64
        rb = right[ri[r0:r1]].double()  # (b, B, d) float64
        out[r0:r1] = (lb[:, :, None, :] * rb[:, None, :, :]).sum(-1)  # (b, A, B)
    return out
