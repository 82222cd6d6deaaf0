"""Grouped ranking with the gallery sharded over Ray actors equals the one-process kernel pass exactly."""
from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from test_kernels import assert_same  # tests/ on path

from hardrank.kernels import TIE_RULES, grouped_ranks
from hardrank.kernels.reference import grouped_ranks_reference

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 << 20, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def _tied_gallery(seed=0, nq=29, nb=41, d=6, groups=(0, 13, 13, 30, 41)):
    """Quantised vectors (scores are multiples of 1/64: ties everywhere), exact duplicates of each
    query's positive planted on both sides of every shard boundary, queries with several positives
    in different shards, and an empty group."""
    rng = np.random.default_rng(seed)
    xb = rng.integers(-2, 3, (nb, d)).astype(np.float32) / 8
    xq = rng.integers(-2, 3, (nq, d)).astype(np.float32) / 8
    pos = [sorted({int(rng.integers(0, nb)), int(rng.integers(0, nb))}) for _ in range(nq)]
    for i, p in enumerate(pos):      # duplicates of the first positive spread over the gallery
        for j in (int(rng.integers(0, nb)), nb - 1 - i % nb, i % nb):
            if j not in p:
                xb[j] = xb[p[0]]
    ptr = np.zeros(nq + 1, np.int64)
    np.cumsum([len(p) for p in pos], out=ptr[1:])
    idx = np.array([j for p in pos for j in p], np.int64)
    return xq, xb, np.array(groups, np.int64), ptr, idx


# every shard layout x every tie rule; each call starts its shard actors (seconds each on 2 cores), so the default
# suite runs a covering subset (each layout and each rule, the index rule at 3 and 9 shards, every rule at 9 shards
# of 6 rows: empty and one-row shards) and `-m matrix` the whole product
_COVER = {((3, 41), "index"), ((9, 6), "index"), ((1, 41), "optimistic"), ((9, 6), "optimistic"),
          ((7, 41), "pessimistic"), ((9, 6), "pessimistic")}
_LAYOUTS = [(1, 41), (3, 41), (7, 41), (9, 6)]  # 9 shards of 6 rows: empty and one-row shards


@pytest.mark.slow
@pytest.mark.parametrize("shards, nb, tie_rule", [
    pytest.param(s, n, rule, marks=() if ((s, n), rule) in _COVER else pytest.mark.matrix)
    for (s, n) in _LAYOUTS for rule in TIE_RULES])
def test_sharded_ranks_equal_the_one_process_pass(ray_cluster, shards, nb, tie_rule):
    from hardrank.executors.ray_rank import ShardedRanker

    groups = (0, 13, 13, 30, 41) if nb == 41 else (0, 2, 2, 5, 6)
    xq, xb, bounds, ptr, idx = _tied_gallery(seed=shards, nb=nb, groups=groups)
    T = torch.from_numpy
    local = grouped_ranks(T(xq), T(xb), T(bounds), T(ptr), T(idx), tie_rule=tie_rule, budget_bytes=1 << 12)
    ref = grouped_ranks_reference(T(xq), T(xb), T(bounds), T(ptr), T(idx), tie_rule=tie_rule)
    ranker = ShardedRanker(shards=shards)
    sharded = ranker(xq, xb, bounds, ptr, idx, tie_rule=tie_rule, budget_bytes=1 << 12)
    assert_same(sharded, local)
    assert_same(sharded, ref)
    rows = sharded.info["sharded"]["rows"]
    assert rows == np.diff(np.linspace(0, nb, shards + 1).astype(int)).tolist()
    assert nb > shards or (0 in rows and 1 in rows)
    if tie_rule == "index" and nb > shards:  # the planted ties really straddle the boundaries: some count, some do not
        ties = (xb @ xq.T).T == sharded.pos_score.numpy()[:, None]
        assert ties.sum() > 2 * len(xq)
        if shards > 1:  # items tying with p* in shards before its own (they count) and after it (they do not)
            shard = np.searchsorted(np.cumsum(rows), np.arange(nb), side="right")  # (nb,) shard of each item
            mine = shard[sharded.pos_index.numpy()][:, None]
            assert (ties & (shard[None, :] < mine)).any() and (ties & (shard[None, :] > mine)).any()


