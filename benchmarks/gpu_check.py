"""One prepared check for a borrowed GPU machine: CUDA tests, then kernels, encoders and the engine end to end
against the hardware's limits, written as one JSON (parts time-boxed; each failure recorded, never fatal).

    bash benchmarks/gpu_check.sh [--out DIR]        # the command to run there (and in CI, where GPU parts skip)
    python benchmarks/gpu_check.py --download-wheels  # here, before borrowing: the wheels the machine lacks

This file holds the options and the registry of parts; the roles live beside it: gpu_check_supervisor.py (the
parent: runs each part in a child process ``--part NAME`` under a deadline, writes gpu_check.json after every
part), gpu_check_wheels.py (the wheels a borrowed machine lacks), gpu_check_parts.py (what every part shares:
sizes, GPU peaks, the result file a child rewrites after every measurement) and the parts themselves:
gpu_check_system.py, gpu_check_kernels.py, gpu_check_models.py, gpu_check_hf.py. Clocks, bare GEMMs and FLOP
formulas come from hardrank.jobs.bench.timing, imported by the children only.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpu_check_hf import part_e2e_hf
from gpu_check_kernels import part_faiss_gpu, part_kernels
from gpu_check_models import part_dali_mixed, part_e2e, part_encoders, part_ray_gpu
from gpu_check_parts import ROOT, Part, run_part
from gpu_check_supervisor import supervise
from gpu_check_system import part_env, part_tests
from gpu_check_wheels import download_wheels

# The parts, in run order: what runs, whether it needs CUDA, the seconds it may take at most on one H100 (the
# budget caps it further) and the optional package it measures (skipped, with the reason, where that is missing).
PARTS = {
    "env": Part(part_env, cuda=False, cap_s=45),
    "tests": Part(part_tests, cuda=True, cap_s=100),
    "kernels": Part(part_kernels, cuda=False, cap_s=150),
    "encoders": Part(part_encoders, cuda=False, cap_s=70),
    "e2e": Part(part_e2e, cuda=False, cap_s=110),
    "e2e_hf": Part(part_e2e_hf, cuda=False, cap_s=110),
    "dali_mixed": Part(part_dali_mixed, cuda=True, cap_s=45, module="nvidia.dali"),
    "faiss_gpu": Part(part_faiss_gpu, cuda=True, cap_s=45, module="faiss"),
    "ray_gpu": Part(part_ray_gpu, cuda=True, cap_s=60, module="ray"),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=None,
                    help="folder for gpu_check.json (default: $OUT when set, else benchmarks/results/gpu_check)")
    ap.add_argument("--work", default=None,
                    help="scratch folder: generated JPEGs, checkpoints, stores (default: $TMPDIR/hardrank-gpu-check)")
    ap.add_argument("--wheels", default=str(ROOT / ".gpu_wheels"), help="carried wheels to install when missing")
    ap.add_argument("--budget-s", type=float, default=480.0, help="seconds for all parts together (default 480)")
    ap.add_argument("--profile", choices=["auto", "gpu", "cpu"], default="auto",
                    help="sizes: gpu (one H100, minutes) or cpu (tiny, seconds); auto picks by CUDA")
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS), help="parts to run")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="dense fp16 peak of a GPU the built-in table does not know (TFLOP/s)")
    ap.add_argument("--download-wheels", action="store_true",
                    help="download the wheels a GPU machine lacks into --wheels, report sizes, and exit")
    ap.add_argument("--part", choices=list(PARTS), help=argparse.SUPPRESS)     # child mode
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.download_wheels:
        return download_wheels(Path(args.wheels))
    work = Path(args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "hardrank-gpu-check")
    if args.part:
        return run_part(PARTS[args.part], args, work)
    out = Path(args.out or os.environ.get("OUT") or ROOT / "benchmarks" / "results" / "gpu_check")
    return supervise(args, PARTS, Path(__file__).resolve(), out, work)


if __name__ == "__main__":
    sys.exit(main())
