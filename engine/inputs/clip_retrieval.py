"""clip-retrieval output folders read as they are, part by part: img_emb/, text_emb/ (.npy) and metadata/ (.parquet).

``clip-retrieval inference`` writes, for each output partition N (zero-padded to the width of the
partition count):

    img_emb/img_emb_N.npy           (rows, d) float16, L2-normalised image embeddings
    text_emb/text_emb_N.npy         (rows, d) float16, L2-normalised caption embeddings
    metadata/metadata_N.parquet     one row per embedding row, in the same order: image_path (the
                                    file's path, or the WebDataset sample key) and caption, plus the
                                    sample's own metadata columns (url, key, ...)

Row i of the three files of a part is one sample: image i and caption i are a pair. Nothing here
loads a folder whole: the id columns are read one part at a time, vectors through memory maps of the
``.npy`` files (``VectorRows``: an array-like the mining search and the Ray shards read block by block,
L2-normalised on read), so memory follows what is asked, not the folder's size. This is the
approach of embedding-reader's numpy reader (metadata and embeddings joined by part and row).
"""
from __future__ import annotations

import hashlib
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from hardrank.errors import DataError
from hardrank.text import pre_caption
from hardrank.vectors import unit_rows

__all__ = ["ClipRetrievalFolder", "VectorRows", "is_clip_retrieval_folder", "match_tables", "KINDS"]

# kind -> (embedding folder, file prefix, metadata id column)
KINDS = {"image": ("img_emb", "img_emb_", "image_path"), "text": ("text_emb", "text_emb_", "caption")}
_META = ("metadata", "metadata_")
_FIX = ("clip-retrieval writes img_emb/img_emb_N.npy, text_emb/text_emb_N.npy and metadata/metadata_N.parquet "
        "together for each part N")


def is_clip_retrieval_folder(path) -> bool:
    """Whether ``path`` is a folder laid out as clip-retrieval's output (an img_emb/ or text_emb/
    folder holding ``*_N.npy`` parts)."""
    p = Path(path)
    return p.is_dir() and any((p / folder).is_dir() and any((p / folder).glob(f"{prefix}*.npy"))
                              for folder, prefix, _ in KINDS.values())


def _numbered(folder: Path, prefix: str, suffix: str) -> dict[int, Path]:
    out: dict[int, Path] = {}
    pattern = re.compile(rf"{re.escape(prefix)}(\d+){re.escape(suffix)}")
    if not folder.is_dir():
        return out
    for f in folder.iterdir():
        m = pattern.fullmatch(f.name)
        if m:
            n = int(m.group(1))
            if n in out:
                raise DataError(f"{folder}: part {n} appears twice ({out[n].name} and {f.name}); keep one")
            out[n] = f
    return out


@dataclass(frozen=True)
class _Part:
    number: int
    rows: int
    files: dict            # kind -> .npy path
    metadata: Path


