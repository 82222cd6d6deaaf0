"""benchmarks/gpu_check.sh on CPU (its JSON contract, GPU parts skipped), and the CUDA checks it runs on a GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import measured

from hardrank import ModelSpec, load_model
from hardrank.embed import ImageEncoder, TextEncoder
from hardrank.kernels import grouped_ranks, topk
from hardrank.kernels.reference import grouped_ranks_reference, topk_reference
from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
CUDA = torch.cuda.is_available()
GPU_PARTS = ("tests", "dali_mixed", "faiss_gpu", "ray_gpu")


def run_check(tmp_path: Path, *args: str, out: Path | None = None, timeout: int = 300):
    """bash benchmarks/gpu_check.sh ARGS with this interpreter; ``out``: the device's $OUT, else none set."""
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["PYTHON"] = sys.executable
    if out is not None:
        env["OUT"] = str(out)
    return subprocess.run(["bash", str(SCRIPT), "--work", str(tmp_path / "work"), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One CPU run of the whole check (tiny sizes): (its JSON, its log, the process)."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    # with a GPU present, force the CPU skeleton and leave the GPU parts to the device run
    args = ["--profile", "cpu", "--parts", "env", "kernels", "encoders", "e2e", "e2e_hf"] if CUDA else []
    proc = run_check(tmp, "--out", str(tmp / "out"), *args)
    data = json.loads((tmp / "out" / "gpu_check.json").read_text())
    return data, (tmp / "out" / "gpu_check.log").read_text(), proc


def test_cpu_run_writes_the_json_and_log(cpu_run):
    data, log, proc = cpu_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert data["schema"] == "hardrank.gpu_check/1"
    assert data["profile"] == "cpu"
    assert set(data) >= {"started", "seconds", "budget_s", "machine", "carried", "skipped", "parts", "headline"}
    assert measured(data["seconds"]) and data["budget_s"] > 0  # (the budget is an option, not a measurement)
    for part in ("env", "kernels", "encoders", "e2e", "e2e_hf"):
        assert data["parts"][part]["status"] == "ok", (part, data["parts"][part])
    hf = data["parts"]["e2e_hf"]["result"]["hf_clip"]  # the transformers path ran end to end
    assert hf["images"] == 16 and hf["texts"] == 80 and measured(hf["images_per_s"])
    assert "gpu_check: " in log and "JSON: " in log  # the log holds the summary table
    assert data["machine"]["torch"] == torch.__version__
    assert data["machine"]["hardrank"] == str(ROOT / "engine")
    assert data["carried"]["missing_before"] == []  # open_clip imports here: nothing to install


@pytest.mark.skipif(CUDA, reason="on a GPU machine the GPU parts run instead of being skipped")
def test_gpu_parts_are_skipped_with_a_reason(cpu_run):
    data, _, _ = cpu_run
    for part in GPU_PARTS:
        assert data["skipped"][part] == "no CUDA device"
        assert data["parts"][part] == {"status": "skipped", "reason": "no CUDA device"}
    assert data["machine"]["cuda"] is False
    assert data["machine"]["peak_tflops"] is None
    assert data["headline"]["skipped"] == sorted(GPU_PARTS)


def test_kernel_rows_hold_ratios_to_the_bare_gemm(cpu_run):
    rows = cpu_run[0]["parts"]["kernels"]["result"]["rows"]
    methods = {(r["shape"], r["dtype"], r["method"]) for r in rows}
    for shape, dtype in [("tiny", "float32"), ("tiny", "bfloat16"), ("tiny x 2", "float32")]:
        for method in ("gemm", "grouped_ranks", "topk_k10"):
            assert (shape, dtype, method) in methods
    for r in rows:  # measured: their shape only (a busy machine rounds a fraction to 0.0)
        assert measured(r["seconds"]) and measured(r["tflops"]) and measured(r["fraction_of_gemm"])
        assert r["fraction_of_peak"] is None  # no peak for a CPU
    # by definition, not measurement: the fastest GEMM row is the limit the others are fractions of
    assert max(r["fraction_of_gemm"] for r in rows if r["method"] == "gemm") == 1.0
    assert any(r.get("form") for r in rows if r["dtype"] == "bfloat16" and r["method"] == "gemm")


def test_encoder_rows_count_flops(cpu_run):
    rows = cpu_run[0]["parts"]["encoders"]["result"]["rows"]
    image = [r for r in rows if r["tower"] == "image"]
    text = [r for r in rows if r["tower"] == "text"]
    assert image and text and all(r["arch"] == "ViT-B-32" for r in rows)
    # ViT-B/32 at 224 px: 8.8 GFLOP an image (12 blocks of 50 tokens at width 768, + patch embedding)
    assert all(abs(r["gflop_per_item"] - 8.82) < 0.05 for r in image)
    assert all(measured(r["items_per_s"]) for r in rows)
    assert {r["what"] for r in rows} >= {"model.encode_image (pixels on device)", "engine ImageEncoder stage"}


def test_end_to_end_reports_where_the_time_goes(cpu_run):
    e2e = cpu_run[0]["parts"]["e2e"]["result"]
    assert e2e["images"] == 16 and e2e["texts"] == 16 * 5 and e2e["k"] == 4
    assert (e2e["images_per_s"] is None or measured(e2e["images_per_s"])) and len(e2e["r_at_1_i2t"]) == 4
    s = e2e["seconds"]
    assert set(s) >= {"decode", "encode", "h2d_copy_est", "rank", "image_embed", "text_embed"}
    assert all(measured(s[k]) for k in ("decode", "encode", "rank", "image_embed", "text_embed"))
    assert s["h2d_copy_est"] is None  # no GPU to copy to
    # the slower of the two stages, or None where one rounded to 0.0
    want = None if not (s["decode"] and s["encode"]) else "decode" if s["decode"] > s["encode"] else "encode"
    assert e2e["bound_by"] == want


def test_out_defaults_to_the_device_folder_and_peak_can_be_given(tmp_path):
    out = tmp_path / "device_out"
    proc = run_check(tmp_path, "--parts", "env", "--peak-tflops", "123", out=out, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((out / "gpu_check.json").read_text())
    assert list(data["parts"]) == ["env"]
    assert data["machine"]["peak_tflops"]["fp16_dense"] == 123.0
    assert data["headline"]["peak_fp16_dense_tflops"] == 123.0
    assert (out / "gpu_check.log").read_text().count("part env") == 1


# --- run on the GPU machine by the check's `tests` part (pytest -m gpu) ---------------------------------------

cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
_TILING_REFS: dict = {}  # the references of the engine-tiling test, computed once for its three dtypes


def _quantised(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """Entries in {-1, 0, 1} / 8: exact in fp16 and bf16, and every score is exact in fp32 in any order."""
    return torch.randint(-1, 2, (n, d), generator=gen).float() / 8


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_kernels_with_the_engine_tiling_match_reference(dtype):
    # the planned blocks (2048 queries x ~1k gallery columns), two query blocks, a shifted last window, 3 groups
    gen = torch.Generator().manual_seed(21)
    nq, nb = 2049, 3 * 1024 + 1
    xq, xb = _quantised(nq, 64, gen), _quantised(nb, 64, gen)
    xb[1500:1510] = xb[7]  # exact duplicates: ties across tiles
    bounds = torch.tensor([0, 1200, 1200 + 1024, nb])
    n_pos = torch.randint(1, 4, (nq,), generator=gen)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), n_pos.cumsum(0)])
    idx = torch.randint(0, nb, (int(ptr[-1]),), generator=gen)
    xqc, xbc = xq.to("cuda", dtype), xb.to("cuda", dtype)
    # the inputs are exact in every dtype, so the (slow, CPU) references are shared by the three dtypes
    refs = _TILING_REFS.setdefault("refs", {
        **{rule: grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule=rule)
           for rule in ("index", "optimistic", "pessimistic")},
        "topk": topk_reference(xq, xb, 10, exclude_ptr=ptr, exclude_idx=idx)})
    for rule in ("index", "optimistic", "pessimistic"):
        fast = grouped_ranks(xqc, xbc, bounds, ptr, idx, tie_rule=rule, budget_bytes=256 << 20)
        for f in ("counts", "pos_score", "pos_index", "neg_score", "neg_index"):
            assert torch.equal(getattr(fast, f).cpu(), getattr(refs[rule], f)), (rule, f)
    D, I = topk(xqc, xbc, 10, exclude_ptr=ptr, exclude_idx=idx, budget_bytes=256 << 20)
    Dr, Ir = refs["topk"]
    assert torch.equal(D.cpu(), Dr) and torch.equal(I.cpu(), Ir)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("precision,min_cos", [("fp16", 0.999), ("bf16", 0.995)])
