"""The low-precision first pass (bf16/fp16 GEMM, a rigorous error bound, exact re-scoring of what it
leaves undecided) gives the fp32 path's and the reference twins' results bit for bit: awkward shapes,
the bound on vectors built to maximise rounding error, near-ties planted at the band's edges, and bands
crowded with near-duplicates (rows fall back to fp32, then to the exact level)."""
from __future__ import annotations

import importlib
from fractions import Fraction

import pytest
import torch
from test_kernels import assert_same, assert_topk_same, csr, gaussian, quantised, random_positives  # tests/ on path

from hardrank.kernels import PRECISIONS, TIE_RULES, grouped_ranks, ranking, resolve_precision, topk
from hardrank.kernels._common import CHUNK, row_maxima
from hardrank.kernels._exact import exact_dot, exact_fp32
from hardrank.kernels._levels import Levels
from hardrank.kernels.reference import _nearest_fp32, grouped_ranks_reference, topk_reference

FORCED = ("fp32", "bf16", "fp16")
topk_mod = importlib.import_module("hardrank.kernels.topk")  # the package's ``topk`` is the function


def every_precision_matches(xq, xb, bounds, pos, rules=TIE_RULES, **kw):
    """grouped_ranks at each forced precision equals the reference; returns the infos."""
    ptr, idx = csr(pos)
    infos = {}
    for rule in rules:
        ref = grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule=rule)
        for p in FORCED:
            got = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=rule, precision=p, **kw)
            assert got.info["precision"] == p
            assert_same(got, ref)
            infos[p] = got.info
    return infos


def topk_every_precision_matches(xq, xb, k, excl=None, **kw):
    ex = {} if excl is None else dict(zip(("exclude_ptr", "exclude_idx"), csr(excl)))
    ref = topk_reference(xq, xb, k, **ex)
    for p in FORCED:
        assert_topk_same(topk(xq, xb, k, precision=p, **ex, **kw), ref)


