"""Mining past memory: the exact pass streams the corpus in tiles (bit-identical to the kernel over the whole
corpus), candidates are read in sorted batches, an index is built once into a folder (blocks committed as
they finish: a killed build resumes) and reused by later runs, and a wrong, damaged or half-built index, or a
full disk, ends in one line."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_interop import write_clip_retrieval

from hardrank.config import MineOptions
from hardrank.jobs.cli import main
from hardrank.kernels import topk
from hardrank.kernels.reference import topk_reference
from hardrank.mining import MineProblem, mine_arrays
from hardrank.mining.progress import Progress
from hardrank.scoring import corpus_io
from hardrank.scoring.backends.exhaustive import KernelSearch

pytestmark = pytest.mark.usefixtures("one_faiss_thread")


def _csr(lists):
    ptr = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=ptr[1:])
    return ptr, np.array([i for x in lists for i in x], np.int64)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.int32)


# -- the exact pass, streamed ------------------------------------------------------------------------------
@pytest.mark.parametrize("nb", [1, 7, 63, 64, 65, 200])
def test_the_streamed_exact_pass_is_bit_identical_to_one_kernel_call_within_its_tile(tmp_path, nb):
    """Small-integer vectors (real ties), duplicated rows, k beyond the corpus, one row, tiles of 1 row, of
    the corpus +-1 and of 64 rows against corpora of 63/64/65 rows; an fp16 memory-mapped corpus (read a
    tile at a time, fp16 on disk) against the kernel over the whole fp32 corpus in memory, and its slow twin."""
    rng = np.random.default_rng(nb)
    d = 8
    xb = rng.integers(-2, 3, (nb, d)).astype(np.float32)
    if nb > 3:
        xb[nb // 2:nb // 2 + 2] = xb[:2]  # duplicates: equal scores, the lower row first
    np.save(tmp_path / "xb.npy", xb.astype(np.float16))
    mapped = np.load(tmp_path / "xb.npy", mmap_mode="r")  # (nb, d) float16 on disk
    xq = rng.integers(-2, 3, (11, d)).astype(np.float32)
    xq[3] = 0  # every score ties
    excl = _csr([rng.choice(nb, min(nb, int(rng.integers(0, 4))), replace=False).tolist() for _ in range(11)])
    for kk in (1, 5, nb, nb + 3):
        ref_D, ref_I = topk(torch.from_numpy(xq), torch.from_numpy(xb), kk, exclude_ptr=torch.from_numpy(excl[0]),
                            exclude_idx=torch.from_numpy(excl[1]))
        slow_D, slow_I = topk_reference(torch.from_numpy(xq), torch.from_numpy(xb), kk,
                                        exclude_ptr=torch.from_numpy(excl[0]), exclude_idx=torch.from_numpy(excl[1]))
        np.testing.assert_array_equal(ref_I.numpy(), slow_I.numpy())
        for tile in ({1, max(1, nb - 1), nb, nb + 1, 64} if nb <= 65 else {7, 64, nb - 1}):
            s = KernelSearch(mapped, 4 * (4 * d) * tile)  # a quarter of the budget holds one fp32 tile
            assert s.tile_rows == min(nb, tile) and s.exact
            D, I = s(xq, kk, excl)
            np.testing.assert_array_equal(I, ref_I.numpy())
            np.testing.assert_array_equal(_bits(D), _bits(ref_D.numpy()))


def test_exact_search_of_a_corpus_beyond_the_budget_streams_it_within_memory(tmp_path):
    """400,000 x 128 fp16 on disk (102 MB; 205 MB as fp32) searched exactly with a 4 MiB budget in a child
    process: its anonymous memory grows by far less than the corpus (the old exact path copied it whole to
    fp32), and its file-backed pages are let go tile by tile."""
    rng = np.random.default_rng(0)
    xb = np.lib.format.open_memmap(tmp_path / "xb.npy", "w+", np.float16, (400_000, 128))
    for s in range(0, 400_000, 100_000):
        x = rng.standard_normal((100_000, 128), dtype=np.float32)
        xb[s:s + 100_000] = x / np.linalg.norm(x, axis=1, keepdims=True)
    xb.flush()
    del xb
    child = f"""
