"""One prepared check for a borrowed GPU machine: CUDA tests, then kernels, encoders and the engine end to end
against the hardware's limits, written as one JSON (parts time-boxed; each failure recorded, never fatal).

    bash benchmarks/gpu_check.sh [--out DIR]        # the command to run there (and in CI, where GPU parts skip)
    python benchmarks/gpu_check.py --download-wheels  # here, before borrowing: the wheels the machine lacks

The parent process imports nothing heavy: it installs carried wheels, then runs each part in a child process
(``--part NAME``) under a deadline, so a hung kernel, an out-of-memory or a crashing extension costs that part
only. A child writes its result file after every measurement, so even a part killed at its deadline leaves what
it measured. The parent rewrites ``gpu_check.json`` after every part.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCHEMA = "hardrank.gpu_check/1"

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

# Parts in run order: (name, needs CUDA, seconds it may take at most on one H100; the deadline caps it further)
PARTS = (
    ("env", False, 45),
    ("tests", True, 100),
    ("kernels", False, 150),
    ("encoders", False, 70),
    ("e2e", False, 110),
    ("dali_mixed", True, 45),
    ("faiss_gpu", True, 45),
    ("ray_gpu", True, 60),
)
PART_NAMES = tuple(p[0] for p in PARTS)
# The CUDA tests: those named "cuda" (each skips without CUDA) and test_amodal's GPU mask check.
CUDA_TESTS = ("cuda or gpu_matches_cpu", ("tests/test_kernels.py", "tests/test_amodal.py", "tests/test_gpu_check.py"))
_EXTRA_MODULE = {"dali_mixed": "nvidia.dali", "faiss_gpu": "faiss", "ray_gpu": "ray"}

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
    },
}


# -- the parent: install, run parts under a deadline, write the JSON ---------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=None,
                    help="folder for gpu_check.json (default: $OUT when set, else benchmarks/results/gpu_check)")
    ap.add_argument("--work", default=None,
                    help="scratch folder: generated JPEGs, checkpoints, stores (default: $TMPDIR/hardrank-gpu-check)")
    ap.add_argument("--wheels", default=str(ROOT / ".gpu_wheels"), help="carried wheels to install when missing")
    ap.add_argument("--budget-s", type=float, default=450.0, help="seconds for all parts together (default 450)")
    ap.add_argument("--profile", choices=["auto", "gpu", "cpu"], default="auto",
                    help="sizes: gpu (one H100, minutes) or cpu (tiny, seconds); auto picks by CUDA")
    ap.add_argument("--parts", nargs="+", choices=PART_NAMES, default=list(PART_NAMES), help="parts to run")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="dense fp16 peak of a GPU the built-in table does not know (TFLOP/s)")
    ap.add_argument("--download-wheels", action="store_true",
                    help="download the wheels a GPU machine lacks into --wheels, report sizes, and exit")
    ap.add_argument("--part", choices=PART_NAMES, help=argparse.SUPPRESS)     # child mode
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.download_wheels:
        return download_wheels(Path(args.wheels))
    work = Path(args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "hardrank-gpu-check")
    if args.part:
        return _child(args, work)
    out = Path(args.out or os.environ.get("OUT") or ROOT / "benchmarks" / "results" / "gpu_check")
    return _parent(args, out, work)


def _parent(args, out: Path, work: Path) -> int:
    t_start = time.time()
    deadline = t_start + args.budget_s
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    state = {"schema": SCHEMA, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": 0.0,
             "budget_s": args.budget_s, "profile": args.profile, "command": " ".join(sys.argv),
             "machine": {}, "carried": {}, "skipped": {}, "parts": {}, "headline": {}}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    state["carried"] = _install(Path(args.wheels), work, env)
    state["hardrank_from"] = _hardrank_path(work, env)
    print(f"gpu_check: carried {state['carried'].get('installed', [])}; hardrank from {state['hardrank_from']}",
          flush=True)
    cuda = False
    for name, needs_cuda, cap in PARTS:
        if name not in args.parts and name != "env":  # env always runs: every other part's plan depends on it
            continue
        reason = None
        if needs_cuda and not cuda:
            reason = "no CUDA device"
        elif name in _EXTRA_MODULE and not state["machine"].get("packages", {}).get(_EXTRA_MODULE[name]):
            reason = NOT_CARRIED[name]
        elif deadline - time.time() < 15:
            reason = f"out of time: the {args.budget_s:.0f} s budget was spent by earlier parts"
        if reason:
            state["skipped"][name] = reason
            state["parts"][name] = {"status": "skipped", "reason": reason}
        else:
            part_deadline = min(deadline, time.time() + cap)
            print(f"\n== part {name} (at most {part_deadline - time.time():.0f} s)", flush=True)
            rec = _run_part(name, args, work, env, part_deadline)
            if rec.get("result", {}).get("skipped"):  # the part found out itself (e.g. faiss without GPU support)
                rec["status"], rec["reason"] = "skipped", rec["result"]["skipped"]
                state["skipped"][name] = rec["reason"]
            state["parts"][name] = rec
            if name == "env":  # saved before hardrank is imported: known even when that import fails
                state["machine"] = rec.get("result", {})
                cuda = bool(state["machine"].get("cuda"))
                if args.profile == "auto":
                    state["profile"] = "gpu" if cuda else "cpu"
                    args.profile = state["profile"]
        state["seconds"] = round(time.time() - t_start, 1)
        state["headline"] = headline(state)
        _write_json(out / "gpu_check.json", state)
    _print_summary(state, out / "gpu_check.json")
    bad = [n for n, p in state["parts"].items() if p["status"] not in ("ok", "skipped")]
    return 1 if bad else 0


def _install(wheels: Path, work: Path, env: dict) -> dict:
    """pip-install the carried wheels into ``work/site`` when the modules they hold are missing; prepend it to
    the children's PYTHONPATH. Nothing is installed where open_clip already imports (CI, a dev machine)."""
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    info = {"wheels_dir": str(wheels), "wheels": [{"file": f.name, "mib": round(f.stat().st_size / 2**20, 2)}
                                                  for f in files], "installed": [], "not_carried": NOT_CARRIED}
    info["total_mib"] = round(sum(w["mib"] for w in info["wheels"]), 2)
    missing = [m for m in ("open_clip", "ftfy", "wcwidth") if importlib.util.find_spec(m) is None]
    info["missing_before"] = missing
    if not missing:
        info["note"] = "open_clip, ftfy and wcwidth already import here: nothing installed"
        return info
    if not files:
        info["error"] = f"{missing} missing and no wheels in {wheels}: run `make gpu-wheels` here and carry .gpu_wheels"
        return info
    site = work / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *map(str, files)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        info["error"] = f"pip install failed ({r.returncode}): {r.stderr[-2000:]}"
        return info
    info["installed"] = [f.name for f in files]
    info["target"] = str(site)
    _prepend_path(env, site)
    return info


