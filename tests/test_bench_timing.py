"""The benchmarks' timing toolkit (hardrank.jobs.bench.timing) and generated inputs: shapes and counts, never speeds."""
import ast
import itertools
import math
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from hardrank.jobs.bench import inputs, timing


def _ticks():
    """A clock that advances by exactly 1 on every reading."""
    return itertools.count().__next__


def _counter():
    calls = []
    return calls, lambda: calls.append(1)


def test_timed_returns_seconds_and_result():
    seconds, result = timing.timed(lambda: 42, clock=_ticks())
    assert (seconds, result) == (1, 42)


def test_timings_warm_up_then_repeat_then_fill_the_window():
    calls, fn = _counter()
    assert timing.timings(fn, repeat=3, warmup=2, clock=_ticks()) == [1, 1, 1]
    assert len(calls) == 5  # 2 untimed + 3 timed
    calls.clear()
    # a window of 10 ticks: each timed call reads the clock twice and the loop once, so 4 calls fill it
    assert len(timing.timings(fn, repeat=1, warmup=0, min_s=10, clock=_ticks())) == 4
    assert timing.best_of(fn, repeat=2, warmup=0, clock=_ticks()) == 1
    with pytest.raises(ValueError, match="repeat >= 1 .*, got 0"):
        timing.best_of(fn, repeat=0)


def test_interleaved_calls_each_function_once_per_round():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    out = timing.interleaved(fns, rounds=2, warmup=1, clock=_ticks())
    assert order == ["a", "b", "c"] * 3  # one warm-up round, two timed ones
    assert out == {"a": [1, 1], "b": [1, 1], "c": [1, 1]}
    with pytest.raises(ValueError, match="rounds >= 1 .*, got 0"):
        timing.interleaved(fns, rounds=0)


def test_throughput_counts_items_per_second_of_back_to_back_calls():
    calls, fn = _counter()
    assert timing.throughput(fn, 8) > 0 and len(calls) == 1  # min_s 0: one cold call
    calls.clear()
    assert timing.throughput(fn, 8, min_s=1e-3, max_calls=4) > 0
    assert 3 <= len(calls) <= 6  # a warm-up, a probe, then 1 to max_calls calls


def test_clock_sums_stages():
    clock = timing.Clock("cpu")
    for n in (3, 4):
        with clock("encode", n):
            pass
    assert clock.n == {"encode": 7} and clock.s["encode"] >= 0


def test_timeline_rate_is_the_steady_state():
    tl = timing.Timeline()
    bar = tl(4, "images")
    bar.update(10)
    bar.close()
    assert len(tl.events) == 1 and tl.rate() != tl.rate()  # too few rows: nan
    tl.events = [(0.0, 10), (1.0, 10), (2.0, 10), (3.0, 10)]
    assert tl.rate() == 10.0  # rows 20..40 over seconds 1..3


def test_score_gemm_scores_as_the_kernels_do():
    a = torch.randn(5, 8).to(torch.bfloat16)
    b = torch.randn(8, 3).to(torch.bfloat16)
    assert timing.score_gemm("cpu", torch.float32)[0] == "float32"
    form, mm = timing.score_gemm("cpu", torch.bfloat16)
    out = mm(a, b)
    # fp32 output where torch's GEMM offers it on this device, else the CPU kernels' bf16 tile
    assert out.dtype == (torch.float32 if "out_dtype" in form else torch.bfloat16)
    assert torch.allclose(out.float(), a.float() @ b.float(), atol=0.1)


@pytest.mark.parametrize("dtype, native", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
@pytest.mark.parametrize("nq, nb, q_block, g_block", [(1, 1, 4, 4), (7, 13, 3, 5), (8, 10, 4, 5), (5, 2, 8, 8)])
def test_bare_gemm_scores_every_tile_once(monkeypatch, dtype, native, nq, nb, q_block, g_block):
    """The tiles cover the (nq, nb) score matrix exactly once, from operands in the asked dtype."""
    timing.score_gemm("cpu", dtype)  # its one-off probe of the device's GEMM, before counting
    seen = []
    real = torch.mm

    def mm(a, b, **kw):
        seen.append((a.shape[0], b.shape[1], a.dtype, b.dtype))
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "mm", mm)
    xq, xb = torch.randn(nq, 6), torch.randn(nb, 6)
    assert timing.bare_gemm(xq, xb, q_block, g_block, dtype, native=native) is None
    assert len(seen) == math.ceil(nq / q_block) * math.ceil(nb / g_block)
    assert sum(r * c for r, c, _, _ in seen) == nq * nb
    assert {(x, y) for _, _, x, y in seen} == {(dtype, dtype)}