import json, numpy as np
from hardrank.config import MineOptions
from hardrank.mining import MineProblem, mine_arrays
from hardrank.mining.memory import status
import hardrank.scoring.faiss_index
xb = np.load({str(tmp_path / 'xb.npy')!r}, mmap_mode="r")
xq = np.ascontiguousarray(xb[:20], dtype=np.float32)
p = MineProblem(xq=xq, xb=xb, query_ids=[str(i) for i in range(20)], corpus_ids=[str(i) for i in range(len(xb))])
s = mine_arrays(p, MineOptions(k=5, search="exact", budget_mb=4, recall_sample=0), {str(tmp_path / 'out')!r},
                echo=lambda m: None)
print(json.dumps(s["memory"]))
"""
    got = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    m = json.loads(got.stdout.strip().splitlines()[-1])
    corpus_fp32_mb = 400_000 * 128 * 4 / 2**20
    assert m["peak_anon_mb"] - m["start_anon_mb"] < corpus_fp32_mb / 4, m  # ids (~30 MB) and tiles, not the corpus
    assert m["peak_file_mb"] - m["start_file_mb"] < 400_000 * 128 * 2 / 2**20 / 2, m  # pages released as it goes
    assert m["within_aim"] is True
    t = pq.read_table(tmp_path / "out" / "negatives").to_pydict()
    assert [n for q, n in zip(t["query_id"], t["negative_id"]) if q == "3"][0] == "3"  # its own row first


class _Recorder:
    """An (n, d) array-like that records the rows each read asks for."""

    def __init__(self, x):
        self.x, self.shape, self.dtype, self.ndim, self.reads = x, x.shape, x.dtype, 2, []

    def __getitem__(self, idx):
        self.reads.append(np.asarray(idx))
        return self.x[idx]

    def __array__(self, dtype=None, copy=None):
        return self.x


def test_candidates_are_read_in_sorted_batches_each_row_once_and_rescored_exactly():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((500, 16)).astype(np.float32)
    xq = rng.standard_normal((40, 16)).astype(np.float32)
    I = rng.integers(-1, 500, (40, 25))
    I[5] = I[4]  # repeated candidates across queries
    rec = _Recorder(x)
    D = corpus_io.rescore(xq, rec, I, budget_bytes=24 * 16 * 300)  # batches of 300 candidate pairs
    want = np.where(I >= 0, np.einsum("md,mkd->mk", xq.astype(np.float64),
                                      x[np.where(I >= 0, I, 0)].astype(np.float64)), -np.inf).astype(np.float32)
    np.testing.assert_array_equal(D, want)
    assert len(rec.reads) > 1
    for r in rec.reads:
        assert r.ndim == 1 and np.all(np.diff(r) > 0)  # sorted, each row once a batch
    assert sum(len(r) for r in rec.reads) <= len(np.unique(I[I >= 0])) + len(rec.reads)
    rec.reads.clear()
    G = corpus_io.gather(rec, I, budget_bytes=4 * 16 * 100)
    np.testing.assert_array_equal(G, x[np.where(I >= 0, I, 0)])
    assert all(np.all(np.diff(r) > 0) for r in rec.reads) and sum(len(r) for r in rec.reads) == len(
        np.unique(np.where(I >= 0, I, 0)))


def test_the_recall_sample_is_searched_exactly_once_and_reused(monkeypatch, tmp_path):
    """One exact search of the recall sample tunes nprobe and is the written recall's reference (they searched
    the sample twice, and an exact run searched it again to check itself); an exact run searches nothing more."""
    from hardrank.mining import searcher

    built = []
    real = searcher.ExactReference.__init__

    def counting(self, *a, **kw):
        built.append(1)
        real(self, *a, **kw)
    monkeypatch.setattr(searcher.ExactReference, "__init__", counting)
    rng = np.random.default_rng(4)
    xb = rng.standard_normal((3000, 32)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    p = MineProblem(xq=xb[:150] + 0.1, xb=xb, query_ids=[f"q{i}" for i in range(150)],
                    corpus_ids=[f"c{i}" for i in range(3000)])
    s = mine_arrays(p, MineOptions(k=5, search="faiss:IVF32,Flat", recall_sample=100), tmp_path / "ivf")
    assert len(built) == 1 and s["recall"]["sample"] == 100 and s["search"]["tuning_sample"] == 100
    built.clear()
    s = mine_arrays(p, MineOptions(k=5, search="exact", recall_sample=100), tmp_path / "ex")
    assert built == [] and s["recall"]["recall@5"] == 1.0 and "own search, which is exact" in s["recall"]["reference"]


def test_progress_lines_carry_rate_and_eta():
    t = [0.0]
    lines = []
    p = Progress(lines.append, "block 1/3: exact pass", 1000, every=10, clock=lambda: t[0])
    for _ in range(10):
        t[0] += 3
        p.update(100)
    assert lines and all("rows/s" in x and "ETA" in x for x in lines[:-1])
    assert lines[0].startswith("block 1/3: exact pass: 400/1,000 rows (40%), 33 rows/s, ETA 0:18")
    assert lines[-1].startswith("block 1/3: exact pass: 1,000/1,000 rows (100%)")


# -- an index kept in a folder ---------------------------------------------------------------------------------
def _corpus(root: Path, n: int = 6000, d: int = 32, seed: int = 0, parts: int = 3):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(40, d))
    img = c[rng.integers(0, 40, n)] + 0.4 * rng.normal(size=(n, d))
    samples = [(f"shard/{i:06d}.jpg", f"a photo {i}", img[i], img[i] + 0.3 * rng.normal(size=d)) for i in range(n)]
    return write_clip_retrieval(root, samples, parts=parts), img


def _queries(path: Path, img, n: int, seed: int, d: int = 32):
    rng = np.random.default_rng(seed)
    q = img[:n] + 0.4 * rng.normal(size=(n, d))
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    pq.write_table(pa.table({"kind": ["text"] * n, "id": [f"q{seed}-{i}" for i in range(n)],
                             "embedding": pa.FixedSizeListArray.from_arrays(pa.array(q.ravel()), d)}), path)
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("mine_index")
    cr, img = _corpus(root / "cr")
    return {"root": root, "cr": str(cr), "img": img, "q1": _queries(root / "q1.parquet", img, 200, 1),
            "q2": _queries(root / "q2.parquet", img, 120, 2)}


def _negatives(out) -> dict:
    t = pq.read_table(Path(out) / "negatives").to_pydict()
    return {(q, r): (n, s) for q, r, n, s in zip(t["query_id"], t["rank"], t["negative_id"], t["score"])}


def _mtimes(folder: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()}


def test_an_index_built_once_is_reused_by_later_runs_with_other_queries_and_k(corpus, tmp_path, capsys):
    idx = tmp_path / "idx"
    args = ["--corpus", corpus["cr"], "--quiet"]
    assert main(["index", "build", *args, "--out", str(idx), "--factory", "IVF32,Flat", "--budget-mb", "1"]) == 0
    assert "mine with: hardrank mine --corpus" in capsys.readouterr().out
    files = sorted(p.name for p in idx.iterdir())
    assert files == ["build.json", "ids.arrow", "ids.json", "index.faiss", "index.json", "lists.ivfdata"]
    m = json.loads((idx / "index.json").read_text())
    assert m["lists"] == "on disk, memory-mapped" and m["identity"]["rows"] == 6000 and m["identity"]["dim"] == 32
    before = _mtimes(idx)
    runs = [("q1", "5"), ("q2", "3"), ("q1", "5")]
    search = []
    for i, (q, k) in enumerate(runs):
        assert main(["mine", *args, "--queries", corpus[q], "-k", k, "--index", str(idx), "--recall-target", "0.999",
                     "--out", str(tmp_path / f"m{i}")]) == 0  # (a target nprobe 1 misses: tuning has a way to go)
        s = json.loads((tmp_path / f"m{i}" / "summary.json").read_text())
        assert s["search"]["factory"] == "IVF32,Flat" and s["search"]["index_folder"] == str(idx)
        assert s["inputs"]["corpus"]["ids"] == f"memory-mapped: {idx / 'ids.arrow'}"  # not read from the metadata
        assert s["recall"]["met"], s["recall"]
        # the recall sample's exact answers, kept in the folder: the same queries again search the corpus for none
        assert s["search"]["recall_sample_reused"] == (200 if i == 2 else 0)
        search.append(s["search"])
    # the tuning kept there too: another query set starts at the kept setting (measured there first); the same
    # queries again get the first run's tuning back, not searched again
    assert search[0]["tuning"][0]["nprobe"] == 1 and search[0]["nprobe"] > 1 and "tuning_start" not in search[0]
    assert search[1]["tuning"][0]["nprobe"] == search[0]["nprobe"] and "tuning.json" in search[1]["tuning_start"]
    assert search[2]["tuning"] == search[0]["tuning"] and search[2]["nprobe"] == search[0]["nprobe"]
    assert "tuning.json" in search[2]["tuning_reused"]
    for f in ("exact_topk.npz", "tuning.json"):  # (the files runs add there)
        before[f] = (idx / f).stat().st_mtime_ns
    assert _mtimes(idx) == before  # nothing built, nothing rewritten
    assert _negatives(tmp_path / "m0") == _negatives(tmp_path / "m2")
    # mine --index-out into a fresh folder builds the same index (same sample, same blocks): the same negatives
    assert main(["mine", *args, "--queries", corpus["q1"], "-k", "5", "--search", "faiss:IVF32,Flat", "--budget-mb",
                 "1", "--recall-target", "0.999", "--index-out", str(tmp_path / "idx2"), "--out",
                 str(tmp_path / "m3")]) == 0
    assert _negatives(tmp_path / "m3") == _negatives(tmp_path / "m0")
    assert not (tmp_path / "idx2" / "blocks").exists() and (tmp_path / "idx2" / "index.json").is_file()


def test_a_kept_tuning_is_used_only_as_written_there(tmp_path):
    """An index folder is a user's: a tuning.json not as runs write it (another type, a bad nprobe or refine,
    damaged JSON) is passed over, never trusted nor a crash; a run's own record comes back."""
    from hardrank.mining.searcher import TuningMemo

    good = {"sample": "ab", "target": 0.95, "met": True, "tuning_recall@10": 0.96, "nprobe": 8, "refine": 2,
            "tuning": [], "seconds_per_query": 0.01}
    path = tmp_path / "tuning.json"
    for text in ("{", "[]", '{"tunings": 3}', json.dumps({"tunings": [dict(good, nprobe=0), dict(good, nprobe="8"),
                                                                   dict(good, refine=10 ** 9), [1], None]})):
        path.write_text(text)
        memo = TuningMemo(path)
        assert memo.kept == [] and memo.start(0.95) is None and memo.same("ab", 0.95) is None
    memo.save(good)
    again = TuningMemo(path)
    assert again.same("ab", 0.95) == good and again.start(0.95) == good and again.start(0.9) is None
    assert again.same("cd", 0.95) is None


