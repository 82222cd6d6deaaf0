"""Bring your own embeddings: the Parquet file (kind, id, embedding) read and checked, and ids matched to suites."""
from __future__ import annotations

from collections import Counter
from pathlib import Path, PurePosixPath
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hardrank.errors import DataError
from hardrank.items import Tables
from hardrank.vectors import UnitRows, unit_rows

__all__ = ["load_embedding_file", "read_embedding_file", "KindRows", "FileRows", "match_ids"]

_COLUMNS = ("kind", "id", "embedding")


_BATCH_VALUES = 1 << 19  # float values decoded per batch (4 MB as float64): the reader's working set


class KindRows(NamedTuple):
    """One kind's rows of an embeddings file: ids, their vectors, and the file rows they were read from."""

    ids: list[str]
    vectors: np.ndarray | UnitRows   # (n, d) float32 unit rows (a float16 file's: a UnitRows view)
    file_rows: np.ndarray            # (n,) int64 row of each in the file (a repeated id: its first row)


def load_embedding_file(path: str | Path) -> dict[str, tuple[list[str], np.ndarray]]:
    """{kind: (ids, (n, d) L2-normalised)} from a Parquet file with columns kind, id, embedding
    (``read_embedding_file`` without the file rows)."""
    return {kind: (r.ids, r.vectors) for kind, r in read_embedding_file(path).items()}