# --- awkward shapes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("q_block,g_block", [(None, None), (7, 29)])
def test_awkward_shapes_and_ties(q_block, g_block):
    gen = torch.Generator().manual_seed(31)
    for nq, nb, G, d in [(37, 101, 4, 16), (1, 53, 1, 16), (11, 1, 1, 16), (13, 130, 3, 48)]:
        xq, xb = quantised(nq, d, gen), quantised(nb, d, gen)  # exact in bf16/fp16: ties everywhere
        if nb > 60:
            xb[nb // 2:nb // 2 + 20] = xb[:20]  # exact duplicates in other tiles
        cuts = sorted(torch.randint(0, nb + 1, (G - 1,), generator=gen).tolist())
        bounds = torch.tensor([0] + cuts + [nb])
        every_precision_matches(xq, xb, bounds, random_positives(nq, nb, gen), q_block=q_block, g_block=g_block)
    # not representable in bf16: the bound is what decides
    xq, xb = gaussian(23, 48, gen), gaussian(257, 48, gen)
    xb[200:230] = xb[:30]
    every_precision_matches(xq, xb, torch.tensor([0, 100, 100, 257]), random_positives(23, 257, gen),
                            q_block=q_block, g_block=g_block)


def test_topk_awkward_shapes_ties_and_exclusions():
    gen = torch.Generator().manual_seed(32)
    xq, xb = quantised(19, 8, gen), quantised(97, 8, gen)
    xb[60:] = xb[:37]
    excl = random_positives(19, 97, gen, max_pos=6)
    excl[0] = list(range(97))  # everything excluded: padding
    for k in (1, 5, 97 + 3):
        topk_every_precision_matches(xq, xb, k, excl, g_block=29)
    xq, xb = gaussian(21, 40, gen), gaussian(300, 40, gen)
    xb[150:] = xb[:150]
    for k in (1, 10):
        topk_every_precision_matches(xq, xb, k, random_positives(21, 300, gen), q_block=8, g_block=64)
        topk_every_precision_matches(xq, xb, k)


def test_low_precision_inputs_and_mixed_dtypes():
    gen = torch.Generator().manual_seed(33)
    xq, xb = gaussian(17, 32, gen), gaussian(150, 32, gen)
    pos = random_positives(17, 150, gen)
    ptr, idx = csr(pos)
    bounds = torch.tensor([0, 75, 150])
    for dq, db in [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32), (torch.float64, torch.bfloat16)]:
        a, b = xq.to(dq), xb.to(db)
        ref = grouped_ranks_reference(a, b, bounds, ptr, idx)  # scores of the fp32-rounded rows
        for p in FORCED:
            assert_same(grouped_ranks(a, b, bounds, ptr, idx, precision=p, g_block=64), ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_row_maxima_of_two_byte_tiles(dtype):
    """Chunk maxima of a 2-byte tile come from int16 bit patterns; chunks without a value >= +0
    (all negative, -inf masked, -0.0) are reduced again: every case equals the fp32 max exactly."""
    gen = torch.Generator().manual_seed(35)
    v = (torch.randn(9, 4 * CHUNK, generator=gen) * 3).to(dtype)
    v[0] = -v[0].abs()                          # a row of negatives only
    v[1, :CHUNK] = float("-inf")                # a masked chunk
    v[2, CHUNK:2 * CHUNK] = -0.0                # -0.0 only: its max is -0.0 (== 0)
    v[3, CHUNK:2 * CHUNK] = 0.0
    v[3, CHUNK + 5] = -0.0                      # +0 and -0
    v[4, 2 * CHUNK:3 * CHUNK] = -v[4, 2 * CHUNK:3 * CHUNK].abs()
    v[4, 2 * CHUNK + 7] = torch.finfo(dtype).tiny / 4  # one positive subnormal among negatives
    v[5] = float("-inf")                        # a fully masked row
    v[6, 3 * CHUNK:] = -torch.finfo(dtype).max  # the most negative finite value
    v[7, :] = torch.finfo(dtype).max
    mx, cm = row_maxima(v)
    want = v.float().view(9, -1, CHUNK).amax(2)
    assert cm.dtype == mx.dtype == torch.float32
    assert torch.equal(cm, want) and torch.equal(mx, want.amax(1))
    mx, cm = row_maxima(v[:, :CHUNK + 3])       # not chunked: plain row maxima
    assert cm is None and torch.equal(mx, v[:, :CHUNK + 3].float().amax(1))


@pytest.mark.parametrize("p", ["bf16", "fp16"])
def test_negative_scores_in_chunked_low_precision_tiles(p):
    """Anti-correlated galleries (scores mostly below 0, whole chunks negative) through tiles wide enough
    to be chunked: the int16 chunk maxima take their fallback, and the ranks stay exact."""
    gen = torch.Generator().manual_seed(36)
    u = gaussian(1, 32, gen)  # queries around u, the gallery around -u: every score < 0
    xq = torch.nn.functional.normalize(u + 0.3 * gaussian(40, 32, gen), dim=1)
    xb = torch.nn.functional.normalize(-u + 0.3 * gaussian(700, 32, gen), dim=1)
    xb[600:] = torch.nn.functional.normalize(u + 0.3 * gaussian(100, 32, gen), dim=1)  # and a few > 0
    xb[300:340] = xb[:40]  # exact duplicates
    pos = random_positives(40, 700, gen)
    ptr, idx = csr(pos)
    bounds = torch.tensor([0, 256, 700])
    for rule in TIE_RULES:
        ref = grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule=rule)
        assert_same(grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=rule, precision=p, g_block=256), ref)
    assert_topk_same(topk(xq, xb, 7, precision=p, g_block=256), topk_reference(xq, xb, 7))


# --- the bound ------------------------------------------------------------------------------------

