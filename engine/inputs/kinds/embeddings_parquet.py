"""Input kind ``embeddings``: a Parquet file of kind, id, embedding (what `hardrank store export` writes)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hardrank.inputs.embedding_files import FileRows, match_ids, read_embedding_file
from hardrank.inputs.kind import Embeddings, InputKind
from hardrank.items import Tables, text_key
from hardrank.models.openclip import file_hash
from hardrank.text import pre_caption
from hardrank.vectors import UnitRows

__all__ = ["KIND"]

_COLUMNS = {"kind", "id", "embedding"}


class _FileEmbeddings(Embeddings):
    """An exported (``hardrank store export``) or bring-your-own embeddings file, every problem named by
    ``read_embedding_file``. Files without a ``key`` column key captions by their normalised text (as the
    store does) and images by their id; rows sharing a key read as the first of them (as the store would)."""

    def __init__(self, path: str):
        path = Path(path)
        rows = read_embedding_file(path)
        self._data = {kind: (r.ids, r.vectors) for kind, r in rows.items()}
        self._file_rows = {kind: r.file_rows for kind, r in rows.items()}
        schema = pq.read_schema(path)
        t = pq.read_table(path, columns=["kind", "key"] if "key" in schema.names else ["kind"])  # not the vectors
        self.dir, self.modalities = path, tuple(self._data)
        meta = json.loads((schema.metadata or {}).get(b"hardrank_export", b"{}") or b"{}")
        self.fingerprint = meta.get("fingerprint") or self.content_id  # an export names its model
        self.names_model = bool(meta.get("fingerprint"))
        kinds = t.column("kind").to_pylist()
        file_keys = t.column("key").to_pylist() if "key" in t.column_names else None
        self._keys, self._first = {}, {}
        for mod, (ids, _) in self._data.items():
            if file_keys is not None:
                keys = [k for k, kind in zip(file_keys, kinds) if kind == mod]
            else:
                keys = [text_key(pre_caption(i)) if mod == "text" else f"id:{i}" for i in ids]
            first: dict[str, int] = {}
            for r, k in enumerate(keys):
                first.setdefault(k, r)
            self._keys[mod], self._first[mod] = keys, np.array([first[k] for k in keys], dtype=np.int64)

    @functools.cached_property
    def content_id(self) -> str:
        return f"embeddings-{file_hash(self.dir)[:16]}"

    def ids(self, modality: str) -> list[str]:
        return self._data[modality][0]

    def vectors(self, modality: str):
        return self._data[modality][1]

    def keys(self, modality: str) -> list[str]:
        return self._keys[modality]

    def read(self, modality: str, rows, *, lazy: bool = False):
        at = self._first[modality][np.asarray(rows, dtype=np.int64)]
        emb = self._data[modality][1]
        if len(at) == len(emb) and (at == np.arange(len(emb))).all():
            return emb  # every row in file order (a whole corpus): the array itself, not a copy of it
        return emb.select(at) if isinstance(emb, UnitRows) else emb[at]  # float16 files stay float16

    def reread(self, modality: str, rows):
        at = self._first[modality][np.asarray(rows, dtype=np.int64)]
        return FileRows(self.dir, self._file_rows[modality][at], self._data[modality][1].shape[1])

    def for_tables(self, tables: Tables):
        return match_ids(self.dir, self._data, tables)


class _EmbeddingsParquet(InputKind):
    name = "embeddings"
    describe = "an embeddings .parquet (kind, id, embedding: `hardrank store export` writes one)"
    yields = "embeddings"
    suffixes = (".parquet",)

    def detect(self, path: str) -> bool:
        p = Path(path)
        if p.suffix != ".parquet" or not p.is_file():
            return False
        try:
            return _COLUMNS <= set(pq.read_schema(p).names)
        except (pa.ArrowException, OSError):
            return False  # not this kind's to explain: a later kind (or eval's reader) names the problem

    def embeddings(self, path: str) -> Embeddings:
        return _FileEmbeddings(path)


KIND = _EmbeddingsParquet()
