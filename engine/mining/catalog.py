"""The corpus's ids and content keys as Arrow columns: memory-mapped from a file for large corpora.

A mining corpus of tens of millions of rows held its ids, keys and a key -> rows dict as Python objects:
about 0.35 KB a row, 10 GB at 28M rows, whatever ``--budget-mb`` said. Here they are three string columns
(``id``, ``key``, and ``group``: the key of the row's group, null when it is the row's own key), written
chunk by chunk (a part of a clip-retrieval folder at a time) to an Arrow IPC file and memory-mapped: what
stays resident is the pages read. Exclusions look the queries' few keys up in the columns
(``rows_with``), chunk by chunk, instead of a dict over the corpus.

The file (``ids.arrow``) lives in the index folder (``mine --index`` / ``--index-out``, ``hardrank index
build``), where the next run reuses it, or in ``--out`` for a corpus of ``MAPPED_ROWS`` rows or more;
``ids.json`` beside it says which corpus it lists (source fingerprint, modality, rows, digest of the ids).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hardrank.atomic import atomic_path, write_json_atomic

__all__ = ["Catalog", "digest", "take", "CATALOG", "MAPPED_ROWS"]

CATALOG, SIDECAR = "ids.arrow", "ids.json"
MAPPED_ROWS = 1 << 20  # corpora of at least this many rows keep their ids in a memory-mapped file
_SCHEMA = pa.schema([("id", pa.string()), ("key", pa.string()), ("group", pa.string())])
_CHUNK = 1 << 20


def digest(strings: Iterable) -> str:
    """blake2b of the strings joined by NUL (a list, or Arrow columns read in chunks): the run record's and
    the index's digest of the ids."""
    h = hashlib.blake2b(digest_size=12)
    first = True
    for chunk in _chunks(strings):
        if not first:
            h.update(b"\0")
        h.update("\0".join(chunk).encode("utf-8"))
        first = False
    return h.hexdigest()


def _chunks(strings) -> Iterator[list[str]]:
    if isinstance(strings, (pa.Array, pa.ChunkedArray)):
        for s in range(0, len(strings), _CHUNK):
            part = strings.slice(s, _CHUNK).to_pylist()
            if part:
                yield part
        return
    strings = list(strings)
    for s in range(0, len(strings), _CHUNK):
        yield strings[s:s + _CHUNK]


def take(col, idx) -> pa.Array:
    """Entries ``idx`` of a list or an Arrow column, in that order. A chunked column is read chunk by chunk, only
    the entries asked for: pyarrow's own ``ChunkedArray.take`` joins the chunks first (a copy of every id: 76 MB
    at 2M rows, pyarrow 26)."""
    idx = np.asarray(idx, np.int64).reshape(-1)
    if isinstance(col, list):
        return pa.array([col[i] for i in idx], pa.string())
    if isinstance(col, pa.Array):
        return col.take(pa.array(idx))
    if col.num_chunks == 1:
        return col.chunk(0).take(pa.array(idx))
    if not len(idx):
        return pa.array([], col.type)
    starts = np.concatenate([[0], np.cumsum([len(c) for c in col.chunks])])
    which = np.searchsorted(starts, idx, side="right") - 1
    order = np.argsort(which, kind="stable")
    parts, at = [], 0
    for c in np.unique(which):
        sel = order[at:at + int((which == c).sum())]
        at += len(sel)
        parts.append(col.chunk(int(c)).take(pa.array(idx[sel] - starts[c])))
    back = np.empty(len(idx), np.int64)
    back[order] = np.arange(len(idx))
    return pa.concat_arrays(parts).take(pa.array(back))


@dataclass
class Catalog:
    """Ids, keys and group keys of the corpus rows (Arrow columns), and the ids' digest."""

    ids: pa.ChunkedArray
    keys: pa.ChunkedArray
    groups: pa.ChunkedArray
    ids_digest: str
    path: Path | None = None  # the memory-mapped file (None: held in memory)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def mapped(self) -> bool:
        return self.path is not None

    def rows_with(self, keys: set[str]) -> dict[str, list[int]]:
        """key -> the corpus rows whose key or group key is ``key``, for the ``keys`` asked (the queries' own
        keys, their positives' and groups'), found chunk by chunk in the columns."""
        out: dict[str, list[int]] = {}
        if not keys or not len(self):
            return out
        want = pa.array(sorted(keys), pa.string())
        for col in (self.keys, self.groups):
            at = 0
            for chunk in col.chunks:
                pos = pc.index_in(chunk, value_set=want).to_numpy(zero_copy_only=False)
                hit = np.flatnonzero(~np.isnan(pos.astype(float)))
                for r in hit:
                    out.setdefault(want[int(pos[r])].as_py(), []).append(at + int(r))
                at += len(chunk)
        return {k: sorted(set(v)) for k, v in out.items()}

    @classmethod
    def of_lists(cls, ids: list[str], keys: list[str], groups: list[str | None] | None = None) -> Catalog:
        groups = groups if groups is not None else [None] * len(ids)
        return cls(pa.chunked_array([pa.array(ids, pa.string())]), pa.chunked_array([pa.array(keys, pa.string())]),
                   pa.chunked_array([pa.array(groups, pa.string())]), digest(ids))

    @classmethod
    def of_chunks(cls, chunks: Iterable[tuple[pa.Array, pa.Array, pa.Array]], folder: Path | None,
                  source: dict, reuse: Path | None = None) -> Catalog:
        """The columns from ``chunks`` of (ids, keys, groups): kept in memory (``folder`` None), else written
        to ``folder/ids.arrow`` and memory-mapped, or reused from there (or from ``reuse``, a folder only read)
        when its ``ids.json`` names the same ``source`` (fingerprint, modality, paired)."""
        for where in (reuse, folder):
            reused = cls.open(where, source) if where is not None else None
            if reused is not None:
                return reused
        if folder is None:
            parts = [pa.RecordBatch.from_arrays(list(c), schema=_SCHEMA) for c in chunks]
            t = pa.Table.from_batches(parts, schema=_SCHEMA)
            return cls(t.column("id"), t.column("key"), t.column("group"), digest(t.column("id")))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / CATALOG
        h = hashlib.blake2b(digest_size=12)
        first, rows = True, 0
        with atomic_path(path) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, _SCHEMA) as w:
                for ids, keys, groups in chunks:
                    w.write_batch(pa.RecordBatch.from_arrays([ids, keys, groups], schema=_SCHEMA))
                    if len(ids):
                        if not first:
                            h.update(b"\0")
                        h.update("\0".join(ids.to_pylist()).encode("utf-8"))
                        first = False
                    rows += len(ids)
        write_json_atomic(folder / SIDECAR, {**source, "rows": rows, "ids_digest": h.hexdigest()})
        return cls.open(folder, {**source, "rows": rows})

    @classmethod
    def open(cls, folder: Path, source: dict) -> Catalog | None:
        """The memory-mapped columns in ``folder`` when its ``ids.json`` names ``source``; else None."""
        side, path = Path(folder) / SIDECAR, Path(folder) / CATALOG
        if not (side.is_file() and path.is_file()):
            return None
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
            if any(meta.get(k) != v for k, v in source.items()):
                return None
            t = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
        except (OSError, ValueError, pa.ArrowException):
            return None
        if len(t) != meta.get("rows") or t.schema != _SCHEMA:
            return None
        return cls(t.column("id"), t.column("key"), t.column("group"), meta["ids_digest"], path)
