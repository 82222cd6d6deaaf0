"""Mining with the corpus sharded over Ray actors equals local mining byte for byte (exact search)."""
from __future__ import annotations

import logging

import numpy as np
import pyarrow.parquet as pq
import pytest

from hardrank.config import MineOptions
from hardrank.mining import MineProblem, mine_arrays
from hardrank.scoring import backends
from hardrank.scoring.backends.sharded import Sharded, merge_topk

ray = pytest.importorskip("ray")


def _csr(lists):
    ptr = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=ptr[1:])
    return ptr, np.array([v for x in lists for v in x], np.int64)


def _tied_case(seed=0, nq=37, nb=53, d=8):
    """Quantised embeddings (scores are exact multiples of 1/64: ties everywhere), exact duplicate
    rows on both sides of every shard boundary, positives with near duplicates."""
    rng = np.random.default_rng(seed)
    xb = rng.integers(-2, 3, (nb, d)).astype(np.float32) / 8
    xb[1::7] = xb[0]                          # duplicates spread over the corpus
    xb[nb - 1] = xb[2]
    xq = rng.integers(-2, 3, (nq, d)).astype(np.float32) / 8
    pos_row = rng.integers(0, nb, nq)
    excl = _csr([[int(p), int((p + 5) % nb)] for p in pos_row])
    return MineProblem(xq=xq, xb=xb, query_ids=[f"q{i}" for i in range(nq)],
                       corpus_ids=[f"c{j}" for j in range(nb)], modality="image", direction="t2i",
                       exclude_ptr=excl[0], exclude_idx=excl[1], pos_ptr=np.arange(nq + 1),
                       pos_emb=xb[pos_row].copy(), pos_ids=[[f"c{p}"] for p in pos_row])


def test_merge_topk_is_the_top_of_the_union():
    rng = np.random.default_rng(1)
    S = rng.integers(0, 4, (9, 30)).astype(np.float32)   # heavy ties
    bounds = [0, 1, 1, 13, 29, 30]                       # a 1-item shard, an empty one, uneven ones
    for kk in (1, 5, 40):
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            order = np.lexsort((np.arange(hi - lo)[None].repeat(9, 0), -S[:, lo:hi]), axis=1)[:, :kk]
            D = np.take_along_axis(S[:, lo:hi], order, 1)
            pad = kk - D.shape[1]
            D = np.concatenate([D, np.full((9, pad), -np.inf, np.float32)], 1)
            I = np.concatenate([order + lo, np.full((9, pad), -1)], 1)
            parts.append((D, I))
        D, I = merge_topk(parts, kk)
        want = np.lexsort((np.arange(30)[None].repeat(9, 0), -S), axis=1)[:, :kk]
        n = min(kk, 30)
        assert np.array_equal(I[:, :n], want[:, :n]) and (I[:, n:] == -1).all()
        assert np.array_equal(D[:, :n], np.take_along_axis(S, want, 1)[:, :n])


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 << 20, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def _negatives(out):
    return pq.read_table(out / "negatives").sort_by([("query_id", "ascending"), ("rank", "ascending")])


def _mine_sharded(prob, opts, out, factory):
    """Mine with the backend ``opts.search`` names placed on ``factory``'s shards, its actors ended afterwards."""
    backend = Sharded(backends.get(opts.search_spec), search=factory)
    try:
        return mine_arrays(prob, opts, out, backend=backend)
    finally:
        backend.close()


@pytest.mark.slow
@pytest.mark.parametrize("shards, nb", [(1, 53), (3, 53), (7, 5)])   # 7 shards of 5 rows: empty and one-row shards
def test_sharded_mining_equals_local(ray_cluster, tmp_path, shards, nb):
    from hardrank.executors.ray_search import ShardedSearchFactory

    prob = _tied_case(nb=nb)
    opts = MineOptions(k=6, dup_threshold=0.9, max_sim=0.9, search="exact", block_size=16, budget_mb=1)
    local = mine_arrays(prob, opts, tmp_path / "local")
    sharded = _mine_sharded(prob, opts, tmp_path / "sharded", ShardedSearchFactory(shards=shards))
    assert _negatives(tmp_path / "local").equals(_negatives(tmp_path / "sharded"))
    assert local["counts"] == sharded["counts"] and sharded["search"]["sharded"]["shards"] == shards


@pytest.mark.slow
def test_shards_of_a_float16_file_corpus_mine_as_the_local_run(ray_cluster, tmp_path):
    """A float16 embeddings file's corpus (``vectors.UnitRows``: float16 values, rows normalised on read) goes
    to the shard actors as it is held and is searched there as locally."""
    from hardrank.executors.ray_search import ShardedSearchFactory
    from hardrank.vectors import UnitRows

    prob = _tied_case(seed=4, nb=60)
    prob.xb = UnitRows.of((prob.xb * 3).astype(np.float16), str)  # not unit: normalised on read
    opts = MineOptions(k=6, dup_threshold=0.9, search="exact", block_size=16, budget_mb=1)
    mine_arrays(prob, opts, tmp_path / "local")
    _mine_sharded(prob, opts, tmp_path / "sharded", ShardedSearchFactory(shards=3))
    assert _negatives(tmp_path / "local").equals(_negatives(tmp_path / "sharded"))