def test_exact_mining_streams_a_clip_retrieval_corpus_and_auto_plans_it(corpus, tmp_path, capsys):
    base = ["mine", "--corpus", corpus["cr"], "--queries", corpus["q1"], "-k", "5", "--budget-mb", "1"]
    assert main([*base, "--search", "exact", "--out", str(tmp_path / "ex")]) == 0
    err = capsys.readouterr().err
    assert "exact search (kernels.topk, the corpus streamed in tiles)" in err
    s = json.loads((tmp_path / "ex" / "summary.json").read_text())
    assert s["search"]["tile_rows"] < 6000 and s["recall"]["recall@5"] == 1.0
    assert main([*base, "--out", str(tmp_path / "auto")]) == 0  # auto: seconds of exact work, so exact
    err = capsys.readouterr().err
    assert "why: auto: 200 x 6,000 x 32 multiply-adds take seconds" in err
    assert _negatives(tmp_path / "auto") == _negatives(tmp_path / "ex")


def test_an_index_of_another_corpus_or_dimension_or_damaged_or_unfinished_is_one_line(corpus, tmp_path, capsys):
    idx = tmp_path / "idx"
    assert main(["index", "build", "--corpus", corpus["cr"], "--out", str(idx), "--factory", "IVF16,Flat",
                 "--budget-mb", "1", "--quiet"]) == 0  # 816 KB of lists: on disk
    other, img = _corpus(tmp_path / "other", n=3000, seed=5)
    wide, _ = _corpus(tmp_path / "wide", n=3000, d=48, seed=6)
    cases = [(str(other), corpus["q1"], "an index of another corpus"),
             (str(wide), _queries(tmp_path / "qw.parquet", _, 20, 3, d=48), "an index of another dimension")]
    capsys.readouterr()
    for cr, q, said in cases:
        assert main(["mine", "--corpus", cr, "--queries", q, "--index", str(idx), "--out", str(tmp_path / "x"),
                     "--quiet"]) == 3
        assert not list((tmp_path / "x").rglob("*"))  # said before anything is written
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert len(err) == 1 and said in err[0] and "Traceback" not in err[0], err
        assert "build one for this corpus" in err[0]
    assert main(["mine", "--corpus", corpus["cr"], "--queries", corpus["q1"], "--index", str(idx), "--out",
                 str(tmp_path / "y"), "--quiet"]) == 0  # the index folder is as it was
    mine = ["mine", "--corpus", corpus["cr"], "--queries", corpus["q1"]]
    damaged = [("index.faiss", lambda p: p.write_bytes(p.read_bytes()[:-100]), "damaged index file"),
               ("lists.ivfdata", lambda p: p.write_bytes(b"\0" * p.stat().st_size), "damaged index file"),
               ("index.json", lambda p: p.write_text("{not json"), "damaged index manifest")]

    def manifest(edit):
        def spoil(p):
            m = json.loads(p.read_text())
            edit(m)
            p.write_text(json.dumps(m))
        return spoil
    # a handed folder's manifest names the files checked: one naming a file outside it (a device that never ends,
    # a path up), or a manifest not as the build writes it, is refused before any file is read
    for name in ("/dev/zero", "../outside.arrow"):
        damaged.append(("index.json", manifest(lambda m, n=name: m["files"].update({n: {"bytes": 0, "blake2b": ""}})),
                        f"damaged index manifest (a file {name!r} that is not a plain name in the folder)"))
    damaged.append(("index.json", manifest(lambda m: m["identity"].update(rows="many")),
                    "damaged index manifest (no corpus identity (rows, dim))"))
    for i, (name, spoil, said) in enumerate(damaged):
        copy = tmp_path / f"spoilt{i}"
        copy.mkdir()
        for f in idx.iterdir():
            (copy / f.name).write_bytes(f.read_bytes())
        spoil(copy / name)
        assert main([*mine, "--index", str(copy), "--quiet", "--out", str(tmp_path / f"d{i}")]) == 3
        err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert len(err) == 1 and err[0].startswith(f"hardrank: error: {copy / name}: {said}"), err
        assert not list((tmp_path / f"d{i}" / "negatives").glob("*.parquet"))
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "build.json").write_text((idx / "build.json").read_text())
    assert main([*mine, "--index", str(tmp_path / "half"), "--quiet", "--out", str(tmp_path / "h")]) == 3
    assert "an index build that did not finish" in capsys.readouterr().err
    assert main([*mine, "--index", str(tmp_path / "none"), "--quiet", "--out", str(tmp_path / "n")]) == 3
    assert "--index" in capsys.readouterr().err