def _hardrank_path(work: Path, env: dict) -> str:
    """Where the children import hardrank from: this checkout's install, else a folder of links that lays
    the repository out as pyproject maps it (engine/ -> hardrank, kernels/ -> hardrank.kernels, jobs/ ->
    hardrank.jobs), since a borrowed machine has neither network nor an editable install."""
    spec = importlib.util.find_spec("hardrank")
    here = ROOT / "engine"
    if spec is not None and spec.origin and Path(spec.origin).resolve().parent == here.resolve():
        return str(here)
    pkg = work / "pkg" / "hardrank"
    pkg.mkdir(parents=True, exist_ok=True)
    links = {p.name: p for p in here.iterdir() if p.name != "__pycache__"}
    links.update(kernels=ROOT / "kernels", jobs=ROOT / "jobs")
    for name, target in links.items():
        link = pkg / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target.resolve())
    _prepend_path(env, pkg.parent)
    return f"{pkg} (links into {ROOT})"


def _prepend_path(env: dict, folder: Path) -> None:
    env["PYTHONPATH"] = os.pathsep.join([str(folder)] + [p for p in [env.get("PYTHONPATH")] if p])


def _run_part(name: str, args, work: Path, env: dict, deadline: float) -> dict:
    """Run one part in a child process until ``deadline``; its result file holds whatever it measured."""
    result = work / f"part_{name}.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", name, "--result", str(result), "--work", str(work),
           "--profile", args.profile, "--deadline", str(deadline)]
    if args.peak_tflops:
        cmd += ["--peak-tflops", str(args.peak_tflops)]
    t0 = time.time()
    # a session of its own, so a timeout ends the part and every process it started (decode pools, pytest)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=max(1.0, deadline - time.time()))
        status = "ok" if rc == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc, status = None, "timeout"
    rec = {"status": status, "seconds": round(time.time() - t0, 1), "returncode": rc}
    if result.is_file():
        data = json.loads(result.read_text())
        rec["result"] = data.get("result", {})
        if data.get("error"):
            rec["error"] = data["error"]
        if status == "ok" and data.get("error"):
            rec["status"] = "failed"
    elif status == "ok":
        rec["status"], rec["error"] = "failed", "the part wrote no result"
    if status == "timeout":
        rec["error"] = f"stopped at its deadline after {rec['seconds']} s; result holds what it measured by then"
    return rec


def _sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (TFLOP/s of tiny CPU runs stay non-zero)."""
    return float(f"{x:.{digits}g}")


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


# -- the child: one part, its result written after every measurement ---------------------------------------------
class Recorder:
    """The part's result, rewritten atomically on each ``save``."""

    def __init__(self, path: Path, deadline: float):
        self.path, self.deadline = path, deadline
        self.result: dict = {}
        self.error: str | None = None

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        _write_json(self.path, {"result": self.result, "error": self.error})


