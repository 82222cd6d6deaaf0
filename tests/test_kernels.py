"""Fast kernels against their reference twins on awkward shapes, planted ties and bad input."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hardrank.kernels import TIE_RULES, GroupedRanks, choice_scores, grouped_ranks, topk
from hardrank.kernels.reference import choice_scores_reference, grouped_ranks_reference, topk_reference

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ("counts", "pos_score", "pos_index", "neg_score", "neg_index")
BLOCKS = [(None, None), (7, 13), (1, 1), (2, 3)]  # (q_block, g_block); None = planned from the budget


# --- helpers ---------------------------------------------------------------------------------

def quantised(n: int, d: int, gen: torch.Generator, levels: int = 3) -> torch.Tensor:
    """(n, d) entries in {-(levels//2) .. levels//2} / 8: every dot product and partial sum is exact
    in fp32 whatever the summation order, so fast and reference scores agree bitwise and ties abound."""
    h = levels // 2
    return torch.randint(-h, h + 1, (n, d), generator=gen).float() / 8


def gaussian(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, d, generator=gen)
    return x / x.norm(dim=1, keepdim=True)


def csr(lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ptr = torch.tensor([0] + [len(x) for x in lists]).cumsum(0)
    idx = torch.tensor([j for x in lists for j in x], dtype=torch.long)
    return ptr, idx


def random_positives(nq: int, nb: int, gen: torch.Generator, max_pos: int = 4) -> list[list[int]]:
    out = []
    for _ in range(nq):
        m = int(torch.randint(1, max_pos + 1, (1,), generator=gen))
        out.append(torch.randint(0, nb, (m,), generator=gen).tolist())  # duplicates possible
    return out


def random_bounds(nb: int, G: int, gen: torch.Generator) -> torch.Tensor:
    cuts = sorted(torch.randint(0, nb + 1, (G - 1,), generator=gen).tolist())
    return torch.tensor([0] + cuts + [nb])


def assert_same(a: GroupedRanks, b: GroupedRanks) -> None:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, (f, x.dtype, y.dtype, x.shape, y.shape)
        assert torch.equal(x, y), f"{f} differs:\n{x}\n{y}"


def check_ranks(xq, xb, bounds, pos, tie_rule, q_block=None, g_block=None, **kw):
    ptr, idx = csr(pos)
    fast = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=tie_rule, q_block=q_block, g_block=g_block, **kw)
    ref = grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule=tie_rule)
    assert_same(fast, ref)
    return fast


# --- grouped_ranks vs reference ----------------------------------------------------------------

@pytest.mark.parametrize("tie_rule", TIE_RULES)
@pytest.mark.parametrize("q_block,g_block", BLOCKS)
def test_grouped_ranks_matches_reference_quantised(tie_rule, q_block, g_block):
    gen = torch.Generator().manual_seed(1)
    for nq, nb, G in [(37, 101, 4), (1, 53, 1), (11, 1, 1), (23, 47, 6)]:
        xq, xb = quantised(nq, 16, gen), quantised(nb, 16, gen)
        bounds = random_bounds(nb, G, gen)  # empty groups likely with G = 6
        check_ranks(xq, xb, bounds, random_positives(nq, nb, gen), tie_rule, q_block, g_block)


@pytest.mark.parametrize("tie_rule", TIE_RULES)
def test_grouped_ranks_few_levels_heavy_ties(tie_rule):
    # entries in {-1, 0, 1} / sqrt(16): scores take few distinct values, most items tie somewhere
    gen = torch.Generator().manual_seed(2)
    xq = torch.randint(-1, 2, (29, 16), generator=gen).float() / 4
    xb = torch.randint(-1, 2, (89, 16), generator=gen).float() / 4
    xb[40:60] = xb[0]  # a run of identical gallery rows
    bounds = torch.tensor([0, 30, 30, 71, 89])
    pos = random_positives(29, 89, gen)
    for qb, gb in BLOCKS:
        check_ranks(xq, xb, bounds, pos, tie_rule, qb, gb)


@pytest.mark.parametrize("g_block", [32, 48, 128, 256, 384])
def test_grouped_ranks_wide_tiles_with_ties(g_block):
    # tile widths that are multiples of 128 (above 128) take the chunk-max best-negative search
    gen = torch.Generator().manual_seed(17)
    xq = torch.randint(-1, 2, (40, 16), generator=gen).float() / 4
    xb = torch.randint(-1, 2, (300, 16), generator=gen).float() / 4
    xb[200:] = xb[:100]
    bounds = torch.tensor([0, 100, 101, 256, 300])
    pos = random_positives(40, 300, gen)
    for rule in TIE_RULES:
        for qb in (None, 8):
            check_ranks(xq, xb, bounds, pos, rule, qb, g_block)


@pytest.mark.parametrize("nb", [12, 13, 14, 25, 26, 27, 39])
@pytest.mark.parametrize("nq", [6, 7, 8, 14, 15])
def test_grouped_ranks_tile_boundaries(nq, nb):
    gen = torch.Generator().manual_seed(nq * 100 + nb)
    xq, xb = quantised(nq, 8, gen), quantised(nb, 8, gen)
    bounds = torch.tensor([0, nb // 2, nb])
    pos = random_positives(nq, nb, gen, max_pos=2)
    for rule in TIE_RULES:
        check_ranks(xq, xb, bounds, pos, rule, q_block=7, g_block=13)


def test_grouped_ranks_tiny_budget_plans_tiny_tiles():
    gen = torch.Generator().manual_seed(3)
    xq, xb = quantised(19, 8, gen), quantised(61, 8, gen)
    bounds = torch.tensor([0, 20, 61])
    pos = random_positives(19, 61, gen)
    for budget in (1, 64, 1000, 4096):  # planned blocks shrink to fit, down to 1 x 1
        check_ranks(xq, xb, bounds, pos, "index", budget_bytes=budget)


def test_exact_duplicates_of_the_positive_tie_with_it():
    """Identical embeddings must give identical scores wherever they sit (other tile, other group,
    a 1-wide tile, a 1-row query block), or a perturbed caption equal to its original is mis-ranked."""
    gen = torch.Generator().manual_seed(4)
    nq, d = 9, 64
    base = gaussian(40, d, gen)
    xq = base[:nq] + 0.1 * gaussian(nq, d, gen)  # each query's positive is its top item
    # gallery: [dups before (group 0) | originals (group 1) | 1-item group | dups after (group 3)]
    xb = torch.cat([base[:nq], base, base[:1], base[:nq]])
    nb = xb.shape[0]
    bounds = torch.tensor([0, nq, nq + 40, nq + 41, nb])
    pos = [[nq + i] for i in range(nq)]  # query i's positive: original i (in group 1)
    ptr, idx = csr(pos)
    for q_block, g_block in [(None, None), (4, 13), (1, 7), (1, 1), (9, 3)]:
        res = {}
        for rule in TIE_RULES:
            res[rule] = r = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=rule, q_block=q_block, g_block=g_block)
            ref = grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule=rule)
            assert torch.equal(r.counts, ref.counts), (rule, q_block, g_block)
            assert torch.equal(r.pos_index, ref.pos_index) and torch.equal(r.neg_index, ref.neg_index)
            torch.testing.assert_close(r.pos_score, ref.pos_score, rtol=0, atol=1e-5)
            # the planted duplicate is the best negative of its group and ties with the positive
            assert torch.equal(r.neg_index[:, 0], torch.arange(nq))
            assert torch.equal(r.neg_index[:, 3], torch.arange(nq) + nq + 41)
            assert torch.equal(r.neg_score[:, 0], r.pos_score) and torch.equal(r.neg_score[:, 3], r.pos_score)
        twin0 = torch.zeros(nq, dtype=torch.long)
        twin0[0] = 1  # query 0's positive also has a twin in the 1-item group (after it)
        # index: the twin before beats the positive, the twins after do not
        assert torch.equal(res["index"].counts[:, 0] - res["optimistic"].counts[:, 0], torch.ones(nq, dtype=torch.long))
        assert torch.equal(res["index"].counts[:, 2:], res["optimistic"].counts[:, 2:])
        assert torch.equal(res["pessimistic"].counts[:, 2] - res["optimistic"].counts[:, 2], twin0)
        ones = torch.ones(nq, dtype=torch.long)
        assert torch.equal(res["pessimistic"].counts[:, 3] - res["optimistic"].counts[:, 3], ones)


def test_duplicate_positive_with_ties_uses_lowest_index_as_best():
    xb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.5, 0.0]])
    xq = torch.tensor([[1.0, 0.0]])
    ptr, idx = csr([[3, 2, 3, 4]])  # positives 2 and 3 tie at 1.0; 3 listed twice; 0 is a tie before
    for rule, expected in [("index", 1), ("optimistic", 0), ("pessimistic", 1)]:
        r = grouped_ranks(xq, xb, torch.tensor([0, 5]), ptr, idx, tie_rule=rule)
        assert int(r.pos_index[0]) == 2 and float(r.pos_score[0]) == 1.0
        assert r.counts.tolist() == [[expected]]
        assert r.neg_index.tolist() == [[0]] and r.neg_score.tolist() == [[1.0]]


def test_rank_is_position_of_first_positive_in_stable_sort():
    gen = torch.Generator().manual_seed(5)
    nq, nb = 31, 97
    xq, xb = quantised(nq, 8, gen), quantised(nb, 8, gen)
    bounds = torch.tensor([0, 10, 10, 60, 97])
    pos = random_positives(nq, nb, gen)
    ptr, idx = csr(pos)
    r = grouped_ranks(xq, xb, bounds, ptr, idx, q_block=7, g_block=13)
    S = xq @ xb.T + 0.0  # exact; + 0.0 folds -0.0 into +0.0
    for i in range(nq):
        order = torch.sort(-S[i], stable=True).indices.tolist()
        first = next(p for p, j in enumerate(order) if j in set(pos[i]))
        assert int(r.rank()[i]) == first
        assert int(r.pos_index[i]) == order[first]
    assert torch.equal(r.rank([0, 2]), r.counts[:, 0] + r.counts[:, 2])


def test_image_to_captions_with_perturbed_group():
    """i2t like RoCOCO: 5 (sometimes 6) original captions per image, then a perturbed group."""
    gen = torch.Generator().manual_seed(6)
    n_img, d = 13, 16
    per = [6 if i in (3, 7) else 5 for i in range(n_img)]
    n_orig = sum(per)
    xq = quantised(n_img, d, gen)
    orig = quantised(n_orig, d, gen)
    pert = orig[torch.randperm(n_orig, generator=gen)[:5 * n_img]].clone()
    pert[::7] = quantised(pert[::7].shape[0], d, gen)  # most perturbed captions equal some original
    xb = torch.cat([orig, pert])
    bounds = torch.tensor([0, n_orig, xb.shape[0]])
    starts = [0] + torch.tensor(per).cumsum(0).tolist()
    pos = [list(range(starts[i], starts[i + 1]))[::-1] for i in range(n_img)]  # unsorted
    for rule in TIE_RULES:
        for qb, gb in [(None, None), (4, 9), (13, 5)]:
            check_ranks(xq, xb, bounds, pos, rule, qb, gb)


def test_positives_in_a_later_group_only():
    gen = torch.Generator().manual_seed(7)
    xq, xb = quantised(17, 8, gen), quantised(70, 8, gen)
    bounds = torch.tensor([0, 30, 30, 50, 70])
    pos = [[50 + int(j) for j in torch.randint(0, 20, (3,), generator=gen)] for _ in range(17)]
    for rule in TIE_RULES:
        for qb, gb in BLOCKS:
            check_ranks(xq, xb, bounds, pos, rule, qb, gb)


def test_positives_scattered_over_every_tile():
    # every query block has positives in every tile, and each item an exact twin in another tile
    gen = torch.Generator().manual_seed(8)
    xq, xb = gaussian(40, 32, gen), gaussian(300, 32, gen)
    xb[150:] = xb[:150]  # each item has an exact twin in the other half
    bounds = torch.tensor([0, 150, 300])
    pos = [torch.randint(0, 300, (5,), generator=gen).tolist() for _ in range(40)]
    ptr, idx = csr(pos)
    ref = grouped_ranks_reference(xq, xb, bounds, ptr, idx)
    for budget in (16 * 32 * 12, 16 * 32 * 24, 64 << 20):
        r = grouped_ranks(xq, xb, bounds, ptr, idx, budget_bytes=budget, q_block=16, g_block=32)
        for f in ("counts", "pos_index", "neg_index"):
            assert torch.equal(getattr(r, f), getattr(ref, f)), (budget, f)


def test_single_item_gallery_and_single_query():
    xq, xb = torch.tensor([[0.6, 0.8]]), torch.tensor([[0.8, 0.6]])
    r = grouped_ranks(xq, xb, torch.tensor([0, 1]), torch.tensor([0, 1]), torch.tensor([0]))
    assert r.counts.tolist() == [[0]] and r.pos_index.tolist() == [0]
    assert r.neg_score.tolist() == [[float("-inf")]] and r.neg_index.tolist() == [[-1]]
    torch.testing.assert_close(r.pos_score, torch.tensor([0.96]))


def test_empty_groups_and_no_queries():
    gen = torch.Generator().manual_seed(9)
    xq, xb = quantised(5, 8, gen), quantised(20, 8, gen)
    bounds = torch.tensor([0, 0, 10, 10, 20, 20])
    r = check_ranks(xq, xb, bounds, random_positives(5, 20, gen), "index", 2, 3)
    for g in (0, 2, 4):
        assert r.counts[:, g].eq(0).all() and r.neg_index[:, g].eq(-1).all()
        assert r.neg_score[:, g].eq(float("-inf")).all()
    e = grouped_ranks(xq[:0], xb, bounds, torch.tensor([0]), torch.tensor([], dtype=torch.long))
    assert e.counts.shape == (0, 5) and e.counts.dtype == torch.long
    assert e.pos_score.shape == (0,) and e.pos_score.dtype == torch.float32
    assert e.pos_index.shape == (0,) and e.neg_score.shape == (0, 5) and e.neg_index.shape == (0, 5)


def test_group_of_only_positives_has_no_negative():
    xq = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    xb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    r = grouped_ranks(xq, xb, torch.tensor([0, 2, 3]), *csr([[0, 1], [1]]))
    assert r.neg_index.tolist() == [[-1, 2], [0, 2]]
    assert r.neg_score[0, 0] == float("-inf")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_on_cpu(dtype):
    gen = torch.Generator().manual_seed(10)
    xq, xb = quantised(21, 16, gen), quantised(64, 16, gen)  # exact in fp16 and bf16
    bounds = torch.tensor([0, 32, 64])
    ptr, idx = csr(random_positives(21, 64, gen))
    for rule in TIE_RULES:
        fast = grouped_ranks(xq.to(dtype), xb.to(dtype), bounds, ptr, idx, tie_rule=rule, q_block=5, g_block=9)
        assert_same(fast, grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule=rule))
    mixed = grouped_ranks(xq.to(dtype), xb, bounds, ptr, idx)
    assert_same(mixed, grouped_ranks_reference(xq, xb, bounds, ptr, idx))


def test_flushed_denormals_keep_ties_at_zero():
    # "s >= s*" is evaluated as "s > nextafter(s*, -inf)"; with s* == 0 that threshold is a denormal
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        xq = torch.tensor([[1.0, 0.0]] * 3)
        xb = torch.tensor([[0.0, 1.0], [0.0, -1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.5]])
        ptr, idx = csr([[2], [0], [4]])  # s* == 0 for all, every other item but one ties at 0
        for rule in TIE_RULES:
            check_ranks(xq, xb, torch.tensor([0, 2, 5]), [[2], [0], [4]], rule)
            check_ranks(xq, xb, torch.tensor([0, 2, 5]), [[2], [0], [4]], rule, 1, 1)
    finally:
        torch.set_flush_denormal(False)


# --- input validation ----------------------------------------------------------------------------

def _valid():
    xq, xb = torch.eye(3), torch.eye(3)
    return xq, xb, torch.tensor([0, 3]), torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2])


def test_error_query_without_positive():
    xq, xb, b, _, _ = _valid()
    with pytest.raises(ValueError, match=r"query 1 has no positive \(pos_ptr\[1\] == pos_ptr\[2\] == 1\)"):
        grouped_ranks(xq, xb, b, torch.tensor([0, 1, 1, 2]), torch.tensor([0, 2]))


@pytest.mark.parametrize("bounds,msg", [
    ([0, 2], r"group_bounds must start at 0 and end at nb=3 \(the gallery size\), got first=0, last=2"),
    ([1, 3], r"must start at 0 .* got first=1"),
    ([0, 2, 1, 3], r"group_bounds must be non-decreasing, but group_bounds\[1\] = 2 > group_bounds\[2\] = 1"),
    (torch.zeros(0, dtype=torch.long), r"group_bounds must have G \+ 1 >= 1 entries"),
    ([[0, 3]], r"group_bounds must be 1-D, got shape \(1, 2\)"),
    ([0.0, 3.0], r"group_bounds must have an integer dtype, got torch.float32"),
])
def test_error_bad_bounds(bounds, msg):
    xq, xb, _, ptr, idx = _valid()
    with pytest.raises(ValueError, match=msg):
        grouped_ranks(xq, xb, torch.as_tensor(bounds), ptr, idx)


def test_error_positive_out_of_range():
    xq, xb, b, ptr, _ = _valid()
    with pytest.raises(ValueError, match=r"pos_idx\[2\] = 3 is out of range for a gallery of 3 items \(valid: 0..2\)"):
        grouped_ranks(xq, xb, b, ptr, torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match=r"pos_idx\[0\] = -1 is out of range"):
        grouped_ranks(xq, xb, b, ptr, torch.tensor([-1, 1, 2]))


def test_error_bad_csr_and_arguments():
    xq, xb, b, ptr, idx = _valid()
    with pytest.raises(ValueError, match=r"pos_ptr must have n \+ 1 = 4 entries .* got 3"):
        grouped_ranks(xq, xb, b, ptr[:3], idx)
    with pytest.raises(ValueError, match=r"pos_ptr\[-1\] = 3 must equal len\(pos_idx\) = 2"):
        grouped_ranks(xq, xb, b, ptr, idx[:2])
    with pytest.raises(ValueError, match=r"pos_ptr must be non-decreasing, but pos_ptr\[1\] = 2 > pos_ptr\[2\] = 1"):
        grouped_ranks(xq, xb, b, torch.tensor([0, 2, 1, 3]), idx)
    with pytest.raises(ValueError,
                       match=r"tie_rule must be one of \('index', 'optimistic', 'pessimistic'\), got 'first'"):
        grouped_ranks(xq, xb, b, ptr, idx, tie_rule="first")
    with pytest.raises(ValueError, match=r"xb has width d=2 but the queries have d=3"):
        grouped_ranks(xq, xb[:, :2], b, ptr, idx)
    with pytest.raises(ValueError, match=r"xq must be 2-D \(n, d\), got shape \(3,\)"):
        grouped_ranks(xq[0], xb, b, ptr, idx)
    with pytest.raises(ValueError, match=r"xq must be float16, bfloat16, float32 or float64, got torch.int64"):
        grouped_ranks(xq.long(), xb, b, ptr, idx)
    with pytest.raises(ValueError, match=r"xb contains NaN or Inf"):
        grouped_ranks(xq, xb.clone().fill_(float("nan")), b, ptr, idx)
    bad = xq.clone()
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"xq contains NaN or Inf"):
        grouped_ranks(bad, xb, b, ptr, idx)
    with pytest.raises(ValueError,
                       match=r"q_block \* g_block = 100 \* 100 scores need 120000 bytes .* budget_bytes=1000"):
        grouped_ranks(xq, xb, b, ptr, idx, budget_bytes=1000, q_block=100, g_block=100)
    with pytest.raises(ValueError, match=r"g_block must be a positive int, got 0"):
        grouped_ranks(xq, xb, b, ptr, idx, g_block=0)


# --- topk ------------------------------------------------------------------------------------------

def assert_topk_same(a, b):
    assert a[0].dtype == torch.float32 and a[1].dtype == torch.long
    assert torch.equal(a[0], b[0]), f"scores differ\n{a[0]}\n{b[0]}"
    assert torch.equal(a[1], b[1]), f"indices differ\n{a[1]}\n{b[1]}"


@pytest.mark.parametrize("q_block,g_block", BLOCKS)
def test_topk_matches_reference_with_ties_and_exclusions(q_block, g_block):
    gen = torch.Generator().manual_seed(11)
    for nq, nb, levels in [(23, 97, 3), (1, 13, 3), (9, 40, 1)]:  # levels=1: all scores 0, all tie
        xq, xb = quantised(nq, 8, gen, levels), quantised(nb, 8, gen, levels)
        if nb > 30:
            xb[30:] = xb[:nb - 30].clone()  # exact duplicates across tiles
        excl = random_positives(nq, nb, gen, max_pos=6)
        excl[0] = list(range(nb))  # a query with everything excluded: all padding
        ptr, idx = csr(excl)
        for k in (1, 5, nb + 3) if q_block in (1, 2) else (1, 5, 10, nb, nb + 3):
            got = topk(xq, xb, k, exclude_ptr=ptr, exclude_idx=idx, q_block=q_block, g_block=g_block)
            assert_topk_same(got, topk_reference(xq, xb, k, exclude_ptr=ptr, exclude_idx=idx))
            assert got[1][0].eq(-1).all() and got[0][0].eq(float("-inf")).all()
        got = topk(xq, xb, 4, q_block=q_block, g_block=g_block)
        assert_topk_same(got, topk_reference(xq, xb, 4))


def test_topk_random_scores_and_edge_sizes():
    gen = torch.Generator().manual_seed(12)
    xq, xb = gaussian(50, 32, gen), gaussian(300, 32, gen)
    D, I = topk(xq, xb, 10, g_block=64)
    Dr, Ir = topk_reference(xq, xb, 10)
    assert torch.equal(I, Ir)
    torch.testing.assert_close(D, Dr, rtol=0, atol=1e-5)
    assert (D[:, :-1] >= D[:, 1:]).all()
    D0, I0 = topk(xq, xb, 0)
    assert D0.shape == (50, 0) and I0.shape == (50, 0)
    De, Ie = topk(xq[:0], xb, 3)
    assert De.shape == (0, 3) and Ie.dtype == torch.long
    Dn, In = topk(xq, xb[:0], 2)
    assert In.eq(-1).all() and Dn.eq(float("-inf")).all()


def test_topk_errors():
    xq, xb = torch.eye(3), torch.eye(3)
    with pytest.raises(ValueError, match=r"k must be a non-negative int, got -1"):
        topk(xq, xb, -1)
    with pytest.raises(ValueError, match=r"exclude_ptr and exclude_idx come together"):
        topk(xq, xb, 1, exclude_ptr=torch.tensor([0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"exclude_idx\[0\] = 7 is out of range for a gallery of 3 items"):
        topk(xq, xb, 1, exclude_ptr=torch.tensor([0, 1, 1, 1]), exclude_idx=torch.tensor([7]))


# --- choice_scores ----------------------------------------------------------------------------------

def test_choice_scores_matches_reference():
    gen = torch.Generator().manual_seed(13)
    left, right = quantised(17, 16, gen), quantised(29, 16, gen)
    li = torch.randint(0, 17, (41, 2), generator=gen)
    ri = torch.randint(0, 29, (41, 5), generator=gen)
    ref = choice_scores_reference(left, right, li, ri)
    for block in (1, 7, 65536):
        out = choice_scores(left, right, li, ri, block=block)
        assert out.shape == (41, 2, 5) and out.dtype == torch.float32
        assert torch.equal(out, ref)
    assert torch.equal(choice_scores(left.half(), right.bfloat16(), li, ri), ref)
    g_left, g_right = gaussian(17, 64, gen), gaussian(29, 64, gen)
    torch.testing.assert_close(choice_scores(g_left, g_right, li, ri),
                               choice_scores_reference(g_left, g_right, li, ri), rtol=0, atol=1e-6)


def test_choice_scores_identical_candidates_tie_exactly():
    gen = torch.Generator().manual_seed(14)
    left = gaussian(3, 512, gen)
    right = gaussian(4, 512, gen)
    right = torch.cat([right, right[1:2], right[1:2]])  # rows 4, 5 equal row 1
    li = torch.tensor([[0], [1], [2]])
    ri = torch.tensor([[1, 4, 0, 5, 3], [5, 2, 1, 4, 1], [4, 4, 1, 3, 5]])
    s = choice_scores(left, right, li, ri)
    for i in range(3):
        vals = {float(s[i, 0, b]) for b in range(5) if int(ri[i, b]) in (1, 4, 5)}
        assert len(vals) == 1


def test_choice_scores_empty_and_errors():
    left, right = torch.eye(3), torch.eye(3)
    empty = choice_scores(left, right, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long))
    assert empty.shape == (0, 2, 4)
    with pytest.raises(ValueError,
                       match=r"right_idx\[1, 0\] = 3 is out of range for right with 3 rows \(valid: 0..2\)"):
        choice_scores(left, right, torch.tensor([[0], [1]]), torch.tensor([[0, 1], [3, 0]]))
    with pytest.raises(ValueError, match=r"left_idx and right_idx need the same number of rows .* got 2 and 1"):
        choice_scores(left, right, torch.tensor([[0], [1]]), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"left_idx must be 2-D, got shape \(2,\)"):
        choice_scores(left, right, torch.tensor([0, 1]), torch.tensor([[0], [1]]))


# --- memory: never (nq, nb) ---------------------------------------------------------------------------

def test_grouped_ranks_memory_stays_within_the_tile_budget():
    script = textwrap.dedent("""
        import resource, sys, torch
        from hardrank.kernels import grouped_ranks
        torch.set_num_threads(1)  # robust timing on a shared 2-core box; memory is what is measured
        def rss_mb():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        g = torch.Generator().manual_seed(0)
        nq = nb = 20000
        xq = torch.randn(nq, 64, generator=g); xb = torch.randn(nb, 64, generator=g)
        ptr = torch.arange(nq + 1) * 2
        idx = torch.stack([torch.arange(nq), (torch.arange(nq) + 1) % nb], 1).flatten()
        bounds = torch.tensor([0, 12345, nb])
        grouped_ranks(xq[:64], xb[:3000], torch.tensor([0, 3000]), ptr[:65], idx[:128] % 3000,
                      budget_bytes=8 << 20)  # warm up: libraries, thread pools, allocator
        before = rss_mb()
        r = grouped_ranks(xq, xb, bounds, ptr, idx, budget_bytes=8 << 20)
        assert r.counts.shape == (nq, 2)
        print(rss_mb() - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    grew_mb = float(out.stdout.strip().splitlines()[-1])
    assert grew_mb < 200, f"peak RSS grew by {grew_mb:.0f} MB; a full (nq, nb) fp32 matrix is 1600 MB"


# --- CUDA -------------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_matches_reference(dtype):
    gen = torch.Generator().manual_seed(15)
    xq, xb = quantised(37, 16, gen), quantised(101, 16, gen)
    bounds = torch.tensor([0, 40, 40, 101])
    pos = random_positives(37, 101, gen)
    ptr, idx = csr(pos)
    xqc, xbc = xq.to("cuda", dtype), xb.to("cuda", dtype)
    for rule in TIE_RULES:
        for qb, gb in BLOCKS:
            fast = grouped_ranks(xqc, xbc, bounds.cuda(), ptr.cuda(), idx.cuda(), tie_rule=rule, q_block=qb, g_block=gb)
            assert fast.counts.device.type == "cuda"
            assert_same(GroupedRanks(*(getattr(fast, f).cpu() for f in FIELDS)),
                        grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule=rule))
    D, I = topk(xqc, xbc, 7, exclude_ptr=ptr, exclude_idx=idx, g_block=13)
    assert_topk_same((D.cpu(), I.cpu()), topk_reference(xq, xb, 7, exclude_ptr=ptr, exclude_idx=idx))
    li, ri = torch.randint(0, 37, (5, 2), generator=gen), torch.randint(0, 101, (5, 3), generator=gen)
    assert torch.equal(choice_scores(xqc, xbc, li, ri).cpu(), choice_scores_reference(xq, xb, li, ri))


@cuda
@pytest.mark.gpu
def test_cuda_duplicates_of_the_positive_tie_with_it():
    gen = torch.Generator().manual_seed(16)
    xq = gaussian(9, 64, gen).cuda().half()
    base = gaussian(40, 64, gen).cuda().half()
    xb = torch.cat([base[:9], base, base[:9]])
    bounds = torch.tensor([0, 9, 49, 58])
    ptr, idx = csr([[9 + i] for i in range(9)])
    for rule, expect in [("index", [1, 0, 0]), ("optimistic", [0, 0, 0]), ("pessimistic", [1, 0, 1])]:
        r = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=rule, g_block=7)
        r0 = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule="optimistic", g_block=7)
        assert (r.counts - r0.counts).cpu().tolist() == [expect] * 9


