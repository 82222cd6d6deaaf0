"""Sharded ranking with the kernels (issue 16): per contiguous gallery shard, ``best_positives``; the
best over shards (highest exact score, then lowest global index) goes back to every shard as
``grouped_ranks``'s ``threshold``; the shards' counts add up, and their best negatives merge, to
``grouped_ranks`` on the whole gallery and to its reference twin, bit for bit, under every tie rule
and first precision (per-row fallback included), with empty and one-item shards and exact ties
planted on both sides of every shard boundary."""
from __future__ import annotations

import pytest
import torch
from test_kernels import assert_same, csr, gaussian, quantised, random_positives  # tests/ on path

from hardrank.kernels import TIE_RULES, GroupedRanks, best_positives, grouped_ranks
from hardrank.kernels.reference import _scores, best_positives_reference, grouped_ranks_reference

FORCED = ("fp32", "bf16", "fp16")


def _local(pos: list[list[int]], lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CSR of each query's positives inside [lo, hi), in the shard's index frame."""
    return csr([[j - lo for j in p if lo <= j < hi] for p in pos])


def _merge(scores: list[torch.Tensor], index: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise best over shards: highest score, then lowest global index (-1: none)."""
    S, indices = torch.stack(scores), torch.stack(index)
    best = S.max(0).values
    big = torch.iinfo(torch.long).max
    first = torch.where((S == best) & (indices >= 0), indices, big).min(0).values
    return best, torch.where(first == big, -1, first)


def sharded_ranks(xq, xb, bounds, pos, cuts, tie_rule, precision, check_shards=False, **kw) -> GroupedRanks:
    """grouped_ranks of the whole gallery computed shard by shard (cuts: [0, ..., nb])."""
    shards = list(zip(cuts[:-1], cuts[1:]))
    bests = []
    for lo, hi in shards:
        lp, li = _local(pos, lo, hi)
        s, i = best_positives(xq, xb[lo:hi], lp, li)
        if check_shards:
            rs, ri = best_positives_reference(xq, xb[lo:hi], lp, li)
            assert torch.equal(s, rs) and torch.equal(i, ri)
        bests.append((s, torch.where(i >= 0, i + lo, -1)))
    s_star, p_star = _merge([b[0] for b in bests], [b[1] for b in bests])
    parts, infos = [], []
    for lo, hi in shards:
        lp, li = _local(pos, lo, hi)
        lb = bounds.clamp(lo, hi) - lo
        thr = (s_star, p_star - lo)
        r = grouped_ranks(xq, xb[lo:hi], lb, lp, li, tie_rule=tie_rule, precision=precision, threshold=thr, **kw)
        assert torch.equal(r.pos_score, s_star) and torch.equal(r.pos_index, p_star - lo)  # echoed
        if check_shards:
            ref = grouped_ranks_reference(xq, xb[lo:hi], lb, lp, li, tie_rule=tie_rule, threshold=thr)
            assert_same(r, ref)
        parts.append((r.counts, r.neg_score, torch.where(r.neg_index >= 0, r.neg_index + lo, -1)))
        infos.append(r.info)
    neg = [_merge([p[1][:, g] for p in parts], [p[2][:, g] for p in parts]) for g in range(len(bounds) - 1)]
    nq = xq.shape[0]
    return GroupedRanks(counts=sum(p[0] for p in parts),
                        pos_score=s_star, pos_index=p_star,
                        neg_score=torch.stack([n[0] for n in neg], 1).reshape(nq, -1),
                        neg_index=torch.stack([n[1] for n in neg], 1).reshape(nq, -1),
                        info={"shards": infos})


def _plant(xb: torch.Tensor, pos: list[list[int]], cuts: list[int], gen: torch.Generator) -> None:
    """Exact duplicates of queries' first positives on both sides of every shard boundary, and a
    second positive that is an exact duplicate of the first (in another shard where possible)."""
    nb = xb.shape[0]
    for q, p in enumerate(pos):
        for c in cuts[1:-1]:
            for j in (c - 1, c):
                if 0 <= j < nb and j not in p and int(torch.randint(0, 3, (1,), generator=gen)) == 0:
                    xb[j] = xb[p[0]]
        if q % 4 == 0:
            j = int(torch.randint(0, nb, (1,), generator=gen))
            if all(j != k for k in p) and all(j not in other for other in pos):
                xb[j] = xb[p[0]]
                p.append(j)


CUTS = [
    [0, 1, 1, 40, 41, 97, 97, 120, 157, 158],  # one-item and empty shards
    [0, 0, 157],                               # an empty first shard, then everything
    [0, 53, 54, 157, 157],                     # an empty last shard
    list(range(0, 158, 13)) + [157],           # many equal shards
]


@pytest.mark.parametrize("tie_rule", TIE_RULES)
@pytest.mark.parametrize("data", ["quantised", "gaussian"])
def test_sharded_counts_add_up_to_the_whole_gallery(tie_rule, data):
    gen = torch.Generator().manual_seed(16 + len(data))
    nq, nb, d = 23, 157, 16
    make = quantised if data == "quantised" else gaussian
    xq, xb = make(nq, d, gen), make(nb, d, gen)
    pos = random_positives(nq, nb, gen, max_pos=3)
    for k, cuts in enumerate(CUTS):
        xbk = xb.clone()
        _plant(xbk, pos_k := [list(p) for p in pos], cuts, gen)
        bounds = torch.tensor([0, 30, 30, 41, 120, nb]) if k % 2 else torch.tensor([0, nb])
        ptr, idx = csr(pos_k)
        ref = grouped_ranks_reference(xq, xbk, bounds, ptr, idx, tie_rule=tie_rule)
        whole = grouped_ranks(xq, xbk, bounds, ptr, idx, tie_rule=tie_rule)
        assert_same(whole, ref)
        for precision in FORCED:
            got = sharded_ranks(xq, xbk, bounds, pos_k, cuts, tie_rule, precision, check_shards=k == 0,
                                g_block=16 if k == 3 else None)
            assert_same(got, ref)
        if k in (0, 3):  # the planted exact ties with s* (beyond p* itself) straddle the boundaries
            ties = (ref.pos_score[:, None] == _scores(xq, xbk)).sum()
            assert int(ties) > 2 * nq


def test_sharded_low_precision_falls_back_per_row():
    """Crowded bands in a shard: near-duplicates of the threshold's item send rows up from bf16 to
    fp32 (and the exact level); the shard sums still equal the one-pass ranks."""
    gen = torch.Generator().manual_seed(160)
    nq, nb, d = 9, 1200, 32
    xq, xb = gaussian(nq, d, gen), gaussian(nb, d, gen)
    pos = [[int(j)] for j in torch.randint(0, nb, (nq,), generator=gen)]
    # rows 0-3: hundreds of near-duplicates of the positive, a few ulps apart, some exact, across shards
    for q in range(4):
        p = pos[q][0]
        noise = torch.randn(300, d, generator=gen) * 2.0 ** -22
        xb[q * 300:(q + 1) * 300] = xb[p] + noise
        xb[q * 300 + 7] = xb[p]
        if p // 300 == q:
            pos[q] = [q * 300 + 7]
    cuts = [0, 299, 300, 301, 700, 701, 1200]
    bounds = torch.tensor([0, 600, nb])
    ptr, idx = csr(pos)
    for rule in TIE_RULES:
        ref = grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=rule, precision="fp32")
        got = sharded_ranks(xq, xb, bounds, pos, cuts, rule, "bf16", g_block=128)
        assert_same(got, ref)
        tiles = [i["row_tiles"] for i in got.info["shards"] if "row_tiles" in i]
        assert all(i["precision"] == "bf16" for i in got.info["shards"])
        assert sum(t.get("fp32", 0) for t in tiles) > 0  # crowded rows went up a level
    assert_same(ref, grouped_ranks_reference(xq, xb, bounds, ptr, idx, tie_rule="pessimistic"))