class ClipRetrievalFolder:
    """One clip-retrieval output folder, checked: every part has its metadata and one .npy per kind,
    with as many rows as the metadata; every .npy is 2-D float16/float32 of one dimension. Errors name
    the file and the fix."""

    def __init__(self, path: str | os.PathLike):
        root = Path(path)
        self.root = root
        self.dir = root  # where the embeddings come from (the mining sources' name for it)
        found = {kind: _numbered(root / folder, prefix, ".npy") for kind, (folder, prefix, _) in KINDS.items()}
        self.kinds = tuple(k for k in KINDS if found[k])
        if not self.kinds:
            raise DataError(f"{root}: no img_emb/img_emb_N.npy or text_emb/text_emb_N.npy files; pass the output "
                            f"folder of clip-retrieval inference ({_FIX})")
        meta = _numbered(root / _META[0], _META[1], ".parquet")
        numbers = sorted(set().union(*(found[k] for k in self.kinds)))
        parts, dim, dtypes = [], None, set()
        for n in numbers:
            missing = [f"{KINDS[k][0]}/{KINDS[k][1]}{n}.npy" for k in self.kinds if n not in found[k]]
            if n not in meta:
                missing.append(f"metadata/metadata_{n}.parquet")
            if missing:
                have = [str(found[k][n].relative_to(root)) for k in self.kinds if n in found[k]]
                raise DataError(f"{root}: part {n} has {have} but lacks {missing}; {_FIX}: copy the missing "
                                f"file(s), or remove the part's other files to leave it out")
            try:
                meta_rows = pq.ParquetFile(meta[n]).metadata.num_rows
                cols = pq.read_schema(meta[n])
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{meta[n]}: not a readable Parquet file ({exc})") from None
            for k in self.kinds:
                col = KINDS[k][2]
                if col not in cols.names:
                    raise DataError(f"{meta[n]}: no column {col!r} (it holds {cols.names}); clip-retrieval writes "
                                    f"image_path with image embeddings and caption with text embeddings")
                t = cols.field(col).type
                if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                    raise DataError(f"{meta[n]}: column {col!r} is {t}, expected strings")
            files = {}
            for k in self.kinds:
                f = found[k][n]
                try:
                    mm = np.load(f, mmap_mode="r")
                except (ValueError, OSError) as exc:
                    raise DataError(f"{f}: not a readable .npy array ({exc})") from None
                if mm.ndim != 2 or mm.dtype not in (np.float16, np.float32):
                    raise DataError(f"{f}: holds a {mm.dtype} array of shape {mm.shape}; expected (rows, dim) "
                                    f"float16 or float32 embeddings")
                if mm.shape[0] != meta_rows:
                    raise DataError(f"{f}: {mm.shape[0]} rows, but {meta[n].name} has {meta_rows}: row i of "
                                    f"each is one sample, so they must match; is one of them from another run?")
                if dim is not None and mm.shape[1] != dim:
                    raise DataError(f"{f}: dimension {mm.shape[1]}, other parts have {dim}: embeddings of one "
                                    f"model only")
                dim = mm.shape[1]
                dtypes.add(mm.dtype)
                files[k] = f
            parts.append(_Part(n, meta_rows, files, meta[n]))
        self.parts = parts
        self.dim = int(dim)
        self.num_rows = sum(p.rows for p in parts)
        self.starts = np.concatenate([[0], np.cumsum([p.rows for p in parts])]).astype(np.int64)
        h = hashlib.blake2b(digest_size=8)  # identity of the folder's files, without reading gigabytes
        for p in parts:
            for f in (*p.files.values(), p.metadata):
                h.update(f"{f.relative_to(root).as_posix()}|{f.stat().st_size}|".encode())
        self.fingerprint = f"clip-retrieval-{h.hexdigest()}"

    def id_parts(self, kind: str):
        """(part index, Arrow string array of ids) per part, one part in memory at a time."""
        self._need(kind)
        col = KINDS[kind][2]
        for i, p in enumerate(self.parts):
            ids = pq.read_table(p.metadata, columns=[col]).column(col)
            if ids.null_count:
                first = int(np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))[0])
                raise DataError(f"{p.metadata}: column {col!r} is null at row {first}; every sample needs one")
            yield i, ids.combine_chunks()

    def ids(self, kind: str) -> list[str]:
        """Every id of ``kind`` (image_path / caption), in folder order."""
        return [s for _, a in self.id_parts(kind) for s in a.to_pylist()]

    def vectors(self, kind: str) -> VectorRows:
        """All rows of ``kind`` as a lazy (n, d) float32 array-like."""
        self._need(kind)
        return VectorRows(tuple(str(p.files[kind]) for p in self.parts), tuple(p.rows for p in self.parts),
                          self.dim)

    def _need(self, kind: str) -> None:
        if kind not in self.kinds:
            raise DataError(f"{self.root}: holds no {kind} embeddings ({KINDS[kind][0]}/ is missing); it has "
                            f"{list(self.kinds)}")


def _convert(src: np.ndarray, dst: np.ndarray) -> None:
    """``dst`` (float32) = ``src`` (float16 or float32 rows of a part's map): exact either way; torch converts
    float16 with vectorised instructions on its threads (a streamed exact pass reads every row this way)."""
    if src.dtype == np.float16 and src.flags.c_contiguous and dst.flags.c_contiguous and len(src):
        with warnings.catch_warnings():  # the map is read-only; torch only reads it
            warnings.simplefilter("ignore", UserWarning)
            torch.from_numpy(dst).copy_(torch.from_numpy(np.asarray(src)))
    else:
        dst[...] = src


