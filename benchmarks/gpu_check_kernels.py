"""gpu_check parts about the ranking kernels: grouped_ranks and topk against a bare GEMM (kernels), FAISS on the GPU."""
from __future__ import annotations

from pathlib import Path

from gpu_check_parts import Recorder, peak_tflops, sig


def _ceilings(device: str) -> dict:
    """The two numbers a kernel is held to, measured here: an 8192^3 fp16 GEMM and a device-to-device copy."""
    import torch

    from hardrank.jobs.bench.timing import bare_gemm_gflops, best_of

    if device != "cuda":
        return {}
    gemm = bare_gemm_gflops(8192, 8192, 8192, device, torch.float16, reps=10, chunk=8192)
    x = torch.empty(1 << 28, dtype=torch.float32, device=device)  # 1 GiB, random: zeros can run faster
    x.uniform_()
    y = torch.empty_like(x)
    tc = best_of(lambda: y.copy_(x), device, repeat=3)
    return {"fp16_gemm_8192_tflops": round(gemm / 1e3, 1),
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

    device = profile["device"]
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

    from hardrank.jobs.bench.timing import bare_gemm, best_of, score_gemm
    from hardrank.kernels import grouped_ranks, topk

    name, nq, groups, d, npos = shape
    device, dtype = profile["device"], getattr(torch, dt)
    et, lt = profile["engine_tiles"], profile["large_tiles"]
    xq, xb, bounds, ptr, idx = _kernel_problem(nq, groups, d, npos, device, dtype)
    engine = "engine (256 MiB budget)"  # what search.py runs: EvalConfig.budget_mb's default
    methods = [("gemm", f"{et[0]}x{et[1]}", lambda: bare_gemm(xq, xb, *et))]
    if lt:
        big = dict(q_block=lt[0], g_block=lt[1], budget_bytes=4 * lt[0] * lt[1] * 8)
        methods.append(("gemm", f"{lt[0]}x{lt[1]}", lambda: bare_gemm(xq, xb, *lt)))
        if dtype != torch.float32:  # cuBLAS's own output dtype, for reference: no exact ranks from it
            methods.append(("gemm_native_out", f"{lt[0]}x{lt[1]}", lambda: bare_gemm(xq, xb, *lt, native=True)))
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
        s = best_of(fn, device, repeat, warmup=int(warm))
        row = {"shape": name, "nq": nq, "nb": sum(groups), "d": d, "groups": len(groups), "dtype": dt,
               "method": method, "tiling": tiling, "seconds": sig(s), "tflops": sig(flops / s / 1e12),
               **extra}
        row["fraction_of_peak"] = round(row["tflops"] / peak, 3) if peak else None
        if dtype != torch.float32 and method == "gemm":
            row["form"] = score_gemm(device, dtype)[0]
        gemm = min((x["seconds"] for x in rows + [row] if x["method"] == "gemm"), default=None)
        rows.append(row)
        for x in rows:  # the fastest GEMM tiling so far is the limit
            x["fraction_of_gemm"] = round(gemm / x["seconds"], 3) if gemm else None
        rec.result["rows"].append(row)
        rec.save()
        print(f"  {name:>10} {dt:>8} {method:<15} {tiling:<24} {s:9.4f} s {row['tflops']:8.2f} TFLOP/s", flush=True)
    return rows


def part_faiss_gpu(rec: Recorder, profile: dict, work: Path, args) -> None:
    """FAISS Flat top-10 on the GPU against hardrank's topk on CUDA, at the RoCOCO shape."""
    import faiss
    import torch

    from hardrank.jobs.bench.timing import best_of
    from hardrank.kernels import topk
    from hardrank.scoring.faiss_index import faiss_topk

    if not hasattr(faiss, "get_num_gpus") or faiss.get_num_gpus() == 0:
        rec.result["skipped"] = "faiss imports but has no GPU support (faiss-cpu)"
        return
    xq, xb, *_ = _kernel_problem(5000, [125010], 512, 1, "cuda", torch.float32)
    q, b = xq.cpu().numpy(), xb.cpu().numpy()
    r = rec.result
    r["faiss_flat_gpu_s"] = round(best_of(lambda: faiss_topk(q, b, 10, factory="Flat", gpu="auto"), "cuda", 2), 4)
    for dt in ("float32", "float16"):
        x, y = xq.to(getattr(torch, dt)), xb.to(getattr(torch, dt))
        r[f"hardrank_topk_{dt}_s"] = round(best_of(lambda x=x, y=y: topk(x, y, 10), "cuda", 2), 4)
    r["topk_float32_vs_faiss"] = round(r["faiss_flat_gpu_s"] / r["hardrank_topk_float32_s"], 2)