def _child(args, work: Path) -> int:
    rec = Recorder(Path(args.result), args.deadline or time.time() + 3600)
    profile = PROFILES[_profile(args.profile)]
    try:
        globals()[f"part_{args.part}"](rec, profile, work, args)
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


def _device(profile: dict) -> str:
    return profile["device"]


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


# -- kernels against a bare GEMM of the same shapes and dtype ---------------------------------------------------
def _timed(fn, device: str, repeat: int, warmup: bool) -> float:
    """Best wall seconds of ``repeat`` runs (device synchronised), after an optional untimed run."""
    from hardrank.jobs.bench.timing import sync

    if warmup:
        fn()
        sync(device)
    best = math.inf
    for _ in range(repeat):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


_MM_FP32_OUT: dict = {}  # (device, dtype) -> the fp32-output GEMM torch offers there, probed once


def mm_fp32_out(device, dtype):
    """(a, b_t) -> a @ b_t in fp32 from fp16/bf16 operands, as the kernels compute scores: cuBLAS with fp32
    output (``out_dtype``) where this torch has it, else upcast operands, as the kernels then do."""
    import torch

    key = (str(device), dtype)
    if key not in _MM_FP32_OUT:
        try:
            one = torch.ones(2, 2, dtype=dtype, device=device)
            ok = torch.mm(one, one, out_dtype=torch.float32).dtype == torch.float32
        except (TypeError, RuntimeError, NotImplementedError):
            ok = False
        _MM_FP32_OUT[key] = (("mm(out_dtype=float32)", lambda a, b_t: torch.mm(a, b_t, out_dtype=torch.float32))
                             if ok else ("upcast to float32", lambda a, b_t: torch.mm(a.float(), b_t.float())))
    return _MM_FP32_OUT[key]


def _bare_gemm(xq, xb, qb: int, gb: int, fp32_out: bool = True) -> None:
    """Every (qb, gb) score tile of xq @ xb.T and nothing else: the limit the kernels are held to."""
    import torch

    low = xq.dtype != torch.float32
    mm = mm_fp32_out(xq.device, xq.dtype)[1] if low and fp32_out else None
    out = None if mm else torch.empty(qb, gb, dtype=xq.dtype, device=xq.device)
    for q0 in range(0, xq.shape[0], qb):
        a = xq[q0:q0 + qb]
        for c0 in range(0, xb.shape[0], gb):
            b = xb[c0:c0 + gb]
            if mm:
                mm(a, b.T)
            else:
                torch.mm(a, b.T, out=out[:len(a), :len(b)])


def _ceilings(device: str) -> dict:
    """The two numbers a kernel is held to, measured here: an 8192^3 fp16 GEMM and a device-to-device copy."""
    import torch

    if device != "cuda":
        return {}
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.float16)
    b = torch.randn(n, n, device=device, dtype=torch.float16)
    t = _timed(lambda: [torch.mm(a, b) for _ in range(5)], device, 2, True) / 5
    x = torch.empty(1 << 28, dtype=torch.float32, device=device)  # 1 GiB, random: zeros can run faster
    x.uniform_()
    y = torch.empty_like(x)
    tc = _timed(lambda: y.copy_(x), device, 3, True)
    return {"fp16_gemm_8192_tflops": round(2 * n**3 / t / 1e12, 1),
            "d2d_copy_gb_s": round(2 * x.numel() * 4 / tc / 1e9, 1)}  # bytes read + written