def _worst_case_rows(n: int, d: int, fmt: str, gen: torch.Generator) -> torch.Tensor:
    """(n, d) fp32 rows whose every entry rounds to ``fmt`` with nearly the largest relative error
    (significand just below a rounding midpoint) and a residual of its entry's sign: x - p(x) ~ u x, so
    for y = x the two residual terms of the bound add up coherently and Cauchy-Schwarz is tight."""
    drop = 16 if fmt == "bf16" else 13  # significand bits the format drops
    frac = ((1 << (drop - 1)) - 1) / 2.0 ** 23  # just under half of the dropped part
    e = torch.randint(-4, 0, (n, d), generator=gen).float()
    sign = torch.randint(0, 2, (n, d), generator=gen).float() * 2 - 1
    return sign * (1 + frac) * torch.exp2(e)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
@pytest.mark.parametrize("d", [64, 512, 2048])
def test_bound_holds_on_adversarial_vectors(fmt, d):
    gen = torch.Generator().manual_seed(34 + d)
    xq = _worst_case_rows(12, d, fmt, gen)
    xq = xq * torch.tensor([1.0, 2.0 ** -10, 8.0, 1e-3] * 3)[:, None]  # norms far apart; 1e-3 breaks the pattern
    tiny = gaussian(8, d, gen)
    tiny[:, ::2] *= 1e-25  # entries fp16 flushes to zero
    xb = torch.cat([xq, -xq, _worst_case_rows(20, d, fmt, gen), gaussian(20, d, gen), tiny])
    lv = Levels(xb, torch.device("cpu"), fmt)
    sc = lv.block(xq, 0, xq.shape[0])
    r = sc.tile(0, None, 0, xb.shape[0]).double()  # (12, nb) the low-precision GEMM's scores
    s = xq.double() @ xb.double().T  # within ~1e-13 of the exact scores
    bound = sc.E[0][:, None] + sc.level(0).rho * r.abs()
    err = (r - s).abs()
    assert bool((err <= bound).all()), f"bound broken by {float((err - bound).max()):.3g}"
    # the test is adversarial: on the duplicate pairs the error reaches a good part of the bound
    worst = float((err / bound)[:, :12].diagonal().max())
    assert worst > (0.4 if fmt == "bf16" else 0.3), worst
    # and the fp32 level's bound holds too
    r32 = sc.tile(sc.n_levels - 2, None, 0, xb.shape[0]).double()
    assert bool(((r32 - s).abs() <= sc.E[sc.n_levels - 2][:, None]).all())


def test_bound_of_fp32_under_reduced_matmul_precision():
    gen = torch.Generator().manual_seed(35)
    xq, xb = gaussian(30, 64, gen), gaussian(400, 64, gen)
    xb[300:] = xb[:100] + 1e-4 * gaussian(100, 64, gen)
    pos = random_positives(30, 400, gen)
    ptr, idx = csr(pos)
    bounds = torch.tensor([0, 200, 400])
    ref = grouped_ranks_reference(xq, xb, bounds, ptr, idx)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # may let the library use bf16 inside fp32 GEMMs
        assert_same(grouped_ranks(xq, xb, bounds, ptr, idx, precision="fp32"), ref)
        assert_topk_same(topk(xq, xb, 7, precision="fp32"), topk_reference(xq, xb, 7))
    finally:
        torch.set_float32_matmul_precision(before)


# --- near-ties at the edges of the band -------------------------------------------------------------

def _planted(gen, d=64, nq=8):
    """Queries x, a positive p per query and blocks of items p + t x / |x|^2, scoring s* + t up to the
    fp32 rounding of the item: exact ties (t = 0), a few ulps, and the bf16 / fp16 / fp32 band
    half-widths just inside and outside. Block j holds item j of every query."""
    xq = gaussian(nq, d, gen)
    base = gaussian(nq, d, gen) * 0.5 + xq * 0.5
    base = base / base.norm(dim=1, keepdim=True)
    ups = [w * f for w in (3e-8, 1e-7, 3e-6, 4e-6, 3.1e-5, 5e-4, 5.5e-4, 4.1e-3, 4.4e-3, 8e-3)
           for f in (1 - 1e-3, 1, 1 + 1e-3)]
    ts = [0.0] + ups + [0.0] + [-t for t in ups]
    blocks = [base + t * xq / (xq * xq).sum(1, keepdim=True) for t in ts]
    return xq, base, blocks


