"""grouped_ranks with the torch.compile'd tile reduction agrees with the reference (CPU)."""
from __future__ import annotations

import pytest
import torch
from test_kernels import assert_same, csr, gaussian, quantised, random_positives  # tests/ is on sys.path

from hardrank.kernels import TIE_RULES, grouped_ranks, ranking
from hardrank.kernels.reference import grouped_ranks_reference


@pytest.fixture(scope="module")
def compiled():
    ranking._compiled_count2_cmax()
    s, up, sure = torch.randn(4, 256), torch.zeros(4), torch.full((4,), 0.5)
    try:
        got = ranking._compiled(s, up, sure) if ranking._compiled else None
    except Exception as e:  # no C++ toolchain or an unsupported platform: eager is the fallback
        pytest.skip(f"torch.compile unavailable here: {type(e).__name__}: {e}")
    if got is None:
        pytest.skip("torch.compile unavailable here")
    assert torch.equal(got[0], (s > 0).sum(1, dtype=torch.int32))
    assert torch.equal(got[1], (s > 0.5).sum(1, dtype=torch.int32))
    assert torch.equal(got[2], s.view(4, 2, 128).amax(2))
    return ranking._compiled


def test_compiled_matches_reference(compiled, monkeypatch):
    monkeypatch.setenv("HARDRANK_COMPILE", "1")
    gen = torch.Generator().manual_seed(21)
    xq = torch.randint(-1, 2, (45, 16), generator=gen).float() / 4
    xb = torch.randint(-1, 2, (260, 16), generator=gen).float() / 4
    xb[130:] = xb[:130]
    bounds = torch.tensor([0, 64, 64, 200, 260])
    pos = random_positives(45, 260, gen)
    ptr, idx = csr(pos)
    for rule in TIE_RULES:
        ref = grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule=rule)
        for qb, gb in [(None, None), (7, 13), (16, 128), (45, 256), (2, 256)]:
            assert_same(grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=rule, q_block=qb, g_block=gb), ref)
        # a bf16 first pass hands the compiled reduction its 2-byte tiles as they are
        assert_same(grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=rule, q_block=16, g_block=256,
                                  precision="bf16"), ref)
    x2q, x2b = quantised(30, 8, gen), quantised(150, 8, gen)
    pos2 = random_positives(30, 150, gen)
    ptr2, idx2 = csr(pos2)
    b2 = torch.tensor([0, 75, 150])
    assert_same(grouped_ranks(x2q, x2b, b2, ptr2, idx2, g_block=128),
                grouped_ranks_reference(x2q, x2b, b2, ptr2, idx2))


def test_compiled_duplicates_still_tie(compiled, monkeypatch):
    monkeypatch.setenv("HARDRANK_COMPILE", "1")
    gen = torch.Generator().manual_seed(22)
    base = gaussian(64, 64, gen)
    xq = base[:20] + 0.1 * gaussian(20, 64, gen)
    filler = gaussian(300, 64, gen)
    xb = torch.cat([base[:20], filler, base, filler, base[:20]])  # twins before and after the positives
    ptr, idx = csr([[320 + i] for i in range(20)])
    bounds = torch.tensor([0, 320, 684, 704])
    r_opt = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule="optimistic", g_block=256)
    r_idx = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule="index", g_block=256)
    r_pes = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule="pessimistic", g_block=256)
    assert (r_idx.counts - r_opt.counts).tolist() == [[1, 0, 0]] * 20
    assert (r_pes.counts - r_opt.counts).tolist() == [[1, 0, 1]] * 20
