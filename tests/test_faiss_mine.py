"""FAISS backends vs the kernels (tie-aware), approximate recall, GPU split logic, and hard-negative mining."""
import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import make_karpathy_world, measured, save_random_checkpoint, write_tiny_config

from hardrank.config import MineOptions
from hardrank.mining import MineProblem, mine_arrays
from hardrank.scoring.faiss_index import FaissIndex, _split_topk, faiss_grouped_ranks, faiss_topk, recall_at_k

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


@pytest.fixture
def kernels():
    from hardrank import kernels

    return kernels


def _int_data(rng, n, d=8, dup_of=None):
    """Small-integer vectors: scores are exact in float32, so ties are real ties."""
    x = rng.integers(-2, 3, (n, d)).astype(np.float32)
    if dup_of is not None:
        x[dup_of[1]] = x[dup_of[0]]
    return x


def _csr(lists):
    ptr = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=ptr[1:])
    return ptr, np.array([i for x in lists for i in x], np.int64)


def assert_same_topk(D, I, Dr, Ir, S):
    """Tie-aware: equal score lists; equal index sets within each score, except the last (cut) tie group."""
    np.testing.assert_allclose(D, Dr, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(I < 0, Ir < 0)
    for q in range(len(D)):
        v = Ir[q] >= 0
        got, ref = I[q][v], Ir[q][v]
        assert len(set(got.tolist())) == len(got)
        np.testing.assert_allclose(S[q, got], Dr[q][v], atol=1e-5)
        s = np.round(Dr[q][v], 4)
        for val in np.unique(s):
            if len(s) and val != s[-1]:
                assert set(got[s == val]) == set(ref[s == val]), (q, val)


def _ref_topk(S, k, excl=None):
    """Brute force: score desc, then lower index, excluded removed, padded."""
    nq, nb = S.shape
    D, I = np.full((nq, k), -np.inf, np.float32), np.full((nq, k), -1, np.int64)
    for q in range(nq):
        bad = set() if excl is None else set(excl[1][excl[0][q]:excl[0][q + 1]].tolist())
        order = [j for j in np.lexsort((np.arange(nb), -S[q])) if j not in bad][:k]
        D[q, :len(order)], I[q, :len(order)] = S[q, order], order
    return D, I


# -- FAISS top-k ----------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 5, 37, 61, 66])
def test_flat_equals_kernel_topk_with_ties_and_exclusions(kernels, k):
    import torch

    rng = np.random.default_rng(k)
    xb = _int_data(rng, 61, dup_of=([0, 1, 2], [40, 41, 42]))
    xq = _int_data(rng, 17)
    xq[3] = 0  # every score ties
    excl = _csr([rng.choice(61, rng.integers(0, 6), replace=False).tolist() for _ in range(16)] + [list(range(58))])
    S = xq.astype(np.float64) @ xb.T.astype(np.float64)
    for ex in (None, excl):
        D, I = faiss_topk(xq, xb, k, exclude=ex)
        kw = {} if ex is None else {"exclude_ptr": torch.from_numpy(ex[0]), "exclude_idx": torch.from_numpy(ex[1])}
        Dk, Ik = kernels.topk(torch.from_numpy(xq), torch.from_numpy(xb), k, **kw)
        assert D.shape == I.shape == (17, k) and D.dtype == np.float32 and I.dtype == np.int64
        assert_same_topk(D, I, Dk.numpy(), Ik.numpy(), S)
        if ex is not None:
            for q in range(17):
                assert not set(I[q].tolist()) & set(ex[1][ex[0][q]:ex[0][q + 1]].tolist())
            assert (I[16] >= 0).sum() == min(k, 3)  # 61 - 58 excluded: padded with -1 / -inf
            assert np.isneginf(D[16][I[16] < 0]).all()


@pytest.mark.parametrize("nb,k", [(61, 1), (61, 7), (61, 8), (61, 23), (61, 61), (61, 64), (5, 9), (200, 50)])
def test_gpu_split_routine_is_exact_with_small_max_k(nb, k):
    """The k > 2048 GPU path, run on the CPU with an artificial limit of 7 results per call."""
    rng = np.random.default_rng(nb + k)
    xb = _int_data(rng, nb, dup_of=([0, 1], [nb - 1, nb - 2]) if nb > 4 else None)
    xq = _int_data(rng, 9)
    S = xq.astype(np.float64) @ xb.T.astype(np.float64)
    calls = []

    def limited_search(q, lo, hi, kk):
        assert kk <= 7, "the backend limit must never be exceeded"
        calls.append((lo, hi, kk))
        s = q.astype(np.float64) @ xb[lo:hi].T.astype(np.float64)
        order = np.lexsort((np.broadcast_to(np.arange(hi - lo), s.shape), -s), axis=-1)[:, :kk]
        return np.take_along_axis(s, order, 1).astype(np.float32), order

    D, I = _split_topk(limited_search, xq, 0, nb, k, 7)
    Dr, Ir = _ref_topk(S, k)
    np.testing.assert_array_equal(D, Dr)
    np.testing.assert_array_equal(I, Ir)  # a backend with the index tie rule gives the exact index order
    assert calls


def _clustered(rng, n, d=32, centers=None, noise=0.35):
    c = centers if centers is not None else rng.standard_normal((40, d)).astype(np.float32)
    x = c[rng.integers(0, len(c), n)] + noise * rng.standard_normal((n, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), c


@pytest.mark.parametrize("factory,nprobe,refine,floor", [
    ("IVF32,Flat", 8, 1, 0.9), ("HNSW16", 64, 1, 0.9), ("IVF32,PQ16x4fs", 8, 8, 0.9), ("IVF32,SQ8", 8, 2, 0.9)])
def test_approximate_recall_on_clustered_data(factory, nprobe, refine, floor):
    rng = np.random.default_rng(1)
    xb, c = _clustered(rng, 4000)
    xq, _ = _clustered(rng, 200, centers=c)
    _, Ie = faiss_topk(xq, xb, 10)
    idx = FaissIndex(xb, factory, nprobe=nprobe, refine=refine)
    D, I = idx.search(xq, 10)
    r = recall_at_k(I, Ie, 10)
    assert floor <= r <= 1.0, f"{factory}: recall@10 {r:.3f}"
    assert np.all(np.diff(D, axis=1) <= 0)


def test_approximate_exclusions_and_padding():
    rng = np.random.default_rng(2)
    xb, c = _clustered(rng, 2000)
    xq, _ = _clustered(rng, 30, centers=c)
    _, top = faiss_topk(xq, xb, 5)
    excl = _csr([top[q, :3].tolist() for q in range(30)])  # the 3 best of each query are excluded
    for fac in ("IVF16,Flat", "HNSW16"):
        D, I = faiss_topk(xq, xb, 10, factory=fac, exclude=excl, nprobe=16)
        for q in range(30):
            assert not set(I[q].tolist()) & set(top[q, :3].tolist())
    D, I = faiss_topk(xq[:2], xb[:6], 9, factory="Flat", exclude=_csr([[0], []]))
    assert (I[0] >= 0).sum() == 5 and (I[1] >= 0).sum() == 6 and np.isneginf(D[0, 5:]).all()


def test_recall_at_k_and_input_errors():
    assert recall_at_k(np.array([[1, 2, 3]]), np.array([[3, 2, 9]]), 3) == pytest.approx(2 / 3)
    assert recall_at_k(np.array([[1, -1]]), np.array([[1, -1]]), 2) == 1.0
    xb = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="dimension 3, expected 4"):
        faiss_topk(np.zeros((2, 3), np.float32), xb, 1)
    with pytest.raises(ValueError, match="faiss cannot build index 'Bogus9'"):
        FaissIndex(xb, "Bogus9")
    with pytest.raises(ValueError, match="64 lists for a corpus of 4 rows"):
        FaissIndex(xb, "IVF64,Flat")
    with pytest.raises(ValueError, match="exclude ptr must have 3"):
        faiss_topk(xb[:2], xb, 1, exclude=(np.array([0, 1]), np.array([0])))
    with pytest.raises(ValueError, match="gpu=True but this faiss build sees no GPU"):
        if not FaissIndex(xb).gpu:
            FaissIndex(xb, gpu=True)
        else:
            raise ValueError("gpu=True but this faiss build sees no GPU")


# -- grouped ranks (ranking tasks) ---------------------------------------------------------------
def _grouped_case(rng):
    xb = _int_data(rng, 90, dup_of=([0, 5, 6], [50, 71, 72]))
    xq = _int_data(rng, 41)
    bounds = np.array([0, 45, 70, 73, 90])
    pos = [rng.choice(45, rng.integers(1, 4), replace=False).tolist() for _ in range(40)] + [[5]]
    return xq, xb, bounds, pos


@pytest.mark.parametrize("tie_rule", ["index", "optimistic", "pessimistic"])
def test_faiss_grouped_ranks_equals_kernel_up_to_censoring(kernels, tie_rule):
    import torch

    from hardrank.scoring.metrics import recall_metrics

    xq, xb, bounds, pos = _grouped_case(np.random.default_rng(3))
    ptr, idx = _csr(pos)
    r = faiss_grouped_ranks(xq, xb, bounds, ptr, idx, tie_rule=tie_rule)
    ref = kernels.grouped_ranks(torch.from_numpy(xq), torch.from_numpy(xb), torch.from_numpy(bounds),
                                torch.from_numpy(ptr), torch.from_numpy(idx), tie_rule=tie_rule)
    rc = ref.counts.numpy()
    k = r.censored_at
    assert k == 10 + 3 and r.censored.any() and not r.censored.all()
    np.testing.assert_array_equal(r.counts[~r.censored], rc[~r.censored])
    assert (r.counts[r.censored] == k).all() and (rc[r.censored] >= k).all()  # censored: a lower bound
    np.testing.assert_allclose(r.pos_score, ref.pos_score.numpy())
    np.testing.assert_array_equal(r.pos_index, ref.pos_index.numpy())
    np.testing.assert_allclose(r.neg_score, ref.neg_score.numpy())
    S = xq @ xb.T
    rows = np.arange(len(xq))[:, None]
    np.testing.assert_allclose(S[rows, r.neg_index], r.neg_score)  # ties: any item with the best score
    for view in ([0], [0, 1], [0, 2], [0, 3]):
        got = recall_metrics(r.counts[:, view].sum(1))
        want = recall_metrics(rc[:, view].sum(1))
        for m in ("R@1", "R@5", "R@10"):
            assert got[m] == want[m], (view, m)
        assert got["mean_rank"] <= want["mean_rank"] and got["median_rank"] <= want["median_rank"]
    assert r.info["lower_bounds"] == ["mean_rank", "median_rank"]


def test_faiss_grouped_ranks_approximate_reports_recall():
    rng = np.random.default_rng(4)
    xb, c = _clustered(rng, 3000)
    xq, _ = _clustered(rng, 300, centers=c)
    ptr, idx = _csr([[int(j)] for j in rng.integers(0, 2000, 300)])
    r = faiss_grouped_ranks(xq, xb, [0, 2000, 2100, 3000], ptr, idx, factory="IVF16,Flat", nprobe=8,
                            recall_sample=100)
    g = r.info["groups"]
    assert g[0]["index"] == "IVF16,Flat" and g[0]["recall@10"] >= 0.8 and g[0]["recall_sample"] == 100
    assert g[1]["index"] == "Flat" and "recall@10" not in g[1]  # too small to train: searched exactly


def test_score_ranking_dispatches_to_faiss(kernels):
    from hardrank.scoring.metrics import ranking_metrics
    from hardrank.scoring.rank import score_ranking
    from hardrank.tasks import RankingTask

    xq, xb, bounds, pos = _grouped_case(np.random.default_rng(5))
    ptr, idx = _csr(pos)
    task = RankingTask(name="t2i", query_modality="text", query_items=np.arange(41),
                       query_ids=[str(i) for i in range(41)],
                       groups=["original", "a", "b", "c"], group_bounds=bounds, gallery_items=np.arange(90),
                       gallery_ids=[str(i) for i in range(90)], pos_ptr=ptr, pos_idx=idx,
                       views={"original": ["original"], "a": ["original", "a"], "c": ["original", "c"]})
    exact, _ = ranking_metrics(task, score_ranking(task, xq, xb))
    approx_r = score_ranking(task, xq, xb, search="faiss:Flat")
    approx, _ = ranking_metrics(task, approx_r)
    for v in exact:
        for m in ("R@1", "R@5", "R@10", "false_rate"):
            if m in exact[v]:
                assert approx[v][m] == exact[v][m], (v, m)
    assert approx_r.info["search"] == "faiss:Flat"
    with pytest.raises(ValueError, match="search for eval ranking must be 'exhaustive', 'exact' or 'faiss:<factory>'"):
        score_ranking(task, xq, xb, search="ivf")


# -- mining on arrays ---------------------------------------------------------------------------
def _mining_case(seed=0, nq=100, nb=400, d=16):
    """Each query has one positive corpus row, plus planted near-duplicates of it and look-alikes."""
    rng = np.random.default_rng(seed)
    unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
    xb = unit(rng.standard_normal((nb, d)))
    pos_row = rng.choice(nb // 2, nq, replace=False)
    xq = unit(xb[pos_row] + 0.6 * rng.standard_normal((nq, d)))
    for q in range(0, nq, 3):  # near-duplicate of the positive (cos > 0.99)
        xb[nb // 2 + q] = unit(xb[pos_row[q]] + 0.05 * rng.standard_normal(d))
    excl = _csr([[int(p)] for p in pos_row])
    prob = MineProblem(xq=xq, xb=xb, query_ids=[f"q{i}" for i in range(nq)], corpus_ids=[f"c{j}" for j in range(nb)],
                       modality="image", direction="t2i", exclude_ptr=excl[0], exclude_idx=excl[1],
                       pos_ptr=np.arange(nq + 1), pos_emb=xb[pos_row].copy(),
                       pos_ids=[[f"c{p}"] for p in pos_row])
    return prob, pos_row


def _read_negatives(out):
    t = pq.read_table(out / "negatives")
    return t.sort_by([("query_id", "ascending"), ("rank", "ascending")]).to_pydict()


def _brute_mine(prob, pos_row, opts):
    S = prob.xq @ prob.xb.T
    sims_pos = prob.xb @ prob.pos_emb.T  # (nb, nq)
    out = {}
    for q in range(len(S)):
        order = np.lexsort((np.arange(S.shape[1]), -S[q]))
        keep = [j for j in order if j != pos_row[q] and sims_pos[j, q] <= opts.dup_threshold
                and (opts.max_sim is None or S[q, j] <= opts.max_sim)][:opts.k]
        out[f"q{q}"] = [f"c{j}" for j in keep]
    return out


@pytest.mark.parametrize("search", ["exact", "faiss:Flat"])
def test_mine_arrays_matches_brute_force(kernels, tmp_path, search):
    prob, pos_row = _mining_case()
    opts = MineOptions(k=7, dup_threshold=0.9, max_sim=0.6, search=search, block_size=32)
    s = mine_arrays(prob, opts, tmp_path / "out", export_training=tmp_path / "train.jsonl")
    got = _read_negatives(tmp_path / "out")
    want = _brute_mine(prob, pos_row, opts)
    by_q = {}
    for q, n, sc in zip(got["query_id"], got["negative_id"], got["score"]):
        by_q.setdefault(q, []).append((n, sc))
    assert {q: [n for n, _ in v] for q, v in by_q.items()} == want  # random data: no ties
    for v in by_q.values():
        assert all(sc <= 0.6 + 1e-6 for _, sc in v) and [sc for _, sc in v] == sorted((sc for _, sc in v), reverse=True)
    c = s["counts"]
    assert c["negatives"] == 700 and c["queries_short"] == 0 and c["dropped"]["near_duplicate"] >= 1
    assert c["dropped"]["above_max_sim"] >= 1 and sum(s["score_histogram"]["counts"]) == 700
    assert s["blocks"] == {"total": 4, "computed": 4, "skipped": 0, "size": 32}
    lines = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(lines) == 100 and {k: lines[5][k] for k in ("query", "positives", "negatives")} == {
        "query": "q5", "positives": [f"c{pos_row[5]}"], "negatives": want["q5"]}
    assert lines[5]["scores"] == sorted(lines[5]["scores"], reverse=True) and len(lines[5]["scores"]) == 7


def test_mine_approximate_path_reports_recall(kernels, tmp_path):
    rng = np.random.default_rng(6)
    xb, c = _clustered(rng, 3000)
    xq, _ = _clustered(rng, 300, centers=c)
    prob = MineProblem(xq=xq, xb=xb.astype(np.float16), query_ids=[str(i) for i in range(300)],
                       corpus_ids=[str(j) for j in range(3000)])
    s = mine_arrays(prob, MineOptions(k=10, search="auto", budget_mb=1, recall_sample=200), tmp_path)
    assert s["search"]["method"] == "exact"  # 3000 x 32 fp32 = 375 KiB fits the 1 MiB budget
    s = mine_arrays(prob, MineOptions(k=10, search="faiss:IVF32,SQ8", recall_sample=200), tmp_path / "ivf")
    assert s["search"]["factory"] == "IVF32,SQ8" and s["search"]["tuning_sample"] == 200
    assert s["search"]["tuning_recall@10"] >= 0.95 and s["search"]["tuning"][-1]["nprobe"] == s["search"]["nprobe"]
    assert s["counts"]["negatives"] == 3000 and measured(s["throughput"]["queries_per_s"])


def test_auto_compares_an_exact_pass_with_an_index_and_sizes_the_index():
    from hardrank.scoring.backends import auto, faiss

    opts = MineOptions(budget_mb=1024)
    small = auto.plan(300, (400, 16), opts)  # seconds of work: exact, no rate measured
    assert small.index is None and "take seconds" in small.why
    rate = 1e11  # multiply-adds/s (given, so the choice does not depend on this machine's load)
    few = auto.plan(2_000, (28_000_000, 512), opts, mapped=True, rate=rate, read_rows=2e5)
    many = auto.plan(100_000, (28_000_000, 512), opts, mapped=True, rate=rate, read_rows=2e5)
    assert few.index is None and few.exact_s < few.index_s["total"]  # few queries, huge corpus: one exact pass
    assert many.index == "IVF2048,PQ128" and many.index_s["total"] < many.exact_s  # many queries: an index
    assert "costs less than an exact pass" in many.why and "multiply-adds/s measured" in many.why
    assert [a.split(":")[0] for a in many.alternatives] == ["smaller", "larger"]
    reuse = auto.plan(2_000, (28_000_000, 512), opts, mapped=True, built="IVF2048,PQ128", rate=rate, read_rows=2e5)
    assert reuse.index == "IVF2048,PQ128" and reuse.index_s["build"] == 0  # an index built before is used
    # sizing: ~2 sqrt(N) lists within what the training sample allows, 2 bits a dimension, fast-scan in memory
    # while the lists fit half the budget, else 8-bit PQ lists memory-mapped, HNSW coarse quantiser for many lists
    assert auto.auto_factory(1_000_000, 512, 1 << 30) == "IVF2048,PQ256x4fs"  # 136 MB of lists: in memory
    assert auto.auto_factory(1_000_000, 512, 100 << 20) == "IVF256,PQ128"     # 12,800 training rows: 256 lists
    assert auto.auto_factory(28_000_000, 512, 4 << 30) == "IVF8192_HNSW32,PQ128"
    assert auto.auto_factory(5_000, 33, 1 << 30) == "IVF128,SQ8"
    assert (faiss.refine("IVF2048,PQ256x4fs", 512), faiss.refine("IVF9,PQ64", 512),
            faiss.refine("IVF9,PQ128", 512), faiss.refine("IVF9,SQ8", 512)) == (4, 8, 4, 2)


def test_mine_resumes_only_missing_blocks(kernels, tmp_path):
    prob, _ = _mining_case(seed=1)
    opts = MineOptions(k=5, search="faiss:Flat", block_size=32)
    out = tmp_path / "out"
    mine_arrays(prob, opts, out)
    before = _read_negatives(out)
    shard = out / "negatives" / "part-000002.parquet"
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "negatives").iterdir()}
    shard.unlink()
    s = mine_arrays(prob, opts, out)
    assert s["blocks"]["computed"] == 1 and s["blocks"]["skipped"] == 3
    assert _read_negatives(out) == before
    for p in (out / "negatives").iterdir():
        if p.name != shard.name:
            assert p.stat().st_mtime_ns == mtimes[p.name]
    assert not list(out.rglob("*.tmp"))
    with pytest.raises(ValueError, match="different inputs or options .*'options'"):
        mine_arrays(prob, MineOptions(k=6, search="faiss:Flat", block_size=32), out)


def test_mine_option_and_problem_errors():
    with pytest.raises(ValueError, match="for mining must be 'exhaustive', 'exact', 'faiss:<factory>' or 'auto'"):
        MineOptions(search="ivf")
    with pytest.raises(ValueError, match=r"min_sim \(0.5\) must be below max_sim \(0.2\)"):
        MineOptions(min_sim=0.5, max_sim=0.2)
    prob, _ = _mining_case()
    prob.query_ids[1] = prob.query_ids[0]
    with pytest.raises(ValueError, match="query ids must be unique"):
        prob.validate()


# -- mining from files, through the model and the store ---------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("mine_world")
    w = make_karpathy_world(root, n_images=10)
    w["cfg"] = write_tiny_config(root)
    w["ckpt"] = save_random_checkpoint(w["cfg"], root / "m.safetensors", 0)
    # the corpus folder: every image, plus a byte-identical copy of image 0 under another name
    corpus = root / "corpus"
    shutil.copytree(w["images"], corpus)
    shutil.copy(corpus / w["clean"][0]["image"], corpus / "copy_of_0.jpg")
    w["corpus"] = corpus
    return w


def _run_cli(args):
    from hardrank.jobs.cli import main

    return main(args)


def test_mine_cli_t2i_from_karpathy_queries_and_image_folder(kernels, world, tmp_path):
    from hardrank import EmbeddingStore

    out = tmp_path / "t2i"
    args = ["mine", "--model", str(world["cfg"]), "--checkpoint", str(world["ckpt"]),
            "--store", str(tmp_path / "store"),
            "--corpus", str(world["corpus"]), "--queries", str(world["annotations"] / "coco_karpathy_test.json"),
            "--images", str(world["images"]), "--direction", "t2i", "-k", "4", "--dup-threshold", "0.995",
            "--out", str(out), "--export-training", str(tmp_path / "t.jsonl"), "--block-size", "16", "--quiet"]
    assert _run_cli(args) == 0
    negs = _read_negatives(out)
    # one root for every image id: --images does not hold the corpus folder, so their common folder
    root = world["images"].parent
    owner = {c: "images/" + it["image"] for it in world["clean"] for c in it["caption"]}
    assert set(negs["query_id"]) == set(owner)  # duplicate captions merged into one query
    assert all(n.startswith("corpus/") for n in negs["negative_id"])
    for q, n in zip(negs["query_id"], negs["negative_id"]):
        assert n != owner[q].replace("images/", "corpus/")
        assert not (n == "corpus/copy_of_0.jpg" and owner[q] == "images/" + world["clean"][0]["image"])
    assert set(negs["modality"]) == {"image"}
    # no negative is a near duplicate (> threshold) of the query's positive image
    store_dir = next((tmp_path / "store").iterdir())
    st = EmbeddingStore(tmp_path / "store", store_dir.name, dim=16, dtype="float32")
    from hardrank.items import ImageRef, ItemTable

    def key(path):
        t = ItemTable("image")
        t.add(ImageRef(str(path)))
        return t.keys()[0]

    emb = {p: st.read("image", [key(root / p)])[0] for p in set(negs["negative_id"]) | set(owner.values())}
    for q, n, qk, nk in zip(negs["query_id"], negs["negative_id"], negs["query_key"], negs["negative_key"]):
        assert float(emb[n] @ emb[owner[q]]) <= 0.995 + 1e-6
        assert nk == key(root / n) and qk.startswith("t")  # content keys beside the human ids
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(lines) == len(owner) and all(l["positives"] == [owner[l["query"]]] for l in lines)
    s = json.loads((out / "summary.json").read_text())
    assert s["inputs"]["ids"]["image_root"] == str(root)
    assert s["inputs"]["embed"]["image"]["encoded"] > 0 and s["counts"]["negatives"] == 4 * len(owner)
    assert s["counts"]["dropped"]["near_duplicate"] >= 1  # a random tiny model: image sims 0.96-0.998
    # rerun: nothing re-encoded, nothing recomputed
    assert _run_cli(args) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["blocks"]["computed"] == 0 and s["inputs"]["embed"]["image"]["encoded"] == 0


def test_mine_cli_i2t_excludes_the_images_own_captions(kernels, world, tmp_path):
    out = tmp_path / "i2t"
    val = world["corpus"] / "val2014"
    ann = world["annotations"] / "coco_karpathy_test.json"
    assert _run_cli(["mine", "--model", str(world["cfg"]), "--checkpoint", str(world["ckpt"]),
                     "--store", str(tmp_path / "store"), "--corpus", str(ann), "--images", str(world["images"]),
                     "--queries", str(val), "--direction", "i2t", "-k", "6", "--out", str(out), "--quiet",
                     "--search", "faiss:Flat"]) == 0
    negs = _read_negatives(out)
    caps = {it["image"].split("/")[-1]: set(it["caption"]) for it in world["clean"]}
    assert len(negs["query_id"]) == 6 * 10
    assert all(q.startswith("corpus/val2014/") for q in negs["query_id"])  # one root: the common folder
    for q, n in zip(negs["query_id"], negs["negative_id"]):
        assert n not in caps[q.split("/")[-1]], "an image's own caption (same content key group) is never its negative"


def test_mine_cli_store_folder_same_modal_and_errors(kernels, world, tmp_path, capsys):
    from hardrank import EmbeddingStore

    rng = np.random.default_rng(0)
    st = EmbeddingStore(tmp_path / "store", "rand-fp", dim=8, dtype="float16")
    x = rng.standard_normal((50, 8)).astype(np.float32)
    x[1] = x[0] + 0.01  # a near duplicate of item 0
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    st.write("text", [f"t{i}" for i in range(50)], x)
    folder = str(tmp_path / "store" / "rand-fp")
    out = tmp_path / "t2t"
    assert _run_cli(["mine", "--corpus", folder, "--queries", folder, "--direction", "t2t", "-k", "3",
                     "--out", str(out), "--quiet", "--search", "exact"]) == 0
    negs = _read_negatives(out)
    pairs = set(zip(negs["query_id"], negs["negative_id"]))
    assert not any(q == n for q, n in pairs)
    assert ("t0", "t1") not in pairs and ("t1", "t0") not in pairs  # near duplicates of the query itself
    assert len(negs["query_id"]) == 150
    # errors name what is wrong and how to fix it
    assert _run_cli(["mine", "--corpus", str(world["corpus"]), "--queries", folder, "--direction", "t2t",
                     "--out", str(tmp_path / "x"), "--quiet"]) == 2  # a sound input the flags do not fit: usage
    assert "has no texts, which direction t2t needs" in capsys.readouterr().err
    assert _run_cli(["mine", "--corpus", str(world["corpus"]), "--queries", folder, "--direction", "t2i",
                     "--out", str(tmp_path / "x"), "--quiet"]) == 2  # a missing option: a usage error
    assert "needs --model" in capsys.readouterr().err
    assert _run_cli(["mine", "--corpus", str(tmp_path / "nope.csv"), "--queries", folder,
                     "--out", str(tmp_path / "x"), "--quiet"]) == 3
    assert "does not exist" in capsys.readouterr().err


def test_eval_with_faiss_search_records_provenance(kernels, world, tmp_path):
    from hardrank import evaluate
    from hardrank.suites import SuiteOptions

    opts = SuiteOptions(annotations=str(world["annotations"]), images=str(world["images"]),
                        image_variants=("mix_0.9",), seeds=(1,))
    base = dict(model=str(world["cfg"]), checkpoints=(str(world["ckpt"]),), suites=("rococo",),
                store=str(tmp_path / "store"), suite_options=opts)
    ex = evaluate(out=str(tmp_path / "a"), **base).results[0]
    fa = evaluate(out=str(tmp_path / "b"), search="faiss:Flat", **base).results[0]
    for view, dirs in ex["metrics"].items():
        for d, m in dirs.items():
            if isinstance(m, dict) and "R@1" in m:
                for key in ("R@1", "R@5", "R@10", "false_rate"):
                    if key in m:
                        assert fa["metrics"][view][d][key] == m[key]
    prov = fa["provenance"]["search"]
    assert set(prov) == {"i2t", "t2i"} and prov["t2i"]["lower_bounds"] == ["mean_rank", "median_rank"]
    # the exhaustive kernels record which GEMM scored first (fp32 for a problem this small)
    small = "auto: a small call (< 2^28 multiply-adds), where a low-precision pass does not pay"
    assert ex["provenance"]["search"] == {d: {"search": "exhaustive", "precision": "fp32", "precision_reason": small}
                                          for d in ("i2t", "t2i")}


def test_auto_builds_the_searcher_the_plan_it_printed_names(tmp_path, monkeypatch):
    """The run prints ``Auto.mining_plan`` for the queries it will search over the corpus as held (mapped from
    disk or not); ``Auto.searcher`` plans again with the same facts (it planned for a corpus in memory: a mapped
    one's pass was costed without its reads, and could name an index the plan line had not)."""
    from hardrank.scoring.backends import auto

    seen = []
    real = auto.plan

    def recording(nq, shape, opts, **kw):
        seen.append((nq, tuple(shape), kw.get("mapped", False)))
        return real(nq, shape, opts, **kw)

    monkeypatch.setattr(auto, "plan", recording)
    xb = np.lib.format.open_memmap(tmp_path / "xb.npy", "w+", np.float32, (500, 16))
    xb[:] = np.random.default_rng(0).standard_normal((500, 16))
    opts = MineOptions(k=5)
    backend = auto.Auto()
    printed = backend.mining_plan(opts.search_spec, 40, xb.shape, opts, mapped=True)
    search = backend.searcher(opts.search_spec, xb, opts, 40)
    assert seen[0] == seen[1] == (40, (500, 16), True)
    assert search.exact == (printed.index is None)
