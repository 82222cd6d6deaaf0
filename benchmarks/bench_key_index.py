"""Store key lookups at scale: 1M keys against a synthetic 50M-row store, key index vs the old Python dict.

Usage: python benchmarks/bench_key_index.py [--rows 50000000] [--queries 1000000] [--shard-rows 8192]
           [--dict-rows 1000000,4000000,10000000] [--ids] [--workdir /tmp/hardrank-bench-keys] [--keep]

Writes a store folder of ``--rows`` text keys (``t`` + 32 hex digits, as ``text_key`` makes them) in
shards of ``--shard-rows`` (the embed pipeline's flush size), in the store's own format (checksummed
Arrow IPC, 2-d fp16 vectors: the keys are what is measured). Then, each in a fresh child process so
its memory is its own:

- ``index``: open the store (``EmbeddingStore``: list the shards, memory-map them, build the key
  index), then ``contains`` and ``read`` of ``--queries`` keys (90% stored, 10% not, shuffled, given
  as a Python list like the embed pipeline passes them); also ``contains`` given an Arrow array;
- ``dict``: the store's index before this one (``to_pylist`` of each shard's keys into one dict of
  key -> (shard, row)), at ``--dict-rows`` (a prefix of the shards; at 50M it needs ~10 GB, more than
  this shared machine should give one benchmark), and the same lookups;
- ``index`` again at the ``--dict-rows`` sizes, for a like-for-like row;
- with ``--ids``: the ``--key-by id`` records (``hardrank.store.idkeys.IdIndex``, the same key index over
  record shards ``ids/ids-*.arrow`` of ``--rows`` identities, ``d`` + 32 hex -> ``i`` + 32 hex),
  ``lookup`` of ``--queries`` identities, against the dict of identity -> key it used before
  (``ids-dict``, at ``--dict-rows``).

Memory: the child's anonymous RSS (heap: ``RssAnon`` of /proc, sampled every 10 ms for the peak)
above its baseline after imports; the memory-mapped shard pages are page cache (``RssFile``),
shared and reclaimable, reported apart. Prints one table, writes benchmarks/results/key_index.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def _splitmix(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def key_bytes(g: np.ndarray) -> np.ndarray:
    """(n, 33) uint8: key of global row g = 't' + 32 hex digits of 16 pseudo-random bytes (a bijection of
    g, so rows >= --rows are keys the store does not hold)."""
    words = np.stack([_splitmix(g), _splitmix(g ^ np.uint64(1 << 62))], 1).astype("<u8")
    b = words.view(np.uint8).reshape(len(g), 16)
    out = np.empty((len(g), 33), np.uint8)
    out[:, 0] = ord("t")
    out[:, 1::2] = _HEX[b >> 4]
    out[:, 2::2] = _HEX[b & 15]
    return out


def key_array(g: np.ndarray, first: str = "t"):
    import pyarrow as pa

    b = key_bytes(g)
    b[:, 0] = ord(first)
    data = b.reshape(-1)
    offsets = np.arange(0, 33 * (len(g) + 1), 33, dtype=np.int32)
    return pa.StringArray.from_buffers(len(g), pa.py_buffer(offsets), pa.py_buffer(data))


def _write_shards(folder: Path, name: str, rows: int, shard_rows: int, table_of, what: str) -> None:
    """Arrow IPC files ``folder/<name>-<s>-bench.arrow`` of ``shard_rows`` rows each (global rows g ->
    ``table_of(g)``), written atomically; files already there are kept (the data are generated once)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from hardrank.atomic import atomic_path

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for s, lo in enumerate(range(0, rows, shard_rows)):
        path = folder / f"{name}-{s:020d}-bench.arrow"
        if path.exists():
            continue
        g = np.arange(lo, min(rows, lo + shard_rows), dtype=np.uint64)
        table = table_of(g)
        with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        if s % 500 == 0:
            print(f"  wrote {lo + len(g):,} {what} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)


def generate(folder: Path, rows: int, shard_rows: int) -> None:
    """The store folder <folder>/fp/text/shard-*.arrow, as EmbeddingStore.write lays shards out."""
    import pyarrow as pa

    from hardrank.store.embedding_store import _DIGEST, _digest, embedding_schema

    (folder / "fp" / "image").mkdir(parents=True, exist_ok=True)
    schema = embedding_schema(2, "float16")

    def table_of(g):
        keys = key_array(g)
        emb = np.zeros((len(g), 2), np.float16)
        emb[:, 0] = 1
        meta = {**schema.metadata, _DIGEST: _digest(keys, emb).encode()}
        return pa.Table.from_arrays([keys, pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 2)],
                                    schema=schema.with_metadata(meta))

    _write_shards(folder / "fp" / "text", "shard", rows, shard_rows, table_of, "rows")