def test_reference_scores_round_the_exact_dot_product_once():
    """The reference's exact path (fsum of exact float64 products, fractions on an fp32 midpoint) equals the
    definition in fractions, on sums that straddle, hit or just miss an fp32 rounding midpoint."""
    from fractions import Fraction

    import numpy as np

    from hardrank.kernels import reference as R

    def definition(a, b):
        return R._nearest_fp32(sum((Fraction(p) * Fraction(q) for p, q in zip(a, b)), Fraction(0)))

    rows = [([1.0, 2.0 ** -24], [1.0, 1.0]),                # exactly a midpoint: ties to even (1.0)
            ([1.0, 2.0 ** -24, 2.0 ** -80], [1.0] * 3),     # a hair above it: fsum lands on it, fractions decide
            ([1.0, 2.0 ** -24, -2.0 ** -80], [1.0] * 3),    # a hair below it
            ([1.0 + 2.0 ** -23, 2.0 ** -24], [1.0, 1.0]),   # a midpoint with an odd lower neighbour: rounds up
            ([3.0, -3.0], [0.5, 0.5]), ([], [])]            # an exact zero, an empty row
    gen = np.random.default_rng(3)
    rows += [(gen.standard_normal(7).astype(np.float32) * 2.0 ** gen.integers(-40, 40, 7),
              gen.standard_normal(7).astype(np.float32)) for _ in range(300)]
    for a, b in rows:
        a = np.asarray(a, np.float32).astype(np.float64)
        b = np.asarray(b, np.float32).astype(np.float64)
        got, want = R._exact_fp32_dot(a, b), definition(a.tolist(), b.tolist())
        assert got == want and np.signbit(got) == np.signbit(want), (a, b, got, want)
    assert R._exact_fp32_dot(np.array([1.0, 2.0 ** -24, 2.0 ** -80]), np.ones(3)) == float(np.float32(1 + 2 ** -23))
