"""Mined negatives exported for hard-negative training: one JSON line per query."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from ..atomic import atomic_path
from .problem import MineProblem

__all__ = ["write_training", "shard_path"]


def shard_path(out: Path, block: int) -> Path:
    return out / "negatives" / f"part-{block:06d}.parquet"


def write_training(path: Path, out: Path, problem: MineProblem, n_blocks: int, B: int) -> int:
    """One JSON line per query: {"query", "positives", "negatives"} (ids), in query order."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for b in range(n_blocks):
            t = pq.read_table(shard_path(out, b), columns=["query_id", "negative_id"])
            negs: dict[str, list[str]] = {}
            for q, neg in zip(t.column("query_id").to_pylist(), t.column("negative_id").to_pylist()):
                negs.setdefault(q, []).append(neg)
            for r in range(b * B, min(len(problem.query_ids), (b + 1) * B)):
                qid = problem.query_ids[r]
                pos = problem.pos_ids[r] if problem.pos_ids is not None else []
                f.write(json.dumps({"query": qid, "positives": list(pos), "negatives": negs.get(qid, [])},
                                   ensure_ascii=False) + "\n")
                n += 1
    return n