def test_best_positives_matches_grouped_ranks_and_reference():
    gen = torch.Generator().manual_seed(161)
    xq, xb = gaussian(12, 24, gen), gaussian(90, 24, gen)
    pos = random_positives(12, 90, gen)
    xb[50] = xb[pos[0][0]]
    pos[0].append(50)  # an exact tie among the positives: the lowest index wins
    pos[3] = []        # no positive: (-inf, -1)
    ptr, idx = csr(pos)
    s, i = best_positives(xq, xb, ptr, idx)
    rs, ri = best_positives_reference(xq, xb, ptr, idx)
    assert torch.equal(s, rs) and torch.equal(i, ri)
    assert s[3] == float("-inf") and i[3] == -1 and i[0] == min(pos[0][0], 50)
    keep = [q for q in range(12) if pos[q]]
    kp, ki = csr([pos[q] for q in keep])
    r = grouped_ranks(xq[keep], xb, torch.tensor([0, 90]), kp, ki)
    assert torch.equal(r.pos_score, s[keep]) and torch.equal(r.pos_index, i[keep])
    # an empty gallery and no queries
    e = best_positives(xq, xb[:0], torch.zeros(13, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert torch.equal(e[1], torch.full((12,), -1)) and bool((e[0] == float("-inf")).all())
    n = best_positives(xq[:0], xb, torch.zeros(1, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert n[0].shape == (0,) and n[1].dtype == torch.long


def test_threshold_outside_the_shard_and_errors():
    """p_star beyond either end of the shard: under ``index`` every exact tie counts (p* in a later
    shard) or none does (p* in an earlier one); bad thresholds are refused with the fix named."""
    gen = torch.Generator().manual_seed(162)
    xq, xb = quantised(5, 8, gen), quantised(40, 8, gen)
    xb[10:20] = xb[0]
    s = best_positives(xq, xb[:1], torch.tensor([0, 1, 2, 3, 4, 5]), torch.zeros(5, dtype=torch.long))[0]
    no_pos = (torch.zeros(6, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    for p, expect in ((-3, 0), (0, 0), (5, 5), (10, 10), (10 ** 6, 10)):  # p* in the shard's frame
        thr = (s, torch.full((5,), p))
        for rule, n in (("index", expect), ("optimistic", 0), ("pessimistic", 10)):
            r = grouped_ranks(xq, xb[10:20], torch.tensor([0, 10]), *no_pos, tie_rule=rule, threshold=thr)
            ref = grouped_ranks_reference(xq, xb[10:20], torch.tensor([0, 10]), *no_pos, tie_rule=rule, threshold=thr)
            assert_same(r, ref)
            assert r.counts[:, 0].tolist() == [n] * 5  # every item of the shard ties with s*
    bad = [((s.double(), torch.zeros(5, dtype=torch.long)), "float32"),
           ((s[:4], torch.zeros(5, dtype=torch.long)), r"shape \(5,\)"),
           ((torch.full((5,), float("nan")), torch.zeros(5, dtype=torch.long)), "NaN"),
           ((s, torch.zeros(5)), "integer dtype"),
           ((s,), "pair")]
    for thr, msg in bad:
        with pytest.raises(ValueError, match=msg):
            grouped_ranks(xq, xb, torch.tensor([0, 40]), *no_pos, threshold=thr)