def test_bare_gemm_gflops_takes_the_best_of_its_runs():
    assert timing.bare_gemm_gflops(300, 200, 64, "cpu", torch.bfloat16, reps=2, chunk=128) > 0


def test_flop_formulas_count_the_architecture():
    assert timing.vit_flops(2, 1, 3) == 2 * 3 * ((4 + 8) * 2 * 2 + 2 * 3 * 2)
    cfg = open_clip.get_model_config("ViT-B-32")
    # 12 blocks of 50 tokens at width 768, the 32x32 patch embedding, the projection: 8.8 GFLOP an image
    assert timing.image_flops(cfg) == pytest.approx(8.82e9, rel=5e-3)
    t = cfg["text_cfg"]
    projection = 2.0 * t["width"] * cfg["embed_dim"]
    assert timing.text_flops(cfg, 16) == timing.vit_flops(t["width"], t["layers"], 16) + projection


@pytest.mark.parametrize("kind", ["total", "anon"])
def test_peak_rss_sees_memory_held_at_exit(kind):
    with timing.PeakRSS(kind) as mem:
        block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, touched
    assert mem.peak >= 32 << 20 and mem.high >= mem.base
    assert block.sum() == 64 << 20
    status = timing.PeakRSS.status()
    assert {"VmRSS", "RssAnon", "RssFile", "VmHWM"} <= set(status)
    with pytest.raises(ValueError, match="kind must be 'total' or 'anon', got 'heap'"):
        timing.PeakRSS("heap")


def test_coco_like_jpegs_are_written_once(tmp_path):
    paths = inputs.coco_like_jpegs(tmp_path, n=2, size=(64, 48))
    assert [Image.open(p).size for p in paths] == [(64, 48)] * 2
    mtimes = [Path(p).stat().st_mtime_ns for p in paths]
    assert inputs.coco_like_jpegs(tmp_path, n=2, size=(64, 48)) == paths
    assert [Path(p).stat().st_mtime_ns for p in paths] == mtimes  # reused
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(p).name for p in paths)  # no temporaries


def test_small_checkpoints_load_as_their_config(tmp_path):
    cfg, ckpts = inputs.small_checkpoints(tmp_path, 1, "tiny")
    assert len(ckpts) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["bench-tiny-clip-0.safetensors",
                                                                            "bench-tiny-clip.json"]
    paths, models, work = inputs.images_and_models(tmp_path / "data", 1, 1, "tiny")
    assert len(paths) == 1 and models[0].embed_dim == inputs.CONFIGS["tiny"]["embed_dim"] and work.is_dir()
    work.rmdir()


ROOT = Path(__file__).resolve().parent.parent
_COPIES = {"sync", "_sync", "bare_gemm", "_bare_gemm", "_gemm", "gemm_gflops", "bare_gemm_gflops", "mm_fp32_out",
           "_timed", "_time", "_best", "best_time", "rate", "_rate", "vit_flops", "image_flops", "text_flops"}


def test_every_benchmark_measures_with_the_one_toolkit():
    """No benchmark defines its own sync, timer, bare GEMM or FLOP formula, calls torch.cuda.synchronize,
    edits sys.path, or picks functions through globals(): scripts import hardrank (and gpu_check its siblings)."""
    scripts = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "jobs" / "bench").glob("*.py"))
    assert len(scripts) > 10  # the folders were found
    bad = []
    for path in scripts:
        if path.name == "timing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.FunctionDef) and node.name in _COPIES and node.col_offset == 0:
                bad.append(f"{where} defines {node.name}")
            elif isinstance(node, ast.Attribute) and node.attr == "synchronize":
                bad.append(f"{where} synchronises by itself")
            elif isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                bad.append(f"{where} uses sys.path")
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "globals":
                bad.append(f"{where} calls globals()")
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("_common",
                                                                                                    "benchmarks"):
                bad.append(f"{where} imports {node.module}")
    assert bad == []
