"""Rows of an embedding store read on demand by content key: a picklable array-like for shard actors."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hardrank.store.embedding_store import EmbeddingStore, open_store

__all__ = ["StoreRows"]


class StoreRows:
    """Corpus rows (n, d) read from an embedding store on demand, by content key: a picklable,
    array-like view that a shard actor slices to load its part only. Supports ``len``, ``shape``,
    ``dtype``, slices (another view), integer / array indexing (rows read) and ``np.asarray``."""

    ndim = 2

    def __init__(self, folder: str, modality: str, keys: list[str], dim: int, dtype: str):
        self.folder, self.modality, self.keys = folder, modality, keys
        self.shape = (len(keys), dim)
        self.dtype = np.dtype(dtype)
        self._store: EmbeddingStore | None = None

    @classmethod
    def of(cls, store: EmbeddingStore, modality: str, keys: list[str]) -> StoreRows:
        return cls(str(store.dir), modality, list(keys), store.dim, store.dtype)

    def __len__(self) -> int:
        return len(self.keys)

    def __getstate__(self):
        return {**self.__dict__, "_store": None}  # each process opens the store itself

    def _read(self, keys: list[str]) -> np.ndarray:
        if self._store is None:
            self._store = open_store(Path(self.folder))
        return self._store.read(self.modality, keys)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return StoreRows(self.folder, self.modality, self.keys[idx], self.shape[1], str(self.dtype))
        idx = np.asarray(idx)
        flat = idx.reshape(-1)
        return self._read([self.keys[i] for i in flat]).reshape(*idx.shape, self.shape[1])

    def __array__(self, dtype=None, copy=None):
        out = self._read(self.keys)
        return out if dtype is None else out.astype(dtype)
