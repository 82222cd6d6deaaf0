"""What every gpu_check part shares: the part record, sizes per profile, GPU peaks, the result file, the child's run."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Part:
    """One measurement part of the check, as the supervisor schedules it."""
    run: Callable          # run(rec: Recorder, profile: dict, work: Path, args) -> None, in a child process
    cuda: bool             # skipped ("no CUDA device") where CUDA is missing
    cap_s: float           # seconds it may take at most on one H100; the check's budget caps it further
    module: str | None = None  # the optional package it measures: skipped with the reason where it does not import


# Dense (no sparsity) peak TFLOP/s at boost clock, from NVIDIA's datasheets (the headline tensor figures there
# are "with sparsity": halve them). H100 SXM5: FP16/BF16 989.4 (1,979 sparse), FP32 66.9 (NVIDIA H100 Tensor
# Core GPU datasheet; H100 architecture whitepaper, table 3: 132 SMs, 1,830 MHz). H100 PCIe: 756.5 (1,513 sparse),
# FP32 51.2 (114 SMs, 1,755 MHz). H100 NVL: 835.5 (1,671 sparse), FP32 60. H200 SXM: 989.4 (1,979 sparse),
# FP32 67 (NVIDIA H200 datasheet; the H100 SXM's chip and clocks, more and faster memory). H200 NVL: 835.5, FP32 60.
# Matched in this order against torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3" is the SXM5 part).
PEAKS = (  # (name must contain all of, label, fp16/bf16 dense, fp32)
    (("H200", "NVL"), "H200 NVL", 835.5, 60.0),
    (("H200",), "H200 SXM", 989.4, 67.0),
    (("H100", "NVL"), "H100 NVL", 835.5, 60.0),
    (("H100", "PCIE"), "H100 PCIe", 756.5, 51.2),
    (("H100",), "H100 SXM5", 989.4, 66.9),
)


# Sizes per profile. gpu: what one H100 runs inside the budget; cpu: the skeleton at tiny sizes (CI, < 60 s).
PROFILES = {
    "gpu": {
        "device": "cuda",
        "kernel_shapes": [  # (name, nq, gallery groups, d, positives per query, dtypes)
            ("rococo", 5000, [25010, 25000, 25000, 25000, 25000], 512, 5, ["float32", "float16", "bfloat16"]),
            ("100k x 1M", 100_000, [1_000_000], 512, 1, ["float32", "float16"]),
        ],
        "engine_tiles": (2048, 1024),       # what grouped_ranks/topk plan with the engine's 256 MiB budget
        "large_tiles": (8192, 8192),        # GPU-sized tiles, passed as q_block/g_block
        "repeat": 2,
        "encoder_archs": ["ViT-B-32", "ViT-L-14"],
        "encoder_batches": [256, 1024],     # 256: the engine's default batch
        "encoder_min_s": 2.0,
        "e2e": {"arch": "ViT-B-32", "images": 5000, "captions": 5, "k": 4, "threads": 16, "batch": 256},
        "e2e_hf": {"clip_images": 5000, "blip_images": 1000, "rerank_k": 16, "captions": 5, "threads": 16,
                   "batch": 256},
    },
    "cpu": {
        "device": "cpu",
        "kernel_shapes": [("tiny", 200, [600, 300, 300], 32, 2, ["float32", "bfloat16"]),
                          ("tiny x 2", 400, [2400], 32, 1, ["float32"])],
        "engine_tiles": (2048, 1024),
        "large_tiles": (128, 512),
        "repeat": 1,
        "encoder_archs": ["ViT-B-32"],
        "encoder_batches": [2],
        "encoder_min_s": 0.0,               # one cold call per row
        "e2e": {"arch": "tiny", "images": 16, "captions": 5, "k": 4, "threads": 2, "batch": 8},
        "e2e_hf": {"clip_images": 16, "blip_images": 16, "rerank_k": 4, "captions": 5, "threads": 2, "batch": 8,
                   "tiny": True},
    },
}



def peak_tflops(name: str | None, override: float | None = None) -> dict:
    """The GPU's dense fp16/bf16 and fp32 peaks (TFLOP/s) from ``PEAKS``, or the override."""
    if override:
        return {"fp16_dense": override, "fp32": None, "source": "--peak-tflops"}
    upper = (name or "").upper()
    for keys, label, fp16, fp32 in PEAKS:
        if all(k in upper for k in keys):
            return {"fp16_dense": fp16, "fp32": fp32, "source": f"{label} datasheet (dense)"}
    return {"fp16_dense": None, "fp32": None,
            "source": f"unknown GPU {name!r}: pass --peak-tflops to get fractions of peak"}


def sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (TFLOP/s of tiny CPU runs stay non-zero)."""
    return float(f"{x:.{digits}g}")


def write_json(path: Path, data: dict) -> None:
    """``path`` holds the old JSON or the whole new one, never half (stdlib only: the parent has no hardrank)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


class Recorder:
    """The part's result, rewritten atomically on each ``save``."""

    def __init__(self, path: Path, deadline: float):
        self.path, self.deadline = path, deadline
        self.result: dict = {}
        self.error: str | None = None

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        write_json(self.path, {"result": self.result, "error": self.error})


def run_part(part: Part, args, work: Path) -> int:
    """The child: run one part (``--part NAME``), its result written after every measurement and at the end, a
    failure recorded in it; exit status 1 when it failed."""
    rec = Recorder(Path(args.result), args.deadline or time.time() + 3600)
    try:
        part.run(rec, PROFILES[_profile(args.profile)], work, args)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        rec.error = f"{type(exc).__name__}: {exc}"
    rec.save()
    return 1 if rec.error else 0


def _profile(name: str) -> str:
    if name != "auto":
        return name
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"
