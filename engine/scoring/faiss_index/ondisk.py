"""FAISS IVF indexes kept in a folder: trained on a bounded sample, filled block by block, lists memory-mapped.

A folder ``IDX`` holds, when complete::

    index.json      the manifest, written last: what the index was built from (the corpus's identity), its
                    factory, its files with their sizes and checksums; without it nothing here is valid
    index.faiss     the index (quantiser, codebooks; with in-memory lists, the lists too)
    lists.ivfdata   the inverted lists (codes and row ids) of an index too large for the memory budget,
                    memory-mapped by FAISS's on-disk lists (``OnDiskInvertedLists``)
    build.json      what the build was asked (a resumed build must ask the same)

While it is built, ``trained.faiss`` (the trained, empty index) and ``blocks/block-NNNNNN.faiss`` (the codes
of one block of corpus rows, each written atomically as it finishes) appear; a killed build resumes at the
first block missing. Merging the blocks makes the lists; the manifest comes last, then the blocks go.

Training: k-means (spherical: unit vectors, inner product) on a sample whose fp32 copy takes at most a
quarter of the budget, one progress line per iteration, on the GPU when FAISS sees one; then the codes
(PQ / SQ) on the same sample. Adding: each block assigned to its lists (on the GPU when there is one) and
encoded on the CPU.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import torch

from hardrank.atomic import atomic_path, write_json_atomic
from hardrank.errors import DataError, NoSpace, UsageError
from hardrank.scoring import corpus_io
from hardrank.scoring.faiss_index import _size_pool
from hardrank.units import hms, size

__all__ = ["VERSION", "build", "check", "open_index", "manifest", "is_index_folder", "train_rows_for", "block_rows_for",
           "fits_memory", "code_bytes"]

VERSION = 1
MANIFEST, BUILD, TRAINED, BLOCKS, LISTS, INDEX = ("index.json", "build.json", "trained.faiss", "blocks",
                                                   "lists.ivfdata", "index.faiss")
_IP = faiss.METRIC_INNER_PRODUCT
_NITER = 10       # k-means iterations (faiss's default of 25 costs 2.5x for little search quality here)
_SAMPLED = 64     # chunks of a large file checksummed (at even offsets), with its size
_CHUNK = 1 << 16  # bytes a chunk


def code_bytes(factory: str, d: int) -> int:
    """Bytes a row's code takes in the lists (without its 8-byte id)."""
    index = faiss.index_factory(d, factory, _IP)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        raise UsageError(f"index {factory!r} is not an IVF index; an index kept in a folder is an IVF index "
                         f"(e.g. IVF4096,PQ128, IVF65536_HNSW32,PQ128, IVF1024,SQ8)")
    return int(ivf.code_size)


def fits_memory(factory: str, nb: int, d: int, budget_bytes: int) -> bool:
    """Whether the lists of ``factory`` over ``nb`` rows (codes + 8-byte ids) fit half the budget."""
    return nb * (code_bytes(factory, d) + 8) <= budget_bytes // 2


def _fast_scan(factory: str) -> bool:
    return "fs" in factory.split(",")[-1]


def _blocks_factory(factory: str) -> str:
    """What the blocks are built as: a fast-scan index (``PQ{m}x4fs``) as the same PQ with plain lists
    (``PQ{m}x4``), converted to fast-scan once merged: FAISS's ``merge_from`` corrupts fast-scan lists
    (a heap overrun after some 30 merges, faiss 1.15), and fast-scan lists cannot be memory-mapped."""
    return factory.replace("x4fsr", "x4").replace("x4fs", "x4")


