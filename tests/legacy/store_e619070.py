# ruff: noqa  (kept verbatim)
# hardrank's engine/store.py at commit e619070 (the store layout before shards carried checksums), verbatim:
# the writer of the previous layout, for the store compatibility tests (tests/test_faults.py). Not imported by
# the package; `git show e619070:engine/store.py` gives the same text.
"""Arrow embedding store: one folder per model fingerprint, atomic shards keyed by content."""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = ["EmbeddingStore", "embedding_schema", "SCHEMA_VERSION", "write_json_atomic"]

SCHEMA_VERSION = 1
_DTYPES = {"float16": pa.float16(), "float32": pa.float32()}


def embedding_schema(dim: int, dtype: str) -> pa.Schema:
    """The one place the store's row schema is built: ``key`` + ``embedding`` as a
    ``fixed_size_list<dtype>[dim]`` (never a variable ``list``)."""
    if dtype not in _DTYPES:
        raise ValueError(f"store dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return pa.schema(
        [pa.field("key", pa.string(), nullable=False),
         pa.field("embedding", pa.list_(pa.field("item", _DTYPES[dtype], nullable=False), dim), nullable=False)],
        metadata={"hardrank_schema": str(SCHEMA_VERSION)},
    )


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


class EmbeddingStore:
    """Embeddings of one model fingerprint, for images and texts.

    Layout: ``root/<fingerprint>/{image,text}/shard-*.arrow`` plus ``manifest.json``. A shard is
    written to a temporary name and renamed, so a killed writer leaves no half shard; the shard
    files on disk are the truth (the manifest, rewritten atomically after each shard, is a
    readable summary). Rows are joined on ``key``, never on row order. Reads are memory-mapped.
    """

    def __init__(self, root: str | os.PathLike, fingerprint: str, *, dim: int, dtype: str,
                 meta: dict | None = None):
        self.dir = Path(root) / fingerprint
        self.fingerprint = fingerprint
        self.dim = int(dim)
        self.dtype = dtype
        self.schema = embedding_schema(self.dim, dtype)
        self.meta = dict(meta or {})
        self._index: dict[str, dict[str, tuple[int, int]]] = {}
        self._shards: dict[str, list[np.ndarray]] = {}
        self._shard_names: dict[str, list[str]] = {}
        manifest = self.dir / "manifest.json"
        if manifest.exists():
            old = json.loads(manifest.read_text())
            if (old.get("dim"), old.get("dtype")) != (self.dim, self.dtype):
                raise ValueError(
                    f"{manifest}: store holds dim={old.get('dim')} dtype={old.get('dtype')}, "
                    f"but this model gives dim={self.dim} dtype={self.dtype}; the fingerprint should "
                    f"differ — delete {self.dir} if it is stale")
        for modality in ("image", "text"):
            (self.dir / modality).mkdir(parents=True, exist_ok=True)
            self._load_index(modality)
        if not manifest.exists():
            self._write_manifest()

    # -- reading -------------------------------------------------------------------------
    def _load_index(self, modality: str) -> None:
        index: dict[str, tuple[int, int]] = {}
        shards: list[np.ndarray] = []
        names: list[str] = []
        for path in sorted((self.dir / modality).glob("shard-*.arrow")):
            try:
                table = ipc.open_file(pa.memory_map(str(path), "r")).read_all()
            except (pa.ArrowInvalid, OSError) as exc:  # only possible if renamed by hand
                raise ValueError(f"{path}: unreadable store shard ({exc}); delete it and rerun") from exc
            if table.schema.field("embedding").type != self.schema.field("embedding").type:
                raise ValueError(f"{path}: embedding type {table.schema.field('embedding').type} "
                                 f"does not match {self.schema.field('embedding').type}")
            emb = self._to_numpy(table)
            sid = len(shards)
            shards.append(emb)
            names.append(path.name)
            for row, key in enumerate(table.column("key").to_pylist()):
                index.setdefault(key, (sid, row))
        self._index[modality] = index
        self._shards[modality] = shards
        self._shard_names[modality] = names

    def _to_numpy(self, table: pa.Table) -> np.ndarray:
        col = table.column("embedding")
        if table.num_rows == 0:
            return np.zeros((0, self.dim), dtype=self.dtype)
        parts = [chunk.values.to_numpy(zero_copy_only=True).reshape(-1, self.dim)
                 for chunk in col.chunks if len(chunk)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def count(self, modality: str) -> int:
        return len(self._index[modality])

    def contains(self, modality: str, keys: list[str]) -> np.ndarray:
        index = self._index[modality]
        return np.fromiter((k in index for k in keys), dtype=bool, count=len(keys))

    def read(self, modality: str, keys: list[str]) -> np.ndarray:
        """(N, dim) embeddings in the order of ``keys``; every key must be present."""
        index = self._index[modality]
        out = np.empty((len(keys), self.dim), dtype=self.dtype)
        locs = []
        missing = []
        for i, k in enumerate(keys):
            loc = index.get(k)
            if loc is None:
                missing.append(k)
            else:
                locs.append(loc)
        if missing:
            raise KeyError(f"{len(missing)} {modality} keys are not in store {self.dir}, "
                           f"e.g. {missing[:3]}")
        if not keys:
            return out
        sid = np.fromiter((s for s, _ in locs), dtype=np.int64, count=len(locs))
        row = np.fromiter((r for _, r in locs), dtype=np.int64, count=len(locs))
        for s in np.unique(sid):
            sel = np.nonzero(sid == s)[0]
            out[sel] = self._shards[modality][s][row[sel]]
        return out

    # -- writing -------------------------------------------------------------------------
    def write(self, modality: str, keys: list[str], embeddings: np.ndarray) -> str | None:
        """Append one shard atomically. Keys already stored are dropped. Returns the shard name."""
        embeddings = np.ascontiguousarray(embeddings, dtype=self.dtype)
        if embeddings.shape != (len(keys), self.dim):
            raise ValueError(f"embeddings of shape {embeddings.shape} do not match "
                             f"{len(keys)} keys x dim {self.dim}")
        index = self._index[modality]
        keep, seen = [], set()
        for i, k in enumerate(keys):
            if k and k not in index and k not in seen:
                keep.append(i)
                seen.add(k)
        if not keep:
            return None
        keys = [keys[i] for i in keep]
        embeddings = embeddings[keep]
        values = pa.array(embeddings.reshape(-1), type=self.schema.field("embedding").type.value_type)
        table = pa.Table.from_arrays(
            [pa.array(keys, pa.string()), pa.FixedSizeListArray.from_arrays(values, self.dim)],
            schema=self.schema)
        name = f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.arrow"
        final = self.dir / modality / name
        tmp = final.with_name("." + name + ".tmp")
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, self.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, final)
        sid = len(self._shards[modality])
        self._shards[modality].append(embeddings)
        self._shard_names[modality].append(name)
        for row, k in enumerate(keys):
            index[k] = (sid, row)
        self._write_manifest()
        return name

    def _write_manifest(self) -> None:
        write_json_atomic(self.dir / "manifest.json", {
            "fingerprint": self.fingerprint, "dim": self.dim, "dtype": self.dtype,
            "schema_version": SCHEMA_VERSION, "meta": self.meta,
            "shards": {m: self._shard_names.get(m, []) for m in ("image", "text")},
            "rows": {m: len(self._index.get(m, {})) for m in ("image", "text")},
        })