def _kernel_problem(nq: int, groups: list[int], d: int, npos: int, device: str, dtype, seed: int = 0):
    """(xq, xb, bounds, pos_ptr, pos_idx): L2-normalised random embeddings made on the device, ``npos``
    positives per query in the first (clean) group, the other groups added distractors (RoCOCO's shape)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    nb = sum(groups)
    norm = torch.nn.functional.normalize
    xq = norm(torch.randn(nq, d, generator=g, device=device), dim=1).to(dtype)  # (nq, d)
    xb = norm(torch.randn(nb, d, generator=g, device=device), dim=1).to(dtype)  # (nb, d)
    bounds = torch.tensor([0, *groups], device=device).cumsum(0)                 # (G + 1,)
    q = torch.arange(nq, device=device)
    pos_idx = ((q[:, None] * npos + torch.arange(npos, device=device)) % groups[0]).reshape(-1)  # (nq * npos,)
    pos_ptr = torch.arange(nq + 1, device=device) * npos
    return xq, xb, bounds, pos_ptr, pos_idx


def part_kernels(rec: Recorder, profile: dict, work: Path, args) -> None:
    """grouped_ranks and topk k=10 against the fastest bare GEMM of the same shapes and dtype, with the engine's
    tiles and (GPU) large tiles; the 100k x 1M shape is shrunk (and says so) when the deadline would not fit it."""
    import torch

    device = _device(profile)
    peaks = peak_tflops(torch.cuda.get_device_name(0), args.peak_tflops) if device == "cuda" else {}
    r = rec.result
    r.update(device=device, rows=[], note="random Gaussian embeddings; scores accumulate in fp32")
    r["ceilings"] = _ceilings(device)
    rec.save()
    first = profile["kernel_shapes"][0]
    first_flops = 2.0 * first[1] * sum(first[2]) * first[3]
    seconds_at: dict[str, float] = {}  # dtype -> seconds of all its methods at the first shape, for estimates
    jobs = [(shape, dt) for shape in profile["kernel_shapes"] for dt in shape[5]]
    for i, ((name, nq, groups, d, npos, _), dt) in enumerate(jobs):
        extra, warm, repeat = {}, True, profile["repeat"]
        if name != first[0]:  # big shape: one run each, and only as many queries as the time left allows
            warm, repeat = False, 1
            est = seconds_at.get(dt, 0.0) * 2.0 * nq * sum(groups) * d / first_flops
            allowed = 0.8 * rec.left() / (len(jobs) - i)
            if est > allowed > 0:
                extra["nq_scaled_from"] = nq
                nq = max(1024, int(nq * allowed / est) // 1024 * 1024)
        rows = _kernel_rows(rec, profile, (name, nq, groups, d, npos), dt, warm, repeat, peaks, extra)
        if name == first[0]:
            seconds_at[dt] = sum(x["seconds"] for x in rows)
        if device == "cuda":
            torch.cuda.empty_cache()


def _kernel_rows(rec: Recorder, profile: dict, shape: tuple, dt: str, warm: bool, repeat: int, peaks: dict,
                 extra: dict) -> list[dict]:
    """Time every method on one (shape, dtype) problem; rows go to the result as they are measured."""
    import torch

    from hardrank.kernels import grouped_ranks, topk

    name, nq, groups, d, npos = shape
    device, dtype = _device(profile), getattr(torch, dt)
    et, lt = profile["engine_tiles"], profile["large_tiles"]
    xq, xb, bounds, ptr, idx = _kernel_problem(nq, groups, d, npos, device, dtype)
    engine = "engine (256 MiB budget)"  # what search.py runs: EvalConfig.budget_mb's default
    methods = [("gemm", f"{et[0]}x{et[1]}", lambda: _bare_gemm(xq, xb, *et))]
    if lt:
        big = dict(q_block=lt[0], g_block=lt[1], budget_bytes=4 * lt[0] * lt[1] * 8)
        methods.append(("gemm", f"{lt[0]}x{lt[1]}", lambda: _bare_gemm(xq, xb, *lt)))
        if dtype != torch.float32:  # cuBLAS's own output dtype, for reference: no exact ranks from it
            methods.append(("gemm_native_out", f"{lt[0]}x{lt[1]}", lambda: _bare_gemm(xq, xb, *lt, False)))
    methods += [("grouped_ranks", engine, lambda: grouped_ranks(xq, xb, bounds, ptr, idx, budget_bytes=256 << 20)),
                ("topk_k10", engine, lambda: topk(xq, xb, 10, budget_bytes=256 << 20))]
    if lt:
        methods += [("grouped_ranks", f"{lt[0]}x{lt[1]} tiles", lambda: grouped_ranks(xq, xb, bounds, ptr, idx, **big)),
                    ("topk_k10", f"{lt[0]}x{lt[1]} tiles", lambda: topk(xq, xb, 10, **big))]
    flops = 2.0 * nq * sum(groups) * d
    peak = peaks.get("fp32" if dtype == torch.float32 else "fp16_dense")
    rows = []
    for method, tiling, fn in methods:
        if rec.left() < 5:
            rec.result.setdefault("not_run", []).append(f"{name} {dt} {method} {tiling}: out of time")
            continue
        s = _timed(fn, device, repeat, warm)
        row = {"shape": name, "nq": nq, "nb": sum(groups), "d": d, "groups": len(groups), "dtype": dt,
               "method": method, "tiling": tiling, "seconds": _sig(s), "tflops": _sig(flops / s / 1e12),
               **extra}
        row["fraction_of_peak"] = round(row["tflops"] / peak, 3) if peak else None
        if dtype != torch.float32 and method == "gemm":
            row["form"] = mm_fp32_out(device, dtype)[0]
        gemm = min((x["seconds"] for x in rows + [row] if x["method"] == "gemm"), default=None)
        rows.append(row)
        for x in rows:  # the fastest GEMM tiling so far is the limit
            x["fraction_of_gemm"] = round(gemm / x["seconds"], 3) if gemm else None
        rec.result["rows"].append(row)
        rec.save()
        print(f"  {name:>10} {dt:>8} {method:<15} {tiling:<24} {s:9.4f} s {row['tflops']:8.2f} TFLOP/s", flush=True)
    return rows


# -- encoders: throughput and fraction of the fp16 dense peak ---------------------------------------------------
def vit_flops(width: int, layers: int, tokens: int, mlp_ratio: float = 4.0) -> float:
    """FLOPs of ``layers`` transformer blocks over ``tokens`` tokens: per token and layer, the qkv and output
    projections (4 w^2 multiply-adds), the MLP (2 r w^2) and attention scores and mixing (2 n w); FLOPs = 2 x MACs."""
    return 2.0 * layers * tokens * ((4 + 2 * mlp_ratio) * width * width + 2 * tokens * width)


def image_flops(cfg: dict) -> float:
    """FLOPs of one image through an open_clip ViT image tower (patch embedding, blocks, projection)."""
    v = cfg["vision_cfg"]
    grid = v["image_size"] // v["patch_size"]
    patches, w = grid * grid, v["width"]
    embed = 2.0 * patches * 3 * v["patch_size"] ** 2 * w  # the patch convolution
    return embed + vit_flops(w, v["layers"], patches + 1, v.get("mlp_ratio", 4.0)) + 2.0 * w * cfg["embed_dim"]


def text_flops(cfg: dict, tokens: int) -> float:
    """FLOPs of one caption of ``tokens`` tokens through an open_clip text tower."""
    t = cfg["text_cfg"]
    return vit_flops(t["width"], t["layers"], tokens, t.get("mlp_ratio", 4.0)) + 2.0 * t["width"] * cfg["embed_dim"]


def _rate(fn, items: int, device: str, min_s: float, max_iter: int = 50) -> float:
    """Items/s of ``fn`` (``items`` per call). ``min_s`` > 0: a warm-up call, a timed one, then as many as last
    ``min_s``; 0 (the CPU skeleton): the first call's rate, cold."""
    from hardrank.jobs.bench.timing import sync

    one = _timed(fn, device, 1, min_s > 0)
    if min_s <= 0:
        return items / one
    n = max(1, min(max_iter, math.ceil(min_s / max(one, 1e-6))))
    sync(device)
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return n * items / (time.perf_counter() - t)


