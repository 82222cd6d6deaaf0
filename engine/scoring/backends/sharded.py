"""The sharded placement: a backend's work split over the executor's actors (``hardrank.executors``).

Not a ``--search`` word: the executor options choose it (``--shard-gallery N``, ``--executor ray``), around
the backend ``--search`` names. Ranks: the gallery split over actors by ``executor.sharded_ranker`` (the
exhaustive kernels' pass, whose counts add up exactly; small galleries stay in process). Top-k: the corpus
split over actors by ``executor.sharded_search``, each actor running the named backend on its slice
(through the registry), their lists merged in the global order. The executor module imports Ray; this
one only calls what the executor hands it."""
from __future__ import annotations

import numpy as np

from hardrank.scoring.backends.base import Backend, MinePlan
from hardrank.scoring.backends.exhaustive import RankArrays

__all__ = ["Sharded", "for_ranking", "for_mining", "merge_topk"]


class Sharded(Backend):
    """``inner`` placed on actors: ``ranker`` (``executors.ray_rank.ShardedRanker``) for ranks, ``search``
    (``executors.ray_search.ShardedSearchFactory``: ``search(xb, opts)``) for top-k; ``close`` ends them."""

    def __init__(self, inner: Backend, *, ranker=None, search=None):
        self.inner, self.ranker, self.search = inner, ranker, search
        self.name, self.aliases, self.ops = inner.name, inner.aliases, inner.ops  # what it places, it serves
        self.remote = search is not None

    def grouped_ranks(self, spec, xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule, device, budget_bytes,
                      precision):
        kw = {"tie_rule": tie_rule, "precision": precision, "budget_bytes": budget_bytes}
        if self.ranker is None or not self.ranker.wants(len(xb), xb.shape[1]):
            return self.inner.grouped_ranks(spec, xq, xb, group_bounds, pos_ptr, pos_idx, device=device, **kw)
        r = self.ranker(xq, xb, group_bounds, pos_ptr, pos_idx, **kw)
        out = RankArrays(r)
        out.info["sharded"] = r.info["sharded"]  # recorded in the result's provenance
        return out

    def searcher(self, spec, xb, opts, nq=None):
        if self.search is None:
            return self.inner.searcher(spec, xb, opts, nq)
        return self.search(xb, opts)

    def describe(self, spec, shape, opts):
        if self.remote:
            return f"the corpus sharded over Ray actors ({self.inner.describe(spec, shape, opts)} on each shard)"
        return self.inner.describe(spec, shape, opts)

    def mining_plan(self, spec, nq, shape, opts, *, mapped=False, built=None):
        if not self.remote:
            return self.inner.mining_plan(spec, nq, shape, opts, mapped=mapped, built=built)
        return MinePlan(self.describe(spec, shape, opts), "--executor ray: each shard builds its own")

    def close(self) -> None:
        for part in (self.ranker, self.search):
            if part is not None:
                part.close()


def for_ranking(backend: Backend, executor, shards: int, above_mb: int) -> Backend:
    """``backend`` with its ranking pass split over gallery shards where the executor does that (``shards`` > 0,
    or the Ray executor for galleries above ``above_mb`` MiB) and the backend allows it; else ``backend``."""
    if not backend.gallery_shards:
        return backend
    ranker = executor.sharded_ranker(shards, above_mb)
    return backend if ranker is None else Sharded(backend, ranker=ranker)


def for_mining(backend: Backend, executor, shards: int | None) -> Backend:
    """``backend`` run on corpus shards held by the executor's actors (the Ray executor), else ``backend``."""
    search = executor.sharded_search(shards)
    return backend if search is None else Sharded(backend, search=search)


def merge_topk(parts: list[tuple[np.ndarray, np.ndarray]], kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-shard top-kk lists (D (m, kk_s) desc, I (m, kk_s) global indices, -1 = none) merged into
    the top-kk of their union under the global order: score descending, then index ascending. Each
    shard's list holds its best items in that order, so the merge equals a search of the whole corpus."""
    D = np.concatenate([d for d, _ in parts], axis=1)
    I = np.concatenate([i for _, i in parts], axis=1)
    key_i = np.where(I >= 0, I, np.iinfo(np.int64).max)  # missing entries sort last
    order = np.lexsort((key_i, -D.astype(np.float64)), axis=1)[:, :kk]
    D, I = np.take_along_axis(D, order, 1), np.take_along_axis(I, order, 1)
    if D.shape[1] < kk:
        pad = kk - D.shape[1]
        D = np.concatenate([D, np.full((len(D), pad), -np.inf, D.dtype)], 1)
        I = np.concatenate([I, np.full((len(I), pad), -1, I.dtype)], 1)
    return D, I
