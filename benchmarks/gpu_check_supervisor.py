"""gpu_check's parent: installs carried wheels, runs each part in a child process under a deadline, writes the JSON.

It imports nothing heavy: a borrowed machine has no hardrank install, so the children import hardrank through a
folder of links made here. A hung kernel, an out-of-memory or a crashing extension costs its part only; the JSON
is rewritten after every part.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpu_check_parts import ROOT, Part, write_json
from gpu_check_wheels import NOT_CARRIED, install

SCHEMA = "hardrank.gpu_check/1"


def supervise(args, parts: dict[str, Part], entry: Path, out: Path, work: Path) -> int:
    """Run ``parts`` (name -> Part, in run order) that ``args.parts`` names (``env`` always: every other part's
    plan depends on it) through ``entry --part NAME``, within ``args.budget_s``; 0 when no part failed."""
    t_start = time.time()
    deadline = t_start + args.budget_s
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    state = {"schema": SCHEMA, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": 0.0,
             "budget_s": args.budget_s, "profile": args.profile, "command": " ".join(sys.argv),
             "machine": {}, "carried": {}, "skipped": {}, "parts": {}, "headline": {}}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    state["carried"], site = install(Path(args.wheels), work)
    if site is not None:
        _prepend_path(env, site)
    state["hardrank_from"] = _hardrank_path(work, env)
    print(f"gpu_check: carried {state['carried'].get('installed', [])}; hardrank from {state['hardrank_from']}",
          flush=True)
    cuda = False
    for name, part in parts.items():
        if name not in args.parts and name != "env":
            continue
        reason = None
        if part.cuda and not cuda:
            reason = "no CUDA device"
        elif part.module and not state["machine"].get("packages", {}).get(part.module):
            reason = NOT_CARRIED.get(name, f"{part.module} does not import here")
        elif deadline - time.time() < 15:
            reason = f"out of time: the {args.budget_s:.0f} s budget was spent by earlier parts"
        if reason:
            state["skipped"][name] = reason
            state["parts"][name] = {"status": "skipped", "reason": reason}
        else:
            part_deadline = min(deadline, time.time() + part.cap_s)
            print(f"\n== part {name} (at most {part_deadline - time.time():.0f} s)", flush=True)
            rec = _run_part(name, entry, args, work, env, part_deadline)
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
        write_json(out / "gpu_check.json", state)
    _print_summary(state, out / "gpu_check.json")
    bad = [n for n, p in state["parts"].items() if p["status"] not in ("ok", "skipped")]
    return 1 if bad else 0


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


def _run_part(name: str, entry: Path, args, work: Path, env: dict, deadline: float) -> dict:
    """Run one part in a child process until ``deadline``; its result file holds whatever it measured."""
    result = work / f"part_{name}.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(entry), "--part", name, "--result", str(result), "--work", str(work),
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