_KILLER = """
import os, signal, sys
from hardrank.jobs.cli import main
from hardrank.scoring.faiss_index import ondisk
real = ondisk._write_index
def write(index, path):
    real(index, path)
    if path.parent.name == "blocks" and len(list(path.parent.glob("block-*.faiss"))) == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # killed right after its third block was committed
ondisk._write_index = write
sys.exit(main(sys.argv[1:]))
"""


def test_a_build_killed_between_blocks_resumes_at_the_next_and_equals_a_clean_one(corpus, tmp_path, capsys):
    args = ["index", "build", "--corpus", corpus["cr"], "--factory", "IVF16,Flat", "--budget-mb", "1"]
    got = subprocess.run([sys.executable, "-c", _KILLER, *args, "--out", str(tmp_path / "idx")],
                         capture_output=True, text=True, timeout=600)
    assert got.returncode == -9, got.stderr[-2000:]
    blocks = sorted((tmp_path / "idx" / "blocks").glob("block-*.faiss"))
    assert len(blocks) == 3 and not (tmp_path / "idx" / "index.json").exists()
    kept = {b.name: b.stat().st_mtime_ns for b in blocks}
    assert main(["mine", "--corpus", corpus["cr"], "--queries", corpus["q1"], "--index", str(tmp_path / "idx"),
                 "--out", str(tmp_path / "x"), "--quiet"]) == 3  # not an index yet
    assert "an index build that did not finish (3 block(s) committed)" in capsys.readouterr().err
    from hardrank.scoring.faiss_index import ondisk

    written = []
    real_write = ondisk._write_index

    def spy(index, path):
        written.append(path.name)
        if path.name in kept:
            assert path.stat().st_mtime_ns == kept[path.name]  # (never reached: committed blocks are skipped)
        real_write(index, path)
    ondisk._write_index = spy
    try:
        assert main([*args, "--out", str(tmp_path / "idx")]) == 0
    finally:
        ondisk._write_index = real_write
    assert "add: 3 of" in capsys.readouterr().err and not set(kept) & set(written)
    assert main([*args, "--out", str(tmp_path / "clean"), "--quiet"]) == 0
    a, b = (json.loads((tmp_path / f / "index.json").read_text()) for f in ("idx", "clean"))
    assert a["files"]["lists.ivfdata"] == b["files"]["lists.ivfdata"]  # the same lists, byte for byte
    q = np.ascontiguousarray(corpus["img"][:50], np.float32)
    got = [ondisk.open_index(tmp_path / f, a["identity"])[0].search(q, 10) for f in ("idx", "clean")]
    np.testing.assert_array_equal(got[0][1], got[1][1])  # (index.faiss names its lists file by its own path)


