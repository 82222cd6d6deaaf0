"""Embeddings held in this process only: the store of a model that has no fingerprint (a model object given to the
Python API without one), so nothing of it is read from or written to disk.

``MemoryStore`` answers the embed pipeline as ``EmbeddingStore`` does (``contains``, ``write``, ``read``; a
writer lock, manifest and checksums have nothing to guard), holding each embedding in the store's dtype, so what a
run reads back is exactly what a store folder would have given it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from hardrank.store.embedding_store import MissingKeys

__all__ = ["MemoryStore"]


class MemoryStore:
    """Embeddings of one model for images and texts, in memory; joined on keys, never on row order."""

    dir = None            # no folder: nothing to lock, list or upload
    readonly = False
    unwritable = None
    fingerprint = None

    def __init__(self, *, dim: int, dtype: str, meta: dict | None = None):
        self.dim, self.dtype, self.meta = int(dim), dtype, dict(meta or {})
        self._rows: dict[str, dict[str, np.ndarray]] = {"image": {}, "text": {}}  # modality -> key -> (dim,)

    @contextlib.contextmanager
    def lock(self, wait: bool = True) -> Iterator[bool]:
        yield True

    def refresh(self) -> None:
        """(Another process cannot add to it.)"""

    def remove_stale_temporaries(self) -> None:
        """(It leaves no temporaries.)"""

    def write_manifest(self) -> None:
        """(It has no manifest.)"""

    def verify(self, modality: str, keys=None) -> int:
        """Shards that failed their checksum: none (nothing was written)."""
        return 0

    def keys(self, modality: str) -> list[str]:
        return list(self._rows[modality])

    def count(self, modality: str) -> int:
        return len(self._rows[modality])

    def contains(self, modality: str, keys) -> np.ndarray:
        """(N,) bool: whether each key is held."""
        rows = self._rows[modality]
        return np.fromiter((k in rows for k in _strings(keys)), dtype=bool)

    def read(self, modality: str, keys) -> np.ndarray:
        """(N, dim) embeddings in the order of ``keys``; every key must be held."""
        keys, rows = _strings(keys), self._rows[modality]
        absent = [k for k in keys if k not in rows]
        if absent:
            raise MissingKeys(f"{len(absent)} {modality} keys are not held in memory, e.g. {absent[:3]}")
        out = np.empty((len(keys), self.dim), dtype=self.dtype)
        for i, k in enumerate(keys):
            out[i] = rows[k]
        return out

    def write(self, modality: str, keys: list[str], embeddings: np.ndarray) -> None:
        """Hold ``embeddings`` (N, dim) under ``keys``, cast to the store's dtype; keys held already are kept."""
        embeddings = np.ascontiguousarray(embeddings, dtype=self.dtype)
        if embeddings.shape != (len(keys), self.dim):
            raise ValueError(f"embeddings of shape {embeddings.shape} do not match {len(keys)} keys x dim {self.dim}")
        rows = self._rows[modality]
        for k, e in zip(keys, embeddings):
            if k and k not in rows:
                rows[k] = e.copy()


def _strings(keys) -> list[str]:
    """Keys as Python strings (a list, or an Arrow string array)."""
    return keys.to_pylist() if hasattr(keys, "to_pylist") else list(keys)