class VectorRows:
    """(n, d) float32 L2-normalised rows of .npy parts, read on demand through memory maps: a slice
    gives another view, an integer array reads those rows, ``np.asarray`` reads the whole view.
    Picklable: a Ray actor handed a slice opens the files itself."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, files: tuple[str, ...], counts: tuple[int, ...], dim: int, sel=None):
        self.files, self.counts, self.dim = files, counts, dim
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.sel = range(int(self.starts[-1])) if sel is None else sel  # global rows: a range or an int64 array
        self._maps: dict[int, np.ndarray] = {}

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.sel), self.dim)

    def __len__(self) -> int:
        return len(self.sel)

    def __getstate__(self):
        return {**self.__dict__, "_maps": {}}

    def select(self, idx) -> VectorRows:
        """The rows ``idx`` of this view, as a view."""
        return VectorRows(self.files, self.counts, self.dim, self._global(np.asarray(idx, np.int64).reshape(-1)))

    def _global(self, idx: np.ndarray) -> np.ndarray:
        if isinstance(self.sel, range):
            if len(idx) and (idx.min() < -len(self.sel) or idx.max() >= len(self.sel)):
                raise IndexError(f"row index out of range for {len(self.sel)} rows")
            return self.sel.start + np.where(idx < 0, idx + len(self.sel), idx)
        return self.sel[idx]

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return VectorRows(self.files, self.counts, self.dim, self.sel[idx])
        if isinstance(idx, (int, np.integer)):
            return self._read(self._global(np.array([idx], np.int64)))[0]
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        flat = idx.reshape(-1).astype(np.int64)
        return self._read(self._global(flat)).reshape(*idx.shape, self.dim)

    def __array__(self, dtype=None, copy=None):
        if isinstance(self.sel, range):
            out = self._read_range(self.sel.start, self.sel.stop)
        else:
            out = self._read(np.asarray(self.sel))
        return out if dtype is None else out.astype(dtype, copy=False)

    def maps(self) -> list[np.ndarray]:
        """Every part's memory map, opened (cheap: no page is read), e.g. to advise the kernel how they will be
        read before reading them (``scoring.corpus_io``)."""
        return [self._map(i) for i in range(len(self.files))]

    def _map(self, i: int) -> np.ndarray:
        m = self._maps.get(i)
        if m is None:
            m = self._maps[i] = np.load(self.files[i], mmap_mode="r")
        return m

    def _read_range(self, lo: int, hi: int) -> np.ndarray:
        out = np.empty((hi - lo, self.dim), np.float32)
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        at = lo
        for i in range(max(first, 0), len(self.files)):
            if at >= hi:
                break
            s, e = int(self.starts[i]), int(self.starts[i + 1])
            if e <= at:
                continue
            stop = min(hi, e)
            _convert(self._map(i)[at - s:stop - s], out[at - lo:stop - lo])
            at = stop
        return self._normalised(out, lo)

    def _read(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), self.dim), np.float32)
        if not len(rows):
            return out
        part = np.searchsorted(self.starts, rows, side="right") - 1
        order = np.argsort(rows, kind="stable")  # each part read in file order
        for i in np.unique(part):
            sel = order[part[order] == i]
            out[sel] = self._map(int(i))[rows[sel] - self.starts[i]]  # (scattered rows: numpy's gather)
        return self._normalised(out, rows)

    def _normalised(self, x: np.ndarray, where) -> np.ndarray:
        def name(j: int) -> str:
            g = int(where + j) if isinstance(where, int) else int(where[j])
            i = int(np.searchsorted(self.starts, g, side="right")) - 1
            return f"{self.files[i]}: row {g - int(self.starts[i])}"
        return unit_rows(x, name, out=x)  # x: this read's own float32 buffer


# -- bring-your-own evaluation: the suites' ids matched in a streamed pass over the metadata ----------
def _components(path: str) -> list[str]:
    return [c for c in path.replace("\\", "/").split("/") if c]


def _image_candidates(table, r: int) -> list[str]:
    """Ids an image row may appear under, preferred first: the annotation's path when the suite kept
    it (Karpathy, RoCOCO and its variant folders), else the file's path and its shorter suffixes (a
    path below --images, or as written when there is no --images); ``@crop:...`` kept on each."""
    ref, tid = table.entries[r], table.ids[r]
    tag = f"@{ref.recipe}" if ref.recipe else ""
    if tid != ref.uri:
        return [tid + tag]
    parts = _components(ref.uri)
    return ["/".join(parts[i:]) + tag for i in range(len(parts))]


def match_tables(folder: ClipRetrievalFolder, tables) -> dict[str, np.ndarray]:
    """Whole-table embedding arrays (rows, d) float32 in row order, for the items the suites name.

    Images: the metadata's ``image_path`` equals the annotation's path, or ends with it after a
    ``/`` (clip-retrieval writes the path it read, e.g. /data/coco/val2014/x.jpg for the annotation's
    val2014/x.jpg; an altered image mix_0.9_s1/val2014/x.jpg matches .../mix_0.9_s1/val2014/x.jpg);
    among several such paths the one with the fewest folders before the id wins (the original under
    /data/coco/val2014/ rather than a variant folder's copy), and two of equal depth must hold the
    same vector. A cropped region (``@crop:...``) takes the image's vector only when the folder has
    the crop's own id. Texts: the caption exactly as written, else as normalised (``pre_caption``).
    Missing ids fail listing the first few."""
    out = {}
    for modality in ("image", "text"):
        table = tables.of(modality)
        if len(table) == 0:
            out[modality] = np.zeros((0, 1), np.float32)
            continue
        if modality not in folder.kinds:
            raise DataError(f"{folder.root}: holds no {KINDS[modality][0]}/ but the suites need "
                            f"{len(table)} {modality}s")
        if modality == "image":
            cands = [_image_candidates(table, r) for r in range(len(table))]
        else:
            cands = [[tid, entry] for tid, entry in zip(table.ids, table.entries)]
        best = _best_rows(folder, modality, [c for cs in cands for c in cs])
        rows = np.full(len(table), -1, np.int64)
        for r, cs in enumerate(cands):
            rows[r] = next((best[c] for c in cs if c in best), -1)
        if modality == "text" and (rows < 0).any():
            _match_normalised(folder, table, rows)
        missing = [table.ids[r] for r in np.flatnonzero(rows < 0)]
        if missing:
            how = ("image_path equal to the annotation's path or ending with /<that path>" if modality == "image"
                   else "caption exactly as in the annotation file")
            raise DataError(f"{folder.root}: {len(missing)} {modality} id(s) needed by the suites are not in its "
                            f"metadata, e.g. {missing[:5]}; a row matches by its {how}. Embed the missing "
                            f"{modality}s with clip-retrieval too, or evaluate the suites' subset it covers")
        out[modality] = folder.vectors(modality)[rows]
    return out


def _best_rows(folder: ClipRetrievalFolder, kind: str, wanted: list[str]) -> dict[str, int]:
    """id -> global row of the metadata row matching it best (see ``match_tables``), one part at a time."""
    want = sorted(set(wanted))
    by_depth: dict[int, list[str]] = {}
    for w in want:
        by_depth.setdefault(len(_components(w)) or 1, []).append(w)
    best: dict[str, tuple[int, int]] = {}   # id -> (folders before it, global row)
    ties: dict[str, list[int]] = {}
    for i, ids in folder.id_parts(kind):
        base = int(folder.starts[i])
        claimed = np.zeros(len(ids), bool)
        exact = pc.index_in(ids, value_set=pa.array(want, ids.type)).to_numpy(zero_copy_only=False)
        candidates = []  # (row, id, extra depth)
        hit = np.flatnonzero(~np.isnan(exact.astype(float)))
        for r in hit:
            candidates.append((int(r), want[int(exact[r])], 0))
        claimed[hit] = True
        if kind == "image":
            depth = (pc.count_substring(ids, "/").to_numpy(zero_copy_only=False) + 1
                     - pc.starts_with(ids, "/").to_numpy(zero_copy_only=False))  # non-empty path components
            for k in sorted(by_depth, reverse=True):  # the longest suffix first
                vs = pa.array(by_depth[k], ids.type)
                suffix = pc.extract_regex(ids, rf"(?:^|/)(?P<s>[^/]+(?:/[^/]+){{{k - 1}}})$").field("s") \
                    if k > 1 else pc.extract_regex(ids, r"(?:^|/)(?P<s>[^/]+)$").field("s")
                pos = pc.index_in(suffix, value_set=vs).to_numpy(zero_copy_only=False).astype(float)
                rows = np.flatnonzero(~np.isnan(pos) & ~claimed)
                for r in rows:
                    candidates.append((int(r), by_depth[k][int(pos[r])], int(depth[r]) - k))
                claimed[rows] = True
        for r, key, extra in candidates:
            g = base + r
            cur = best.get(key)
            if cur is None or extra < cur[0]:
                best[key] = (extra, g)
                ties.pop(key, None)
            elif extra == cur[0] and kind == "image":
                ties.setdefault(key, [cur[1]]).append(g)
    if ties:
        vec = folder.vectors(kind)
        for key, gs in ties.items():
            v = vec[np.array(gs)]
            differ = next((j for j in range(1, len(gs)) if not np.array_equal(v[0], v[j])), None)
            if differ is not None:
                raise DataError(f"{folder.root}: image id {key!r} matches rows {gs[0]} and {gs[differ]} of the "
                                f"metadata (paths {_path_of(folder, kind, gs[0])!r} and "
                                f"{_path_of(folder, kind, gs[differ])!r}) with different embeddings; give the "
                                f"annotation's longer path so one of them matches alone")
    return {k: g for k, (_, g) in best.items()}


def _path_of(folder: ClipRetrievalFolder, kind: str, g: int) -> str:
    i = int(np.searchsorted(folder.starts, g, side="right")) - 1
    col = KINDS[kind][2]
    return pq.read_table(folder.parts[i].metadata, columns=[col]).column(col)[g - int(folder.starts[i])].as_py()


def _match_normalised(folder: ClipRetrievalFolder, table, rows: np.ndarray) -> None:
    """Texts still unmatched: a metadata caption whose normalised form is the suite's entry."""
    need: dict[str, list[int]] = {}
    for r in np.flatnonzero(rows < 0):
        need.setdefault(table.entries[r], []).append(int(r))
    for i, ids in folder.id_parts("text"):
        base = int(folder.starts[i])
        for j, cap in enumerate(ids.to_pylist()):
            hit = need.pop(pre_caption(cap), None)
            if hit is not None:
                rows[hit] = base + j
                if not need:
                    return