def _captions(n: int, seed: int = 0) -> list[str]:
    """COCO-like captions: 8-14 words from a small vocabulary (about 12-18 tokens each)."""
    import numpy as np

    words = ("a man woman child dog cat red blue green small large wooden old young sitting standing "
             "on in near the table street field beach with holding two three people car bus train plate of "
             "food pizza bench water grass snow skateboard kite umbrella white black brown next to front "
             "bowl riding walking looking at sign tree building").split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, int(rng.integers(8, 15)))) for _ in range(n)]


def part_encoders(rec: Recorder, profile: dict, work: Path, args) -> None:
    """open_clip image and text towers (random init; fp16 on CUDA, fp32 on CPU): the bare forward and the engine's
    encode stage (which casts, normalises and copies embeddings back), in items/s and as a fraction of peak."""
    import torch

    device = _device(profile)
    peak = peak_tflops(torch.cuda.get_device_name(0), args.peak_tflops)["fp16_dense"] if device == "cuda" else None
    rec.result.update(device=device, precision="fp16" if device == "cuda" else "fp32", peak_fp16_dense_tflops=peak,
                      rows=[])
    for arch in profile["encoder_archs"]:
        if rec.left() < 10:
            rec.result.setdefault("not_run", []).append(f"{arch}: out of time")
            continue
        _encoder_rows(rec, profile, arch, peak)
        if device == "cuda":
            torch.cuda.empty_cache()


def _encoder_rows(rec: Recorder, profile: dict, arch: str, peak: float | None) -> None:
    import open_clip
    import torch

    from hardrank import ModelSpec, load_model
    from hardrank.embed import ImageEncoder, TextEncoder, encode_text

    device, min_s = _device(profile), profile["encoder_min_s"]
    m = load_model(ModelSpec(arch, None, rec.result["precision"], device, random_init=True))
    cfg = open_clip.get_model_config(arch)
    size = cfg["vision_cfg"]["image_size"]
    texts = _captions(256 if device == "cuda" else 4)

    def row(tower, what, batch, fn, flops):
        rate = _rate(fn, batch, device, min_s)
        x = {"arch": arch, "tower": tower, "what": what, "batch": batch, "items_per_s": round(rate, 1),
             "gflop_per_item": round(flops / 1e9, 3), "tflops": _sig(rate * flops / 1e12)}
        x["fraction_of_peak"] = round(x["tflops"] / peak, 3) if peak else None
        rec.result["rows"].append(x)
        rec.save()
        print(f"  {arch:<9} {tower:<5} {what:<40} batch {batch:5d} {rate:10.1f}/s {x['tflops']:7.1f} TFLOP/s",
              flush=True)

    with torch.inference_mode():
        for b in profile["encoder_batches"]:
            px = torch.randn(b, 3, size, size, device=device).to(m.dtype)  # (B, 3, H, W) in the model's dtype
            row("image", "model.encode_image (pixels on device)", b, lambda: m.model.encode_image(px), image_flops(cfg))
        b = profile["encoder_batches"][0]
        stage = ImageEncoder([m])
        px32 = torch.randn(b, 3, size, size, device=device)  # float32, as decoders deliver, already on the device
        row("image", "engine ImageEncoder stage", b, lambda: stage({"pixels": px32}), image_flops(cfg))
        tok = m.tokenizer(texts).to(device)  # (n, 77)
        n_tok = int(tok.argmax(-1).max()) + 1  # the trimmed length encode_text runs at (EOT has the largest id)
        row("text", f"encode_text (trimmed to {n_tok} tokens)", len(texts), lambda: encode_text(m.model, tok),
            text_flops(cfg, n_tok))
        tstage = TextEncoder([m])
        row("text", "engine TextEncoder stage (+tokenise)", len(texts), lambda: tstage({"text": texts}),
            text_flops(cfg, n_tok))