def test_cuda_encoders_match_fp32_on_cpu(precision, min_cos):
    ckpt = str(TOY_CHECKPOINTS / "toy-clip_step0700.safetensors")
    ref = load_model(ModelSpec(str(TOY_MODEL), ckpt, "fp32", "cpu"))
    gpu = load_model(ModelSpec(str(TOY_MODEL), ckpt, precision, "cuda"))
    assert gpu.device == "cuda" and gpu.fingerprint != ref.fingerprint  # precision is part of the fingerprint
    h, w = ref.preprocess_cfg["size"]
    px = torch.randn(16, 3, h, w, generator=torch.Generator().manual_seed(22))  # (B, 3, H, W) float32, on the CPU
    texts = ["a red circle on the left", "a small blue square", "two green triangles",
             "a large yellow star at the top right of the picture next to a purple square"]
    for stage, batch in ((ImageEncoder, {"pixels": px}), (TextEncoder, {"text": texts})):
        e_ref = stage([ref])(batch)["emb0"]
        e = stage([gpu])(batch)["emb0"]  # (B, D) float32, L2-normalised, back on the CPU
        assert e.shape == e_ref.shape
        assert abs(float((e * e).sum(1).min()) - 1) < 1e-4
        cos = (e * e_ref).sum(1)
        assert cos.min() >= min_cos, (stage.__name__, precision, cos)
