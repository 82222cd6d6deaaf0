"""Bring your own embeddings: score precomputed image/text embeddings with the same protocols."""
from __future__ import annotations

from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .items import Tables

__all__ = ["load_embedding_file", "embeddings_for_tables"]

_COLUMNS = ("kind", "id", "embedding")


def load_embedding_file(path: str | Path) -> dict[str, tuple[list[str], np.ndarray]]:
    """{kind: (ids, (n, d) float32 L2-normalised)} from a Parquet file with columns kind, id, embedding."""

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"embeddings file {path} does not exist")
    table = pq.read_table(path)
    missing = [c for c in _COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected kind ('image'|'text'), id, embedding "
                         f"(list of floats); found {table.column_names}")
    out = {}
    kinds = table.column("kind").to_pylist()
    bad = sorted({k for k in kinds if k not in ("image", "text")})
    if bad:
        raise ValueError(f"{path}: column 'kind' holds {bad}; only 'image' and 'text' are allowed")
    for kind in ("image", "text"):
        sub = table.filter(pc.equal(table.column("kind"), kind))
        if sub.num_rows == 0:
            continue
        col = sub.column("embedding").combine_chunks()
        lengths = np.asarray(pc.list_value_length(col).to_numpy(zero_copy_only=False))
        if len(set(lengths.tolist())) != 1:
            first = int(np.nonzero(lengths != lengths[0])[0][0])
            raise ValueError(f"{path}: {kind} embeddings have different lengths ({lengths[0]} vs {lengths[first]} "
                             f"at {kind} row {first}, id {sub.column('id')[first].as_py()!r})")
        flat = pc.list_flatten(col).to_numpy(zero_copy_only=False)
        emb = np.asarray(flat, dtype=np.float32).reshape(len(lengths), -1)
        norms = np.linalg.norm(emb, axis=1, keepdims=True)
        if (norms == 0).any():
            raise ValueError(f"{path}: {kind} id {sub.column('id')[int(np.nonzero(norms[:, 0] == 0)[0][0])].as_py()!r} "
                             f"has an all-zero embedding")
        out[kind] = (sub.column("id").to_pylist(), emb / norms)
    dims = {v[1].shape[1] for v in out.values()}
    if len(dims) > 1:
        raise ValueError(f"{path}: image and text embeddings differ in dimension {sorted(dims)}")
    return out


def _suffixes(uri: str):
    parts = PurePosixPath(Path(uri).as_posix()).parts
    for i in range(len(parts)):  # longest suffix first: 'mix_0.9_s1/val2014/x.jpg' before 'val2014/x.jpg'
        yield "/".join(parts[i:]).lstrip("/")


def embeddings_for_tables(path: str | Path, tables: Tables) -> dict[str, np.ndarray]:
    """Whole-table embedding arrays in row order. Rows are matched by the id the annotation file
    writes (image path / raw caption); images may also match by the longest path suffix of their
    file (a cropped region: that suffix plus ``@crop:x,y,w,h``, as ``hardrank store export`` writes
    it, else the path alone). Missing ids fail, listing the first few."""
    data = load_embedding_file(path)
    out = {}
    for modality in ("image", "text"):
        table = tables.of(modality)
        if len(table) == 0:
            out[modality] = np.zeros((0, 1), np.float32)
            continue
        if modality not in data:
            raise ValueError(f"{path}: holds no '{modality}' rows but the suites need {len(table)} {modality}s")
        ids, emb = data[modality]
        lookup = {i: r for r, i in enumerate(ids)}
        rows, missing = np.empty(len(table), dtype=np.int64), []
        for r, (tid, entry) in enumerate(zip(table.ids, table.entries)):
            hit = lookup.get(tid)
            if hit is None and modality == "image":  # a cropped region first under its own id (path@crop:...)
                tags = [f"@{entry.recipe}", ""] if entry.recipe else [""]
                hit = next((lookup[s + t] for t in tags for s in _suffixes(entry.uri) if s + t in lookup), None)
            if hit is None and modality == "text":
                hit = lookup.get(entry)
            if hit is None:
                missing.append(tid)
                hit = 0
            rows[r] = hit
        if missing:
            raise ValueError(f"{path}: {len(missing)} {modality} id(s) needed by the suites are missing, e.g. "
                             f"{missing[:5]}; ids are the image path as the annotation file writes it (altered "
                             f"images under their variant folder) or the caption exactly as in the file")
        out[modality] = emb[rows]
    return out