def train_rows_for(nlist: int, nb: int, d: int, budget_bytes: int) -> int:
    """Training sample: 64 rows a list (PQ codebooks want >= 9,984), at most a quarter of the budget in
    fp32 and the whole corpus."""
    cap = max(1, (budget_bytes // 4) // (4 * d))
    return int(min(nb, cap, max(64 * nlist, 10_000)))


def block_rows_for(factory: str, d: int, budget_bytes: int) -> int:
    """Corpus rows added per block: the block's fp32 rows and its codes within an eighth of the budget."""
    return max(256, (budget_bytes // 8) // (4 * d + code_bytes(factory, d) + 8))


# -- small helpers -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_stdout():
    """FAISS's on-disk lists print to C's stdout ("resizing ...", "updating ondisk filename"): not on ours."""
    libc = ctypes.CDLL(None)
    with contextlib.suppress(ValueError, OSError):
        sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    try:
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


def _write_index(index, path: Path) -> None:
    """``index`` (a block, a trained index, an on-disk index's header: small) serialised and written atomically
    (a full disk: ``NoSpace`` naming the file)."""
    data = faiss.serialize_index(index)  # (n,) uint8
    with atomic_path(path, int(data.nbytes)) as tmp, open(tmp, "wb") as f:
        f.write(memoryview(data))
        f.flush()
        os.fsync(f.fileno())


def _write_large(index, path: Path, size: int) -> None:
    """``index`` (its lists in memory, up to half the budget) written by FAISS itself, atomically: no serialised
    copy beside it. FAISS's write error carries the C library's reason: a full disk becomes ``NoSpace``."""
    with atomic_path(path, size) as tmp:
        try:
            faiss.write_index(index, str(tmp))
        except RuntimeError as exc:
            msg = str(exc)
            for code in (errno.ENOSPC, errno.EDQUOT):
                if os.strerror(code) in msg:
                    raise OSError(code, os.strerror(code), str(tmp)) from None
            raise


def _read_index(path: Path, flags: int = 0):
    """An index file of the folder; on-disk lists are always looked up beside it (IO_FLAG_ONDISK_SAME_DIR):
    the file path FAISS stores inside an index is data, and a handed folder's could name any file."""
    try:
        with _quiet_stdout():
            return faiss.read_index(str(path), flags | faiss.IO_FLAG_ONDISK_SAME_DIR)
    except RuntimeError as exc:
        raise DataError(f"{path}: damaged: FAISS cannot read it ({str(exc).strip().splitlines()[-1][:200]})"
                        ) from None


def _checksum(path: Path) -> dict:
    """Size and blake2b of a file: the whole of it up to 256 MB, else ``_SAMPLED`` chunks at even offsets."""
    size = path.stat().st_size
    h = hashlib.blake2b(digest_size=16)
    whole = size <= 256 << 20
    with open(path, "rb") as f:
        if whole:
            for chunk in iter(lambda: f.read(8 << 20), b""):
                h.update(chunk)
        else:
            for off in np.linspace(0, size - _CHUNK, _SAMPLED).astype(np.int64):
                f.seek(int(off))
                h.update(f.read(_CHUNK))
    return {"bytes": size, "blake2b": h.hexdigest(), "checked": "whole" if whole else f"{_SAMPLED} chunks"}


def is_index_folder(path) -> bool:
    return (Path(path) / MANIFEST).is_file() or (Path(path) / BUILD).is_file()


def _gpu():
    """A FAISS GPU resource when this faiss build sees a GPU, else None."""
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        return faiss.StandardGpuResources()
    return None


def _flat(centroids: np.ndarray, res):
    """An exact inner-product index over the centroids (on the GPU when ``res``): assigns rows to lists."""
    q = faiss.IndexFlatIP(centroids.shape[1])
    q.add(centroids)
    return faiss.index_cpu_to_gpu(res, 0, q) if res is not None else q


# -- training -------------------------------------------------------------------------------------
def _kmeans(x: np.ndarray, nlist: int, seed: int, echo, res, chunk_rows: int) -> np.ndarray:
    """Spherical k-means of unit rows ``x`` (n, d) into ``nlist`` unit centroids, ``_NITER`` iterations; an
    emptied list takes a point of the largest one (as FAISS splits). One progress line per iteration."""
    n, d = x.shape
    rng = np.random.default_rng(seed)
    C = np.ascontiguousarray(x[np.sort(rng.choice(n, nlist, replace=False))])
    t0 = time.perf_counter()
    for it in range(_NITER):
        assign = np.empty(n, np.int64)
        q = _flat(C, res)
        for s in range(0, n, chunk_rows):
            assign[s:s + chunk_rows] = q.search(x[s:s + chunk_rows], 1)[1][:, 0]
        sums = torch.zeros(nlist, d, dtype=torch.float64)
        for s in range(0, n, chunk_rows):
            part = torch.from_numpy(x[s:s + chunk_rows]).double()
            sums.index_add_(0, torch.from_numpy(assign[s:s + chunk_rows]), part)
        counts = np.bincount(assign, minlength=nlist)
        for e in np.flatnonzero(counts == 0):  # an empty list: a point of the largest list, nudged
            big = int(np.argmax(counts))
            members = np.flatnonzero(assign == big)
            j = int(rng.choice(members))
            sums[e] = torch.from_numpy(x[j]).double()
            counts[e], counts[big] = 1, counts[big] - 1
            sums[big] -= sums[e]
            assign[j] = e
        C = sums.numpy()
        C = np.ascontiguousarray((C / np.maximum(np.linalg.norm(C, axis=1, keepdims=True), 1e-30)).astype(np.float32))
        dt = time.perf_counter() - t0
        echo(f"train: k-means iteration {it + 1}/{_NITER} ({n:,} rows into {nlist:,} lists), "
             f"{(it + 1) * n / dt:,.0f} rows/s, ETA {hms(dt / (it + 1) * (_NITER - it - 1))}")
    return C


def _train(xb, factory: str, train_rows: int, budget_bytes: int, seed: int, echo, res):
    """The trained, empty index (as its blocks are built: ``_blocks_factory``): coarse centroids by
    ``_kmeans`` on a sample, then the codes on it."""
    nb, d = xb.shape
    index = faiss.index_factory(d, _blocks_factory(factory), _IP)
    ivf = faiss.extract_index_ivf(index)
    rows = np.sort(np.random.default_rng(seed).choice(nb, train_rows, replace=False))
    x = corpus_io.gather(xb, rows, budget_bytes // 8)  # (train_rows, d) float32, sorted reads
    corpus_io.release(xb)
    t0 = time.perf_counter()
    chunk = max(1, (budget_bytes // 8) // max(1, 8 * ivf.nlist))
    C = _kmeans(x, ivf.nlist, seed, echo, res, chunk)
    ivf.quantizer.add(C)  # a quantiser holding nlist centroids is not trained again by index.train
    echo(f"train: codes ({factory.split(',')[-1]}) on {train_rows:,} rows")
    _light_codebooks(index)
    index.train(x)
    return index, time.perf_counter() - t0


def _light_codebooks(index) -> None:
    """8-bit PQ trains its 256-centroid codebooks on at most 64 x 256 rows for 10 iterations (FAISS: 256 x 256
    rows, 25 iterations, then a polysemous ordering the search never uses): with exact re-scoring the codes only
    choose candidates, and PQ128's codebooks took minutes on 2 cores."""
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    if isinstance(ivf, faiss.IndexIVFPQ):
        ivf.do_polysemous_training = False
        ivf.pq.cp.niter = _NITER
        ivf.pq.cp.max_points_per_centroid = 64


# -- the build --------------------------------------------------------------------------------------
def _block_path(folder: Path, b: int) -> Path:
    return folder / BLOCKS / f"block-{b:06d}.faiss"


def manifest(folder) -> dict | None:
    """The folder's manifest (a complete index), or None when it has none; an unreadable one is damage."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
        why = None if isinstance(m, dict) and m.get("version") == VERSION else (
            f"version {m.get('version') if isinstance(m, dict) else '?'}, expected {VERSION}")
        why = why or _malformed(m)
    except (OSError, ValueError) as exc:
        why = str(exc)
    if why is not None:
        raise DataError(f"{path}: damaged index manifest ({why}); rebuild the index: delete {folder}, then hardrank "
                        f"index build --corpus ... --out {folder}")
    return m


def _malformed(m: dict) -> str | None:
    """What in a manifest is not as ``build`` writes it (a folder is a user's: its manifest names the files that are
    checked, so each must be a plain name in the folder), else None."""
    ident, files = m.get("identity"), m.get("files")
    if not isinstance(m.get("factory"), str):
        return "no factory"
    if not isinstance(ident, dict) or not all(isinstance(ident.get(k), int) for k in ("rows", "dim")):
        return "no corpus identity (rows, dim)"
    if not isinstance(files, dict) or INDEX not in files:
        return f"no file list naming {INDEX}"
    for name, want in files.items():
        if Path(name).name != name or name in (".", ".."):
            return f"a file {name!r} that is not a plain name in the folder"
        if not (isinstance(want, dict) and isinstance(want.get("bytes"), int) and isinstance(want.get("blake2b"), str)):
            return f"no size and checksum for {name}"
    return None


def _differs(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _describe(identity: dict) -> str:
    return (f"{identity.get('rows', '?'):,} rows x {identity.get('dim', '?')}-d "
            f"{identity.get('modality', '')} (fingerprint {identity.get('fingerprint') or identity.get('vectors')})")


def build(folder, xb, factory: str, identity: dict, *, budget_bytes: int, seed: int = 0, echo=None,
          catalog_files: tuple[str, ...] = ()) -> dict:
    """Build (or resume, or find complete) the IVF index ``factory`` over ``xb`` (n, d) in ``folder``; returns
    the manifest. ``identity``: what the corpus is (rows, dim, fingerprint, a hash of sampled rows, the ids'
    digest), recorded and checked by ``open_index``. ``catalog_files``: files the caller wrote there first
    (the ids), checksummed into the manifest too. A full disk raises ``NoSpace`` naming the file; what was
    committed stays and a rerun resumes."""
    echo = echo or (lambda s: None)
    _size_pool()  # FAISS's threads: the run's budget (torch's)
    folder = Path(folder)
    nb, d = xb.shape
    done = manifest(folder)
    if done is not None:
        if done.get("identity") != identity:
            raise DataError(f"{folder} holds an index of another corpus ({_describe(done['identity'])}; this corpus: "
                            f"{_describe(identity)}; they differ in {_differs(done['identity'], identity)}): use "
                            f"another --out / --index-out, or delete {folder}")
        if done.get("factory") != factory:
            raise UsageError(f"{folder} holds a complete {done['factory']} index of this corpus, not {factory}: "
                             f"reuse it (mine --index {folder}), or build {factory} in another folder")
        echo(f"index: {folder} holds this corpus's {factory} index already; nothing to build")
        return done
    on_disk = not fits_memory(factory, nb, d, budget_bytes) or nb == 0
    if on_disk and _fast_scan(factory):
        raise UsageError(f"index {factory!r}: its lists ({size(nb * (code_bytes(factory, d) + 8))}) exceed half of "
                         f"--budget-mb {budget_bytes >> 20}, and FAISS cannot memory-map fast-scan (x4fs) lists; "
                         f"use 8-bit codes (e.g. {factory.rsplit(',', 1)[0]},PQ{d // 4}) or a larger --budget-mb")
    ivf_probe = faiss.extract_index_ivf(faiss.index_factory(d, factory, _IP))
    nlist = int(ivf_probe.nlist)
    if nb < nlist:
        raise UsageError(f"index {factory!r} has {nlist:,} lists for a corpus of {nb:,} rows; use fewer lists "
                         f"(about 2 sqrt(rows)) or exact search")
    plan = {"version": VERSION, "factory": factory, "identity": identity, "nlist": nlist,
            "train_rows": train_rows_for(nlist, nb, d, budget_bytes), "block_rows": block_rows_for(factory, d,
                                                                                                budget_bytes),
            "lists": "on disk, memory-mapped" if on_disk else "in memory", "seed": seed}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "exact_topk.npz").unlink(missing_ok=True)  # exact answers a mining run kept for another index
    bpath = folder / BUILD
    if bpath.exists():
        try:
            old = json.loads(bpath.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if old != json.loads(json.dumps(plan)):
            what = _differs(old, plan) if isinstance(old, dict) else ["build.json unreadable"]
            raise UsageError(f"{folder} holds an unfinished build of another index (it differs in {what}); "
                             f"finish it with the same corpus and options, or delete {folder} to start over")
    else:
        write_json_atomic(bpath, plan)
    res = _gpu()
    timings = {}
    t_all = time.perf_counter()
    tpath = folder / TRAINED
    if tpath.exists():
        trained = _read_index(tpath)
        echo(f"train: reused {tpath}")
    else:
        echo(f"train: {factory} on {plan['train_rows']:,} of {nb:,} rows"
             + (" (k-means on the GPU)" if res is not None else ""))
        trained, timings["train"] = _train(xb, factory, plan["train_rows"], budget_bytes, seed, echo, res)
        _write_index(trained, tpath)
    _add_blocks(folder, xb, trained, plan, res, echo, timings)
    t0 = time.perf_counter()
    index_file = folder / INDEX
    if on_disk:
        _merge_on_disk(folder, trained, plan, nb)
    else:
        merged = faiss.clone_index(trained)
        for b in range(math.ceil(nb / plan["block_rows"])):
            merged.merge_from(_read_index(_block_path(folder, b)), 0)
        # the plain lists packed for fast-scan, once whole, then let go (the packed index borrows the plain one's
        # quantiser, which therefore lives until the file is written)
        packed = merged
        if _fast_scan(factory):
            packed = faiss.IndexIVFPQFastScan(faiss.downcast_index(faiss.extract_index_ivf(merged)))
            faiss.extract_index_ivf(merged).invlists.reset()
        _write_large(packed, index_file, nb * (code_bytes(factory, d) + 8))
        del packed, merged
    timings["merge"] = time.perf_counter() - t0
    files = {name: _checksum(folder / name) for name in (INDEX, LISTS, *catalog_files) if (folder / name).exists()}
    done = {**plan, "rows": nb, "dim": d, "code_bytes": code_bytes(factory, d), "files": files,
            "seconds": {k: round(v, 1) for k, v in timings.items()} | {"total": round(time.perf_counter() - t_all, 1)},
            "gpu": res is not None}
    write_json_atomic(folder / MANIFEST, done)  # last: the index is valid from here on
    shutil.rmtree(folder / BLOCKS, ignore_errors=True)
    tpath.unlink(missing_ok=True)
    echo(f"index: {factory} over {nb:,} rows written to {folder} ({size(sum(f['bytes'] for f in files.values()))})")
    return done


def _add_blocks(folder: Path, xb, trained, plan: dict, res, echo, timings: dict) -> None:
    """Each block of ``plan['block_rows']`` corpus rows encoded and written as its own file; blocks already
    written (a killed build) are skipped. The first block timed says how long the rest will take."""
    nb = len(xb)
    R = plan["block_rows"]
    n_blocks = math.ceil(nb / R)
    (folder / BLOCKS).mkdir(exist_ok=True)
    todo = [b for b in range(n_blocks) if not _block_path(folder, b).exists()]
    if len(todo) < n_blocks:
        echo(f"add: {n_blocks - len(todo)} of {n_blocks} block(s) committed before; resuming")
    q = faiss.extract_index_ivf(trained).quantizer
    # on a GPU, rows are assigned to their lists there (exactly: the nearest centroid), then encoded here
    assigner = _flat(q.reconstruct_n(0, q.ntotal), res) if res is not None else None
    t0, rows_done, last = time.perf_counter(), 0, 0.0
    for i, b in enumerate(todo):
        lo, hi = b * R, min(nb, (b + 1) * R)
        x = corpus_io.read_tile(xb, lo, hi)
        corpus_io.release(xb)
        block = faiss.clone_index(trained)
        _add(block, x, np.arange(lo, hi, dtype=np.int64), assigner)
        _write_index(block, _block_path(folder, b))
        del block, x
        rows_done += hi - lo
        dt = time.perf_counter() - t0
        left = sum(min(nb, (c + 1) * R) - c * R for c in todo[i + 1:])
        now = time.perf_counter()
        if i == 0 and not left:
            echo(f"add: {hi - lo:,} rows (the last block) in {dt:.1f}s")
        elif i == 0:
            echo(f"add: first block of {hi - lo:,} rows in {dt:.1f}s: about {hms(dt / (hi - lo) * left)} for the "
                 f"other {len(todo) - 1:,} block(s) ({left:,} rows) on this machine")
        elif now - last >= 10 or not left:
            echo(f"add: block {b + 1}/{n_blocks} committed, {rows_done / dt:,.0f} rows/s, "
                 f"ETA {hms(dt / rows_done * left)}")
            last = now
    timings["add"] = time.perf_counter() - t0


def _add(index, x: np.ndarray, ids: np.ndarray, assigner) -> None:
    """Rows ``x`` added to ``index`` under ``ids``; ``assigner`` (an index over the centroids, on the GPU)
    picks their lists when given, else the index's own quantiser does."""
    if assigner is None:
        index.add_with_ids(x, ids)
        return
    _, a = assigner.search(x, 1)
    a = np.ascontiguousarray(a[:, 0].astype(np.int64))
    ivf = faiss.extract_index_ivf(index)
    ivf.add_core(len(x), faiss.swig_ptr(x), faiss.swig_ptr(ids), faiss.swig_ptr(a))
    index.ntotal = ivf.ntotal


def _block_lists(path: Path):
    """A committed block's index, memory-mapped from its file, holding its lists without the coarse quantiser
    every block file also holds (nlist x d floats: 4 MiB at 2,048 x 512): holding every block's (503 blocks of
    a 30.9M-row corpus) held 2.2 GiB beside the budget while the lists were merged. The quantiser is freed
    here, an empty one in its place (the block is only a holder of its lists, never searched)."""
    block = _read_index(path, faiss.IO_FLAG_MMAP)
    ivf = faiss.extract_index_ivf(block)
    if ivf.own_fields:
        quantiser = faiss.downcast_index(ivf.quantizer)
        empty = faiss.IndexFlatIP(ivf.d)
        ivf.own_fields = False
        ivf.quantizer = empty
        block.referenced_objects = [empty]  # (faiss's own way to keep a field alive with its index)
        quantiser.this.own(True)  # freed with this object, now
        del quantiser
    return block


def _merge_on_disk(folder: Path, trained, plan: dict, nb: int) -> None:
    """The blocks' lists merged into ``lists.ivfdata`` (FAISS's on-disk lists), then ``index.faiss``. FAISS
    writes the merged file through a memory map, where a full disk is a crash, not an error: the space it
    needs is checked first."""
    code = int(faiss.extract_index_ivf(trained).code_size)
    need = nb * (code + 8)
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    lists = folder / LISTS
    have = lists.stat().st_size if lists.exists() else 0
    if free + have < need + (64 << 20):
        raise NoSpace(f"no space left on the device for {lists} (it needs about {size(need)}, {size(free)} free "
                      f"there); free some space there or build the index on another disk (--out / --index-out), "
                      f"then run the same command again: the {math.ceil(nb / plan['block_rows'])} committed blocks "
                      f"are kept")
    index = faiss.clone_index(trained)
    ivf = faiss.extract_index_ivf(index)
    parts = [_block_lists(_block_path(folder, b)) for b in range(math.ceil(nb / plan["block_rows"]))]
    vec = faiss.InvertedListsPtrVector()
    for p in parts:
        vec.push_back(faiss.extract_index_ivf(p).invlists)
    lists.unlink(missing_ok=True)
    with _quiet_stdout():  # (index.faiss names the file; open_index reads it from the folder, wherever it moved)
        il = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(lists.resolve()))
        ntotal = il.merge_from_multiple(vec.data(), vec.size(), False, False)
    ivf.ntotal = index.ntotal = ntotal
    ivf.replace_invlists(il, True)
    il.this.disown()
    _write_index(index, folder / INDEX)
    del index, parts


def check(folder, identity: dict) -> dict:
    """The manifest of a complete index folder built from the corpus ``identity`` describes, its files checked
    (sizes and checksums); without reading the index. Errors (one line each, naming the folder and the fix): no
    index there, an unfinished build, another corpus or dimension, a damaged file."""
    folder = Path(folder)
    m = manifest(folder)
    if m is None:
        if (folder / BUILD).exists():
            n = len(list((folder / BLOCKS).glob("block-*.faiss"))) if (folder / BLOCKS).is_dir() else 0
            raise DataError(f"{folder}: an index build that did not finish ({n} block(s) committed); resume it with "
                            f"the same command (hardrank index build ... --out {folder}, or mine --index-out "
                            f"{folder})")
        raise DataError(f"{folder}: no index there (no {MANIFEST}); build one with hardrank index build --corpus ... "
                        f"--out {folder}, or mine with --index-out {folder}")
    have = m.get("identity", {})
    if have != identity:
        diff = _differs(have, identity)
        what = "dimension" if "dim" in diff else "corpus"
        raise DataError(f"{folder}: an index of another {what} ({_describe(have)}; this corpus: {_describe(identity)}; "
                        f"they differ in {diff}); build one for this corpus (hardrank index build --corpus ... "
                        f"--out NEW_FOLDER, or mine --index-out NEW_FOLDER)")
    for name, want in m["files"].items():
        path = folder / name
        got = _checksum(path) if path.is_file() and not path.is_symlink() else None  # (not a FIFO, device or link)
        if got != want:
            why = "missing" if got is None else (f"{got['bytes']:,} bytes, expected {want['bytes']:,}"
                                                 if got["bytes"] != want["bytes"] else "its checksum differs")
            raise DataError(f"{path}: damaged index file ({why}); rebuild the index: delete {folder} and run "
                            f"hardrank index build --corpus ... --out {folder}")
    return m


def open_index(folder, identity: dict):
    """(the FAISS index, its manifest) of a complete index folder built from the corpus ``identity`` describes
    (``check``); lists on disk are memory-mapped, not read."""
    folder = Path(folder)
    m = check(folder, identity)
    have = m["identity"]
    index = _read_index(folder / INDEX)
    if index.ntotal != have.get("rows") or index.d != have.get("dim"):
        raise DataError(f"{folder / INDEX}: damaged index file (it holds {index.ntotal:,} rows of {index.d}-d, the "
                        f"manifest says {have.get('rows'):,} of {have.get('dim')}-d); delete {folder} and rebuild")
    return index, m
