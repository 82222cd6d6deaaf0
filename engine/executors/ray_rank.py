"""Grouped ranking with the gallery sharded over Ray actors: per-shard counts add up to the exact ranks.

``hardrank eval --shard-gallery N`` (or ``--executor ray`` with a gallery above
``--shard-gallery-above-mb``): a ranking task's gallery is cut into N contiguous slices, one per
actor. Two rounds per task:

1. every actor scores the queries' positives it holds (exact scores: the fp32 value nearest the
   exact dot product, the same bits the kernels use everywhere) and returns each query's best one;
   the driver keeps the best over shards: the highest score, then the lowest global index. That is
   the single-machine pass's best positive p* with score s*, whichever shard holds it.
2. every actor counts, per query and gallery group, its non-positive items that beat (s*, p*) under
   the tie rule (``grouped_ranks`` with an external threshold) and its best negative per group.
   Counts add exactly; best negatives merge by score, then lowest global index.

The tie-rule subtlety: under ``index`` an item scoring exactly s* beats p* iff its *global* index is
lower. Each actor gets p* in its own index frame (``p* - lo``, negative when p* lies in an earlier
shard, beyond its size when in a later one), so ties in shards before p*'s count, ties in shards
after it do not, and ties inside p*'s shard compare as in the single pass. ``optimistic`` and
``pessimistic`` do not look at indices. Ranks and every metric therefore equal the local pass.

Actors that die are restarted (the constructor reloads the slice from the object store) and their
call is retried.
"""
from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import ray
import torch

from hardrank.executors.ray_embed import connect
from hardrank.executors.ray_search import local_csr
from hardrank.kernels import GroupedRanks, best_positives, grouped_ranks
from hardrank.kernels.ranking import check_rank_inputs
from hardrank.vectors import f32

__all__ = ["ShardedRanker", "gallery_shards"]

log = logging.getLogger("hardrank.ray")


def gallery_shards(nb: int, d: int, shards: int, above_mb: int) -> int:
    """How many shards a gallery of nb x d gets: ``shards`` when given (> 0), else one per
    ``above_mb`` MiB of fp32 gallery (1: not sharded)."""
    if shards > 0:
        return shards
    return max(1, math.ceil(nb * d * 4 / ((above_mb << 20) or 1)))