@pytest.mark.slow
def test_a_query_without_a_positive_fails_as_in_one_process(ray_cluster):
    from hardrank.executors.ray_rank import ShardedRanker

    xq, xb, bounds, ptr, idx = _tied_gallery()
    lists = [idx[a:b] for a, b in zip(ptr[:-1], ptr[1:])]
    lists[3] = idx[:0]           # query 3 loses its positives
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    idx = np.concatenate(lists)
    with pytest.raises(ValueError, match="query 3 has no positive"):
        ShardedRanker(shards=3)(xq, xb, bounds, ptr, idx)


@pytest.mark.slow
def test_a_killed_shard_actor_does_not_change_the_ranks(ray_cluster, tmp_path, monkeypatch):
    """A shard actor's process dies in the counting round; Ray restarts it (reloading its slice) and
    retries the call: the ranks are those of one process."""
    import os

    from hardrank.executors import ray_rank

    marker = tmp_path / "died"

    def count(self, *args):
        if not marker.exists():
            marker.touch()
            os._exit(1)
        return ray_rank._GalleryShard.count(self, *args)

    # built here, so Ray ships the class by value
    monkeypatch.setattr(ray_rank, "_GalleryShard", type("DiesOnce", (ray_rank._GalleryShard,), {"count": count}))
    xq, xb, bounds, ptr, idx = _tied_gallery(seed=5)
    T = torch.from_numpy
    local = grouped_ranks(T(xq), T(xb), T(bounds), T(ptr), T(idx))
    assert_same(ray_rank.ShardedRanker(shards=3)(xq, xb, bounds, ptr, idx), local)
    assert marker.exists()


def test_shard_count_follows_the_gallery_size():
    from hardrank.executors.ray_rank import gallery_shards

    assert gallery_shards(1000, 512, 3, 8192) == 3                    # explicit
    assert gallery_shards(1000, 512, 0, 8192) == 1                    # small: one process
    assert gallery_shards(10_000_000, 512, 0, 8192) == 3              # 19.1 GiB of fp32 over 8 GiB actors


@pytest.mark.slow
def test_eval_with_a_sharded_gallery_writes_the_same_results(ray_cluster, tmp_path):
    """`hardrank eval --shard-gallery 3` on a RoCOCO-style world: every metric and outcome equals the
    one-process run; the provenance says how the gallery was split."""
    from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

    from hardrank.jobs.cli import main

    w = make_karpathy_world(tmp_path / "w", n_images=12)
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "c.safetensors", 0)
    base = ["eval", "--model", str(cfg), "--checkpoint", str(ckpt), "--suite", "rococo", "--annotations",
            str(w["annotations"]), "--images", str(w["images"]), "--image-variants", "mix_0.9", "--store",
            str(tmp_path / "store"), "--quiet"]
    assert main([*base, "--out", str(tmp_path / "local")]) == 0
    assert main([*base, "--out", str(tmp_path / "sharded"), "--shard-gallery", "3"]) == 0
    a = json.loads(next((tmp_path / "local").glob("*/rococo.json")).read_text())
    b = json.loads(next((tmp_path / "sharded").glob("*/rococo.json")).read_text())
    assert a["metrics"] == b["metrics"]
    assert b["provenance"]["search"]["t2i"]["sharded"]["shards"] == 3
    oa = pq.read_table(next((tmp_path / "local").glob("*/rococo.parquet")))
    ob = pq.read_table(next((tmp_path / "sharded").glob("*/rococo.parquet")))
    assert oa.equals(ob)