@pytest.fixture(params=["planned", "never", "always"])
def crowding(request, monkeypatch):
    """Rows go one level up per the planned cost model, never (every undecided item re-scored on its
    own), or always (every row with one undecided item scored again, up to the exact level)."""
    if request.param != "planned":
        n = 1 << 30 if request.param == "never" else -1
        monkeypatch.setattr(ranking, "crowd_limit", lambda *a: n)
        monkeypatch.setattr(ranking, "CAND_LIMIT", n)
        monkeypatch.setattr(topk_mod, "CAND_LIMIT", n)
    return request.param


def test_near_ties_at_the_band_edges(crowding):
    gen = torch.Generator().manual_seed(36)
    nq, d = 8, 64
    xq, base, blocks = _planted(gen, d, nq)
    half = len(blocks) // 2  # an exact twin of the positive and the ups before it, the downs after
    first, second = torch.cat(blocks[:half]), torch.cat(blocks[half:])
    xb = torch.cat([first, base, gaussian(300, d, gen), second])
    start, nb = first.shape[0], xb.shape[0]
    pos = [[start + i] for i in range(nq)]
    bounds = torch.tensor([0, start, start + nq + 300, nb])
    every_precision_matches(xq, xb, bounds, pos, g_block=128)
    every_precision_matches(xq, xb, bounds, pos, rules=("index",), q_block=3, g_block=37)
    for k in (1, 3, 40):
        topk_every_precision_matches(xq, xb, k, pos, g_block=128)


# --- crowded bands --------------------------------------------------------------------------------

def test_crowded_band_of_near_duplicates_falls_back_and_stays_exact(crowding):
    gen = torch.Generator().manual_seed(37)
    nq, d = 6, 64
    xq = gaussian(nq, d, gen)
    p = gaussian(1, d, gen) * 0.3 + xq[:1] * 0.7
    p = p / p.norm()
    near = p + 1e-6 * gaussian(6000, d, gen)  # inside every low-precision band, and the fp32 one
    wide = p + 2e-3 * gaussian(2000, d, gen)  # inside the bf16 band only
    xb = torch.cat([gaussian(1000, d, gen), near, p.expand(500, d), wide, p])
    nb = xb.shape[0]
    pos = [[nb - 1]] * nq
    bounds = torch.tensor([0, 1000, 7000, nb])
    infos = every_precision_matches(xq, xb, bounds, pos, rules=("index", "pessimistic"))
    if crowding == "planned":
        assert infos["bf16"]["row_tiles"]["fp32"] > 0 and infos["fp32"]["row_tiles"]["exact"] > 0
    if crowding == "never":
        assert infos["bf16"]["row_tiles"]["exact"] == 0 and infos["bf16"]["rescored_pairs"] > 6000
    topk_every_precision_matches(xq, xb, 10)
    topk_every_precision_matches(xq, xb, 600, [[0, 1]] * nq)


# --- exact scores ---------------------------------------------------------------------------------