@pytest.mark.slow
def test_a_killed_shard_actor_does_not_change_the_output(ray_cluster, tmp_path):
    from hardrank.executors.ray_search import ShardedSearchFactory

    prob = _tied_case(seed=2, nq=64)
    opts = MineOptions(k=5, search="exact", block_size=8)

    class KillOnce(ShardedSearchFactory):
        def __call__(self, problem, o):
            search = super().__call__(problem, o)
            calls = {"n": 0}
            fan_out = search._fan_out

            def killing(xq, kk, excl, exact):
                calls["n"] += 1
                if calls["n"] == 3:  # mid-run: the actor dies, Ray restarts it, the call is retried
                    ray.kill(search.actors[1], no_restart=False)
                return fan_out(xq, kk, excl, exact)

            search._fan_out = killing
            return search

    local = mine_arrays(prob, opts, tmp_path / "local")
    _mine_sharded(prob, opts, tmp_path / "sharded", KillOnce(shards=2))
    assert _negatives(tmp_path / "local").equals(_negatives(tmp_path / "sharded"))
    assert local["counts"]["negatives"] == 64 * 5


@pytest.mark.slow
def test_approximate_shards_report_recall_against_exact_shards(ray_cluster, tmp_path):
    from hardrank.executors.ray_search import ShardedSearchFactory

    rng = np.random.default_rng(3)
    unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    xb, xq = unit(rng.standard_normal((3000, 16))), unit(rng.standard_normal((200, 16)))
    prob = MineProblem(xq=xq, xb=xb, query_ids=[f"q{i}" for i in range(200)],
                       corpus_ids=[f"c{j}" for j in range(3000)], modality="text", direction="t2t")
    opts = MineOptions(k=10, search="faiss:IVF16,Flat", recall_sample=100, dup_threshold=None)
    s = _mine_sharded(prob, opts, tmp_path / "ivf", ShardedSearchFactory(shards=2))
    assert s["search"]["tuning_recall@10"] >= 0.95 and s["search"]["sharded"]["rows"] == [1500, 1500]
    assert s["counts"]["negatives"] == 2000


@pytest.mark.slow
def test_mine_cli_with_the_ray_executor_equals_local(ray_cluster, tmp_path):
    """`hardrank mine --executor ray`: the inputs embedded through the store, the corpus read by the
    shard actors from the store, the same negatives as the local run."""
    from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

    from hardrank.jobs.cli import main

    w = make_karpathy_world(tmp_path / "w", n_images=10)
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "c.safetensors", 0)
    base = ["mine", "--model", str(cfg), "--checkpoint", str(ckpt), "--corpus", str(w["images"]), "--queries",
            str(w["annotations"] / "coco_karpathy_test.json"), "--images", str(w["images"]), "--direction", "t2i",
            "-k", "4", "--store", str(tmp_path / "store"), "--quiet"]
    assert main([*base, "--out", str(tmp_path / "local")]) == 0
    assert main([*base, "--out", str(tmp_path / "ray"), "--executor", "ray", "--shards", "3"]) == 0
    assert _negatives(tmp_path / "local").equals(_negatives(tmp_path / "ray"))


@pytest.mark.slow
def test_actors_open_a_memory_mapped_corpus_themselves(ray_cluster, tmp_path):
    """A memory-mapped corpus (what a corpus too large for the driver is) travels to the actors as
    (file, offset, shape): each maps its own rows; the output equals local mining."""
    from hardrank.executors.ray_search import ShardedSearchFactory, _slice

    prob = _tied_case(seed=3, nb=29)
    np.save(tmp_path / "corpus.npy", prob.xb.astype(np.float16))
    xb = np.load(tmp_path / "corpus.npy", mmap_mode="r")
    assert not isinstance(_slice(xb, 3, 9), np.ndarray)  # a (file, offset, shape) reference, not rows
    view = np.asarray(_slice(xb, 3, 9))
    assert not view.flags.owndata and not view.flags.writeable and np.array_equal(view, xb[3:9])  # mapped, not copied
    prob.xb = xb
    opts = MineOptions(k=4, dup_threshold=0.9, search="exact", block_size=16)
    mine_arrays(prob, opts, tmp_path / "local")
    _mine_sharded(prob, opts, tmp_path / "sharded", ShardedSearchFactory(shards=4))
    assert _negatives(tmp_path / "local").equals(_negatives(tmp_path / "sharded"))