def generate_ids(folder: Path, rows: int, shard_rows: int) -> None:
    """Identity records <folder>/ids-root/fp/ids/ids-*.arrow, as IdIndex.commit writes them."""
    import pyarrow as pa

    from hardrank.store.idkeys import _SCHEMA

    _write_shards(folder / "ids-root" / "fp" / "ids", "ids", rows, shard_rows,
                  lambda g: pa.Table.from_arrays([key_array(g, "d"), key_array(g, "i")], schema=_SCHEMA),
                  "id records")


def queries(rows: int, total_rows: int, n: int, seed: int = 0) -> np.ndarray:
    """(n,) global rows: 90% stored (below ``rows``), 10% never stored (at and above ``total_rows``)."""
    rng = np.random.default_rng(seed)
    n_in = int(round(0.9 * n))
    g = np.concatenate([rng.integers(0, rows, n_in), total_rows + rng.permutation(n - n_in)]).astype(np.uint64)
    return g[rng.permutation(n)]


def worker(method: str, folder: Path, rows: int, total_rows: int, shard_rows: int, n_queries: int) -> dict:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from hardrank.jobs.bench.timing import PeakRSS
    from hardrank.store.embedding_store import EmbeddingStore
    from hardrank.store.key_index import KeyIndex

    if method in ("ids", "ids-dict"):
        return ids_worker(method, folder, rows, total_rows, shard_rows, n_queries)
    g = queries(rows, total_rows, n_queries)
    qarr = key_array(g)
    q = qarr.to_pylist()                          # what callers pass: a list of str
    expect = g < rows
    mem = PeakRSS("anon", interval=0.01).start()  # the heap: the mapped shards are page cache
    base = mem.reset()
    out = {"method": method, "rows": rows, "queries": n_queries}
    t0 = time.perf_counter()
    n_shards = -(-rows // shard_rows)
    if method == "index" and rows == total_rows:    # the store end to end: list, map, index
        store = EmbeddingStore(folder, "fp", dim=2, dtype="float16", readonly=True)
        contains = lambda keys: store.contains("text", keys)
        read = lambda keys: store.read("text", keys)
        index_bytes = store.key_index["text"].nbytes
        distinct = store.count("text")
    else:
        paths = sorted((folder / "fp" / "text").glob("shard-*.arrow"))[:n_shards]
        tables = [ipc.open_file(pa.memory_map(str(p), "r")).read_all() for p in paths]
        if method == "index":
            idx = KeyIndex.build([t.column("key").chunk(0) for t in tables])
            contains = idx.contains
            index_bytes, distinct = idx.nbytes, len(idx)
            read = None
        else:  # the old EmbeddingStore._reindex: one dict of every key
            index: dict[str, tuple[int, int]] = {}
            for sid, t in enumerate(tables):
                for row, key in enumerate(t.column("key").to_pylist()):
                    index.setdefault(key, (sid, row))
            contains = lambda keys: np.fromiter((k in index for k in keys), dtype=bool, count=len(keys))
            read = lambda keys: [index[k] for k in keys]
            index_bytes, distinct = None, len(index)
    out["open_s"] = round(time.perf_counter() - t0, 3)
    out["distinct"] = distinct
    out["peak_open_mb"] = round((mem.high - base) / 2**20, 1)
    out["held_mb"] = round((mem.now() - base) / 2**20, 1)
    out["index_bytes_per_row"] = round(index_bytes / rows, 2) if index_bytes is not None else None
    contains(q[:1000])  # warm-up: first calls set up Arrow's compute kernels and memory pool
    contains(qarr[:1000])
    before = mem.reset()
    t0 = time.perf_counter()
    got = contains(q)
    out["contains_s"] = round(time.perf_counter() - t0, 3)
    assert np.array_equal(np.asarray(got), expect), "wrong answer"
    if method == "index":
        t0 = time.perf_counter()
        got = contains(qarr)
        out["contains_arrow_s"] = round(time.perf_counter() - t0, 3)
        assert np.array_equal(np.asarray(got), expect)
    present = [k for k, e in zip(q, expect) if e]
    if read is not None and method == "index":  # the first read verifies each shard's checksum once
        t0 = time.perf_counter()
        read(present)
        out["read_first_s"] = round(time.perf_counter() - t0, 3)
    if read is not None:
        t0 = time.perf_counter()
        read(present)
        out["read_s" if method == "index" else "locate_s"] = round(time.perf_counter() - t0, 3)
    out["peak_lookup_extra_mb"] = round((mem.high - before) / 2**20, 1)
    f = mem.status()
    out["rss_file_mb"] = round(f["RssFile"] / 2**20, 1)
    out["vm_hwm_mb"] = round(f["VmHWM"] / 2**20, 1)
    return out


def ids_worker(method: str, folder: Path, rows: int, total_rows: int, shard_rows: int, n_queries: int) -> dict:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from hardrank.jobs.bench.timing import PeakRSS
    from hardrank.store.idkeys import IdIndex

    g = queries(rows, total_rows, n_queries)
    q = key_array(g, "d").to_pylist()
    expect = [("i" + k[1:]) if stored else None for k, stored in zip(q, g < rows)]
    mem = PeakRSS("anon", interval=0.01).start()  # the heap: the mapped shards are page cache
    base = mem.reset()
    out = {"method": method, "rows": rows, "queries": n_queries}
    t0 = time.perf_counter()
    root = folder / "ids-root"
    if method == "ids" and rows == total_rows:  # IdIndex end to end: list, map, index the record shards
        ix = IdIndex(root, readonly=True)
        lookup, index_bytes, distinct = ix.lookup, ix._index.nbytes, len(ix)
    else:
        paths = sorted((root / "fp" / "ids").glob("ids-*.arrow"))[:-(-rows // shard_rows)]
        if method == "ids":  # the same as IdIndex.refresh, over a prefix of the shards
            ix = IdIndex(folder / "absent", readonly=True)
            blocks = [ix._read(p) for p in paths]
            ix._index.extend([i for i, _ in blocks])
            ix._values.extend(k for _, k in blocks)
            lookup, index_bytes, distinct = ix.lookup, ix._index.nbytes, len(ix)
        else:  # IdIndex before: one dict of identity -> key
            index: dict[str, str] = {}
            for p in paths:
                t = ipc.open_file(pa.memory_map(str(p), "r")).read_all()
                for i, k in zip(t.column("id_key").to_pylist(), t.column("key").to_pylist()):
                    index.setdefault(i, k)
            lookup = lambda keys: [index.get(k) for k in keys]
            index_bytes, distinct = None, len(index)
    out["open_s"] = round(time.perf_counter() - t0, 3)
    out["distinct"] = distinct
    out["peak_open_mb"] = round((mem.high - base) / 2**20, 1)
    out["held_mb"] = round((mem.now() - base) / 2**20, 1)
    out["index_bytes_per_row"] = round(index_bytes / rows, 2) if index_bytes is not None else None
    lookup(q[:1000])
    before = mem.reset()
    t0 = time.perf_counter()
    got = lookup(q)
    out["contains_s"] = round(time.perf_counter() - t0, 3)
    assert got == expect, "wrong answer"
    out["peak_lookup_extra_mb"] = round((mem.high - before) / 2**20, 1)
    f = mem.status()
    out["rss_file_mb"] = round(f["RssFile"] / 2**20, 1)
    out["vm_hwm_mb"] = round(f["VmHWM"] / 2**20, 1)
    return out


def _child(args, method: str, rows: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--worker-rows", str(rows), "--rows", str(args.rows),
           "--queries", str(args.queries), "--shard-rows", str(args.shard_rows), "--workdir", str(args.workdir)]
    print(f"{method} at {rows:,} rows ...", file=sys.stderr, flush=True)
    # glibc keeps freed heap below its (growing) mmap threshold: fix the threshold so RssAnon is live memory
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072",
           "MALLOC_TRIM_THRESHOLD_": "131072"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        print(res.stderr, file=sys.stderr)
        raise SystemExit(f"{method} at {rows} rows failed")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _extrapolate(dicts: list[dict], rows: int) -> dict | None:
    """The dict grows linearly with the rows: least squares through the measured sizes, to ``rows``."""
    if len(dicts) < 2:
        return None
    a, b = np.polyfit([r["rows"] for r in dicts], [r["held_mb"] for r in dicts], 1)
    ta, tb = np.polyfit([r["rows"] for r in dicts], [r["open_s"] for r in dicts], 1)
    return {"rows": rows, "held_mb": round(a * rows + b), "open_s": round(ta * rows + tb, 1),
            "contains_s": dicts[-1]["contains_s"], "bytes_per_row": round(a * 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000_000)
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--shard-rows", type=int, default=8192)
    ap.add_argument("--dict-rows", default="1000000,4000000,10000000")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/hardrank-bench-keys"))
    ap.add_argument("--keep", action="store_true", help="keep the generated store for the next run")
    ap.add_argument("--ids", action="store_true", help="also the --key-by id records (IdIndex) against their old dict")
    ap.add_argument("--worker", choices=["index", "dict", "ids", "ids-dict"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-rows", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    folder = args.workdir / f"store-{args.rows}-{args.shard_rows}"
    if args.worker:
        print(json.dumps(worker(args.worker, folder, args.worker_rows, args.rows, args.shard_rows, args.queries)))
        return
    t0 = time.perf_counter()
    generate(folder, args.rows, args.shard_rows)
    if args.ids:
        generate_ids(args.workdir / f"store-{args.rows}-{args.shard_rows}", args.rows, args.shard_rows)
    gen_s = time.perf_counter() - t0
    small = [int(x) for x in args.dict_rows.split(",") if x]
    rows = []
    for new, old in [("index", "dict")] + ([("ids", "ids-dict")] if args.ids else []):
        rows.append(_child(args, new, args.rows))
        for n in small:
            rows.append(_child(args, new, n))
            rows.append(_child(args, old, n))
    extrapolated = {m: _extrapolate([r for r in rows if r["method"] == m], args.rows) for m in ("dict", "ids-dict")}
    print(f"\nkey lookups: {args.queries:,} keys (90% stored) against a store of N text keys in shards of "
          f"{args.shard_rows:,}; {platform.processor() or platform.machine()}, {os.cpu_count()} cpus")
    hdr = f"{'method':<8} {'N':>12} {'open s':>8} {'held MB':>9} {'B/row':>6} {'peak open MB':>13} " \
          f"{'contains s':>11} {'(arrow in)':>10} {'read/locate s':>14} {'lookup extra MB':>16} {'page cache MB':>14}"
    print(hdr)
    for r in rows:
        print(f"{r['method']:<8} {r['rows']:>12,} {r['open_s']:>8.2f} {r['held_mb']:>9.1f} "
              f"{r['held_mb'] * 2**20 / r['rows']:>6.1f} {r['peak_open_mb']:>13.1f} {r['contains_s']:>11.3f} "
              f"{r.get('contains_arrow_s', float('nan')):>10.3f} "
              f"{r.get('read_s', r.get('locate_s', float('nan'))):>14.3f} {r['peak_lookup_extra_mb']:>16.1f} "
              f"{r['rss_file_mb']:>14.1f}")
    for m, e in extrapolated.items():
        if e is not None:
            print(f"{m:<8} {args.rows:>12,} {e['open_s']:>8.1f} {e['held_mb']:>9,} "
                  f"{e['bytes_per_row']:>6.1f}   (extrapolated linearly from the measured dict sizes)")
    out = {"rows": args.rows, "queries": args.queries, "shard_rows": args.shard_rows, "generate_s": round(gen_s, 1),
           "machine": {"processor": platform.processor(), "cpus": os.cpu_count(), "python": platform.python_version()},
           "results": rows, "dict_extrapolated": extrapolated["dict"],
           "ids_dict_extrapolated": extrapolated["ids-dict"]}
    res = ROOT / "benchmarks" / "results"
    res.mkdir(parents=True, exist_ok=True)
    (res / "key_index.json").write_text(json.dumps(out, indent=1))
    if not args.keep:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