# -- end to end through the engine ------------------------------------------------------------------------------
def _world(work: Path, n_images: int, captions: int, threads: int) -> tuple[Path, Path]:
    """(Karpathy annotation file, image root) of ``n_images`` generated COCO-sized JPEGs (640x480, q90, distinct
    content) with ``captions`` captions each; made in parallel once, reused by later runs."""
    import multiprocessing as mp

    from _common import coco_like_jpegs

    root = work / f"coco_{n_images}"
    ann = root / "karpathy_test.json"
    if ann.is_file():
        return ann, root
    chunks = max(1, min(threads, n_images // 8 or 1))
    sizes = [n_images // chunks + (c < n_images % chunks) for c in range(chunks)]
    with mp.get_context("fork").Pool(chunks) as pool:  # no CUDA in this process yet: fork is safe
        paths = pool.starmap(coco_like_jpegs, [(root / f"c{c:02d}", n, (640, 480), 1000 + c)
                                               for c, n in enumerate(sizes)])
    flat = [Path(p).relative_to(root).as_posix() for ps in paths for p in ps]
    caps = _captions(len(flat) * captions, seed=1)
    items = [{"image": p, "caption": caps[i * captions:(i + 1) * captions]} for i, p in enumerate(flat)]
    _write_json(ann, items)  # written last: its presence means the world is whole
    return ann, root


def _checkpoints(work: Path, arch: str, k: int) -> tuple[str, list[str]]:
    """(model, k random-init checkpoint files): an open_clip built-in name saved as fp16 safetensors, or the
    benchmarks' tiny config."""
    if arch in ("tiny", "small"):
        from _common import small_checkpoints

        return small_checkpoints(work / "models", k, arch)
    import open_clip
    import torch
    from safetensors.torch import save_file

    out = []
    for i in range(k):
        path = work / "models" / f"{arch}-rand{i}.safetensors"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.manual_seed(i)
            model = open_clip.create_model(arch, pretrained=None)
            save_file({n: t.detach().half().contiguous() for n, t in model.state_dict().items()}, str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)
        out.append(str(path))
    return arch, out


def _h2d(batch: int, size: int) -> dict:
    """Seconds to copy one decoded batch (B, 3, H, W) float32 to the GPU: pageable (what the engine does: the
    decoders return ordinary tensors) and pinned."""
    import torch

    x = torch.rand(batch, 3, size, size)
    out = {}
    for kind, src in (("pageable", x), ("pinned", x.pin_memory())):
        s = _timed(lambda src=src: [src.to("cuda", non_blocking=True) for _ in range(5)], "cuda", 3, True) / 5
        out[f"{kind}_s"] = round(s, 5)
        out[f"{kind}_gb_s"] = round(x.numel() * 4 / s / 1e9, 2)
    return out


def part_e2e(rec: Recorder, profile: dict, work: Path, args) -> None:
    """hardrank.evaluate on generated COCO-sized JPEGs (Karpathy suite: i2t and t2i), K checkpoints sharing one
    Pillow decode: images/s, and where the time goes (decode, host-to-device copy, encode, rank)."""
    p = profile["e2e"]
    r = rec.result
    r.update(config=dict(p))
    t = time.perf_counter()
    ann, root = _world(work, p["images"], p["captions"], p["threads"])
    r["world_s"] = round(time.perf_counter() - t, 1)
    import shutil

    import torch

    import hardrank

    t = time.perf_counter()
    model, ckpts = _checkpoints(work, p["arch"], p["k"])
    r["checkpoints_s"] = round(time.perf_counter() - t, 1)
    rec.save()
    device = _device(profile)
    for folder in ("e2e_store", "e2e_results"):  # cold store: every image is decoded and encoded
        shutil.rmtree(work / folder, ignore_errors=True)
    t = time.perf_counter()
    report = hardrank.evaluate(model=model, checkpoints=ckpts, suites=["karpathy"], annotations=str(ann),
                               images=str(root), out=str(work / "e2e_results"), store=str(work / "e2e_store"),
                               decode_threads=p["threads"], batch_size=p["batch"], device=device)
    wall = time.perf_counter() - t
    img, txt = report.embed_stats["image"], report.embed_stats["text"]
    st = img["stage_seconds"]
    n_img, k = img["encoded"], p["k"]
    rank = sum(v for res in report.results for key, v in res["provenance"]["timings"].items()
               if key.startswith("rank_"))
    batches = math.ceil(n_img / p["batch"])
    r.update(images=n_img, texts=txt["encoded"], k=k, device=device, wall_s=round(wall, 2),
             images_per_s=round(n_img / img["seconds"], 1) if img["seconds"] else None,
             images_per_s_wall=round(n_img / wall, 1),
             image_x_checkpoint_per_s=round(n_img * k / img["seconds"], 1) if img["seconds"] else None,
             r_at_1_i2t=[res["metrics"]["original"]["i2t"]["R@1"] for res in report.results])
    h2d = _h2d(p["batch"], 224) if device == "cuda" else None
    h2d_s = h2d["pageable_s"] * batches * k if h2d else None  # ImageEncoder copies each batch once per checkpoint
    r["seconds"] = {
        "image_embed": img["seconds"], "text_embed": txt["seconds"],
        "decode": st.get("decode"),                  # in a prefetch thread: overlaps encode
        "encode": st.get("encode"),                  # K checkpoints; includes the copies to and from the GPU
        "h2d_copy_est": round(h2d_s, 3) if h2d_s is not None else None,
        "rank": round(rank, 3), "write": st.get("write"), "key": st.get("key"),
        "other": round(wall - img["seconds"] - txt["seconds"] - rank, 3),  # model loading, suite load, results
    }
    r["h2d_per_batch"] = h2d
    r["decode_images_per_s"] = round(n_img / st["decode"], 1) if st.get("decode") else None
    r["encode_images_per_s"] = round(n_img / st["encode"], 1) if st.get("encode") else None
    r["bound_by"] = None if not (st.get("decode") and st.get("encode")) else (
        "decode" if st["decode"] > st["encode"] else "encode")
    rec.save()
    if device == "cuda":
        torch.cuda.empty_cache()


# -- the optional GPU paths: only where their packages were carried ---------------------------------------------
def part_dali_mixed(rec: Recorder, profile: dict, work: Path, args) -> None:
    """DALI ``mixed`` decoding vs Pillow on 16 threads, on the generated JPEGs (decode + resize only)."""
    from hardrank import ModelSpec, load_model
    from hardrank.embed import PillowDecoder
    from hardrank.embed.dali import DaliDecoder
    from hardrank.items import ImageRef

    p = profile["e2e"]
    ann, root = _world(work, min(p["images"], 2048), p["captions"], p["threads"])
    refs = [ImageRef(str(root / it["image"])) for it in json.loads(ann.read_text())]
    pre = load_model(ModelSpec("ViT-B-32", None, "fp32", "cpu", random_init=True)).preprocess_cfg
    batches = [refs[i:i + p["batch"]] for i in range(0, len(refs), p["batch"])]
    r, first = rec.result, {}
    for name, dec in (("dali_mixed", DaliDecoder(pre, threads=p["threads"], batch_size=p["batch"], device="gpu")),
                      ("pillow", PillowDecoder(pre, threads=p["threads"]))):
        first[name] = dec({"ref": batches[0]})["pixels"][:8]  # warm-up (DALI builds its pipeline)
        t = time.perf_counter()
        for b in batches:
            dec({"ref": b})
        r[f"{name}_images_per_s"] = round(len(refs) / (time.perf_counter() - t), 1)
        rec.save()
    diff = (first["dali_mixed"] - first["pillow"]).abs()  # normalised pixels of the first 8 images
    r.update(images=len(refs), pixel_mean_abs_diff=round(float(diff.mean()), 5),
             pixel_max_abs_diff=round(float(diff.max()), 4),
             speedup=round(r["dali_mixed_images_per_s"] / r["pillow_images_per_s"], 2))


def part_faiss_gpu(rec: Recorder, profile: dict, work: Path, args) -> None:
    """FAISS Flat top-10 on the GPU against hardrank's topk on CUDA, at the RoCOCO shape."""
    import faiss
    import torch

    from hardrank.kernels import topk
    from hardrank.scoring.faiss_index import faiss_topk

    if not hasattr(faiss, "get_num_gpus") or faiss.get_num_gpus() == 0:
        rec.result["skipped"] = "faiss imports but has no GPU support (faiss-cpu)"
        return
    xq, xb, *_ = _kernel_problem(5000, [125010], 512, 1, "cuda", torch.float32)
    q, b = xq.cpu().numpy(), xb.cpu().numpy()
    r = rec.result
    r["faiss_flat_gpu_s"] = round(_timed(lambda: faiss_topk(q, b, 10, factory="Flat", gpu="auto"), "cuda", 2, True), 4)
    for dt in ("float32", "float16"):
        x, y = xq.to(getattr(torch, dt)), xb.to(getattr(torch, dt))
        r[f"hardrank_topk_{dt}_s"] = round(_timed(lambda x=x, y=y: topk(x, y, 10), "cuda", 2, True), 4)
    r["topk_float32_vs_faiss"] = round(r["faiss_flat_gpu_s"] / r["hardrank_topk_float32_s"], 2)


def part_ray_gpu(rec: Recorder, profile: dict, work: Path, args) -> None:
    """The Ray executor (one encoder actor with num_gpus=1) end to end, as part_e2e on fewer images."""
    import shutil

    import hardrank

    p = dict(profile["e2e"], images=min(profile["e2e"]["images"], 2000))
    ann, root = _world(work, p["images"], p["captions"], p["threads"])
    model, ckpts = _checkpoints(work, p["arch"], p["k"])
    shutil.rmtree(work / "ray_store", ignore_errors=True)
    t = time.perf_counter()
    report = hardrank.evaluate(model=model, checkpoints=ckpts, suites=["karpathy"], annotations=str(ann),
                               images=str(root), out=str(work / "ray_results"), store=str(work / "ray_store"),
                               decode_threads=p["threads"], batch_size=p["batch"], executor="ray")
    img = report.embed_stats["image"]
    rec.result.update(images=img["encoded"], wall_s=round(time.perf_counter() - t, 2),
                      images_per_s=round(img["encoded"] / img["seconds"], 1) if img["seconds"] else None)


# -- preparing the wheels (here, before borrowing) ----------------------------------------------------------------
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


# -- the summary ---------------------------------------------------------------------------------------------------
def headline(state: dict) -> dict:
    """The few numbers the run is for, flat, from the parts' results (absent parts leave theirs out)."""
    h: dict = {}
    m = state.get("machine") or {}
    h["gpu"] = m.get("gpu")
    h["peak_fp16_dense_tflops"] = (m.get("peak_tflops") or {}).get("fp16_dense")
    parts = state.get("parts", {})
    tests = parts.get("tests", {})
    if tests.get("result"):
        t = tests["result"]
        h["cuda_tests"] = f"{t.get('passed', 0)} passed, {t.get('failures', 0) + t.get('errors', 0)} failed, " \
                          f"{t.get('skipped', 0)} skipped"
    for row in parts.get("kernels", {}).get("result", {}).get("rows", []):
        if row["method"] in ("grouped_ranks", "topk_k10") and row.get("fraction_of_gemm") is not None:
            tiles = "engine" if row["tiling"].startswith("engine") else "large"
            key = f"{row['method']} {row['shape']} {row['dtype']} {tiles} tiles: fraction of GEMM"
            h[key] = row["fraction_of_gemm"]
    ceil = parts.get("kernels", {}).get("result", {}).get("ceilings") or {}
    h.update({f"measured {k}": v for k, v in ceil.items()})
    for row in parts.get("encoders", {}).get("result", {}).get("rows", []):
        if row["what"].startswith(("model.", "encode_text")):
            key = f"{row['arch']} {row['tower']} batch {row['batch']}"
            h[f"{key}: items/s"] = row["items_per_s"]
            if row.get("fraction_of_peak") is not None:
                h[f"{key}: fraction of fp16 peak"] = row["fraction_of_peak"]
    e2e = parts.get("e2e", {}).get("result", {})
    if e2e.get("images_per_s") is not None:
        h["e2e images/s (image embedding, K checkpoints)"] = e2e["images_per_s"]
        h["e2e seconds"] = e2e.get("seconds")
        h["e2e bound by"] = e2e.get("bound_by")
    dali = parts.get("dali_mixed", {}).get("result", {})
    if dali.get("speedup") is not None:
        h["DALI mixed / Pillow decode"] = dali["speedup"]
    faiss = parts.get("faiss_gpu", {}).get("result", {})
    if faiss.get("topk_float32_vs_faiss") is not None:
        h["FAISS GPU Flat seconds / hardrank topk fp32 seconds"] = faiss["topk_float32_vs_faiss"]
    h["skipped"] = sorted(state.get("skipped", {}))
    return h


def _print_summary(state: dict, path: Path) -> None:
    print(f"\ngpu_check: {state['seconds']} s of a {state['budget_s']:.0f} s budget, profile {state['profile']}; "
          f"{state['machine'].get('gpu') or 'no GPU'}")
    print(f"{'part':<11} {'status':<8} {'seconds':>8}  note")
    for name, p in state["parts"].items():
        note = p.get("reason") or p.get("error") or ""
        print(f"{name:<11} {p['status']:<8} {p.get('seconds', 0):8.1f}  {note[:150]}")
    for k, v in state["headline"].items():
        if k not in ("skipped",) and v is not None:
            print(f"  {k}: {v}")
    print(f"JSON: {path}")


if __name__ == "__main__":
    sys.exit(main())