def test_exact_scores_are_correctly_rounded():
    mid = 2.0 ** -24  # half an fp32 step at 1
    cases = [  # (x, y, the fp32 nearest the exact dot product)
        ([1.0, mid], [1.0, 1.0], 1.0),  # exactly halfway: ties to even
        ([1.0, mid, 2.0 ** -60], [1.0, 1.0, 1.0], 1.0 + 2.0 ** -23),  # a hair above: the fp64 sum would tie
        ([1.0, mid, -(2.0 ** -60)], [1.0, 1.0, 1.0], 1.0),  # a hair below
        ([1.0 + 2.0 ** -23, mid], [1.0, 1.0], 1.0 + 2.0 ** -22),  # halfway, even upwards
        ([0.5, -0.25, -0.25], [1.0, 1.0, 1.0], 0.0),  # zero by cancellation
        ([3.0, -(2.0 ** -70)], [2.0 ** -80, 1.0], -1021 * 2.0 ** -80),
        ([1e-30, 1e-30], [1e-15, -1e-15], 0.0),
    ]
    for x, y, want in cases:
        xs, ys = torch.tensor([x]), torch.tensor([y])
        got = float(exact_dot(xs, ys)[0])
        assert got == want and exact_fp32(xs[0].tolist(), ys[0].tolist()) == want, (x, y, got)
    gen = torch.Generator().manual_seed(38)
    a, b = gaussian(300, 24, gen), gaussian(300, 24, gen)
    b[::3] = a[::3]
    b[1::3] = -a[1::3] + 1e-7 * gaussian(100, 24, gen)  # near-zero scores: the certification must hold
    got = exact_dot(a, b)
    for i in range(300):
        exact = sum((Fraction(u) * Fraction(v) for u, v in zip(a[i].tolist(), b[i].tolist())), Fraction(0))
        assert float(got[i]) == _nearest_fp32(exact), i


# --- the option -----------------------------------------------------------------------------------

def test_precision_argument():
    xq, xb = torch.eye(3), torch.eye(3)
    b, ptr, idx = torch.tensor([0, 3]), torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"precision must be one of \('auto', 'fp32', 'bf16', 'fp16'\), got 'int8'"):
        grouped_ranks(xq, xb, b, ptr, idx, precision="int8")
    with pytest.raises(ValueError, match=r"precision must be one of .* got 'tf32'"):
        topk(xq, xb, 1, precision="tf32")
    big = xq * 1e4
    with pytest.raises(ValueError, match=r"precision='fp16' needs .* reach \|x\| = 10000 at d = 3: use 'bf16'"):
        grouped_ranks(big, xb, b, ptr, idx, precision="fp16")
    assert PRECISIONS == ("auto", "fp32", "bf16", "fp16")
    assert resolve_precision("fp16") == "fp16" and resolve_precision("auto", work=1000) == "fp32"
    assert resolve_precision("auto", "cpu") in ("fp32", "bf16")
    assert grouped_ranks(xq, xb, b, ptr, idx).info["precision"] == "fp32"  # auto: a small problem


def test_flushed_denormals_with_low_precision():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        xq = torch.tensor([[1.0, 0.0]] * 3)
        xb = torch.tensor([[0.0, 1.0], [0.0, -1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.5], [1e-39, 1.0]])
        every_precision_matches(xq, xb, torch.tensor([0, 2, 6]), [[2], [0], [4]])
        every_precision_matches(xq, xb, torch.tensor([0, 2, 6]), [[2], [0], [4]], q_block=1, g_block=1)
    finally:
        torch.set_flush_denormal(False)


def test_bench_kernels_times_both_paths(tmp_path, capsys):
    import argparse
    import json

    from hardrank.jobs.bench.kernel_bench import add_kernels_parser

    parser = argparse.ArgumentParser()
    add_kernels_parser(parser.add_subparsers())
    out = tmp_path / "bench.json"
    args = parser.parse_args(["kernels", "--nq", "40", "--nb", "600", "--variants", "1", "--d", "32", "--repeat", "1",
                              "--gemm-tiling", "64x256", "--skip", "faiss", "argsort", "onehot", "--out", str(out)])
    assert args.func(args) == 0
    res = json.loads(out.read_text())
    assert {r["key"] for r in res["rows"]} == {"gemm", "gemm_lp", "grouped", "grouped_lp", "topk", "topk_lp"}
    assert res["bit_identical"] == {"grouped": True, "topk": True}
    assert "x the fp32 GEMM throughput" in capsys.readouterr().out
    from hardrank.errors import UsageError
    for flag in ("--nq", "--nb", "--repeat"):  # an empty problem is named, not a traceback
        with pytest.raises(UsageError, match=f"{flag} must be >= 1, got 0"):
            args.func(parser.parse_args(["kernels", flag, "0", "--out", str(out)]))