def test_a_full_disk_during_the_build_is_one_line_and_leaves_nothing_valid(corpus, tmp_path, capsys, monkeypatch):
    from hardrank.scoring.faiss_index import ondisk

    real_open = open

    def full(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        if "w" in mode and "block-000002" in str(path):
            real_write = f.write

            def write(data):
                real_write(bytes(data)[:len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            f.write = write
        return f
    monkeypatch.setattr(ondisk, "open", full, raising=False)
    args = ["index", "build", "--corpus", corpus["cr"], "--factory", "IVF16,Flat", "--budget-mb", "1"]
    idx = tmp_path / "idx"
    assert main([*args, "--out", str(idx), "--quiet"]) == 5
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith(f"hardrank: error: no space left on the device writing "
                                               f"{idx / 'blocks' / 'block-000002.faiss'}"), err
    assert not list(idx.rglob("*.tmp")) and not (idx / "index.json").exists()
    assert sorted(p.name for p in (idx / "blocks").iterdir()) == ["block-000000.faiss", "block-000001.faiss"]
    monkeypatch.undo()
    # the merge checks its space first (FAISS writes it through a memory map, where a full disk is a crash)
    real_statvfs = os.statvfs
    monkeypatch.setattr(ondisk.os, "statvfs", lambda p: os.statvfs_result(
        tuple(real_statvfs(p))[:4] + (0,) + tuple(real_statvfs(p))[5:]))
    assert main([*args, "--out", str(idx), "--quiet"]) == 5
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and f"no space left on the device for {idx / 'lists.ivfdata'}" in err[0], err
    assert "committed blocks are kept" in err[0] and not (idx / "index.json").exists()
    monkeypatch.undo()
    assert main([*args, "--out", str(idx), "--quiet"]) == 0
    assert main([*args, "--out", str(tmp_path / "clean"), "--quiet"]) == 0
    a, b = (json.loads((tmp_path / f / "index.json").read_text()) for f in ("idx", "clean"))
    assert a["files"]["lists.ivfdata"] == b["files"]["lists.ivfdata"]


def test_an_assigner_adds_rows_to_the_lists_the_index_would(tmp_path):
    """The GPU add path (rows assigned by an exact search of the centroids, then encoded), run here with the
    CPU flat index a GPU one replaces: the same lists as the index's own add."""
    import faiss

    from hardrank.scoring.faiss_index import ondisk

    rng = np.random.default_rng(7)
    x = rng.standard_normal((3000, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.index_factory(16, "IVF16,SQ8", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    a, b = faiss.clone_index(index), faiss.clone_index(index)
    ids = np.arange(3000, dtype=np.int64)
    ondisk._add(a, x, ids, None)
    q = faiss.extract_index_ivf(index).quantizer
    ondisk._add(b, x, ids, ondisk._flat(q.reconstruct_n(0, q.ntotal), None))
    la, lb = faiss.extract_index_ivf(a).invlists, faiss.extract_index_ivf(b).invlists
    assert b.ntotal == 3000
    for j in range(16):
        assert sorted(faiss.rev_swig_ptr(la.get_ids(j), la.list_size(j))) == sorted(
            faiss.rev_swig_ptr(lb.get_ids(j), lb.list_size(j)))


def test_merging_the_blocks_holds_their_lists_not_a_quantiser_per_block(tmp_path, monkeypatch):
    """Each block file holds the coarse quantiser (nlist x d floats: 4 MiB here, as at 2,048 x 512); the merge
    holds only the blocks' memory-mapped lists: the full-size build (503 blocks) held 2.2 GiB beside its budget.
    Measured when the merged lists are created, every block read by then; the merged index is whole."""
    import faiss

    from hardrank.mining.memory import status
    from hardrank.scoring.faiss_index import ondisk

    d, nlist, n_blocks, per = 512, 2048, 48, 5
    rng = np.random.default_rng(0)
    trained = faiss.index_factory(d, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    faiss.extract_index_ivf(trained).quantizer.add(rng.standard_normal((nlist, d)).astype(np.float32))
    trained.is_trained = True
    (tmp_path / ondisk.BLOCKS).mkdir()
    x = rng.standard_normal((n_blocks * per, d)).astype(np.float32)
    for b in range(n_blocks):
        block = faiss.clone_index(trained)
        block.add_with_ids(x[b * per:(b + 1) * per], np.arange(b * per, (b + 1) * per, dtype=np.int64))
        ondisk._write_index(block, ondisk._block_path(tmp_path, b))
    del block
    real, seen = faiss.OnDiskInvertedLists, []

    def lists(*a):
        seen.append(status()["RssAnon"])
        return real(*a)

    monkeypatch.setattr(faiss, "OnDiskInvertedLists", lists)
    before = status()["RssAnon"]
    ondisk._merge_on_disk(tmp_path, trained, {"block_rows": per}, n_blocks * per)
    quantiser = nlist * d * 4
    assert len(seen) == 1 and seen[0] - before < 8 * quantiser  # was n_blocks (48) quantisers: 192 MiB
    monkeypatch.undo()
    index = ondisk._read_index(tmp_path / ondisk.INDEX)
    assert index.ntotal == n_blocks * per
    faiss.extract_index_ivf(index).nprobe = nlist
    _, I = index.search(x[::37], 1)
    assert I[:, 0].tolist() == list(range(0, n_blocks * per, 37))


def test_the_catalog_keeps_the_corpus_ids_out_of_python_lists(corpus, tmp_path):
    from hardrank.config import MineConfig, build
    from hardrank.mining.inputs import build_problem

    cfg = build(MineConfig, dict(corpus=corpus["cr"], queries=corpus["q1"], out=str(tmp_path / "o")))
    p = build_problem(cfg, ids_dir=tmp_path / "ids", ids_mapped=True)
    assert isinstance(p.corpus_ids, pa.ChunkedArray) and isinstance(p.corpus_keys, pa.ChunkedArray)
    assert p.corpus_ids[5].as_py() == "shard/000005.jpg" and p.corpus_keys[5].as_py() == "id:shard/000005.jpg"
    assert p.meta["corpus"]["ids"] == f"memory-mapped: {tmp_path / 'ids' / 'ids.arrow'}"
    t0 = time.perf_counter()
    again = build_problem(cfg, ids_dir=tmp_path / "ids", ids_mapped=True)  # reused: the metadata is not read
    assert again.meta["corpus"]["ids_digest"] == p.meta["corpus"]["ids_digest"] and time.perf_counter() - t0 >= 0
    inmem = build_problem(cfg)
    assert inmem.meta["corpus"]["ids"] == "in memory" and inmem.corpus_ids.to_pylist() == p.corpus_ids.to_pylist()


def test_exact_answers_kept_in_a_folder_come_back_for_every_query_vector(tmp_path):
    """Kept by a 16-byte digest of the vector (found among random vectors: one ending in a zero byte, which a
    fixed-width bytes column would have cut short and never found again), served with each request's own
    exclusions dropped, searched again only when too few remain."""
    import hashlib

    from hardrank.mining.searcher import _Remembered

    rng = np.random.default_rng(0)
    xb = rng.standard_normal((300, 8)).astype(np.float32)
    rows = []
    while len(rows) < 3:
        v = rng.standard_normal(8).astype(np.float32)
        if hashlib.blake2b(v.tobytes(), digest_size=16).digest()[-1] == 0:
            rows.append(v)
    xq = np.stack(rows + [rng.standard_normal(8).astype(np.float32) for _ in range(5)])
    calls = []

    def exact(q, kk, excl):
        calls.append(len(q))
        D, I = topk(torch.from_numpy(q), torch.from_numpy(xb), kk)
        return D.numpy(), I.numpy()
    first = _Remembered(exact, tmp_path / "exact_topk.npz", len(xb))
    D0, I0 = first(xq, 6, None)
    first.save()
    # a folder is a user's: a file naming rows past this corpus, or not an npz at all, is passed over
    assert _Remembered(exact, tmp_path / "exact_topk.npz", 10).kept == {}
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip")
    assert _Remembered(exact, tmp_path / "junk.npz", len(xb)).kept == {}
    again = _Remembered(exact, tmp_path / "exact_topk.npz", len(xb))
    excl = _csr([[int(I0[j, 0])] for j in range(len(xq))])  # each query's best excluded: served from what is kept
    D1, I1 = again(xq, 4, excl)
    assert calls == [8] and again.hits == 8
    np.testing.assert_array_equal(I1, I0[:, 1:5])
    np.testing.assert_array_equal(D1, D0[:, 1:5])
    again(xq[:2], 9, None)  # more than kept: searched again
    assert calls == [8, 2]


def test_an_index_file_naming_lists_outside_its_folder_never_reads_them(corpus, tmp_path):
    """index.faiss stores the path of its on-disk lists. A handed folder holding only index.faiss (manifest edited
    to match) must not read the lists of the folder it was copied from: lists are looked up beside the index."""
    from hardrank.errors import DataError
    from hardrank.scoring.faiss_index import ondisk

    assert main(["index", "build", "--corpus", corpus["cr"], "--factory", "IVF16,Flat", "--budget-mb", "1",
                 "--out", str(tmp_path / "idx"), "--quiet"]) == 0
    m = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert "lists.ivfdata" in m["files"]  # its lists are on disk, named inside index.faiss by absolute path
    copy = tmp_path / "handed"
    copy.mkdir()
    for name in m["files"]:
        if name != "lists.ivfdata":
            shutil.copy(tmp_path / "idx" / name, copy / name)
    del m["files"]["lists.ivfdata"]
    (copy / "index.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="damaged"):
        ondisk.open_index(copy, m["identity"])
