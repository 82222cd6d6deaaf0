"""gpu_check parts about the machine: what it is (env) and whether the CUDA tests pass on it (tests)."""
from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from gpu_check_parts import ROOT, Recorder, peak_tflops

# The CUDA tests: those named "cuda" (each skips without CUDA) and test_amodal's GPU mask check.
CUDA_TESTS = ("cuda or gpu_matches_cpu", ("tests/test_kernels.py", "tests/test_amodal.py", "tests/test_gpu_check.py"))


def part_env(rec: Recorder, profile: dict, work: Path, args) -> None:
    """The machine: CPU, torch, CUDA, the GPU and its peaks, which optional packages import, then hardrank's
    import (saved before it, so a failing import still leaves what was found)."""
    import torch

    r = rec.result
    r.update(platform=platform.platform(), python=platform.python_version(), cpus=os.cpu_count(),
             torch=torch.__version__, torch_cuda=torch.version.cuda, cuda=torch.cuda.is_available())
    if r["cuda"]:
        p = torch.cuda.get_device_properties(0)
        r.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                 sms=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                 tf32_matmul=torch.backends.cuda.matmul.allow_tf32)
    r["peak_tflops"] = peak_tflops(r.get("gpu"), args.peak_tflops) if r["cuda"] or args.peak_tflops else None
    r["packages"] = {mod: _version(mod, dists) for mod, dists in _PACKAGES}
    rec.save()
    import hardrank

    r["hardrank"] = str(Path(hardrank.__file__).parent)


_PACKAGES = (  # (module, distributions that may provide it)
    ("open_clip", ["open_clip_torch"]), ("ftfy", ["ftfy"]), ("numpy", ["numpy"]), ("PIL", ["pillow"]),
    ("pyarrow", ["pyarrow"]), ("timm", ["timm"]), ("torchvision", ["torchvision"]), ("pytest", ["pytest"]),
    ("faiss", ["faiss-gpu", "faiss-gpu-cu12", "faiss-cpu"]), ("nvidia.dali", ["nvidia-dali-cuda130",
                                                                            "nvidia-dali-cuda120"]), ("ray", ["ray"]))


def _version(module: str, dists: list[str]) -> str | None:
    """"<distribution> <version>" of an importable module ("present" if no distribution says), else None."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except ModuleNotFoundError:  # a parent package (nvidia) is missing
        return None
    for d in dists:
        try:
            return f"{d} {metadata.version(d)}"
        except metadata.PackageNotFoundError:
            continue
    return "present"


def part_tests(rec: Recorder, profile: dict, work: Path, args) -> None:
    """The CUDA tests: kernels fp32/fp16/bf16 against their reference twins (tests/test_kernels.py, and at the
    engine's tiling in tests/test_gpu_check.py), the encoders fp16/bf16 against fp32, mask IoU on the GPU."""
    junit = work / "junit_gpu.xml"
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", f"--junitxml={junit}",
           "-k", CUDA_TESTS[0], *CUDA_TESTS[1]]
    r = subprocess.run(cmd, cwd=ROOT, timeout=max(5.0, rec.left() - 5))
    rec.result.update(command=" ".join(cmd[1:]), returncode=r.returncode, **_junit_counts(junit))
    failed = rec.result.get("failures", 0) + rec.result.get("errors", 0)
    if r.returncode not in (0, 5) or failed:  # 5: nothing collected (reported as 0 tests)
        rec.error = f"pytest exited {r.returncode}: {failed} failed; see the log"


def _junit_counts(path: Path) -> dict:
    if not path.is_file():
        return {}
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    out["failed_tests"] = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
                           if c.find("failure") is not None or c.find("error") is not None]
    return out
