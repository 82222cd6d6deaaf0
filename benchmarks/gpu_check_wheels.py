"""The wheels a borrowed GPU machine lacks: downloaded here before borrowing, installed there when missing."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What a borrowed machine's image lacks and the check needs, pinned to the versions CI runs. Downloaded by
# --download-wheels into .gpu_wheels/ (ignored by git; name it in the device call's `carry`).
WHEELS = ("open_clip_torch==3.3.0", "ftfy==6.3.1", "wcwidth==0.9.4")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                   "manylinux1_x86_64")
CARRY_LIMIT_MIB = 64  # the working tree plus carried paths, per device call

# Why the other GPU paths cannot travel (PyPI, 2026-11-26; the image has CUDA 13 and no network):
NOT_CARRIED = {
    "dali_mixed": "not carried: nvidia-dali-cuda130 2.4.0 is a 189.5 MiB wheel (about 480 MB installed), over the "
                  "64 MiB a device call may carry",
    "faiss_gpu": "not carried: PyPI has no FAISS GPU wheel for CUDA 13; faiss-gpu-cu12 1.14.1.post1 (46.2 MiB) and "
                 "faiss-gpu 1.15.1 (129 MiB) need the CUDA 12 runtime and nvidia-cublas-cu12 (554 MiB), which the "
                 "CUDA 13 image lacks",
    "ray_gpu": "not carried: ray 2.60.0 is a 75.6 MiB wheel (cp312, plus its dependencies), over the 64 MiB a "
               "device call may carry",
}


def install(wheels: Path, work: Path) -> tuple[dict, Path | None]:
    """pip-install the carried wheels into ``work/site`` when the modules they hold are missing: (what was found
    and done, the folder the children must import from, or None). Nothing is installed where open_clip already
    imports (CI, a dev machine)."""
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    info = {"wheels_dir": str(wheels), "wheels": [{"file": f.name, "mib": round(f.stat().st_size / 2**20, 2)}
                                                  for f in files], "installed": [], "not_carried": NOT_CARRIED}
    info["total_mib"] = round(sum(w["mib"] for w in info["wheels"]), 2)
    missing = [m for m in ("open_clip", "ftfy", "wcwidth") if importlib.util.find_spec(m) is None]
    info["missing_before"] = missing
    if not missing:
        info["note"] = "open_clip, ftfy and wcwidth already import here: nothing installed"
        return info, None
    if not files:
        info["error"] = f"{missing} missing and no wheels in {wheels}: run `make gpu-wheels` here and carry .gpu_wheels"
        return info, None
    site = work / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *map(str, files)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        info["error"] = f"pip install failed ({r.returncode}): {r.stderr[-2000:]}"
        return info, None
    info["installed"] = [f.name for f in files]
    info["target"] = str(site)
    return info, site


def download_wheels(folder: Path) -> int:
    """Download ``WHEELS`` for the machine's Python 3.12 / x86-64 into ``folder``; report the call's size."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *[a for p in WHEEL_PLATFORMS for a in ("--platform", p)],
           "-d", str(folder), *WHEELS]
    r = subprocess.run(cmd)
    if r.returncode:
        print(f"pip download failed ({r.returncode}); the machine needs {', '.join(WHEELS)}", file=sys.stderr)
        return r.returncode
    wheels = sum(f.stat().st_size for f in folder.glob("*.whl")) / 2**20
    tree = _tree_mib()
    for f in sorted(folder.glob("*.whl")):
        print(f"  {f.name:<70} {f.stat().st_size / 2**20:7.2f} MiB")
    total = wheels + (tree or 0)
    print(f"wheels {wheels:.1f} MiB + working tree {tree if tree is not None else '?'} MiB = {total:.1f} MiB "
          f"of the {CARRY_LIMIT_MIB} MiB a device call carries")
    if total > CARRY_LIMIT_MIB:
        print("too large to carry: remove something from the folder", file=sys.stderr)
        return 1
    rel = os.path.relpath(folder, ROOT)
    print(f"then, on the device: command `bash benchmarks/gpu_check.sh`, carry [\"{rel}\"], timeout_s 540")
    return 0


def _tree_mib() -> float | None:
    """MiB of what a device call sends: tracked and untracked-not-ignored files."""
    try:
        names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    return round(sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file()) / 2**20, 1)

