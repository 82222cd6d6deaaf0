"""The torch device a run uses: ``--device`` checked against what torch sees, before any work."""
from __future__ import annotations

import torch

from hardrank.errors import UsageError

__all__ = ["resolve_device"]


def resolve_device(device: str = "auto") -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; other names pass through once the
    device is known to exist (UsageError naming ``--device`` otherwise, before any work)."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"option device (--device) is {device!r}, but torch sees no CUDA GPU "
                             f"(torch.cuda.is_available() is False: no GPU, no driver, or a CPU-only torch build); "
                             f"use --device cpu, or --device auto to take a GPU when there is one")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UsageError(f"option device (--device) is {device!r}, but torch sees "
                             f"{torch.cuda.device_count()} CUDA device(s) (cuda:0..cuda:"
                             f"{torch.cuda.device_count() - 1}); pick one of those")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UsageError("option device (--device) is 'mps', but torch sees no Apple GPU; use --device cpu")
    return device