def test_auto_precision_follows_the_hardware_and_says_why(monkeypatch):
    """auto takes bf16 on a CPU only with bf16 matrix units (cpuinfo flags), a oneDNN bf16 GEMM and a
    probe that finds it fast; the reason goes into the kernels' info (and the eval provenance)."""
    from hardrank.kernels import _levels, precision_choice

    big = 1 << 30
    monkeypatch.setattr(_levels, "_cpu_bf16_flags", lambda: ())
    monkeypatch.setattr(_levels, "_cpu_bf16_speedup", lambda: 5.0)
    assert precision_choice("auto", "cpu", big) == (
        "fp32", "auto: no bf16 matrix unit (the CPU flags have neither amx_bf16 nor avx512_bf16)")
    monkeypatch.setattr(_levels, "_cpu_bf16_flags", lambda: ("amx_bf16", "avx512_bf16"))
    assert precision_choice("auto", "cpu", big) == (
        "bf16", "auto: amx_bf16+avx512_bf16; a bf16 GEMM probe ran 5.0x faster than fp32")
    assert precision_choice("auto", "cpu", 1000)[0] == "fp32"  # small calls stay in fp32
    assert precision_choice("fp32", "cpu", big) == ("fp32", "requested")  # forcing fp32
    monkeypatch.setattr(_levels, "_cpu_bf16_speedup", lambda: 1.2)
    assert precision_choice("auto", "cpu", big)[0] == "fp32"
    monkeypatch.setattr(_levels, "_cpu_bf16_flags", lambda: None)  # no /proc/cpuinfo: oneDNN and the probe decide
    monkeypatch.setattr(_levels, "_cpu_bf16_speedup", lambda: 0.0)
    assert precision_choice("auto", "cpu", big) == ("fp32", "auto: CPU flags unknown, but this torch's oneDNN has "
                                                            "no bf16 GEMM")
    xq, xb = torch.eye(3), torch.eye(3)
    b, ptr, idx = torch.tensor([0, 3]), torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2])
    info = grouped_ranks(xq, xb, b, ptr, idx, precision="bf16").info
    assert info["precision"] == "bf16" and info["precision_reason"] == "requested"


def test_auto_stays_fp32_for_narrow_embeddings_on_cpu(monkeypatch):
    """On a CPU auto keeps fp32 below d = 128 although the call is large and bf16 units are there: the tile
    passes bf16 does not speed up outweigh its GEMM saving (the toy model, d = 64). Ranks are the same bits."""
    from hardrank.kernels import _levels

    monkeypatch.setattr(_levels, "_cpu_bf16_flags", lambda: ("avx512_bf16",))
    monkeypatch.setattr(_levels, "_cpu_bf16_speedup", lambda: 3.0)
    monkeypatch.setattr(_levels, "_SMALL", 0)  # every call counts as large
    g = torch.Generator().manual_seed(0)
    for d, want in ((64, "fp32"), (128, "bf16")):
        xq = torch.nn.functional.normalize(torch.randn(7, d, generator=g), dim=1)
        xb = torch.nn.functional.normalize(torch.randn(11, d, generator=g), dim=1)
        b, ptr, idx = torch.tensor([0, 11]), torch.arange(8), torch.arange(7)
        auto = grouped_ranks(xq, xb, b, ptr, idx, precision="auto")
        assert auto.info["precision"] == want, auto.info["precision_reason"]
        assert torch.equal(auto.counts, grouped_ranks(xq, xb, b, ptr, idx, precision="fp32").counts)
    assert "d = 64 < 128" in grouped_ranks(xq[:, :64].contiguous(), xb[:, :64].contiguous(), b, ptr, idx).info[
        "precision_reason"]