def read_embedding_file(path: str | Path) -> dict[str, KindRows]:
    """{kind: KindRows} from a Parquet file with columns kind, id, embedding.
    Every problem (missing or mistyped column, null, duplicated id, NaN, all-zero vector) raises a
    DataError naming the file and the first offending id. Vectors of any finite magnitude are
    normalised to their direction (``vectors.unit_rows``: x 1e20 or x 1e-25 scores as the vector itself).

    Memory: the vectors are streamed, a few MB of rows at a time, into one array per kind allocated up
    front: float32 unit rows, or for a file of float16 values those values as stored, in a
    ``vectors.UnitRows`` view that normalises rows on read (float32 rows equal to those of the same values
    written as float32; rounding the unit vectors to float16 again would move scores by ~1e-4). Nothing
    else of the vectors' size is held (the Parquet column is never materialised whole)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"embeddings file {path} {'is a folder' if path.is_dir() else 'does not exist'}; pass a "
                        f"Parquet file with columns kind, id, embedding")
    try:
        # no pre-buffering, a small read buffer: one batch of the column is decoded at a time
        pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    if pf.metadata.num_rows == 0:  # before the types: an empty file's columns are often typed null
        raise DataError(f"{path}: holds no rows (an empty file); an embeddings file needs one row per item "
                        f"with kind ('image'|'text'), id and embedding (list of floats): write its rows, or "
                        f"pass the file that holds them")
    missing = [c for c in _COLUMNS if c not in schema.names]
    if missing:
        raise DataError(f"{path}: missing column(s) {missing}; expected kind ('image'|'text'), id, embedding "
                        f"(list of floats); found {schema.names}")
    for name in ("kind", "id"):
        t = schema.field(name).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise DataError(f"{path}: column {name!r} is {t}, expected strings")
    etype = schema.field("embedding").type
    if not (pa.types.is_list(etype) or pa.types.is_large_list(etype) or pa.types.is_fixed_size_list(etype)) \
            or not (pa.types.is_floating(etype.value_type) or pa.types.is_integer(etype.value_type)):
        raise DataError(f"{path}: column 'embedding' is {etype}, expected a list of floats per row (list<float>); "
                        f"if the vectors were saved as text, parse them into float lists before writing the file")
    try:
        labels = pf.read(columns=["kind", "id"])
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    for name in ("kind", "id"):
        nulls = labels.column(name).null_count
        if nulls:
            raise DataError(f"{path}: column {name!r} has {nulls} null value(s); every row needs a {name}")
    kind_col = labels.column("kind")
    bad = sorted(set(pc.unique(kind_col).to_pylist()) - {"image", "text"})
    if bad:
        raise DataError(f"{path}: column 'kind' holds {bad}; only 'image' and 'text' are allowed")
    code = np.asarray(pc.equal(kind_col, "text").to_numpy(zero_copy_only=False), dtype=np.int8)  # 0 image, 1 text
    all_ids = labels.column("id").to_pylist()
    del labels, kind_col
    dtype = np.float16 if pa.types.is_float16(etype.value_type) else np.float32
    rows = {kind: np.flatnonzero(code == c) for c, kind in enumerate(("image", "text"))}
    ids = {kind: all_ids if len(r_) == len(all_ids) else [all_ids[r] for r in r_]
           for kind, r_ in rows.items() if len(r_)}
    pos_of = np.zeros(len(code), np.int64)  # file row -> its row among its kind's rows
    for r_ in rows.values():
        pos_of[r_] = np.arange(len(r_))
    emb: dict[str, np.ndarray] = {}
    dim = {}
    lo = 0
    step = max(1, _BATCH_VALUES // (etype.list_size if pa.types.is_fixed_size_list(etype) else 1024))
    for batch in pf.iter_batches(batch_size=step, columns=["embedding"]):
        col = batch.column(0)
        file_rows = np.arange(lo, lo + len(col))
        lo += len(col)
        for kind in ids:
            sel = file_rows[code[file_rows] == (kind == "text")]
            if not len(sel):
                continue
            sub = col if len(sel) == len(col) else col.take(pa.array(sel - file_rows[0]))
            at = pos_of[sel]  # rows of this kind's array
            block = _vectors(path, kind, ids[kind], at, sub, dim)
            if kind not in emb:
                emb[kind] = np.empty((len(ids[kind]), dim[kind]), dtype)  # the one array of the kind's vectors
            if dtype == np.float16:  # kept as stored: normalised on read (UnitRows), never rounded again
                emb[kind][at[0]:at[-1] + 1] = block
                continue
            name = lambda j, kind=kind, at=at: f"{path}: {kind} id {ids[kind][at[j]]!r}"
            unit_rows(block, name, out=emb[kind][at[0]:at[-1] + 1])  # at is consecutive: rows keep file order
    pa.default_memory_pool().release_unused()  # the batches' buffers: the pool keeps them otherwise
    out = {}
    for kind in ids:
        if kind not in emb:  # no batch held the kind's rows: only possible for an empty file
            continue
        kemb = emb[kind]
        if dtype == np.float16:
            kemb = UnitRows.of(kemb, lambda j, kind=kind: f"{path}: {kind} id {ids[kind][j]!r}")
        keep, kemb = _one_row_per_id(path, kind, ids[kind], kemb)
        out[kind] = KindRows([ids[kind][r] for r in keep], kemb, rows[kind][keep])
    dims = {v.vectors.shape[1] for v in out.values()}
    if len(dims) > 1:
        raise DataError(f"{path}: image and text embeddings differ in dimension {sorted(dims)}")
    return out


def _vectors(path: Path, kind: str, ids: list[str], at: np.ndarray, col, dim: dict) -> np.ndarray:
    """(len(col), d) values of one batch of a kind's embedding column, checked (nulls, lengths, NaN / inf),
    in the file's own dtype until normalised (a float64 value past float32's range is still a direction).
    ``at``: the rows' positions among the kind's rows (for the messages); ``dim``: the kind's dimension,
    set by its first row."""
    if col.null_count:
        first = int(np.nonzero(col.is_null().to_numpy(zero_copy_only=False))[0][0])
        raise DataError(f"{path}: {kind} id {ids[at[first]]!r} has a null embedding")
    lengths = np.asarray(pc.list_value_length(col).to_numpy(zero_copy_only=False))
    d = dim.setdefault(kind, int(lengths[0]))
    if d == 0:
        raise DataError(f"{path}: {kind} embeddings are empty lists (id {ids[at[0]]!r}); each row needs its vector")
    if (lengths != d).any():
        first = int(np.nonzero(lengths != d)[0][0])
        raise DataError(f"{path}: {kind} embeddings have different lengths ({d} vs {lengths[first]} at {kind} row "
                        f"{at[first]}, id {ids[at[first]]!r})")
    flat = pc.list_flatten(col)
    if flat.null_count:
        raise DataError(f"{path}: {kind} embeddings hold {flat.null_count} null value(s)")
    block = np.asarray(flat.to_numpy(zero_copy_only=False)).reshape(len(lengths), d)
    finite = np.isfinite(block).all(1)
    if not finite.all():
        raise DataError(f"{path}: {kind} id {ids[at[int(np.nonzero(~finite)[0][0])]]!r} has a NaN or infinite "
                        f"value in its embedding ({int((~finite).sum())} such row(s) in this part of the file)")
    return block


def _one_row_per_id(path: Path, kind: str, ids: list[str], emb):
    """(rows kept, their vectors): rows of a repeated id (a caption written once per occurrence) must hold
    the same vector (the same unit row); they become one, compacted within ``emb`` (no second array; a
    ``UnitRows`` compacts its float16 values and norms). Different vectors under one id would make the
    result depend on row order: an error."""
    counts = Counter(ids)
    if len(counts) == len(ids):
        return np.arange(len(ids)), emb
    first: dict[str, int] = {}
    keep = []
    for r, i in enumerate(ids):
        j = first.setdefault(i, r)
        if j == r:
            keep.append(r)
        elif not np.array_equal(emb[j], emb[r]):
            raise DataError(f"{path}: {kind} id {i!r} appears {counts[i]} times with different embeddings (rows "
                            f"{j} and {r} of the {kind} rows); each id needs one embedding: drop or fix the "
                            f"duplicates")
    keep = np.asarray(keep, np.int64)
    arrays = (emb.raw, emb.root) if isinstance(emb, UnitRows) else (emb,)
    step = max(1, _BATCH_VALUES // max(1, emb.shape[1]))
    for s in range(0, len(keep), step):  # keep[j] >= j: every source row is read before it is overwritten
        src = keep[s:s + step]
        for a in arrays:
            a[s:s + len(src)] = a[src]
    return keep, emb[:len(keep)]


class FileRows:
    """(n, d) float32 unit rows of an embeddings file read again from the file on every access: nothing of
    the vectors is held, only each row's position in the file. The recall check's reference reads through
    it, so what it compares against is the file as stored, whatever the loaded arrays became (a float16
    file's vectors rounded a second time on load once passed unseen: the reference saw the same copy).

    An array-like: ``len``, ``shape``, ``dtype``, slices (another view), integer-array indexing (one pass over
    the row groups holding the rows), ``np.asarray``; ``blocks()`` streams every row once, in file order."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, path: str | Path, file_rows: np.ndarray, dim: int):
        self.path, self.file_rows, self.dim = Path(path), np.asarray(file_rows, np.int64), int(dim)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.file_rows), self.dim)

    def __len__(self) -> int:
        return len(self.file_rows)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return FileRows(self.path, self.file_rows[idx], self.dim)
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        flat = idx.reshape(-1).astype(np.int64)
        out = np.empty((len(flat), self.dim), np.float32)
        for at, rows in FileRows(self.path, self.file_rows[flat], self.dim).blocks():
            out[at] = rows
        return out.reshape(*idx.shape, self.dim)

    def __array__(self, dtype=None, copy=None):
        out = self[np.arange(len(self))]
        return out if dtype is None else out.astype(dtype, copy=False)

    def blocks(self):
        """(positions (b,) in this view, (b, d) float32 unit rows): every row once, a batch of the file at a
        time (row groups holding none of the rows are skipped)."""
        if not len(self.file_rows):
            return
        pf = pq.ParquetFile(self.path, pre_buffer=False, buffer_size=1 << 20)
        order = np.argsort(self.file_rows, kind="stable")
        fr = self.file_rows[order]
        step = max(1, _BATCH_VALUES // 4 // max(1, self.dim))  # a quarter of the loader's batches: 1 MB of float32
        start = 0
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            a, b = np.searchsorted(fr, [start, start + n])
            if a < b:
                lo = start
                for batch in pf.iter_batches(batch_size=step, row_groups=[g], columns=["embedding"]):
                    i, j = np.searchsorted(fr, [lo, lo + len(batch)])
                    if i < j:
                        col, at = batch.column(0), fr[i:j] - lo
                        whole = j - i == len(col) and at[-1] - at[0] == len(col) - 1  # every row once, in order
                        yield order[i:j], self._unit(col if whole else col.take(pa.array(at)), fr[i:j])
                    lo += len(batch)
                    del batch
                    pa.default_memory_pool().release_unused()  # the pool keeps each batch's buffers otherwise
            start += n

    def _unit(self, col, file_rows: np.ndarray) -> np.ndarray:
        flat = np.asarray(pc.list_flatten(col).to_numpy(zero_copy_only=False))
        if flat.size != len(file_rows) * self.dim:
            raise DataError(f"{self.path}: changed while it was read (rows {file_rows[0]}..{file_rows[-1]} no "
                            f"longer hold {self.dim}-d embeddings); rerun on a file that stays as it is")
        return unit_rows(flat.reshape(len(file_rows), self.dim), lambda j: f"{self.path}: row {file_rows[j]}")


def _suffixes(uri: str):
    parts = PurePosixPath(Path(uri).as_posix()).parts
    for i in range(len(parts)):  # longest suffix first: 'mix_0.9_s1/val2014/x.jpg' before 'val2014/x.jpg'
        yield "/".join(parts[i:]).lstrip("/")


def match_ids(path, data: dict[str, tuple[list[str], np.ndarray]], tables: Tables) -> dict[str, np.ndarray]:
    """Whole-table embedding arrays in row order, from ``data`` ({kind: (ids, (n, d) vectors)}) read
    from ``path`` (named in errors). Rows are matched by the id the annotation file writes (image
    path / raw caption); images may also match by the longest path suffix of their file (a cropped
    region: that suffix plus ``@crop:x,y,w,h``, as ``hardrank store export`` writes it, else the path
    alone); texts also when an id is the caption's normalised form. Missing ids fail, listing the first few."""
    out = {}
    for modality in ("image", "text"):
        table = tables.of(modality)
        if len(table) == 0:
            out[modality] = np.zeros((0, 1), np.float32)
            continue
        if modality not in data:
            raise DataError(f"{path}: holds no '{modality}' rows but the suites need {len(table)} {modality}s")
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
            raise DataError(f"{path}: {len(missing)} {modality} id(s) needed by the suites are missing, e.g. "
                             f"{missing[:5]}; ids are the image path as the annotation file writes it (altered "
                             f"images under their variant folder) or the caption exactly as in the file")
        out[modality] = np.asarray(emb[rows], dtype=np.float32)  # fp16 files too: eval scores float32
    return out
