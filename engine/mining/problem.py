"""A mining problem as arrays: queries, corpus, exclusions and positives; the negatives' schema."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from hardrank.scoring import corpus_io
from hardrank.store.rows import StoreRows  # re-exported: it was defined here

__all__ = ["MineProblem", "StoreRows", "negatives_schema", "csr_take", "gather"]


@dataclass
class MineProblem:
    """Embeddings and exclusions of one mining run (rows are positions in ``xq`` / ``xb``).

    exclude_*: CSR over queries of corpus rows never returned (the query's positives found in the
    corpus: same content key or same Karpathy group). pos_*: CSR of the positives' embeddings in the
    corpus modality, for the near-duplicate filter (positives need not be in the corpus)."""

    xq: np.ndarray                        # (nq, d) float, L2-normalised
    xb: np.ndarray                        # (nb, d) float (an fp16 memmap is fine: read in chunks)
    query_ids: list[str]                  # (nq,) unique
    corpus_ids: list[str] | pa.ChunkedArray  # (nb,): a list, or the catalog's memory-mapped Arrow ids
    modality: str = "image"               # modality of the corpus (the negatives)
    direction: str = "t2i"
    exclude_ptr: np.ndarray | None = None  # (nq+1,) int64
    exclude_idx: np.ndarray | None = None  # corpus rows
    pos_ptr: np.ndarray | None = None      # (nq+1,) int64
    pos_emb: np.ndarray | None = None      # (npos, d) float
    pos_ids: list[list[str]] | None = None  # positives' ids per query, for --export-training
    query_keys: list[str] | None = None    # (nq,) content keys of the queries (the shards' query_key)
    corpus_keys: list[str] | None = None   # (nb,) content keys of the corpus (the shards' negative_key)
    pairs: list[tuple[str, str, str, str]] | None = None  # Karpathy (image path, image key, caption, caption
    #                                        key) of the inputs: the rows of a NegCLIP --export-training file
    meta: dict = field(default_factory=dict)  # sources, counts: copied into the summary
    # the same problem with xq / xb / pos_emb read again from the inputs' files (``Embeddings.reread``): the
    # recall check's reference, blind to what loading made of the vectors; None: the arrays are as stored
    reference: MineProblem | None = None

    def validate(self) -> None:
        nq, nb = len(self.xq), len(self.xb)
        for name, x in (("xq", self.xq), ("xb", self.xb)):
            if getattr(x, "ndim", 0) != 2 or x.dtype.kind != "f":
                raise ValueError(f"{name} must be a 2-D float array, got {getattr(x, 'shape', type(x))}")
        if self.xq.shape[1] != self.xb.shape[1]:
            raise ValueError(f"queries have dimension {self.xq.shape[1]}, the corpus {self.xb.shape[1]}: "
                             f"embed both with the same model")
        if len(self.query_ids) != nq or len(self.corpus_ids) != nb:
            raise ValueError(f"{len(self.query_ids)} query ids for {nq} queries / {len(self.corpus_ids)} corpus ids "
                             f"for {nb} rows")
        for name, keys, n in (("query_keys", self.query_keys, nq), ("corpus_keys", self.corpus_keys, nb)):
            if keys is not None and len(keys) != n:
                raise ValueError(f"{len(keys)} {name} for {n} rows")
        if len(set(self.query_ids)) != nq:
            raise ValueError("query ids must be unique (merge duplicate queries and their positives first)")
        for a, b, what in ((self.exclude_ptr, self.exclude_idx, "exclude"), (self.pos_ptr, self.pos_emb, "pos")):
            if (a is None) != (b is None):
                raise ValueError(f"{what}_ptr and its values must be given together")
            if a is not None and (len(a) != nq + 1 or a[0] != 0 or a[-1] != len(b) or np.any(np.diff(a) < 0)):
                raise ValueError(f"{what}_ptr must be a CSR pointer of {nq + 1} entries ending at {len(b)}")
        if self.exclude_idx is not None and len(self.exclude_idx) and (
                self.exclude_idx.min() < 0 or self.exclude_idx.max() >= nb):
            raise ValueError(f"exclude_idx holds rows outside the corpus [0, {nb})")


def negatives_schema() -> pa.Schema:
    """One row per (query, negative): the Parquet shards' schema (a public contract). Ids are human
    (image paths relative to the run's image root, captions as written); the keys are the items'
    content keys (null when the inputs were arrays without keys)."""
    return pa.schema([("query_id", pa.string()), ("rank", pa.int32()), ("negative_id", pa.string()),
                      ("score", pa.float32()), ("modality", pa.string()), ("query_key", pa.string()),
                      ("negative_key", pa.string())])


def csr_take(ptr, vals, rows):
    """Rows ``rows`` of a CSR (ptr, vals) as a new CSR."""
    if ptr is None:
        return None
    lens = (ptr[1:] - ptr[:-1])[rows]
    new_ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    src = np.repeat(ptr[:-1][rows] - new_ptr[:-1], lens) + np.arange(new_ptr[-1])
    return new_ptr, vals[src]


def gather(xb, I, budget_bytes: int = 64 << 20) -> np.ndarray:
    """(m, kk, d) float32 rows of ``xb`` for candidate indices ``I`` (-1 -> row 0, masked by callers), read in
    sorted order of row (``corpus_io.gather``)."""
    return corpus_io.gather(xb, I, budget_bytes)