class _GalleryShard:
    """A Ray actor: gallery rows [lo, lo + n) of one ranking task."""

    def __init__(self, rows, lo: int, threads: int):
        torch.set_num_threads(max(1, threads))
        # rows and queries arrive read-only (Ray's object store, memory maps); the kernels only read them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.xb = torch.from_numpy(f32(np.asarray(rows)))
        self.lo = lo

    def best(self, xq: np.ndarray, ptr: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per query, the best positive of this slice: (score, global index), (-inf, -1) without one."""
        s, i = best_positives(torch.from_numpy(xq), self.xb, torch.from_numpy(ptr), torch.from_numpy(idx))
        i = i.numpy()
        return s.numpy(), np.where(i >= 0, i + self.lo, -1)

    def count(self, xq: np.ndarray, bounds: np.ndarray, ptr: np.ndarray, idx: np.ndarray, s_star: np.ndarray,
              p_star: np.ndarray, tie_rule: str, precision: str, budget_bytes: int):
        """(counts (nq, G), best negative score (nq, G), its global index (nq, G), info) of this slice."""
        r = grouped_ranks(torch.from_numpy(xq), self.xb, torch.from_numpy(bounds), torch.from_numpy(ptr),
                          torch.from_numpy(idx), tie_rule=tie_rule, precision=precision, budget_bytes=budget_bytes,
                          threshold=(torch.from_numpy(s_star), torch.from_numpy(p_star - self.lo)))
        ni = r.neg_index.numpy()
        return r.counts.numpy(), r.neg_score.numpy(), np.where(ni >= 0, ni + self.lo, -1), r.info


class ShardedRanker:
    """The sharded placement's ranker (``hardrank.scoring.backends.sharded``): ``ranker(xq, xb, group_bounds,
    pos_ptr, pos_idx, tie_rule=, precision=, budget_bytes=)`` -> ``GroupedRanks`` equal to ``grouped_ranks``
    on one machine, the gallery split over ``shards`` actors (0: one per ``above_mb`` MiB of gallery).
    Joins (or starts, of ``threads`` CPUs: ``ray_embed.connect``) the Ray cluster; ``close`` ends the Ray session
    it started."""

    def __init__(self, shards: int = 0, above_mb: int = 8192, address: str | None = None, threads: int | None = None):
        self.shards, self.above_mb, self.address, self.threads = shards, above_mb, address, threads
        self._owned = False

    def wants(self, nb: int, d: int) -> bool:
        """Whether a gallery of nb x d is sharded at all."""
        return self.shards > 0 or gallery_shards(nb, d, 0, self.above_mb) > 1

    def __call__(self, xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule: str = "index",
                 precision: str = "auto", budget_bytes: int = 256 << 20) -> GroupedRanks:
        self._owned = connect(self.address, self.threads) or self._owned
        xq, xb = f32(np.asarray(xq)), np.asarray(xb)
        bounds = np.asarray(group_bounds, np.int64)
        ptr, idx = np.asarray(pos_ptr, np.int64), np.asarray(pos_idx, np.int64)
        nq, nb = xq.shape[0], xb.shape[0]
        check_rank_inputs(bounds, ptr, idx, nq, nb)  # before any actor starts, with the one-process messages
        n = gallery_shards(nb, xb.shape[1], self.shards, self.above_mb)
        cuts = np.linspace(0, nb, n + 1).astype(np.int64)  # contiguous slices (some empty if n > nb)
        cpus = max(1.0, float(ray.cluster_resources().get("CPU", 1)))
        per = min(1.0, cpus / n)  # every actor must fit at once (so each runs one thread)
        actor = ray.remote(max_restarts=-1, max_task_retries=-1)(_GalleryShard)
        # the driver holds the slices' refs until the end: a crashed actor restarts from them (a ref
        # passed inline is freed once the actor is built, and the restart then fails to load its slice)
        slices = [ray.put(xb[lo:hi]) for lo, hi in zip(cuts[:-1], cuts[1:])]
        actors = [actor.options(num_cpus=per).remote(ref, int(lo), 1) for ref, lo in zip(slices, cuts[:-1])]
        try:
            q = ray.put(xq)
            local = [local_csr((ptr, idx), int(lo), int(hi)) for lo, hi in zip(cuts[:-1], cuts[1:])]
            best = ray.get([a.best.remote(q, lp, li) for a, (lp, li) in zip(actors, local)])
            s_star, p_star = _merge_best([b[0] for b in best], [b[1] for b in best])
            rs, rp = ray.put(s_star), ray.put(p_star)  # once, not once per shard
            calls = []
            for a, lo, hi, (lp, li) in zip(actors, cuts[:-1], cuts[1:], local):
                lb = np.clip(bounds, lo, hi) - lo  # the groups cut to this slice (G + 1 bounds, some empty)
                calls.append(a.count.remote(q, lb, lp, li, rs, rp, tie_rule, precision, budget_bytes))
            parts = ray.get(calls)
        finally:
            for a in actors:
                ray.kill(a)
        counts = sum(p[0] for p in parts)  # n >= 1 shards
        neg_score, neg_index = _merge_best([p[1] for p in parts], [p[2] for p in parts])
        info = dict(parts[0][3])
        info["sharded"] = {"shards": n, "rows": np.diff(cuts).tolist()}
        log.info("ranked %d queries against a gallery of %d rows in %d shards", nq, nb, n)
        return GroupedRanks(counts=torch.from_numpy(counts),
                            pos_score=torch.from_numpy(s_star), pos_index=torch.from_numpy(p_star),
                            neg_score=torch.from_numpy(neg_score), neg_index=torch.from_numpy(neg_index), info=info)

    def close(self) -> None:
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False


def _merge_best(scores: list[np.ndarray], index: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise best over shards: the highest score, then the lowest global index (-1 = none)."""
    S, I = np.stack(scores), np.stack(index)
    best = S.max(0)
    big = np.iinfo(np.int64).max
    first = np.where((S == best) & (I >= 0), I, big).min(0)
    return best.astype(np.float32), np.where(first == big, -1, first).astype(np.int64)
